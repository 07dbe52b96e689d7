// Batch-norm (training statistics), global average pooling, max pooling, and the per-channel
// helpers of the convolution (bias add, bias gradient). NCHW layout throughout.
//
// Batch-norm uses own kernels rather than cuDNN's: one block per channel computes the statistics
// in double (as the CPU backend does, so they do not depend on the reduction order), then
// normalises; the running statistics follow torch.nn.BatchNorm2d (momentum, unbiased variance).
// This keeps any float dtype for every argument, which cuDNN's batch-norm does not.
//
// maxpool2d_backward gets no kernel size or stride, so it cannot gather per input element; it
// scatters each output's gradient to its argmax with fp32 atomics (into a fp32 scratch,
// Category::workspace, when dinp is 16-bit). Overlapping windows therefore sum in an unspecified
// order (only when stride < kernel; differences are within fp32 rounding).
#include <cstdint>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace memtrade::cuda {
namespace {

constexpr int kChannelThreads = 512;

// Flat index of the k-th element (k < N·HW) of channel ch in an (N, C, HW) tensor.
__device__ __forceinline__ std::int64_t channel_elem(std::int64_t k, std::int64_t c,
                                                     std::int64_t ch, std::int64_t hw) {
  return ((k / hw) * c + ch) * hw + k % hw;
}

template <typename TO, typename TI>
__global__ void batchnorm_fwd_kernel(TO* out, float* mean, float* invstd, const TI* inp,
                                     AnyIn gamma, AnyIn beta, AnyOut running_mean,
                                     AnyOut running_var, std::int64_t n, std::int64_t c,
                                     std::int64_t hw, float eps, float momentum) {
  __shared__ double shared[32];
  const std::int64_t ch = blockIdx.x;
  const double count = static_cast<double>(n * hw);
  double sum = 0.0;
  for (std::int64_t k = threadIdx.x; k < n * hw; k += blockDim.x)
    sum += to_f(inp[channel_elem(k, c, ch, hw)]);
  const double mu = block_sum(sum, shared) / count;
  double ss = 0.0;
  for (std::int64_t k = threadIdx.x; k < n * hw; k += blockDim.x) {
    const std::int64_t i = channel_elem(k, c, ch, hw);
    const double d = to_f(inp[i]) - mu;
    ss += d * d;
  }
  ss = block_sum(ss, shared);
  const float m = static_cast<float>(mu);
  const float is = static_cast<float>(1.0 / sqrt(ss / count + eps));  // biased: normalises
  const float g = gamma[ch], b = beta[ch];
  for (std::int64_t k = threadIdx.x; k < n * hw; k += blockDim.x) {
    const std::int64_t i = channel_elem(k, c, ch, hw);
    out[i] = from_f<TO>((to_f(inp[i]) - m) * is * g + b);
  }
  if (threadIdx.x == 0) {
    mean[ch] = m;
    invstd[ch] = is;
    // torch.nn.BatchNorm2d: running = (1 − momentum)·running + momentum·stat, unbiased variance.
    if (running_mean.p)
      running_mean.store(ch, (1.0f - momentum) * running_mean.load(ch) + momentum * m);
    if (running_var.p)
      running_var.store(ch, (1.0f - momentum) * running_var.load(ch) +
                                momentum * static_cast<float>(ss / (count - 1.0)));
  }
}

template <typename TD, typename TG, typename TI>
__global__ void batchnorm_bwd_kernel(TD* dinp, AnyOut dgamma, AnyOut dbeta, const TG* dout,
                                     const TI* inp, AnyIn gamma, const float* mean,
                                     const float* invstd, std::int64_t n, std::int64_t c,
                                     std::int64_t hw, bool accumulate) {
  __shared__ double shared[32];
  const std::int64_t ch = blockIdx.x;
  const float m = mean[ch], is = invstd[ch];
  double sum_dy = 0.0, sum_dy_xhat = 0.0;
  for (std::int64_t k = threadIdx.x; k < n * hw; k += blockDim.x) {
    const std::int64_t i = channel_elem(k, c, ch, hw);
    const float g = to_f(dout[i]);
    sum_dy += g;
    sum_dy_xhat += g * (to_f(inp[i]) - m) * is;
  }
  sum_dy = block_sum(sum_dy, shared);
  sum_dy_xhat = block_sum(sum_dy_xhat, shared);
  // dx = γ·invstd/n · (n·dy − Σdy − x̂·Σ(dy·x̂))
  const float cnt = static_cast<float>(n * hw);
  const float coef = gamma[ch] * is / cnt;
  const float sdy = static_cast<float>(sum_dy), sdx = static_cast<float>(sum_dy_xhat);
  for (std::int64_t k = threadIdx.x; k < n * hw; k += blockDim.x) {
    const std::int64_t i = channel_elem(k, c, ch, hw);
    const float g = to_f(dout[i]);
    dinp[i] = from_f<TD>(coef * (cnt * g - sdy - (to_f(inp[i]) - m) * is * sdx));
  }
  if (threadIdx.x == 0) {
    if (dgamma.p) dgamma.store(ch, (accumulate ? dgamma.load(ch) : 0.0f) + sdx);
    if (dbeta.p) dbeta.store(ch, (accumulate ? dbeta.load(ch) : 0.0f) + sdy);
  }
}

template <typename TS>
__global__ void channel_sum_kernel(AnyOut dst, const TS* src, std::int64_t n, std::int64_t c,
                                   std::int64_t hw, bool accumulate) {
  __shared__ double shared[32];
  const std::int64_t ch = blockIdx.x;
  double sum = 0.0;
  for (std::int64_t k = threadIdx.x; k < n * hw; k += blockDim.x)
    sum += to_f(src[channel_elem(k, c, ch, hw)]);
  sum = block_sum(sum, shared);
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

void check_nchw(std::string_view op, std::string_view name, const Tensor& t) {
  check_float(op, name, t);
  if (t.ndim() != 4)
    fail(op, std::string(name) + " must be (N, C, H, W), got " + shape_str(t.shape()));
}

void check_channel_vec(std::string_view op, std::string_view name, const Tensor& t, std::int64_t c,
                       bool need_f32) {
  check_float(op, name, t);
  if (t.numel() != c || (need_f32 && t.dtype() != DType::F32))
    fail(op, std::string(name) + " must be (" + std::to_string(c) + ")" + (need_f32 ? " F32" : "") +
                 ", got " + shape_str(t.shape()) + " " + std::string(dtype_name(t.dtype())));
}

AnyOut any_out(Tensor* t) {
  return t ? AnyOut{t->data(), t->dtype()} : AnyOut{nullptr, DType::F32};
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
  check_nchw(op, "inp", inp);
  check_float(op, "out", out);
  check_shape(op, "out", out, inp.shape());
  const std::int64_t n = inp.dim(0), c = inp.dim(1), hw = inp.dim(2) * inp.dim(3);
  check_channel_vec(op, "gamma", gamma, c, false);
  check_channel_vec(op, "beta", beta, c, false);
  check_channel_vec(op, "mean", mean, c, true);
  check_channel_vec(op, "invstd", invstd, c, true);
  if (running_mean) check_channel_vec(op, "running_mean", *running_mean, c, false);
  if (running_var) check_channel_vec(op, "running_var", *running_var, c, false);
  if (n * hw < 2)
    fail(op, "need more than 1 value per channel in training, inp " + shape_str(inp.shape()));
  if (c == 0) return;
  dispatch_float(out.dtype(), op, [&](auto o) {
    dispatch_float(inp.dtype(), op, [&](auto x) {
      using TO = decltype(o);
      using TI = decltype(x);
      batchnorm_fwd_kernel<TO, TI><<<static_cast<unsigned>(c), kChannelThreads, 0, stream_>>>(
          out.as<TO>(), mean.as<float>(), invstd.as<float>(), inp.as<TI>(),
          AnyIn{gamma.data(), gamma.dtype()}, AnyIn{beta.data(), beta.dtype()},
          any_out(running_mean), any_out(running_var), n, c, hw, eps, momentum);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::batchnorm_backward(Tensor& dinp, Tensor* dgamma, Tensor* dbeta, const Tensor& dout,
                                 const Tensor& inp, const Tensor& gamma, const Tensor& mean,
                                 const Tensor& invstd, bool accumulate) {
  NvtxRange range("batchnorm_backward");
  constexpr std::string_view op = "batchnorm_backward";
  check_nchw(op, "inp", inp);
  check_float(op, "dinp", dinp);
  check_float(op, "dout", dout);
  check_shape(op, "dinp", dinp, inp.shape());
  check_shape(op, "dout", dout, inp.shape());
  const std::int64_t n = inp.dim(0), c = inp.dim(1), hw = inp.dim(2) * inp.dim(3);
  check_channel_vec(op, "gamma", gamma, c, false);
  check_channel_vec(op, "mean", mean, c, true);
  check_channel_vec(op, "invstd", invstd, c, true);
  if (dgamma) check_channel_vec(op, "dgamma", *dgamma, c, false);
  if (dbeta) check_channel_vec(op, "dbeta", *dbeta, c, false);
  if (c == 0) return;
  dispatch_float(dinp.dtype(), op, [&](auto d) {
    dispatch_float(dout.dtype(), op, [&](auto g) {
      dispatch_float(inp.dtype(), op, [&](auto x) {
        using TD = decltype(d);
        using TG = decltype(g);
        using TI = decltype(x);
        batchnorm_bwd_kernel<TD, TG, TI><<<static_cast<unsigned>(c), kChannelThreads, 0, stream_>>>(
            dinp.as<TD>(), any_out(dgamma), any_out(dbeta), dout.as<TG>(), inp.as<TI>(),
            AnyIn{gamma.data(), gamma.dtype()}, mean.as<float>(), invstd.as<float>(), n, c, hw,
            accumulate);
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
