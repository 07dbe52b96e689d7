// Batch-norm (training statistics), global average pooling, max pooling, and the per-channel
// helpers of the convolution (bias add, bias gradient). NCHW layout throughout.
//
// Batch-norm uses own kernels rather than cuDNN's: each channel's statistics are summed in double
// (as the CPU backend does, so they hardly depend on the reduction order), the variance in two
// passes, Σx then Σ(x − μ)², as on the CPU; then the channel is normalised. The running
// statistics follow torch.nn.BatchNorm2d (momentum, unbiased variance). This keeps any float
// dtype for every argument, which cuDNN's batch-norm does not.
//
// With many channels one block per channel fills the GPU (fused kernels). With few (a small CNN's
// 32-128 on 132 SMs) each channel is split into S slices, one block each: every pass writes one
// double per block to the small scratch, and the next pass sums a channel's S partials in a fixed
// order, so results are deterministic (S depends on the shape and the SM count only).
//
// maxpool2d_backward gets no kernel size or stride, so it cannot gather per input element; it
// scatters each output's gradient to its argmax with fp32 atomics (into a fp32 scratch,
// Category::workspace, when dinp is 16-bit). Overlapping windows therefore sum in an unspecified
// order (only when stride < kernel; differences are within fp32 rounding).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace memtrade::cuda {
namespace {

constexpr int kChannelThreads = 512;
// The smallest slice worth a block of its own (8 elements a thread).
constexpr std::int64_t kMinSlice = 8 * kChannelThreads;

// Calls f(flat index) for the elements k in [begin, end) of channel ch of an (N, C, HW) tensor
// that fall to this thread (begin + threadIdx.x, then blockDim.x apart), in increasing k. One
// division per thread, then a cursor (image, position): a 64-bit division and modulo per
// element would cost more than the load.
template <typename F>
__device__ __forceinline__ void for_channel(std::int64_t begin, std::int64_t end, std::int64_t c,
                                            std::int64_t ch, std::int64_t hw, F&& f) {
  std::int64_t k = begin + threadIdx.x;
  if (k >= end) return;  // also hw == 0: nothing to divide
  std::int64_t img = k / hw, j = k % hw;
  const std::int64_t di = blockDim.x / hw, dj = blockDim.x % hw;
  for (; k < end; k += blockDim.x) {
    f((img * c + ch) * hw + j);
    img += di;
    j += dj;
    if (j >= hw) {
      j -= hw;
      ++img;
    }
  }
}

// Block b = ch·S + s of a split launch: channel ch, elements [begin, end) of its `count`.
struct Slice {
  std::int64_t ch, begin, end;
  int s;
};
__device__ __forceinline__ Slice slice_of(std::int64_t count, int S) {
  const std::int64_t ch = blockIdx.x / S;
  const int s = static_cast<int>(blockIdx.x % S);
  return {ch, count * s / S, count * (s + 1) / S, s};
}

// The S partials of channel ch, summed in a fixed order (the same in every block).
__device__ __forceinline__ double channel_total(const double* part, std::int64_t ch, int S) {
  double t = 0.0;
  for (int q = 0; q < S; ++q) t += part[ch * S + q];
  return t;
}

// Mean and inverse standard deviation from Σx and Σ(x − μ)² in double (the biased variance
// normalises); stores them and the running statistics when `write_out` (one block a channel).
__device__ __forceinline__ float2 bn_stats(double mu, double ss, double count, float eps,
                                           float momentum, std::int64_t ch, bool write_out,
                                           float* mean, float* invstd, AnyOut running_mean,
                                           AnyOut running_var) {
  const float m = static_cast<float>(mu);
  const float is = static_cast<float>(1.0 / sqrt(ss / count + eps));
  if (write_out) {
    mean[ch] = m;
    invstd[ch] = is;
    // torch.nn.BatchNorm2d: running = (1 − momentum)·running + momentum·stat, unbiased variance.
    if (running_mean.p)
      running_mean.store(ch, (1.0f - momentum) * running_mean.load(ch) + momentum * m);
    if (running_var.p)
      running_var.store(ch, (1.0f - momentum) * running_var.load(ch) +
                                momentum * static_cast<float>(ss / (count - 1.0)));
  }
  return make_float2(m, is);
}

// Σx and Σ(x − mu)² over [begin, end) of channel ch, each thread adding in double.
template <typename TI>
__device__ __forceinline__ double sum_x(const TI* inp, std::int64_t begin, std::int64_t end,
                                        std::int64_t c, std::int64_t ch, std::int64_t hw) {
  double sum = 0.0;
  for_channel(begin, end, c, ch, hw, [&](std::int64_t i) { sum += to_f(inp[i]); });
  return sum;
}
template <typename TI>
__device__ __forceinline__ double sum_sq_dev(const TI* inp, double mu, std::int64_t begin,
                                             std::int64_t end, std::int64_t c, std::int64_t ch,
                                             std::int64_t hw) {
  double ss = 0.0;
  for_channel(begin, end, c, ch, hw, [&](std::int64_t i) {
    const double d = to_f(inp[i]) - mu;
    ss += d * d;
  });
  return ss;
}

template <typename TO, typename TI>
__device__ __forceinline__ void bn_normalise(TO* out, const TI* inp, float m, float is, float g,
                                             float b, std::int64_t begin, std::int64_t end,
                                             std::int64_t c, std::int64_t ch, std::int64_t hw) {
  for_channel(begin, end, c, ch, hw,
              [&](std::int64_t i) { out[i] = from_f<TO>((to_f(inp[i]) - m) * is * g + b); });
}

// One block per channel: the three passes in one kernel.
template <typename TO, typename TI>
__global__ void batchnorm_fwd_kernel(TO* out, float* mean, float* invstd, const TI* inp,
                                     AnyIn gamma, AnyIn beta, AnyOut running_mean,
                                     AnyOut running_var, std::int64_t n, std::int64_t c,
                                     std::int64_t hw, float eps, float momentum) {
  __shared__ double shared[32];
  const std::int64_t ch = blockIdx.x, count = n * hw;
  const double mu = block_sum(sum_x(inp, 0, count, c, ch, hw), shared) / count;
  const double ss = block_sum(sum_sq_dev(inp, mu, 0, count, c, ch, hw), shared);
  const float2 st = bn_stats(mu, ss, count, eps, momentum, ch, threadIdx.x == 0, mean, invstd,
                             running_mean, running_var);
  bn_normalise(out, inp, st.x, st.y, gamma[ch], beta[ch], 0, count, c, ch, hw);
}

// Split, pass 1: part_sum[b] = Σx over block b's slice.
template <typename TI>
__global__ void batchnorm_sum_kernel(double* part_sum, const TI* inp, std::int64_t n,
                                     std::int64_t c, std::int64_t hw, int S) {
  __shared__ double shared[32];
  const Slice sl = slice_of(n * hw, S);
  const double sum = block_sum(sum_x(inp, sl.begin, sl.end, c, sl.ch, hw), shared);
  if (threadIdx.x == 0) part_sum[blockIdx.x] = sum;
}

// Split, pass 2: part_ss[b] = Σ(x − μ)² over block b's slice, μ from all of pass 1.
template <typename TI>
__global__ void batchnorm_sq_dev_kernel(double* part_ss, const double* part_sum, const TI* inp,
                                        std::int64_t n, std::int64_t c, std::int64_t hw, int S) {
  __shared__ double shared[32];
  __shared__ double mu_shared;
  const Slice sl = slice_of(n * hw, S);
  if (threadIdx.x == 0) mu_shared = channel_total(part_sum, sl.ch, S) / (n * hw);
  __syncthreads();
  const double ss = block_sum(sum_sq_dev(inp, mu_shared, sl.begin, sl.end, c, sl.ch, hw), shared);
  if (threadIdx.x == 0) part_ss[blockIdx.x] = ss;
}

// Split, pass 3: every block normalises its slice; block s == 0 of a channel stores the stats.
template <typename TO, typename TI>
__global__ void batchnorm_apply_kernel(TO* out, float* mean, float* invstd, const TI* inp,
                                       const double* part_sum, const double* part_ss, AnyIn gamma,
                                       AnyIn beta, AnyOut running_mean, AnyOut running_var,
                                       std::int64_t n, std::int64_t c, std::int64_t hw, int S,
                                       float eps, float momentum) {
  __shared__ float2 st;
  const std::int64_t count = n * hw;
  const Slice sl = slice_of(count, S);
  if (threadIdx.x == 0)
    st = bn_stats(channel_total(part_sum, sl.ch, S) / count, channel_total(part_ss, sl.ch, S),
                  count, eps, momentum, sl.ch, sl.s == 0, mean, invstd, running_mean, running_var);
  __syncthreads();
  bn_normalise(out, inp, st.x, st.y, gamma[sl.ch], beta[sl.ch], sl.begin, sl.end, c, sl.ch, hw);
}

// (Σdy, Σdy·x̂) over [begin, end) of channel ch, each thread adding in double.
template <typename TG, typename TI>
__device__ __forceinline__ void bn_bwd_sums(double& sum_dy, double& sum_dy_xhat, const TG* dout,
                                            const TI* inp, float m, float is, std::int64_t begin,
                                            std::int64_t end, std::int64_t c, std::int64_t ch,
                                            std::int64_t hw) {
  sum_dy = 0.0;
  sum_dy_xhat = 0.0;
  for_channel(begin, end, c, ch, hw, [&](std::int64_t i) {
    const float g = to_f(dout[i]);
    sum_dy += g;
    sum_dy_xhat += g * (to_f(inp[i]) - m) * is;
  });
}

// dx = γ·invstd/n · (n·dy − Σdy − x̂·Σ(dy·x̂)) over [begin, end) of channel ch.
template <typename TD, typename TG, typename TI>
__device__ __forceinline__ void bn_bwd_apply(TD* dinp, const TG* dout, const TI* inp, float gamma,
                                             float m, float is, float sdy, float sdx,
                                             std::int64_t count, std::int64_t begin,
                                             std::int64_t end, std::int64_t c, std::int64_t ch,
                                             std::int64_t hw) {
  const float cnt = static_cast<float>(count);
  const float coef = gamma * is / cnt;
  for_channel(begin, end, c, ch, hw, [&](std::int64_t i) {
    const float g = to_f(dout[i]);
    dinp[i] = from_f<TD>(coef * (cnt * g - sdy - (to_f(inp[i]) - m) * is * sdx));
  });
}

__device__ __forceinline__ void store_param_grads(AnyOut dgamma, AnyOut dbeta, std::int64_t ch,
                                                  float sdx, float sdy, bool accumulate) {
  if (dgamma.p) dgamma.store(ch, (accumulate ? dgamma.load(ch) : 0.0f) + sdx);
  if (dbeta.p) dbeta.store(ch, (accumulate ? dbeta.load(ch) : 0.0f) + sdy);
}

// One block per channel.
template <typename TD, typename TG, typename TI>
__global__ void batchnorm_bwd_kernel(TD* dinp, AnyOut dgamma, AnyOut dbeta, const TG* dout,
                                     const TI* inp, AnyIn gamma, const float* mean,
                                     const float* invstd, std::int64_t n, std::int64_t c,
                                     std::int64_t hw, bool accumulate) {
  __shared__ double shared[32];
  const std::int64_t ch = blockIdx.x, count = n * hw;
  const float m = mean[ch], is = invstd[ch];
  double sum_dy, sum_dy_xhat;
  bn_bwd_sums(sum_dy, sum_dy_xhat, dout, inp, m, is, 0, count, c, ch, hw);
  const float sdy = static_cast<float>(block_sum(sum_dy, shared));
  const float sdx = static_cast<float>(block_sum(sum_dy_xhat, shared));
  bn_bwd_apply(dinp, dout, inp, gamma[ch], m, is, sdy, sdx, count, 0, count, c, ch, hw);
  if (threadIdx.x == 0) store_param_grads(dgamma, dbeta, ch, sdx, sdy, accumulate);
}

// Split, pass 1: part[b] = Σdy and part[C·S + b] = Σdy·x̂ over block b's slice.
template <typename TG, typename TI>
__global__ void batchnorm_bwd_sums_kernel(double* part, const TG* dout, const TI* inp,
                                          const float* mean, const float* invstd, std::int64_t n,
                                          std::int64_t c, std::int64_t hw, int S) {
  __shared__ double shared[32];
  const Slice sl = slice_of(n * hw, S);
  double sum_dy, sum_dy_xhat;
  bn_bwd_sums(sum_dy, sum_dy_xhat, dout, inp, mean[sl.ch], invstd[sl.ch], sl.begin, sl.end, c,
              sl.ch, hw);
  sum_dy = block_sum(sum_dy, shared);
  sum_dy_xhat = block_sum(sum_dy_xhat, shared);
  if (threadIdx.x == 0) {
    part[blockIdx.x] = sum_dy;
    part[c * S + blockIdx.x] = sum_dy_xhat;
  }
}

// Split, pass 2: every block applies dx to its slice; block s == 0 stores dgamma and dbeta.
template <typename TD, typename TG, typename TI>
__global__ void batchnorm_bwd_apply_kernel(TD* dinp, AnyOut dgamma, AnyOut dbeta, const TG* dout,
                                           const TI* inp, AnyIn gamma, const float* mean,
                                           const float* invstd, const double* part, std::int64_t n,
                                           std::int64_t c, std::int64_t hw, int S,
                                           bool accumulate) {
  __shared__ float2 sums;  // (Σdy, Σdy·x̂) of the whole channel
  const std::int64_t count = n * hw;
  const Slice sl = slice_of(count, S);
  if (threadIdx.x == 0) {
    sums = make_float2(static_cast<float>(channel_total(part, sl.ch, S)),
                       static_cast<float>(channel_total(part + c * S, sl.ch, S)));
    if (sl.s == 0) store_param_grads(dgamma, dbeta, sl.ch, sums.y, sums.x, accumulate);
  }
  __syncthreads();
  bn_bwd_apply(dinp, dout, inp, gamma[sl.ch], mean[sl.ch], invstd[sl.ch], sums.x, sums.y, count,
               sl.begin, sl.end, c, sl.ch, hw);
}

template <typename TS>
__global__ void channel_sum_kernel(AnyOut dst, const TS* src, std::int64_t n, std::int64_t c,
                                   std::int64_t hw, bool accumulate) {
  __shared__ double shared[32];
  const std::int64_t ch = blockIdx.x;
  const double sum = block_sum(sum_x(src, 0, n * hw, c, ch, hw), shared);
  if (threadIdx.x == 0) dst.store(ch, (accumulate ? dst.load(ch) : 0.0f) + static_cast<float>(sum));
}

template <typename T>
__global__ void channel_bias_add_kernel(T* out, AnyIn bias, std::int64_t total, std::int64_t c,
                                        std::int64_t hw) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += stride)
    out[i] = from_f<T>(to_f(out[i]) + bias[(i / hw) % c]);
}

// One warp per (n, c) plane.
template <typename TO, typename TI>
__global__ void avgpool_fwd_kernel(TO* out, const TI* inp, std::int64_t planes, std::int64_t hw) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t p = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
       p < planes; p += static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32)) {
    double sum = 0.0;
    for (std::int64_t j = lane; j < hw; j += 32) sum += to_f(inp[p * hw + j]);
    sum = warp_sum(sum);
    if (lane == 0) out[p] = from_f<TO>(static_cast<float>(sum / static_cast<double>(hw)));
  }
}

template <typename TD, typename TG>
__global__ void avgpool_bwd_kernel(TD* dinp, const TG* dout, std::int64_t planes, std::int64_t hw) {
  const std::int64_t total = planes * hw;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += stride)
    dinp[i] = from_f<TD>(to_f(dout[i / hw]) / static_cast<float>(hw));
}

// argmax: flat index ih·W + iw within the plane; the first maximum wins, NaN propagates.
template <typename TO, typename TI>
__global__ void maxpool_fwd_kernel(TO* out, std::int32_t* argmax, const TI* inp,
                                   std::int64_t planes, std::int64_t h, std::int64_t w,
                                   std::int64_t oh, std::int64_t ow, int kernel, int stride) {
  const std::int64_t total = planes * oh * ow;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; o < total;
       o += step) {
    const std::int64_t p = o / (oh * ow), y = (o / ow) % oh, x = o % ow;
    const TI* plane = inp + p * h * w;
    float best = -INFINITY;
    std::int64_t best_i = (y * stride) * w + x * stride;
    bool found_nan = false;
    for (int ky = 0; ky < kernel && !found_nan; ++ky) {
      for (int kx = 0; kx < kernel; ++kx) {
        const std::int64_t i = (y * stride + ky) * w + x * stride + kx;
        const float v = to_f(plane[i]);
        if (v > best || isnan(v)) {
          best = v;
          best_i = i;
          if (isnan(v)) {
            found_nan = true;
            break;
          }
        }
      }
    }
    out[o] = from_f<TO>(best);
    argmax[o] = static_cast<std::int32_t>(best_i);
  }
}

template <typename TG>
__global__ void maxpool_bwd_kernel(float* dinp, const TG* dout, const std::int32_t* argmax,
                                   std::int64_t total, std::int64_t ohw, std::int64_t hw) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; o < total;
       o += step) {
    const std::int32_t a = argmax[o];
    if (a >= 0 && a < hw) atomicAdd(dinp + (o / ohw) * hw + a, to_f(dout[o]));
  }
}

AnyOut any_out(Tensor* t) {
  return t ? AnyOut{t->data(), t->dtype()} : AnyOut{nullptr, DType::F32};
}

// Slices per channel for batch-norm: enough blocks in all for about one full wave (an SM holds
// four kChannelThreads blocks), at least kMinSlice elements each, and the two doubles a block
// leaves (c·S each) within the small scratch. 1 selects the fused one-block-per-channel kernels.
int bn_slices(std::int64_t c, std::int64_t count) {
  const std::int64_t want = (4 * static_cast<std::int64_t>(sm_count()) + c - 1) / c;
  const auto fit = static_cast<std::int64_t>(kSmallScratchBytes / (2 * sizeof(double))) / c;
  return static_cast<int>(std::max<std::int64_t>(1, std::min({want, count / kMinSlice, fit})));
}

}  // namespace

void launch_channel_bias_add(void* out, DType ot, const void* bias, DType bt, std::int64_t n,
                             std::int64_t c, std::int64_t hw, cudaStream_t s) {
  const std::int64_t total = n * c * hw;
  if (total == 0) return;
  dispatch_float(ot, "conv bias", [&](auto o) {
    using T = decltype(o);
    channel_bias_add_kernel<T>
        <<<grid_for(total), kThreads, 0, s>>>(static_cast<T*>(out), AnyIn{bias, bt}, total, c, hw);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_channel_sum(void* dst, DType dt, const void* src, DType st, std::int64_t n,
                        std::int64_t c, std::int64_t hw, bool accumulate, cudaStream_t s) {
  if (c == 0) return;
  dispatch_float(st, "conv bias gradient", [&](auto g) {
    using TS = decltype(g);
    channel_sum_kernel<TS><<<static_cast<unsigned>(c), kChannelThreads, 0, s>>>(
        AnyOut{dst, dt}, static_cast<const TS*>(src), n, c, hw, accumulate);
    CUDA_CHECK_LAUNCH();
  });
}

void CudaOps::batchnorm_forward(Tensor& out, Tensor& mean, Tensor& invstd, const Tensor& inp,
                                const Tensor& gamma, const Tensor& beta, Tensor* running_mean,
                                Tensor* running_var, float eps, float momentum) {
  NvtxRange range("batchnorm_forward");
  constexpr std::string_view op = "batchnorm_forward";
  const std::int64_t c =
      check_batchnorm_forward(out, mean, invstd, inp, gamma, beta, running_mean, running_var);
  const std::int64_t n = inp.dim(0), hw = inp.dim(2) * inp.dim(3);
  if (n * hw < 2)
    fail(op, "need more than 1 value per channel in training, inp " + shape_str(inp.shape()));
  if (c == 0) return;
  const int S = bn_slices(c, n * hw);
  const AnyIn g{gamma.data(), gamma.dtype()}, b{beta.data(), beta.dtype()};
  dispatch_float(out.dtype(), op, [&](auto o) {
    dispatch_float(inp.dtype(), op, [&](auto x) {
      using TO = decltype(o);
      using TI = decltype(x);
      if (S == 1) {
        batchnorm_fwd_kernel<TO, TI><<<static_cast<unsigned>(c), kChannelThreads, 0, stream_>>>(
            out.as<TO>(), mean.as<float>(), invstd.as<float>(), inp.as<TI>(), g, b,
            any_out(running_mean), any_out(running_var), n, c, hw, eps, momentum);
        CUDA_CHECK_LAUNCH();
        return;
      }
      auto* part_sum = static_cast<double*>(small_scratch());
      double* part_ss = part_sum + c * S;
      const auto blocks = static_cast<unsigned>(c * S);
      batchnorm_sum_kernel<TI>
          <<<blocks, kChannelThreads, 0, stream_>>>(part_sum, inp.as<TI>(), n, c, hw, S);
      CUDA_CHECK_LAUNCH();
      batchnorm_sq_dev_kernel<TI>
          <<<blocks, kChannelThreads, 0, stream_>>>(part_ss, part_sum, inp.as<TI>(), n, c, hw, S);
      CUDA_CHECK_LAUNCH();
      batchnorm_apply_kernel<TO, TI><<<blocks, kChannelThreads, 0, stream_>>>(
          out.as<TO>(), mean.as<float>(), invstd.as<float>(), inp.as<TI>(), part_sum, part_ss, g, b,
          any_out(running_mean), any_out(running_var), n, c, hw, S, eps, momentum);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::batchnorm_backward(Tensor& dinp, Tensor* dgamma, Tensor* dbeta, const Tensor& dout,
                                 const Tensor& inp, const Tensor& gamma, const Tensor& mean,
                                 const Tensor& invstd, bool accumulate) {
  NvtxRange range("batchnorm_backward");
  constexpr std::string_view op = "batchnorm_backward";
  const std::int64_t c =
      check_batchnorm_backward(dinp, dgamma, dbeta, dout, inp, gamma, mean, invstd);
  const std::int64_t n = inp.dim(0), hw = inp.dim(2) * inp.dim(3);
  if (c == 0) return;
  const int S = bn_slices(c, n * hw);
  const AnyIn gm{gamma.data(), gamma.dtype()};
  dispatch_float(dinp.dtype(), op, [&](auto d) {
    dispatch_float(dout.dtype(), op, [&](auto g) {
      dispatch_float(inp.dtype(), op, [&](auto x) {
        using TD = decltype(d);
        using TG = decltype(g);
        using TI = decltype(x);
        if (S == 1) {
          batchnorm_bwd_kernel<TD, TG, TI>
              <<<static_cast<unsigned>(c), kChannelThreads, 0, stream_>>>(
                  dinp.as<TD>(), any_out(dgamma), any_out(dbeta), dout.as<TG>(), inp.as<TI>(), gm,
                  mean.as<float>(), invstd.as<float>(), n, c, hw, accumulate);
          CUDA_CHECK_LAUNCH();
          return;
        }
        auto* part = static_cast<double*>(small_scratch());
        const auto blocks = static_cast<unsigned>(c * S);
        batchnorm_bwd_sums_kernel<TG, TI><<<blocks, kChannelThreads, 0, stream_>>>(
            part, dout.as<TG>(), inp.as<TI>(), mean.as<float>(), invstd.as<float>(), n, c, hw, S);
        CUDA_CHECK_LAUNCH();
        batchnorm_bwd_apply_kernel<TD, TG, TI><<<blocks, kChannelThreads, 0, stream_>>>(
            dinp.as<TD>(), any_out(dgamma), any_out(dbeta), dout.as<TG>(), inp.as<TI>(), gm,
            mean.as<float>(), invstd.as<float>(), part, n, c, hw, S, accumulate);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void CudaOps::global_avgpool_forward(Tensor& out, const Tensor& inp) {
  NvtxRange range("global_avgpool_forward");
  constexpr std::string_view op = "global_avgpool_forward";
  check_nchw(op, "inp", inp);
  check_float(op, "out", out);
  check_shape(op, "out", out, {inp.dim(0), inp.dim(1)});
  const std::int64_t planes = inp.dim(0) * inp.dim(1), hw = inp.dim(2) * inp.dim(3);
  if (planes == 0) return;
  dispatch_float(out.dtype(), op, [&](auto o) {
    dispatch_float(inp.dtype(), op, [&](auto x) {
      using TO = decltype(o);
      using TI = decltype(x);
      avgpool_fwd_kernel<TO, TI>
          <<<grid_for_rows(planes), kThreads, 0, stream_>>>(out.as<TO>(), inp.as<TI>(), planes, hw);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::global_avgpool_backward(Tensor& dinp, const Tensor& dout) {
  NvtxRange range("global_avgpool_backward");
  constexpr std::string_view op = "global_avgpool_backward";
  check_nchw(op, "dinp", dinp);
  check_float(op, "dout", dout);
  check_shape(op, "dout", dout, {dinp.dim(0), dinp.dim(1)});
  const std::int64_t planes = dinp.dim(0) * dinp.dim(1), hw = dinp.dim(2) * dinp.dim(3);
  if (planes * hw == 0) return;
  dispatch_float(dinp.dtype(), op, [&](auto d) {
    dispatch_float(dout.dtype(), op, [&](auto g) {
      using TD = decltype(d);
      using TG = decltype(g);
      avgpool_bwd_kernel<TD, TG><<<grid_for(planes * hw), kThreads, 0, stream_>>>(
          dinp.as<TD>(), dout.as<TG>(), planes, hw);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::maxpool2d_forward(Tensor& out, Tensor& argmax, const Tensor& inp, int kernel,
                                int stride) {
  NvtxRange range("maxpool2d_forward");
  constexpr std::string_view op = "maxpool2d_forward";
  check_nchw(op, "inp", inp);
  check_float(op, "out", out);
  check_i32(op, "argmax", argmax);
  if (kernel < 1 || stride < 1)
    fail(op, "kernel " + std::to_string(kernel) + " and stride " + std::to_string(stride) +
                 " must be >= 1");
  const std::int64_t h = inp.dim(2), w = inp.dim(3);
  if (h < kernel || w < kernel)
    fail(op,
         "kernel " + std::to_string(kernel) + " larger than the input " + shape_str(inp.shape()));
  const std::int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  const Shape os{inp.dim(0), inp.dim(1), oh, ow};
  check_shape(op, "out", out, os);
  check_shape(op, "argmax", argmax, os);
  const std::int64_t planes = inp.dim(0) * inp.dim(1), total = planes * oh * ow;
  if (total == 0) return;
  dispatch_float(out.dtype(), op, [&](auto o) {
    dispatch_float(inp.dtype(), op, [&](auto x) {
      using TO = decltype(o);
      using TI = decltype(x);
      maxpool_fwd_kernel<TO, TI><<<grid_for(total), kThreads, 0, stream_>>>(
          out.as<TO>(), argmax.as<std::int32_t>(), inp.as<TI>(), planes, h, w, oh, ow, kernel,
          stride);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::maxpool2d_backward(Tensor& dinp, const Tensor& dout, const Tensor& argmax) {
  NvtxRange range("maxpool2d_backward");
  constexpr std::string_view op = "maxpool2d_backward";
  check_nchw(op, "dinp", dinp);
  check_float(op, "dout", dout);
  check_i32(op, "argmax", argmax);
  check_shape(op, "argmax", argmax, dout.shape());
  if (dout.ndim() != 4 || dout.dim(0) != dinp.dim(0) || dout.dim(1) != dinp.dim(1))
    fail(op, "dout " + shape_str(dout.shape()) + " does not match dinp " + shape_str(dinp.shape()));
  const std::int64_t hw = dinp.dim(2) * dinp.dim(3), ohw = dout.dim(2) * dout.dim(3);
  const std::int64_t total = dout.numel();
  // Out-of-range argmax entries (an error on the CPU) are skipped: checking needs a sync.
  AsDTypeOut acc(dinp, DType::F32, false, stream_);
  CUDA_CHECK(cudaMemsetAsync(acc.data(), 0, static_cast<std::size_t>(dinp.numel()) * 4, stream_));
  if (total > 0) {
    dispatch_float(dout.dtype(), op, [&](auto g) {
      using TG = decltype(g);
      maxpool_bwd_kernel<TG><<<grid_for(total), kThreads, 0, stream_>>>(
          static_cast<float*>(acc.data()), dout.as<TG>(), argmax.as<std::int32_t>(), total, ohw,
          hw);
      CUDA_CHECK_LAUNCH();
    });
  }
  acc.commit();
}

}  // namespace memtrade::cuda
