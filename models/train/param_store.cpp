#include "models/train/param_store.h"
#include "models/train/splitmix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {
namespace {

// Counter-based normal values (models/train/splitmix.h): std::normal_distribution is
// implementation-defined, and every element computed on its own lets init use all cores.
double unit(std::uint64_t h) {
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}  // [0, 1)

// Initial fp32 values of one parameter: normal(0, std) (Box-Muller), zeros or ones; of a
// tensor-parallel slice, the slice of the whole parameter's values (so that every tp gives the
// model tp 1 starts from).
std::vector<float> init_values(const ParamSpec& spec, std::uint64_t seed, int index) {
  if (spec.tp.split()) {
    ParamSpec whole = spec;
    whole.shape = spec.full_shape();
    whole.tp = TpSlice{};
    return tp_slice_of(spec, init_values(whole, seed, index));
  }
  std::vector<float> v(static_cast<std::size_t>(shape_numel(spec.shape)));
  if (spec.init_std == 0.0f) return v;
  if (spec.init_std < 0.0f) {
    std::fill(v.begin(), v.end(), 1.0f);
    return v;
  }
  const std::uint64_t base =
      splitmix64(splitmix64(seed) ^ (static_cast<std::uint64_t>(index) << 32));
  const auto pairs = static_cast<std::int64_t>((v.size() + 1) / 2);
  constexpr double kTwoPi = 6.283185307179586;
#pragma omp parallel for schedule(static) if (pairs > 65536)
  for (std::int64_t k = 0; k < pairs; ++k) {
    const auto i = static_cast<std::size_t>(2 * k);
    const double u1 = 1.0 - unit(splitmix64(base + i));  // (0, 1]: log is finite
    const double u2 = unit(splitmix64(base + i + 1));
    const double r = std::sqrt(-2.0 * std::log(u1)) * spec.init_std;
    v[i] = static_cast<float>(r * std::cos(kTwoPi * u2));
    if (i + 1 < v.size()) v[i + 1] = static_cast<float>(r * std::sin(kTwoPi * u2));
  }
  return v;
}

// Writes fp32 values into a host-addressable (pinned) tensor, rounding to its dtype.
void write_host(Tensor& t, const std::vector<float>& values) {
  for (std::size_t i = 0; i < values.size(); ++i)
    store_from_float(t.data(), t.dtype(), i, values[i]);
}

}  // namespace

ParamPlacement ParamPlacement::from(const TrainConfig& cfg) {
  ParamPlacement p;
  p.compute = compute_dtype(cfg.precision);
  p.master = has_master_copy(cfg.precision);
  p.offload = cfg.offload;
  p.sharding = cfg.data_parallel > 1 ? cfg.sharding : Sharding::none;
  return p;
}

TrainerParamStore::TrainerParamStore(Device& dev, const std::vector<ParamSpec>& specs,
                                     const ParamPlacement& placement, std::uint64_t seed,
                                     Comm& comm, Comm* expert_comm)
    : dev_(dev),
      specs_(specs),
      place_(placement),
      slots_(specs.size()),
      comm_(comm),
      expert_comm_(expert_comm != nullptr ? *expert_comm : comm),
      layout_{comm.size(), comm.rank()} {
  if (layout_.ranks == 1) place_.sharding = Sharding::none;
  int max_block = -1;
  for (const auto& s : specs_) max_block = std::max(max_block, s.block);
  block_params_.resize(static_cast<std::size_t>(max_block + 1));
  block_depth_.assign(static_cast<std::size_t>(max_block + 1), 0);

  // A device without data (the memory model's) gets the allocations alone: no values are
  // drawn, nothing is written.
  const bool init = dev_.holds_data();
  for (int i = 0; i < size(); ++i) {
    const ParamSpec& spec = specs_[static_cast<std::size_t>(i)];
    Slot& s = slots_[static_cast<std::size_t>(i)];
    const std::vector<float> values =
        init ? init_values(spec, seed, spec.init_index >= 0 ? spec.init_index : i)
             : std::vector<float>{};
    auto on_device = [&](Tensor& t) {
      if (init) dev_.from_host_f32(t, values);
    };
    auto on_host = [&](Tensor& t) {
      if (init) write_host(t, values);
    };
    if (!spec.trainable) {  // a buffer: F32, resident, mutated by forward
      s.weight = dev_.empty(spec.shape, DType::F32, Category::params);
      on_device(s.weight);
      continue;
    }
    if (sharded()) {
      const Part p = even_part(shape_numel(spec.shape), group(i).size(), group(i).rank());
      s.offset = p.offset;
      s.part = p.count;
    }
    // This rank's part of the initial values (every rank draws the whole parameter: the same
    // values as one rank would have).
    auto part_values = [&] {
      return init
                 ? std::vector<float>(values.begin() + s.offset, values.begin() + s.offset + s.part)
                 : std::vector<float>{};
    };
    if (streamed(i) || gathered(i)) {
      if (spec.block >= 0) block_params_[static_cast<std::size_t>(spec.block)].push_back(i);
    } else {
      s.weight = dev_.empty(spec.shape, place_.compute, Category::params);
      on_device(s.weight);
    }
    if (place_.sharding == Sharding::zero3) {
      s.shard = dev_.empty({s.part}, place_.compute, Category::params);
      if (init) dev_.from_host_f32(s.shard, part_values());
    }
    if (sharded()) {
      if (place_.offload == Offload::optimizer) {
        // ZeRO-Offload of the rank's part: its host copy (fp32 with a master precision, else
        // the compute dtype) is what the host update runs on.
        s.master = dev_.empty_pinned({s.part}, place_.master ? DType::F32 : place_.compute,
                                     Category::master);
        if (init) write_host(s.master, part_values());
      } else if (place_.master) {
        s.master = dev_.empty({s.part}, DType::F32, Category::master);
        if (init) dev_.from_host_f32(s.master, part_values());
      }
      continue;
    }
    if (place_.stream_params()) {
      s.host_weight = dev_.empty_pinned(spec.shape, place_.compute, Category::params);
      on_host(s.host_weight);
      if (place_.master) {
        s.master = dev_.empty_pinned(spec.shape, DType::F32, Category::master);
        on_host(s.master);
      }
    } else if (place_.offload == Offload::optimizer) {
      // fp32 has no master on the device, but the host update needs the parameters on the
      // host: the pinned copy plays the master's role (pure precision: in the 16-bit dtype).
      const DType dt = place_.master ? DType::F32 : place_.compute;
      s.master = dev_.empty_pinned(spec.shape, dt, Category::master);
      on_host(s.master);
    } else if (place_.master) {
      s.master = dev_.empty(spec.shape, DType::F32, Category::master);
      on_device(s.master);
    }
  }
  make_buckets();
  if (layout_.ranks > 1 && place_.sharding == Sharding::torch_zero1) {
    std::vector<int> order;
    for (int i = 0; i < size(); ++i)
      if (spec(i).trainable) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return shape_numel(spec(a).shape) > shape_numel(spec(b).shape);
    });
    owner_.assign(specs_.size(), -1);
    std::vector<std::int64_t> load(static_cast<std::size_t>(layout_.ranks), 0);
    for (int i : order) {
      const auto r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      owner_[static_cast<std::size_t>(i)] = r;
      load[static_cast<std::size_t>(r)] += shape_numel(spec(i).shape);
    }
  }
}

void TrainerParamStore::make_buckets() {
  // DDP allocates its buckets when it wraps the model (Reducer::initialize_buckets).
  if (!ddp()) return;
  bucket_plan_ = ddp_buckets(specs_, place_.compute);
  if (expert_comm_.size() > 1 && &expert_comm_ != &comm_) {  // one rank: nothing to reduce
    std::vector<DdpBucket> experts = ddp_buckets(specs_, place_.compute, true);
    bucket_plan_.insert(bucket_plan_.end(), experts.begin(), experts.end());
  }
  for (const DdpBucket& b : bucket_plan_) {
    buckets_.push_back(dev_.empty({b.numel}, place_.compute, Category::grads));
    int ready = b.params.empty() ? -1 : spec(b.params.front()).block;
    for (int i : b.params) ready = std::min(ready, spec(i).block);  // -1: outside the blocks
    bucket_ready_block_.push_back(ready);
  }
  bucket_started_.assign(bucket_plan_.size(), false);
}

TrainerParamStore::Slot& TrainerParamStore::slot(int index) {
  if (index < 0 || index >= size())
    throw std::out_of_range(fmt::format("parameter index {} out of range [0, {})", index, size()));
  return slots_[static_cast<std::size_t>(index)];
}

bool TrainerParamStore::streamed(int index) const {
  const ParamSpec& spec = specs_[static_cast<std::size_t>(index)];
  return place_.stream_params() && spec.trainable && spec.block >= 0;
}

bool TrainerParamStore::gathered(int index) const {
  return place_.sharding == Sharding::zero3 && specs_[static_cast<std::size_t>(index)].trainable;
}

Tensor& TrainerParamStore::weight(int index) {
  Slot& s = slot(index);
  if (!s.weight.defined())
    throw std::logic_error(fmt::format("weight '{}' of block {} used outside enter_block({})",
                                       spec(index).name, spec(index).block, spec(index).block));
  return s.weight;
}

GradRef TrainerParamStore::grad(int index) {
  Slot& s = slot(index);
  if (!spec(index).trainable)
    throw std::logic_error(fmt::format("'{}' is a buffer and has no gradient", spec(index).name));
  if (!s.grad.defined()) {
    s.grad = dev_.empty(spec(index).shape, place_.compute, Category::grads);
    s.grad_written = false;  // a fresh grad is assigned, not added to (PyTorch's None grad)
  }
  const bool accumulate = s.grad_written;
  s.grad_written = true;
  return GradRef{s.grad, accumulate};
}

void TrainerParamStore::upload_weight(int index) {
  ScopedRange range(dev_, "param_upload");
  Slot& s = slot(index);
  // Compute stream: the bytes may reuse memory that compute work freed a moment ago.
  dev_.copy(s.weight.data(), s.host_weight.data(), s.weight.nbytes(), CopyKind::host_to_device,
            StreamKind::compute);
}

void TrainerParamStore::enter_block(int block) {
  if (block < 0) throw std::invalid_argument(fmt::format("enter_block({})", block));
  if (static_cast<std::size_t>(block) >= block_depth_.size()) return;  // a block without params
  if (block_depth_[static_cast<std::size_t>(block)]++ > 0) return;
  for (int i : block_params_[static_cast<std::size_t>(block)]) {
    if (gathered(i)) {
      gather_weight(i);
      continue;
    }
    Slot& s = slot(i);
    s.weight = dev_.empty(spec(i).shape, place_.compute, Category::params);
    upload_weight(i);
  }
}

void TrainerParamStore::gather_weight(int index) {
  ScopedRange range(dev_, "param_gather");
  Slot& s = slot(index);
  s.weight = dev_.empty(spec(index).shape, place_.compute, Category::params);
  group(index).all_gather(s.shard, s.weight, even_parts(s.weight.numel(), group(index).size()));
}

void TrainerParamStore::gather_root(bool for_backward) {
  if (place_.sharding != Sharding::zero3) return;
  for (int i = 0; i < size(); ++i)
    if (gathered(i) && spec(i).block < 0) gather_weight(i);
  if (for_backward) prefetch(static_cast<int>(block_depth_.size()) - 1);
}

void TrainerParamStore::prefetch(int block) {
  if (block < 0 || static_cast<std::size_t>(block) >= block_depth_.size()) return;
  if (block_params_[static_cast<std::size_t>(block)].empty()) return;
  prefetched_.resize(block_depth_.size(), false);
  if (prefetched_[static_cast<std::size_t>(block)]) return;
  prefetched_[static_cast<std::size_t>(block)] = true;
  enter_block(block);  // the prefetch holds one reference until the block's backward is done
}

void TrainerParamStore::block_backward_begins(int block) {
  if (place_.sharding == Sharding::zero3) prefetch(block - 1);
}

void TrainerParamStore::release_root() {
  if (place_.sharding != Sharding::zero3) return;
  for (int i = 0; i < size(); ++i)
    if (gathered(i) && spec(i).block < 0) slot(i).weight.reset();
}

void TrainerParamStore::block_grads_done(int block) {
  if (static_cast<std::size_t>(block) < prefetched_.size() &&
      prefetched_[static_cast<std::size_t>(block)]) {
    prefetched_[static_cast<std::size_t>(block)] = false;
    exit_block(block);  // the prefetch's reference; the model's exit_block frees the weights
  }
  if (!sync_ || layout_.ranks == 1) return;
  if (ddp()) {
    // DDP's Reducer: a bucket whose grads are all final is all-reduced while backward goes on.
    // Buckets start as they become ready (the same order on every rank: backward's).
    for (std::size_t b = 0; b < bucket_plan_.size(); ++b)
      if (bucket_ready_block_[b] == block && !bucket_started_[b]) start_bucket(b);
    comm_.progress();
    if (&expert_comm_ != &comm_) expert_comm_.progress();
    return;
  }
  if (place_.sharding != Sharding::zero2 && place_.sharding != Sharding::zero3) return;
  for (int i = 0; i < size(); ++i)
    if (spec(i).block == block && spec(i).trainable && slot(i).grad.defined())
      reduce_scatter_grad(i, dev_.ops());
}

void TrainerParamStore::start_bucket(std::size_t b) {
  Tensor& bucket = buckets_[b];
  auto* base = static_cast<unsigned char*>(bucket.data());
  std::size_t off = 0;
  for (int i : bucket_plan_[b].params) {
    Slot& s = slot(i);
    if (!s.grad.defined()) s.grad = dev_.empty(spec(i).shape, place_.compute, Category::grads);
    dev_.copy(base + off, s.grad.data(), s.grad.nbytes(), CopyKind::device_to_device);
    off += s.grad.nbytes();
  }
  (bucket_plan_[b].experts ? expert_comm_ : comm_).start_all_reduce(bucket);
  bucket_started_[b] = true;
}

void TrainerParamStore::finish_bucket(std::size_t b) {
  auto* base = static_cast<unsigned char*>(buckets_[b].data());
  std::size_t off = 0;
  for (int i : bucket_plan_[b].params) {
    Slot& s = slot(i);
    dev_.copy(s.grad.data(), base + off, s.grad.nbytes(), CopyKind::device_to_device);
    off += s.grad.nbytes();
  }
  bucket_started_[b] = false;
}

void TrainerParamStore::reduce_scatter_grad(int index, Ops& ops) {
  ScopedRange range(dev_, "grad_reduce_scatter");
  Slot& s = slot(index);
  Tensor part = dev_.empty({s.part}, place_.compute, Category::grads);
  group(index).reduce_scatter(s.grad, part, even_parts(s.grad.numel(), group(index).size()));
  s.grad.reset();  // the full grad is gone; the rank keeps its part
  if (s.grad_part.defined()) {
    ops.add_inplace(s.grad_part, part);  // zero_grad=zero: onto the zero-filled part
  } else {
    s.grad_part = std::move(part);
  }
}

void TrainerParamStore::reduce_grads(Ops& ops) {
  if (layout_.ranks == 1) return;
  ScopedRange range(dev_, "grad_reduce");
  if (ddp()) {
    // DDP: each bucket gathers its grads, is all-reduced (started during backward where its
    // grads were final then: block_grads_done; the rest now, the buckets with parameters outside
    // the blocks), and gives them back.
    for (std::size_t b = 0; b < bucket_plan_.size(); ++b)
      if (!bucket_started_[b]) start_bucket(b);
    comm_.wait_started();
    if (&expert_comm_ != &comm_) expert_comm_.wait_started();
    for (std::size_t b = 0; b < bucket_plan_.size(); ++b) finish_bucket(b);
    return;
  }
  for (int i = 0; i < size(); ++i) {
    Slot& s = slot(i);
    if (!spec(i).trainable || !s.grad.defined()) continue;
    if (place_.sharding == Sharding::zero1) {
      group(i).all_reduce(s.grad);
    } else {
      reduce_scatter_grad(i, ops);  // what no block's backward reduced (outside the blocks)
    }
  }
}

void TrainerParamStore::broadcast_buffers() {
  if (layout_.ranks == 1 || !comm_.moves_data()) return;
  for (int i = 0; i < size(); ++i)
    if (!spec(i).trainable) comm_.broadcast(slot(i).weight, 0);
}

void TrainerParamStore::exit_block(int block) {
  if (block < 0) throw std::invalid_argument(fmt::format("exit_block({})", block));
  if (static_cast<std::size_t>(block) >= block_depth_.size()) return;
  int& depth = block_depth_[static_cast<std::size_t>(block)];
  if (depth == 0) throw std::logic_error(fmt::format("exit_block({}) without enter_block", block));
  if (--depth > 0) return;
  // Freed in stream order: later users of these bytes are queued behind the block's kernels.
  for (int i : block_params_[static_cast<std::size_t>(block)]) slot(i).weight.reset();
}

void TrainerParamStore::begin_step(ZeroGrad zero_grad, Ops& ops) {
  for (auto& s : slots_) {
    if (zero_grad == ZeroGrad::zero && s.grad_part.defined()) ops.fill(s.grad_part, 0.0f);
    if (zero_grad == ZeroGrad::zero && s.grad.defined()) {
      ops.fill(s.grad, 0.0f);
      s.grad_written = true;  // every write of this step adds onto the zeros
    } else {
      s.grad_written = false;
    }
  }
}

void TrainerParamStore::release_grads() {
  for (auto& s : slots_) {
    s.grad.reset();
    s.grad_part.reset();
    s.grad_written = false;
  }
}

std::vector<Tensor*> TrainerParamStore::grads() {
  std::vector<Tensor*> out;
  for (auto& s : slots_)
    if (s.grad_part.defined())
      out.push_back(&s.grad_part);
    else if (s.grad.defined())
      out.push_back(&s.grad);
  return out;
}

bool TrainerParamStore::has_grad(int index) const {
  const Slot& s = slots_.at(static_cast<std::size_t>(index));
  return s.grad.defined() || s.grad_part.defined();
}

Tensor& TrainerParamStore::device_grad(int index) {
  Slot& s = slot(index);
  if (!s.grad.defined())
    throw std::logic_error(fmt::format("'{}' has no gradient", spec(index).name));
  return s.grad;
}

Tensor& TrainerParamStore::update_target(int index) {
  Slot& s = slot(index);
  if (!spec(index).trainable)
    throw std::logic_error(fmt::format("'{}' is a buffer, not updated", spec(index).name));
  if (s.master.defined()) return s.master;
  if (s.host_weight.defined()) return s.host_weight;
  if (place_.sharding == Sharding::zero3) return s.shard;
  if (sharded()) {
    s.target_view = Tensor::view(s.weight, s.offset, s.part);
    return s.target_view;
  }
  return s.weight;
}

Tensor& TrainerParamStore::update_grad(int index) {
  Slot& s = slot(index);
  if (s.grad_part.defined()) return s.grad_part;
  Tensor& g = device_grad(index);
  if (!sharded()) return g;
  s.grad_view = Tensor::view(g, s.offset, s.part);
  return s.grad_view;
}

Tensor& TrainerParamStore::fetch_grad(int index) {
  Slot& s = slot(index);
  const Tensor& g = update_grad(index);  // the rank's part under sharding
  if (!s.host_grad.defined())
    s.host_grad = dev_.empty_pinned(g.shape(), g.dtype(), Category::grads);
  dev_.copy(s.host_grad.data(), g.data(), g.nbytes(), CopyKind::device_to_host,
            StreamKind::compute);
  return s.host_grad;
}

void TrainerParamStore::publish(int index, Ops& device_ops, Ops* host_ops) {
  if (owner_.empty()) return publish_local(index, device_ops, host_ops);
  // torch-zero1: the owner updated it; every rank takes the owner's (zero.py _sync_params:
  // one broadcast per parameter from its rank), the fp32 master too where there is one.
  const int owner = owner_.at(static_cast<std::size_t>(index));
  if (owner == layout_.rank) publish_local(index, device_ops, host_ops);
  Slot& s = slot(index);
  comm_.broadcast(s.weight, owner);
  if (s.master.defined()) comm_.broadcast(s.master, owner);
}

void TrainerParamStore::publish_local(int index, Ops& device_ops, Ops* host_ops) {
  Slot& s = slot(index);
  if (sharded()) {
    // The rank's part is new: cast from the master into the weight's part, then (zero1/2)
    // gather every rank's part into the replicated weight.
    Tensor* weight_part = &s.shard;
    if (place_.sharding != Sharding::zero3) {
      s.target_view = Tensor::view(s.weight, s.offset, s.part);
      weight_part = &s.target_view;
    }
    if (s.master.defined() && s.part > 0) {
      if (!place_.host_update()) {
        device_ops.cast(*weight_part, s.master);
      } else {
        if (host_ops == nullptr) throw std::logic_error("publish: host update without host ops");
        upload_from_host(*weight_part, s.master, *host_ops);  // ZeRO-Offload of the rank's part
      }
    }
    if (place_.sharding != Sharding::zero3)
      group(index).all_gather_in_place(s.weight, even_parts(s.weight.numel(), group(index).size()));
    return;
  }
  if (!place_.host_update()) {
    if (s.master.defined()) device_ops.cast(s.weight, s.master);  // fp32 master -> 16-bit
    return;
  }
  if (host_ops == nullptr) throw std::logic_error("publish: host update without host ops");
  if (place_.stream_params()) {
    if (s.master.defined()) host_ops->cast(s.host_weight, s.master);
    if (!streamed(index)) upload_weight(index);  // resident non-block weight
    return;                                      // block weights are read at the next enter
  }
  upload_from_host(s.weight, s.master, *host_ops);  // offload=optimizer
}

void TrainerParamStore::upload_from_host(Tensor& dst, const Tensor& host, Ops& host_ops) {
  const Tensor* src = &host;
  if (host.dtype() != dst.dtype()) {  // cast on the host first, into pinned staging
    staging_.push_back(dev_.empty_pinned(dst.shape(), dst.dtype(), Category::temporaries));
    host_ops.cast(staging_.back(), host);
    src = &staging_.back();
  }
  dev_.copy(dst.data(), src->data(), dst.nbytes(), CopyKind::host_to_device, StreamKind::compute);
}

void TrainerParamStore::finish_publish() {
  if (staging_.empty()) return;
  dev_.synchronize(StreamKind::compute);
  staging_.clear();
}

std::vector<float> TrainerParamStore::read_f32(const Tensor& t) {
  if (!dev_.holds_data()) throw std::logic_error("read_f32: the device holds no data");
  if (!on_host(t)) return dev_.to_host_f32(t);
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(t.data(), t.dtype(), i);
  return out;
}

std::vector<float> TrainerParamStore::gather_f32(int index, Tensor& part) {
  Tensor full = dev_.empty(spec(index).shape, part.dtype(), Category::temporaries);
  group(index).all_gather(part, full, even_parts(full.numel(), group(index).size()));
  return read_f32(full);
}

std::vector<float> TrainerParamStore::grad_f32(int index) {
  Slot& s = slot(index);
  if (s.grad_part.defined()) return gather_f32(index, s.grad_part);
  if (!s.grad.defined()) return {};
  return read_f32(s.grad);
}

std::vector<float> TrainerParamStore::param_f32(int index) {
  Slot& s = slot(index);
  if (sharded() && spec(index).trainable) {
    if (s.master.defined()) return gather_f32(index, s.master);
    if (place_.sharding == Sharding::zero3) return gather_f32(index, s.shard);
  }
  if (s.master.defined()) return read_f32(s.master);
  if (s.host_weight.defined()) return read_f32(s.host_weight);
  return read_f32(weight(index));
}

}  // namespace memtrade
