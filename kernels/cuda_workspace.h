// memtrade's CUDA backend's persistent workspace. The memory model's CUDA target takes PyTorch's
// workspaces instead (kernels/torch_workspace.h); a memtrade CUDA run holds this block instead.
#pragma once

#include <cstddef>

#include "kernels/allocator.h"

namespace memtrade {

// One block (Category::workspace), taken on the first GEMM or device reduction and kept for the
// ops' lifetime: cuBLASLt's workspace, then the small scratch of reductions and the inf/nan flag.
inline constexpr std::size_t kCudaLtWorkspaceBytes = 32 * MiB;
inline constexpr std::size_t kCudaSmallScratchBytes = 64 * KiB;

}  // namespace memtrade
