// Flash attention on CUDA: the kernels of kernels/cuda/flash_attention_block.h (where the
// algorithm, the tiling and the shared-memory layout are described) bound to the GPU: a phase is
// one call per thread followed by __syncthreads(); elements are read and written in their own
// dtype through AnyIn/AnyOut. Scratch (kernels/ops.h): backward's D (B, NH, T) F32,
// Category::temporaries, as on the CPU; the tiles are shared memory; no workspace.
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

#define MEMTRADE_FLASH_FN __device__ __forceinline__
#include "kernels/cuda/flash_attention_block.h"

namespace memtrade::cuda {
namespace {

struct DeviceMem {
  __device__ static float load(const void* p, DType t, std::int64_t i) { return AnyIn{p, t}[i]; }
  __device__ static void store(void* p, DType t, std::int64_t i, float v) {
    AnyOut{p, t}.store(i, v);
  }
};

struct DeviceExec {
  template <typename F>
  __device__ void operator()(F&& phase) {
    phase(static_cast<int>(threadIdx.x));
    __syncthreads();
  }
};

// Grids: x = tiles, y = heads, z = sequences. The query-tile kernels take the last (longest:
// they see the most keys) tiles first; the key-tile kernel the first (they see the most
// queries).
template <int HD>
__global__ void __launch_bounds__(flash::kThreads) flash_fwd_kernel(flash::ForwardArgs a) {
  extern __shared__ float smem[];
  DeviceExec ex;
  flash::forward_block<HD, DeviceMem>(ex, smem, a, gridDim.x - 1 - blockIdx.x, blockIdx.y,
                                      blockIdx.z);
}

template <int HD>
__global__ void __launch_bounds__(flash::kThreads) flash_bwd_kv_kernel(flash::BackwardArgs a) {
  extern __shared__ float smem[];
  DeviceExec ex;
  flash::backward_kv_block<HD, DeviceMem>(ex, smem, a, blockIdx.x, blockIdx.y, blockIdx.z);
}

template <int HD>
__global__ void __launch_bounds__(flash::kThreads) flash_bwd_q_kernel(flash::BackwardArgs a) {
  extern __shared__ float smem[];
  DeviceExec ex;
  flash::backward_q_block<HD, DeviceMem>(ex, smem, a, gridDim.x - 1 - blockIdx.x, blockIdx.y,
                                         blockIdx.z);
}

__global__ void flash_dsum_kernel(flash::BackwardArgs a, std::int64_t rows) {
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    flash::dsum_row<DeviceMem>(a, r);
}

// Launches kernel over (tiles, heads, B) with `floats` of dynamic shared memory (over the
// default 48 KiB: opted in per kernel).
template <typename Args>
void launch(void (*kernel)(Args), const Args& a, std::int64_t tiles, std::int64_t heads,
            std::int64_t batch, int floats, cudaStream_t s) {
  const auto bytes = static_cast<int>(floats * sizeof(float));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(heads),
                  static_cast<unsigned>(batch));
  kernel<<<grid, flash::kThreads, static_cast<std::size_t>(bytes), s>>>(a);
  CUDA_CHECK_LAUNCH();
}

// f(std::integral_constant<int, HD>{}) for hd's bucket.
template <typename F>
void dispatch_head_dim(std::int64_t hd, F&& f) {
  switch (flash::head_dim_bucket(hd)) {
    case 32:
      f(std::integral_constant<int, 32>{});
      return;
    case 64:
      f(std::integral_constant<int, 64>{});
      return;
    case 128:
      f(std::integral_constant<int, 128>{});
      return;
    default:
      f(std::integral_constant<int, 256>{});
      return;
  }
}

flash::Dims device_dims(const AttentionDims& d) {
  return {d.b, d.t, d.nh, d.nkv, d.hd, 1.0f / std::sqrt(static_cast<float>(d.hd))};
}

std::int64_t tiles_of(const AttentionDims& d, int rows) {
  return (d.t + rows - 1) / rows;
}

// Grid y and z are limited to 65535.
void check_grid(std::string_view op, const AttentionDims& d) {
  if (d.b > 65535 || d.nh > 65535)
    fail(op, "batch " + std::to_string(d.b) + " and n_head " + std::to_string(d.nh) +
                 " must be <= 65535 (CUDA grid)");
}

}  // namespace

void CudaOps::flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head,
                                      int n_kv_head) {
  NvtxRange range("flash_attention_forward");
  const AttentionDims d = check_flash_attention_forward(out, lse, qkv, n_head, n_kv_head);
  check_grid("flash_attention_forward", d);
  if (d.b == 0 || d.t == 0) return;
  const flash::ForwardArgs a{device_dims(d), qkv.data(),  qkv.dtype(),
                             out.data(),     out.dtype(), lse.as<float>()};
  dispatch_head_dim(d.hd, [&](auto hd) {
    using L = flash::Layout<decltype(hd)::value>;
    launch(flash_fwd_kernel<decltype(hd)::value>, a, tiles_of(d, L::R), d.nh, d.b, L::kForward,
           stream_);
  });
}

void CudaOps::flash_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                       const Tensor& out, const Tensor& lse, int n_head,
                                       int n_kv_head) {
  NvtxRange range("flash_attention_backward");
  const AttentionDims d =
      check_flash_attention_backward(dqkv, dout, qkv, out, lse, n_head, n_kv_head);
  check_grid("flash_attention_backward", d);
  if (d.b == 0 || d.t == 0) return;
  Tensor dsum(*dqkv.allocator(), {d.b, d.nh, d.t}, DType::F32, Category::temporaries);  // D
  const flash::BackwardArgs a{device_dims(d),   qkv.data(),  qkv.dtype(),  out.data(),
                              out.dtype(),      dout.data(), dout.dtype(), lse.as<float>(),
                              dsum.as<float>(), dqkv.data(), dqkv.dtype()};
  const std::int64_t rows = d.b * d.nh * d.t;
  flash_dsum_kernel<<<grid_for(rows), kThreads, 0, stream_>>>(a, rows);
  CUDA_CHECK_LAUNCH();
  dispatch_head_dim(d.hd, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    using L = flash::Layout<HD>;
    const std::int64_t tiles = tiles_of(d, L::R);
    launch(flash_bwd_kv_kernel<HD>, a, tiles, d.nkv, d.b, L::kBackwardKv, stream_);
    launch(flash_bwd_q_kernel<HD>, a, tiles, d.nh, d.b, L::kBackwardQ, stream_);
  });
}

}  // namespace memtrade::cuda
