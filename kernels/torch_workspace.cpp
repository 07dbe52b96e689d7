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

EmbeddingSortBuffers embedding_sort_buffers(std::int64_t n, std::int64_t v, std::int64_t c) {
  EmbeddingSortBuffers b;
  if (n <= kEmbeddingSortThreshold) return b;
  const std::int64_t segments = n < v ? n : v;
  const std::int64_t partial_segments = n / 10 + segments;
  b.index = n * 8;
  b.range = n * 8;
  b.sort_alt = 2 * n * 8;
  b.segment_offsets = n * 8;
  b.scalar = 8;
  b.partials = segments * 8;
  b.partial_offsets = partial_segments * 8;
  b.partial_sums = partial_segments * c * 4;
  // Live during the sort (modelled) against the op's end; cub's storage left out at most
  // 16 KiB of bins, 4 B a key of look-back (tiles of at least 256 keys), 2 KiB of counters and
  // alignment; each buffer's rounding to 512 B at most 512 B more.
  const std::int64_t sort = 2 * b.index + b.range + b.sort_alt + 4 * 512;
  const std::int64_t end_of_op = 2 * b.index + b.segment_offsets + 2 * b.scalar + 2 * b.partials +
                                 b.partial_offsets + b.partial_sums;
  const std::int64_t tiles = 16 * 1024 + 4 * n + 2 * 1024;
  b.cub_tiles_bound = sort + tiles > end_of_op ? sort + tiles - end_of_op : 0;
  return b;
}

}  // namespace memtrade
