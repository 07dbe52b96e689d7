// Device-side building blocks shared by the CUDA op files (.cu only): fp32 conversions of the
// storage types, runtime dtype dispatch onto templates, runtime-typed pointers for small
// secondary arguments, warp/block reductions and launch geometry.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace memtrade::cuda {

using bf16 = __nv_bfloat16;
using half = __half;

// ---- fp32 <-> storage ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ float to_f(T v);
template <>
__device__ __forceinline__ float to_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f<half>(half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_f<bf16>(bf16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ half from_f<half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float v) {
  return __float2bfloat16_rn(v);
}

// A float tensor whose dtype is only known at run time: for small secondary arguments (weights
// of a norm, per-channel vectors, optimizer state) where one uniform branch per load is cheaper
// than another template dimension.
struct AnyIn {
  const void* p;
  DType t;
  __device__ __forceinline__ float operator[](std::int64_t i) const {
    switch (t) {
      case DType::F16:
        return __half2float(static_cast<const half*>(p)[i]);
      case DType::BF16:
        return __bfloat162float(static_cast<const bf16*>(p)[i]);
      default:
        return static_cast<const float*>(p)[i];
    }
  }
};
struct AnyOut {
  void* p;
  DType t;
  __device__ __forceinline__ float load(std::int64_t i) const { return AnyIn{p, t}[i]; }
  __device__ __forceinline__ void store(std::int64_t i, float v) const {
    switch (t) {
      case DType::F16:
        static_cast<half*>(p)[i] = __float2half_rn(v);
        break;
      case DType::BF16:
        static_cast<bf16*>(p)[i] = __float2bfloat16_rn(v);
        break;
      default:
        static_cast<float*>(p)[i] = v;
        break;
    }
  }
};

// ---- runtime dtype -> template ------------------------------------------------------------------
// f(T{}) with T the storage type of a float dtype; throws for I32.
template <typename F>
void dispatch_float(DType t, std::string_view what, F&& f) {
  switch (t) {
    case DType::F32:
      f(float{});
      return;
    case DType::F16:
      f(half{});
      return;
    case DType::BF16:
      f(bf16{});
      return;
    case DType::I32:
      break;
  }
  throw std::invalid_argument(std::string(what) + ": expected a float dtype (f32, f16, bf16)");
}

// ---- reductions ---------------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `shared` holds 32 values; the trailing barrier makes back-to-back calls safe.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  T r = lane < warps ? shared[lane] : T(0);
  r = warp_sum(r);
  __syncthreads();
  return r;
}

// ---- launch geometry ----------------------------------------------------------------------------
inline constexpr int kThreads = 256;
// Blocks for a grid-stride loop over n items (at least 1, capped: the loop covers the rest).
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  std::int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > (1 << 20)) blocks = 1 << 20;
  return static_cast<unsigned>(blocks);
}
// Blocks for one warp per row, kThreads / 32 rows per block.
inline unsigned grid_for_rows(std::int64_t rows) {
  constexpr int per_block = kThreads / 32;
  std::int64_t blocks = (rows + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > (1 << 20)) blocks = 1 << 20;  // kernels loop over rows with a grid stride
  return static_cast<unsigned>(blocks);
}

}  // namespace memtrade::cuda
