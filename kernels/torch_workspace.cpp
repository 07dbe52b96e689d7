#include "kernels/torch_workspace.h"

#include "kernels/allocator.h"

namespace memtrade {

ComputeCapability compute_capability(GpuArch arch) {
  switch (arch) {
    case GpuArch::ampere:
      return {8, 0};  // the table's Ampere rows are A100s
    case GpuArch::ada:
      return {8, 9};
    case GpuArch::hopper:
      return {9, 0};
    case GpuArch::blackwell:
      return {10, 0};  // B200
  }
  return kDefaultCudaTarget;
}

std::size_t cublas_workspace_bytes(ComputeCapability cc) {
  const bool sm90 = cc.major == 9 && cc.minor == 0;
  return sm90 ? 4096 * 8 * KiB : 4096 * KiB * 2 + 16 * KiB * 8;
}

std::size_t cublaslt_workspace_bytes(ComputeCapability cc) {
  const std::size_t lt = 1024 * KiB;
  const std::size_t cublas = cublas_workspace_bytes(cc);
  return lt < cublas ? lt : cublas;
}

EmbeddingSortBuffers embedding_sort_buffers(std::int64_t n, std::int64_t c) {
  EmbeddingSortBuffers b;
  if (n <= kEmbeddingSortThreshold) return b;
  b.index = n * 8;
  b.range = n * 8;
  b.sort_alt = 2 * n * 8;
  b.segment = n * 8;
  b.scalar = 8;
  b.partial_sums = n * c * 4;
  return b;
}

}  // namespace memtrade
