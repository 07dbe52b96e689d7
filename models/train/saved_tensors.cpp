#include "models/train/saved_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {

SavedTensors::SavedTensors(Device& dev)
    : dev_(dev), produced_(dev.make_event()), copied_(dev.make_event()) {}

SavedTensors::~SavedTensors() {
  // Copies in flight still read their sources: wait before the Tensors free them. A destructor
  // must not throw (std::terminate): after a sticky CUDA error the sync fails, and the error that
  // caused the unwinding is the one worth reporting.
  if (pending_.empty() && segments_.empty()) return;
  try {
    dev_.synchronize(StreamKind::copy);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memtrade: SavedTensors: copy-stream sync failed in destructor: %s\n",
                 e.what());
  }
}

SavedTensors::Entry* SavedTensors::find(int segment, std::string_view key) {
  auto s = segments_.find(segment);
  if (s == segments_.end()) return nullptr;
  auto it = s->second.index.find(key);
  return it == s->second.index.end() ? nullptr : &*it->second;
}

const SavedTensors::Entry* SavedTensors::find(int segment, std::string_view key) const {
  auto s = segments_.find(segment);
  if (s == segments_.end()) return nullptr;
  auto it = s->second.index.find(key);
  return it == s->second.index.end() ? nullptr : &*it->second;
}

void SavedTensors::add(Entry e) {
  Segment& s = segments_[e.segment];
  s.entries.push_back(std::move(e));
  s.index.emplace(s.entries.back().key, std::prev(s.entries.end()));
}

void SavedTensors::erase(int segment, std::string_view key) {
  auto s = segments_.find(segment);
  if (s == segments_.end()) return;
  auto it = s->second.index.find(key);
  if (it == s->second.index.end()) return;
  s->second.entries.erase(it->second);
  s->second.index.erase(it);
  if (s->second.entries.empty()) segments_.erase(s);
}

void SavedTensors::save(int segment, std::string_view key, Tensor t) {
  if (!t.defined())
    throw std::logic_error(
        fmt::format("SavedTensors: saving undefined tensor {}/{}", segment, key));
  if (find(segment, key) != nullptr)
    throw std::logic_error(fmt::format("SavedTensors: {}/{} saved twice", segment, key));
  Entry e{segment, std::string(key), {}, {}, {}};
  // A view (the model input, saved in place) stays: its base lives on the device through the
  // step anyway, so a host copy would free nothing and its way back would allocate.
  if (offload_ && !t.is_view()) {
    ScopedRange range(dev_, "offload");
    // The copy stream must not read the tensor before the compute stream has written it.
    produced_->record(StreamKind::compute);
    dev_.wait(StreamKind::copy, *produced_);
    e.host = Tensor(dev_.pinned(), t.shape(), t.dtype(), Category::activations);
    dev_.copy(e.host.data(), t.data(), t.nbytes(), CopyKind::device_to_host, StreamKind::copy);
    pending_.push_back(std::move(t));  // freed by flush(), once the copy has completed
  } else {
    e.dev = std::move(t);
  }
  add(std::move(e));
}

void SavedTensors::share(int segment, std::string_view key, std::shared_ptr<Tensor> t) {
  if (!t || !t->defined())
    throw std::logic_error(
        fmt::format("SavedTensors: sharing undefined tensor {}/{}", segment, key));
  if (find(segment, key) != nullptr)
    throw std::logic_error(fmt::format("SavedTensors: {}/{} saved twice", segment, key));
  add(Entry{segment, std::string(key), {}, {}, std::move(t)});
}

bool SavedTensors::has(int segment, std::string_view key) const {
  return find(segment, key) != nullptr;
}

Tensor& SavedTensors::get(int segment, std::string_view key) {
  Entry* e = find(segment, key);
  if (e == nullptr)
    throw std::logic_error(fmt::format("SavedTensors: nothing saved as {}/{}", segment, key));
  if (e->shared) return *e->shared;
  if (!e->dev.defined())
    throw std::logic_error(
        fmt::format("SavedTensors: {}/{} is offloaded; fetch() it", segment, key));
  return e->dev;
}

Tensor SavedTensors::take(int segment, std::string_view key) {
  const Entry* e = find(segment, key);
  if (e != nullptr && e->shared)
    throw std::logic_error(fmt::format("SavedTensors: {}/{} is shared, not taken", segment, key));
  Tensor t = std::move(get(segment, key));
  if (e->host.defined()) dev_.synchronize(StreamKind::copy);  // H2D may still read it
  erase(segment, key);
  return t;
}

void SavedTensors::unshare(int segment, std::string_view key) {
  const Entry* e = find(segment, key);
  if (e == nullptr || !e->shared)
    throw std::logic_error(fmt::format("SavedTensors: {}/{} is not shared", segment, key));
  erase(segment, key);
}

void SavedTensors::flush() {
  if (pending_.empty()) return;
  // The sources go back to the allocator now; whatever reuses their bytes runs on the compute
  // stream behind this wait, so the host never stalls for the copies.
  copied_->record(StreamKind::copy);
  dev_.wait(StreamKind::compute, *copied_);
  pending_.clear();
}

void SavedTensors::prefetch(int segment) {
  if (arrivals_.contains(segment)) return;
  ScopedRange range(dev_, "prefetch");
  auto s = segments_.find(segment);
  if (s == segments_.end()) return;
  bool issued = false;
  for (auto& e : s->second.entries) {
    if (e.dev.defined() || e.shared) continue;
    if (!issued) {
      // The destination may be memory the compute stream freed a moment ago: let it finish.
      produced_->record(StreamKind::compute);
      dev_.wait(StreamKind::copy, *produced_);
      issued = true;
    }
    e.dev = Tensor(dev_.memory(), e.host.shape(), e.host.dtype(), Category::activations);
    dev_.copy(e.dev.data(), e.host.data(), e.host.nbytes(), CopyKind::host_to_device,
              StreamKind::copy);
  }
  if (!issued) return;
  auto arrived = dev_.make_event();
  arrived->record(StreamKind::copy);
  arrivals_.emplace(segment, std::move(arrived));
}

void SavedTensors::fetch(int segment) {
  prefetch(segment);
  auto it = arrivals_.find(segment);
  if (it != arrivals_.end()) dev_.wait(StreamKind::compute, *it->second);
}

void SavedTensors::release(int segment) {
  auto it = arrivals_.find(segment);
  if (it != arrivals_.end()) {
    it->second->synchronize();  // the pinned sources of its copies must be done with
    arrivals_.erase(it);
  } else {
    bool host = false;  // never fetched: its forward copies may still be writing them
    if (auto s = segments_.find(segment); s != segments_.end())
      for (const auto& e : s->second.entries) host = host || e.host.defined();
    if (host) dev_.synchronize(StreamKind::copy);
  }
  segments_.erase(segment);  // its entries freed in the order they were saved
}

void SavedTensors::clear() {
  if (!pending_.empty() || !segments_.empty()) dev_.synchronize(StreamKind::copy);
  pending_.clear();
  segments_.clear();
  arrivals_.clear();
}

std::int64_t SavedTensors::device_bytes() const {
  std::int64_t n = 0;
  for (const auto& [_, s] : segments_)
    for (const auto& e : s.entries)
      if (e.dev.defined()) n += static_cast<std::int64_t>(e.dev.nbytes());
  for (const auto& t : pending_) n += static_cast<std::int64_t>(t.nbytes());
  return n;
}

std::int64_t SavedTensors::host_bytes() const {
  std::int64_t n = 0;
  for (const auto& [_, s] : segments_)
    for (const auto& e : s.entries)
      if (e.host.defined()) n += static_cast<std::int64_t>(e.host.nbytes());
  return n;
}

// ---- checkpoint plan ----------------------------------------------------------------------------

CheckpointPlan CheckpointPlan::none(int num_blocks) {
  CheckpointPlan p;
  for (int i = 0; i < num_blocks; ++i) p.segments.push_back({i, i + 1, false});
  return p;
}

CheckpointPlan CheckpointPlan::make(const Checkpoint& c, int num_blocks) {
  const int n = num_blocks;
  switch (c.kind) {
    case Checkpoint::Kind::selective: {
      CheckpointPlan p = none(n);
      p.selective = true;
      return p;
    }
    case Checkpoint::Kind::sqrt: {
      CheckpointPlan p;
      const int s = std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n)))));
      for (int b = 0; b < n; b += s) p.segments.push_back({b, std::min(n, b + s), true});
      return p;
    }
    case Checkpoint::Kind::density:
    case Checkpoint::Kind::first: {
      if (!(c.density >= 0.0 && c.density <= 1.0))
        throw std::invalid_argument(fmt::format("checkpoint density {} not in [0, 1]", c.density));
      const auto k = static_cast<std::int64_t>(std::lround(c.density * n));
      CheckpointPlan p = none(n);
      for (int i = 0; i < n; ++i)
        p.segments[i].recompute =
            c.kind == Checkpoint::Kind::first ? i < k : (i + 1) * k / n > i * k / n;
      return p;
    }
  }
  return none(n);
}

bool CheckpointPlan::recomputed(int block) const {
  for (const auto& s : segments)
    if (block >= s.begin && block < s.end) return s.recompute;
  return false;
}

int CheckpointPlan::num_recomputed() const {
  int k = 0;
  for (const auto& s : segments)
    if (s.recompute) k += s.end - s.begin;
  return k;
}

}  // namespace memtrade
