// CPU implementation of Ops: fp32 arithmetic over F32/F16/BF16 storage, OpenBLAS for GEMMs
// (a blocked fallback where OpenBLAS is absent), OpenMP across cores for everything else.
#pragma once

#include <memory>

#include "kernels/device.h"
#include "kernels/ops.h"

namespace memtrade {

std::unique_ptr<Ops> make_cpu_ops();

}  // namespace memtrade

namespace memtrade {

// The same scratch allocations as make_cpu_ops()'s ops, without arithmetic or memory access:
// what the memory model (harness/run/estimate.cpp) runs a step with. For Backend::cuda, the
// backend-neutral scratch (Category::temporaries, equal on both backends) plus PyTorch's CUDA
// workspaces instead of the CPU's workspace, sized for sm90 (kernels/torch_workspace.h, which
// also has the overload for another generation and what the dry run saw: dry_run_workspace).
// With a `clock` (kernels/op_cost.h) every op also charges its cost to it: a device op to the
// compute stream, or, with `host`, the host's ops of the offload modes to the host.
class StepClock;
std::unique_ptr<Ops> make_dry_run_ops(Backend target, StepClock* clock = nullptr,
                                      bool host = false);

}  // namespace memtrade
