#include "kernels/comm.h"
#include "kernels/op_cost.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {

Part even_part(std::int64_t numel, int ranks, int rank) {
  if (ranks < 1) throw std::invalid_argument(fmt::format("even_parts: {} ranks", ranks));
  const std::int64_t per = (numel + ranks - 1) / ranks;
  const std::int64_t offset = std::min(numel, per * rank);
  return Part{offset, std::min(per, numel - offset)};
}

std::vector<std::int64_t> even_parts(std::int64_t numel, int ranks) {
  if (ranks < 1) throw std::invalid_argument(fmt::format("even_parts: {} ranks", ranks));
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) out.push_back(even_part(numel, ranks, r).count);
  return out;
}

std::int64_t part_offset(std::span<const std::int64_t> counts, int rank) {
  std::int64_t off = 0;
  for (int r = 0; r < rank; ++r) off += counts[static_cast<std::size_t>(r)];
  return off;
}

namespace {

// Self and meta: nothing crosses ranks. Self is rank 0 of 1, where every collective is the
// identity (a reduce-scatter or gather copies between its two tensors); meta is rank r of N,
// whose tensors hold no bytes, so there is nothing to copy.
class LocalComm final : public Comm {
 public:
  LocalComm(int rank, int size, bool meta, TimedGroup timed = {})
      : rank_(rank), size_(size), meta_(meta), timed_(timed) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommBackend backend() const override { return meta_ ? CommBackend::meta : CommBackend::self; }
  std::string name() const override {
    return meta_ ? fmt::format("meta (rank {} of {}, no data)", rank_, size_) : "self (1 rank)";
  }
  bool moves_data() const override { return !meta_; }

  void all_reduce(Tensor& t) override { charge(CollectiveKind::all_reduce, t); }
  void start_all_reduce(Tensor& t) override { started(CollectiveKind::all_reduce, t); }
  void wait_started() override {
    if (timed_.clock) timed_.clock->wait_collectives();
  }
  void reduce_scatter(const Tensor& full, Tensor& part,
                      std::span<const std::int64_t> counts) override {
    check(counts);
    // FSDP / ZeRO-2's gradient reduce-scatter: overlapped with the rest of backward.
    started(CollectiveKind::reduce_scatter, full);
    if (!meta_) copy_bytes(part.data(), full.data(), part.nbytes());
  }
  void all_gather(const Tensor& part, Tensor& full, std::span<const std::int64_t> counts) override {
    check(counts);
    // ZeRO-3 / FSDP's gather of a unit's weights: prefetched one unit ahead.
    prefetched(CollectiveKind::all_gather, full);
    if (!meta_) copy_bytes(full.data(), part.data(), part.nbytes());
  }
  void all_gather_in_place(Tensor& full, std::span<const std::int64_t> counts) override {
    check(counts);
    // ZeRO-3 / FSDP's gather of a unit's weights: prefetched one unit ahead.
    prefetched(CollectiveKind::all_gather, full);
  }
  void broadcast(Tensor& t, int) override { charge(CollectiveKind::broadcast, t); }
  void all_to_all(const Tensor& in, std::span<const std::int64_t> send, Tensor& out,
                  std::span<const std::int64_t> recv) override {
    check(send);
    check(recv);
    charge(CollectiveKind::all_to_all, in);
    if (!meta_)
      copy_bytes(out.data(), in.data(), static_cast<std::size_t>(send[0]) * dtype_size(in.dtype()));
  }
  void barrier() override {}
  std::unique_ptr<Comm> split(int, int) override {
    if (meta_)
      throw std::logic_error("a meta comm cannot split: make its groups with make_meta_comm");
    return std::make_unique<LocalComm>(0, 1, false);
  }
  double all_reduce_sum(double v) override { return v; }
  double all_reduce_max(double v) override { return v; }
  std::vector<std::int64_t> all_gather_host(std::span<const std::int64_t> mine) override {
    std::vector<std::int64_t> out;
    for (int r = 0; r < size_; ++r) out.insert(out.end(), mine.begin(), mine.end());
    return out;
  }

 private:
  void check(std::span<const std::int64_t> counts) const {
    if (static_cast<int>(counts.size()) != size_)
      throw std::invalid_argument(
          fmt::format("collective with {} counts on {} ranks", counts.size(), size_));
  }
  // Self's tensors are on the host (CPU backend: dp 1 never calls these on CUDA).
  static void copy_bytes(void* dst, const void* src, std::size_t n) {
    if (dst != src && n > 0) std::copy_n(static_cast<const char*>(src), n, static_cast<char*>(dst));
  }
  static double bytes(const Tensor& t) { return static_cast<double>(t.nbytes()); }
  void charge(CollectiveKind kind, const Tensor& t) {
    if (timed_.clock) timed_.clock->collective(kind, bytes(t), size_, timed_.span);
  }
  // Data parallelism's started and prefetched collectives; a tensor-parallel group's are in line.
  void started(CollectiveKind kind, const Tensor& full) {
    if (timed_.in_line) return charge(kind, full);
    if (timed_.clock) timed_.clock->start_collective(kind, bytes(full), size_, timed_.span);
  }
  void prefetched(CollectiveKind kind, const Tensor& full) {
    if (timed_.in_line) return charge(kind, full);
    if (timed_.clock) timed_.clock->prefetched_collective(kind, bytes(full), size_, timed_.span);
  }
  int rank_, size_;
  bool meta_;
  TimedGroup timed_;  // the meta device's time model, where it keeps one (timed_.clock)
};

}  // namespace

std::unique_ptr<Comm> make_self_comm() {
  return std::make_unique<LocalComm>(0, 1, false);
}

Comm& self_comm() {
  static LocalComm one(0, 1, false);
  return one;
}

std::unique_ptr<Comm> make_meta_comm(int rank, int size, const TimedGroup& group) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument(fmt::format("meta comm: rank {} of {}", rank, size));
  return std::make_unique<LocalComm>(rank, size, true, group);
}

std::unique_ptr<Comm> make_meta_comm(int rank, int size, StepClock* clock) {
  return make_meta_comm(rank, size, TimedGroup{clock});
}

std::unique_ptr<Comm> make_comm(Device& device, int world) {
  if (!device.holds_data()) return make_meta_comm(device.meta_rank(), world, device.step_clock());
  if (world == 1) return make_self_comm();
  std::unique_ptr<Comm> c =
      device.backend() == Backend::cuda ? make_nccl_comm(device) : make_mpi_comm();
  if (c->size() != world)
    throw std::runtime_error(fmt::format(
        "data parallel over {} ranks, but this process is one of {} (launch with {} ranks)", world,
        c->size(), world));
  return c;
}

}  // namespace memtrade

#ifndef MEMTRADE_HAVE_NCCL
namespace memtrade {
std::unique_ptr<Comm> make_nccl_comm(Device&) {
  throw std::runtime_error(
      "data parallelism on CUDA needs NCCL and MPI, and this memtrade was built without them");
}
std::string nccl_library_version() {
  return "not built";
}
}  // namespace memtrade
#endif
