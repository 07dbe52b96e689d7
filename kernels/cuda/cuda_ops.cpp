// CudaOps' lifetime, its persistent workspace and the dtype scratch helpers.
#include <fmt/format.h>

#include "kernels/cuda/cuda_ops.h"

namespace memtrade::cuda {

AsDType::AsDType(const Tensor& t, DType want, CachingAllocator& alloc, cudaStream_t stream) {
  if (t.dtype() == want) {
    p_ = t.data();
    return;
  }
  scratch_ = Tensor(alloc, t.shape(), want, Category::workspace);
  launch_cast(scratch_.data(), want, t.data(), t.dtype(), t.numel(), stream);
  p_ = scratch_.data();
}

AsDTypeOut::AsDTypeOut(Tensor& t, DType want, bool load_existing, cudaStream_t stream)
    : t_(t), stream_(stream) {
  if (t.dtype() == want) {
    p_ = t.data();
    return;
  }
  scratch_ = Tensor(*t.allocator(), t.shape(), want, Category::workspace);
  p_ = scratch_.data();
  if (load_existing) launch_cast(p_, want, t.data(), t.dtype(), t.numel(), stream_);
}

void AsDTypeOut::commit() {
  if (scratch_.defined())
    launch_cast(t_.data(), t_.dtype(), scratch_.data(), scratch_.dtype(), t_.numel(), stream_);
}

CudaOps::CudaOps(CachingAllocator& device_memory, cudaStream_t stream)
    : memory_(device_memory), stream_(stream), lt_(LtHandle::create()) {}

CudaOps::~CudaOps() {
  // Work still queued may use the workspace; let it finish before the block goes back.
  CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream_));
}

void* CudaOps::lt_workspace() {
  if (!workspace_.defined()) {
    // Allocated on first use, so that a run without GEMMs or reductions never holds it.
    const auto words = static_cast<std::int64_t>((kLtWorkspaceBytes + kSmallScratchBytes) / 4);
    workspace_ = Tensor(memory_, {words}, DType::I32, Category::workspace);
  }
  return workspace_.data();
}

void* CudaOps::small_scratch() {
  return static_cast<unsigned char*>(lt_workspace()) + kLtWorkspaceBytes;
}

cudnnHandle_t CudaOps::cudnn() {
  if (!cudnn_.get()) cudnn_ = CudnnHandle::create(stream_);
  return cudnn_.get();
}

}  // namespace memtrade::cuda
