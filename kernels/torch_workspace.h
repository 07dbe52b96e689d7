// PyTorch's CUDA workspaces: what the memory model allocates for a CUDA target (--backend cuda,
// kernels/cpu/cpu_dry_run_ops.cpp) where PyTorch's CUDA path allocates it, sized per device
// generation. Declared without CUDA headers: the model runs on machines without CUDA.
//
// Sources, pytorch/pytorch as stored by the reference library (main, 2025; commits named):
//   aten/src/ATen/cuda/CublasHandlePool.cpp (26a39059): parseChosenWorkspaceSize,
//     getCUDABlasLtWorkspaceSize, setWorkspaceForHandle, getCUDABlasLtWorkspace,
//     getCurrentCUDABlasHandle
//   aten/src/ATen/cuda/CUDABlas.cpp (bd53dc4f): CublasLtWorkspace (the Lt matmuls' workspace)
//   aten/src/ATen/native/cuda/Embedding.cu (1c94016e): embedding_dense_backward_cuda
//   aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu (01b9dc56, and the current one:
//     max_segments = min(numel, num_weights)): embedding_backward_cuda_kernel
//   aten/src/ATen/native/cudnn/Conv_v8.cpp (00725399): run_conv_plan
// memtrade's own CUDA backend keeps one block of its own instead (kernels/cuda_workspace.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/gpu_specs.h"

namespace memtrade {

struct ComputeCapability {
  int major = 9, minor = 0;
};
// The table's cards by generation: A100 sm80, L4/L40S/RTX 4090 sm89, H100/H200 sm90, B200 sm100.
ComputeCapability compute_capability(GpuArch arch);
// Without --gpu the target is sm90 (H100, H200): the card memtrade's GPU figures are for.
inline constexpr ComputeCapability kDefaultCudaTarget{9, 0};

// cuBLAS's workspace, one per (cuBLAS handle, stream) pair, from the caching allocator on the
// handle's first use (getCurrentCUDABlasHandle -> setWorkspaceForHandle) and kept. Handles are
// per host thread (a thread-local pool window), and autograd runs a CUDA backward on its own
// device thread (torch/csrc/autograd/engine.cpp Engine::thread_init, Note [Allocating GPUs to
// autograd threads]: a thread per CUDA device), so training holds two: the main thread's
// (forward, optimizer) and the autograd thread's (backward, checkpoint recomputation). With
// CUBLAS_WORKSPACE_CONFIG unset: ":4096:2:16:8" = 4096 KiB·2 + 16 KiB·8 = 8,519,680 B, and
// 4096 KiB·8 = 32 MiB on sm90 exactly (parseChosenWorkspaceSize: major == 9 && minor == 0).
std::size_t cublas_workspace_bytes(ComputeCapability cc);
// cuBLASLt's, its own per (handle, stream) pair unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=1
// (getCUDABlasLtWorkspace): CUBLASLT_WORKSPACE_SIZE unset, 1024 KiB, at most cuBLAS's
// (getCUDABlasLtWorkspaceSize). Taken by the Lt matmuls, i.e. by default addmm with a 1-D bias
// (nn.Linear with a bias: gemm_and_bias), after the handle's cuBLAS workspace; plain mm and bmm
// run on cuBLAS.
std::size_t cublaslt_workspace_bytes(ComputeCapability cc);

// embedding_dense_backward_cuda sorts the indices when there are more than this many (with
// scale_grad_by_freq off); up to it one kernel writes the gradient, with no scratch.
inline constexpr std::int64_t kEmbeddingSortThreshold = 3072;

// The sort path's buffers for n indices (int64: nn.Embedding takes LongTensor ids) into a table of
// v rows of c elements, in allocation order; all freed before the op returns. Zero for
// n <= kEmbeddingSortThreshold. EmbeddingBackwardKernel.cu is the current one, which sizes the
// per-segment buffers by s = min(n, v) segments and p = n/10 + s partial segments
// (NROWS_PER_THREAD = 10) without reading the data; the revision named above sized them n.
struct EmbeddingSortBuffers {
  // embedding_dense_backward_cuda: sorted_indices and orig_indices, kept to the end.
  std::int64_t index = 0;  // each: n·8
  // During the sort only: `range` (arange(n)) and cub's SortPairs temporary storage, of which
  // this counts the alternate keys and values (not overwrite-okay, 64-bit keys, 8 passes) and
  // leaves out the bins, look-back tiles and counters (cub_tiles_bound).
  std::int64_t range = 0;     // n·8
  std::int64_t sort_alt = 0;  // 2·n·8
  // embedding_backward_cuda_kernel: segment_offsets (n), num_of_segments, partials_per_segment and
  // partials_per_segment_offset (s each), num_of_partial_segments, partial_segment_offset (p),
  // all int64, and grad_weight_per_segment (p, c) in acc_type: fp32 for fp32, fp16 and bf16.
  std::int64_t segment_offsets = 0;  // n·8
  std::int64_t scalar = 0;           // each of the two: 8
  std::int64_t partials = 0;         // each of the two: s·8
  std::int64_t partial_offsets = 0;  // p·8
  std::int64_t partial_sums = 0;     // p·c·4
  // How far cub's storage left out here (radix-sort bins 8·256·8 B, look-back tiles at most 4 B
  // a key, counters, 256 B alignment; unique_by_key's and exclusive_sum's tile state, live at
  // lower points of the op) can lift the op's peak above the modelled one: 0 unless the sort's
  // 40n B come near the buffers of the op's end.
  std::int64_t cub_tiles_bound = 0;
};
EmbeddingSortBuffers embedding_sort_buffers(std::int64_t n, std::int64_t v, std::int64_t c);

// The memory model's ops (kernels/cpu/cpu_ops.h) for a CUDA target of generation `cc`.
class Ops;
class StepClock;
enum class Backend : std::uint8_t;
std::unique_ptr<Ops> make_dry_run_ops(Backend target, StepClock* clock, bool host,
                                      ComputeCapability cc);
// What the dry-run ops `ops` (make_dry_run_ops) took of PyTorch's CUDA workspaces: the named
// blocks live at their allocator's peak (rounded bytes, allocation order; together the
// peak's Category::workspace), and what they could not size: how many convolutions ran (cuDNN
// workspace) and embedding sorts, with the largest cub_tiles_bound among them. Empty for a CPU
// target.
struct DryRunWorkspace {
  std::vector<std::pair<std::string, std::int64_t>> at_peak;
  std::int64_t convolutions = 0;
  std::int64_t embedding_sorts = 0;
  std::int64_t embedding_cub_bound = 0;
};
DryRunWorkspace dry_run_workspace(Ops& ops);

}  // namespace memtrade
