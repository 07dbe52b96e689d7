// Rotary position embeddings in place on packed qkv. Block (x, y) takes position x and a slice
// of the batch (grid-strided): it computes cos and sin of its position once into shared memory,
// in double from the fp32 angle as the CPU does (so both backends rotate with the same floats),
// then rotates the position's q and k heads in each of its sequences. The products are kept
// apart from the sums (__fmul_rn) so that nvcc does not fuse them into FMAs the CPU lacks: the
// two backends give the same results, bit for bit, barring a cos/sin on a rounding boundary.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace memtrade::cuda {
namespace {

// The frequencies travel as a kernel argument (2 KiB at kRopeMaxHeadDim): no device buffer to
// allocate or copy.
struct InvFreq {
  float v[kRopeMaxHeadDim / 2];
};

template <typename T>
__global__ void rope_kernel(T* qkv, const InvFreq freq, std::int64_t batch, std::int64_t len,
                            std::int64_t heads, std::int64_t hd, std::int64_t row, float sign) {
  __shared__ float cs[kRopeMaxHeadDim / 2];
  __shared__ float sn[kRopeMaxHeadDim / 2];
  const std::int64_t half = hd / 2;
  for (std::int64_t t = blockIdx.x; t < len; t += gridDim.x) {
    __syncthreads();  // the previous position's readers are done with cs/sn
    for (std::int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const double angle = __fmul_rn(static_cast<float>(t), freq.v[i]);
      double s, c;
      sincos(angle, &s, &c);
      cs[i] = static_cast<float>(c);
      sn[i] = sign * static_cast<float>(s);
    }
    __syncthreads();
    for (std::int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
      T* x = qkv + (b * len + t) * row;  // q heads, then k heads: contiguous
      for (std::int64_t k = threadIdx.x; k < heads * half; k += blockDim.x) {
        const std::int64_t h = k / half, i = k % half;
        T* p = x + h * hd;
        const float x1 = to_f(p[i]), x2 = to_f(p[i + half]);
        p[i] = from_f<T>(__fsub_rn(__fmul_rn(x1, cs[i]), __fmul_rn(x2, sn[i])));
        p[i + half] = from_f<T>(__fadd_rn(__fmul_rn(x2, cs[i]), __fmul_rn(x1, sn[i])));
      }
    }
  }
}

void launch_rope(Tensor& qkv, const RopeDims& d, const RopeConfig& rope, float sign,
                 std::string_view op, cudaStream_t stream) {
  if (d.b == 0 || d.t == 0) return;
  const std::vector<float> inv = rope_inv_freq(d.hd, rope);
  InvFreq freq{};
  std::memcpy(freq.v, inv.data(), inv.size() * sizeof(float));
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(d.t, 1 << 20)),
                  static_cast<unsigned>(std::min<std::int64_t>(d.b, 65535)));
  dispatch_float(qkv.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<grid, kThreads, 0, stream>>>(qkv.as<T>(), freq, d.b, d.t, d.nh + d.nkv, d.hd,
                                                  d.row(), sign);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void CudaOps::rope_forward(Tensor& qkv, int n_head, int n_kv_head, const RopeConfig& rope) {
  NvtxRange range("rope_forward");
  const RopeDims d = check_rope("rope_forward", qkv, n_head, n_kv_head);
  launch_rope(qkv, d, rope, 1.0f, "rope_forward", stream_);
}

void CudaOps::rope_backward(Tensor& dqkv, int n_head, int n_kv_head, const RopeConfig& rope) {
  NvtxRange range("rope_backward");
  const RopeDims d = check_rope("rope_backward", dqkv, n_head, n_kv_head);
  launch_rope(dqkv, d, rope, -1.0f, "rope_backward", stream_);
}

}  // namespace memtrade::cuda
