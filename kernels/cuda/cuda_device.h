// CUDA-only extras of the CUDA device for code that needs more than the Device interface: the
// raw streams (for own kernels or library calls) and the TF32 switch of the `tf32` precision.
// Include only in CUDA builds (`#ifdef MEMTRADE_HAVE_CUDA`); everything else goes through
// kernels/device.h and kernels/cuda_probe.h.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/device.h"

namespace memtrade::cuda {

// The cudaStream_t behind `kind` of a device made by make_cuda_device (both streams are
// created with cudaStreamNonBlocking). Throws std::invalid_argument for another backend.
cudaStream_t raw_stream(Device& device, StreamKind kind);

// TF32 tensor cores for the fp32 GEMMs and convolutions of `device`'s ops (off by default).
// Throws std::invalid_argument for another backend.
void set_tf32(Device& device, bool on);

}  // namespace memtrade::cuda
