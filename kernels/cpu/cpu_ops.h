// CPU implementation of Ops: fp32 arithmetic over F32/F16/BF16 storage, OpenBLAS for GEMMs
// (a blocked fallback where OpenBLAS is absent), OpenMP across cores for everything else.
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace memtrade {

std::unique_ptr<Ops> make_cpu_ops();

}  // namespace memtrade
