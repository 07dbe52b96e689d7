// The NCCL backend of Comm (kernels/comm.h): one GPU per rank, every collective queued on the
// device's compute stream (so it orders with the kernels around it, as torch's
// ProcessGroupNCCL does on its own stream with events). The unique id is made by rank 0 and
// broadcast over MPI, as llm.c does it; host values (losses, times, flags) go over MPI too.
//
// libnccl (218 MB) is opened when a data-parallel CUDA point first needs it (dlopen), not linked:
// every other run, and the GPU check's bundle (64 MiB), goes without it.
#include "kernels/comm.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#ifdef MEMTRADE_HAVE_NCCL
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_device.h"
#endif

namespace memtrade {

#ifdef MEMTRADE_HAVE_NCCL

namespace {

// The NCCL entry points this backend calls (one list: the struct's members and their lookup),
// from the library opened at first use.
// clang-format off
#define MEMTRADE_NCCL_FUNCTIONS(X)                                                          \
  X(ncclGetErrorString) X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank)            \
  X(ncclCommDestroy) X(ncclAllReduce) X(ncclReduce) X(ncclBroadcast) X(ncclSend)            \
  X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd)
// clang-format on

struct Nccl {
#define MEMTRADE_NCCL_MEMBER(name) decltype(&::name) name = nullptr;
  MEMTRADE_NCCL_FUNCTIONS(MEMTRADE_NCCL_MEMBER)
#undef MEMTRADE_NCCL_MEMBER
};

// libnccl.so.2 (LD_LIBRARY_PATH: the CUDA toolkit's, or pip's nvidia-nccl); null if absent or
// missing one of the functions.
const Nccl* nccl_library() {
  static const Nccl* lib = []() -> const Nccl* {
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return nullptr;
    static Nccl n;
    bool ok = true;
#define MEMTRADE_NCCL_LOOKUP(name)                               \
  n.name = reinterpret_cast<decltype(&::name)>(dlsym(h, #name)); \
  ok = ok && n.name != nullptr;
    MEMTRADE_NCCL_FUNCTIONS(MEMTRADE_NCCL_LOOKUP)
#undef MEMTRADE_NCCL_LOOKUP
    return ok ? &n : nullptr;
  }();
  return lib;
}

const Nccl& nccl() {
  const Nccl* n = nccl_library();
  if (n == nullptr)
    throw std::runtime_error(
        "data parallelism on CUDA needs NCCL: libnccl.so.2 was not found (LD_LIBRARY_PATH)");
  return *n;
}

void check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess)
    throw std::runtime_error(fmt::format("NCCL {}: {}", what, nccl().ncclGetErrorString(rc)));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I32:
      return ncclInt32;
  }
  return ncclFloat32;
}

char* at(const Tensor& t, std::int64_t offset) {
  return static_cast<char*>(const_cast<void*>(t.data())) +
         static_cast<std::size_t>(offset) * dtype_size(t.dtype());
}

class NcclComm final : public Comm {
 public:
  // Over the ranks of `host` (MPI: the world, or a group split from it): rank 0 of the group
  // makes the unique id and every rank reads it from a host gather, so a group needs no MPI
  // handle of its own (tensor and data parallelism's groups are separate communicators).
  NcclComm(Device& dev, std::unique_ptr<Comm> host)
      : dev_(dev), host_(std::move(host)), stream_(cuda::raw_stream(dev, StreamKind::compute)) {
    constexpr std::size_t kWords = (sizeof(ncclUniqueId) + 7) / 8;
    std::vector<std::int64_t> mine(kWords, 0);
    if (host_->rank() == 0) {
      ncclUniqueId id;
      check(nccl().ncclGetUniqueId(&id), "get_unique_id");
      std::memcpy(mine.data(), &id, sizeof(id));
    }
    const std::vector<std::int64_t> all = host_->all_gather_host(mine);  // rank 0's first
    ncclUniqueId id;
    std::memcpy(&id, all.data(), sizeof(id));
    check(nccl().ncclCommInitRank(&comm_, host_->size(), id, host_->rank()), "comm_init_rank");
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  std::unique_ptr<Comm> split(int color, int key) override {
    return std::make_unique<NcclComm>(dev_, host_->split(color, key));
  }
  ~NcclComm() override {
    if (overlap_stream_ != nullptr) {
      cudaStreamSynchronize(overlap_stream_);
      cudaEventDestroy(ready_);
      cudaEventDestroy(done_);
      cudaStreamDestroy(overlap_stream_);
    }
    nccl().ncclCommDestroy(comm_);
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  CommBackend backend() const override { return CommBackend::nccl; }
  std::string name() const override {
    return fmt::format("nccl {} ({} ranks; ids over {})", nccl_library_version(), size(),
                       mpi_library_version());
  }

  void all_reduce(Tensor& t) override {
    check(nccl().ncclAllReduce(t.data(), t.data(), static_cast<std::size_t>(t.numel()),
                               nccl_type(t.dtype()), ncclSum, comm_, stream_),
          "all_reduce");
  }
  // Uneven parts: one rooted reduce per part in a group (ncclReduceScatter takes equal parts).
  void reduce_scatter(const Tensor& full, Tensor& part,
                      std::span<const std::int64_t> counts) override {
    check(nccl().ncclGroupStart(), "group_start");
    std::int64_t off = 0;
    for (int r = 0; r < size(); ++r) {
      const auto n = static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
      check(nccl().ncclReduce(at(full, off), r == rank() ? part.data() : nullptr, n,
                              nccl_type(full.dtype()), ncclSum, r, comm_, stream_),
            "reduce");
      off += static_cast<std::int64_t>(n);
    }
    check(nccl().ncclGroupEnd(), "group_end");
  }
  void all_gather(const Tensor& part, Tensor& full, std::span<const std::int64_t> counts) override {
    gather(part.data(), full, counts);
  }
  void all_gather_in_place(Tensor& full, std::span<const std::int64_t> counts) override {
    gather(at(full, part_offset(counts, rank())), full, counts);
  }
  void broadcast(Tensor& t, int root) override {
    check(nccl().ncclBroadcast(t.data(), t.data(), static_cast<std::size_t>(t.numel()),
                               nccl_type(t.dtype()), root, comm_, stream_),
          "broadcast");
  }
  void all_to_all(const Tensor& in, std::span<const std::int64_t> send, Tensor& out,
                  std::span<const std::int64_t> recv) override {
    check(nccl().ncclGroupStart(), "group_start");
    std::int64_t so = 0, ro = 0;
    for (int r = 0; r < size(); ++r) {
      const auto s = static_cast<std::size_t>(send[static_cast<std::size_t>(r)]);
      const auto n = static_cast<std::size_t>(recv[static_cast<std::size_t>(r)]);
      if (s > 0)
        check(nccl().ncclSend(at(in, so), s, nccl_type(in.dtype()), r, comm_, stream_), "send");
      if (n > 0)
        check(nccl().ncclRecv(at(out, ro), n, nccl_type(out.dtype()), r, comm_, stream_), "recv");
      so += static_cast<std::int64_t>(s);
      ro += static_cast<std::int64_t>(n);
    }
    check(nccl().ncclGroupEnd(), "group_end");
  }
  void barrier() override {
    cudaStreamSynchronize(stream_);
    host_->barrier();
  }
  // On a stream of its own (torch's ProcessGroupNCCL: a stream per device, ordered after the
  // compute stream's work by an event, and the compute stream after it by another).
  void start_all_reduce(Tensor& t) override {
    if (overlap_stream_ == nullptr) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&overlap_stream_, cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventRecord(ready_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(overlap_stream_, ready_, 0));
    check(nccl().ncclAllReduce(t.data(), t.data(), static_cast<std::size_t>(t.numel()),
                               nccl_type(t.dtype()), ncclSum, comm_, overlap_stream_),
          "all_reduce");
    started_ = true;
  }
  void wait_started() override {
    if (!started_) return;
    CUDA_CHECK(cudaEventRecord(done_, overlap_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, done_, 0));
    started_ = false;
  }
  double all_reduce_sum(double v) override { return host_->all_reduce_sum(v); }
  double all_reduce_max(double v) override { return host_->all_reduce_max(v); }
  std::vector<std::int64_t> all_gather_host(std::span<const std::int64_t> mine) override {
    return host_->all_gather_host(mine);
  }

 private:
  // Uneven parts: one broadcast per part in a group (ncclAllGather takes equal parts).
  void gather(const void* mine, Tensor& full, std::span<const std::int64_t> counts) {
    check(nccl().ncclGroupStart(), "group_start");
    std::int64_t off = 0;
    for (int r = 0; r < size(); ++r) {
      const auto n = static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
      check(nccl().ncclBroadcast(r == rank() ? mine : nullptr, at(full, off), n,
                                 nccl_type(full.dtype()), r, comm_, stream_),
            "broadcast");
      off += static_cast<std::int64_t>(n);
    }
    check(nccl().ncclGroupEnd(), "group_end");
  }

  Device& dev_;
  std::unique_ptr<Comm> host_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  // start_all_reduce's stream and events, made on first use; started_: some wait is owed.
  cudaStream_t overlap_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool started_ = false;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Device& device) {
  if (device.backend() != Backend::cuda) throw std::runtime_error("NCCL needs a CUDA device");
  return std::make_unique<NcclComm>(device, make_mpi_comm());
}

std::string nccl_library_version() {
  const Nccl* n = nccl_library();
  if (n == nullptr) return "not found (libnccl.so.2, opened at first use)";
  int v = 0;
  n->ncclGetVersion(&v);
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

#endif

}  // namespace memtrade
