// Batch-norm (training statistics) and pooling for the convolution network, NCHW layout.
// Channels (or (n, c) planes) go to threads, so every reduction has one owner: deterministic.
// Sums run in double in kernels/cpu/cpu_vec.h's fixed lanes.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"

namespace memtrade::cpu {
namespace {

// Calls f(off, len) over the elements of channel ch in every image, in kChunk pieces.
template <typename F>
void for_channel(const Tensor& t, std::int64_t ch, F&& f) {
  const std::int64_t n = t.dim(0), c = t.dim(1), hw = t.dim(2) * t.dim(3);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t o = 0; o < hw; o += kChunk)
      f((i * c + ch) * hw + o, std::min(kChunk, hw - o));
}

float read1(const Tensor& t, std::int64_t i) {
  return load_as_float(t.data(), t.dtype(), i);
}
void write1(Tensor& t, std::int64_t i, float v) {
  store_from_float(t.data(), t.dtype(), i, v);
}

}  // namespace

void CpuOps::batchnorm_forward(Tensor& out, Tensor& mean, Tensor& invstd, const Tensor& inp,
                               const Tensor& gamma, const Tensor& beta, Tensor* running_mean,
                               Tensor* running_var, float eps, float momentum) {
  constexpr std::string_view op = "batchnorm_forward";
  const std::int64_t c =
      check_batchnorm_forward(out, mean, invstd, inp, gamma, beta, running_mean, running_var);
  const std::int64_t count = inp.numel() / std::max<std::int64_t>(c, 1);
  if (count < 2)
    fail(op, "need more than 1 value per channel in training, inp {}", shape_str(inp.shape()));
#pragma omp parallel for schedule(static) if (inp.numel() >= kParallelGrain)
  for (std::int64_t ch = 0; ch < c; ++ch) {
    float bx[kChunk], bo[kChunk];
    double sum = 0.0;
    for_channel(inp, ch, [&](std::int64_t off, std::int64_t len) {
      sum += vec::sum(read_f32(inp, off, len, bx), len);
    });
    const double mu = sum / static_cast<double>(count);
    double ss = 0.0;
    for_channel(inp, ch, [&](std::int64_t off, std::int64_t len) {
      ss += vec::sum_sq_dev(read_f32(inp, off, len, bx), mu, len);
    });
    const double var = ss / static_cast<double>(count);  // biased: used to normalise
    const float m = static_cast<float>(mu);
    const float is = static_cast<float>(1.0 / std::sqrt(var + eps));
    const float g = read1(gamma, ch), b = read1(beta, ch);
    for_channel(inp, ch, [&](std::int64_t off, std::int64_t len) {
      const float* x = read_f32(inp, off, len, bx);
      float* y = dest_f32(out, off, bo);
      vec::batchnorm_apply(x, m, is, g, b, y, len);
      write_f32(out, off, len, y);
    });
    mean.as<float>()[ch] = m;
    invstd.as<float>()[ch] = is;
    // torch.nn.BatchNorm2d: running = (1 - momentum)·running + momentum·stat, unbiased variance.
    if (running_mean)
      write1(*running_mean, ch, (1.0f - momentum) * read1(*running_mean, ch) + momentum * m);
    if (running_var) {
      const double unbiased = ss / static_cast<double>(count - 1);
      write1(*running_var, ch,
             (1.0f - momentum) * read1(*running_var, ch) + momentum * static_cast<float>(unbiased));
    }
  }
}

void CpuOps::batchnorm_backward(Tensor& dinp, Tensor* dgamma, Tensor* dbeta, const Tensor& dout,
                                const Tensor& inp, const Tensor& gamma, const Tensor& mean,
                                const Tensor& invstd, bool accumulate) {
  const std::int64_t c =
      check_batchnorm_backward(dinp, dgamma, dbeta, dout, inp, gamma, mean, invstd);
  const std::int64_t count = inp.numel() / std::max<std::int64_t>(c, 1);
#pragma omp parallel for schedule(static) if (inp.numel() >= kParallelGrain)
  for (std::int64_t ch = 0; ch < c; ++ch) {
    float bx[kChunk], bg[kChunk], bo[kChunk];
    const float m = mean.as<float>()[ch], is = invstd.as<float>()[ch];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for_channel(inp, ch, [&](std::int64_t off, std::int64_t len) {
      vec::batchnorm_backward_sums(read_f32(inp, off, len, bx), read_f32(dout, off, len, bg), m, is,
                                   len, sum_dy, sum_dy_xhat);
    });
    // dx = γ·invstd/n · (n·dy − Σdy − x̂·Σ(dy·x̂))
    const float k = read1(gamma, ch) * is / static_cast<float>(count);
    const float sdy = static_cast<float>(sum_dy), sdx = static_cast<float>(sum_dy_xhat);
    const float n = static_cast<float>(count);
    for_channel(inp, ch, [&](std::int64_t off, std::int64_t len) {
      const float* x = read_f32(inp, off, len, bx);
      const float* g = read_f32(dout, off, len, bg);
      float* y = dest_f32(dinp, off, bo);
      vec::batchnorm_dx(x, g, m, is, k, n, sdy, sdx, y, len);
      write_f32(dinp, off, len, y);
    });
    if (dgamma) write1(*dgamma, ch, (accumulate ? read1(*dgamma, ch) : 0.0f) + sdx);
    if (dbeta) write1(*dbeta, ch, (accumulate ? read1(*dbeta, ch) : 0.0f) + sdy);
  }
}

void CpuOps::global_avgpool_forward(Tensor& out, const Tensor& inp) {
  constexpr std::string_view op = "global_avgpool_forward";
  check_nchw(op, "inp", inp);
  check_float(op, "out", out);
  check_shape(op, "out", out, {inp.dim(0), inp.dim(1)});
  const std::int64_t planes = inp.dim(0) * inp.dim(1), hw = inp.dim(2) * inp.dim(3);
#pragma omp parallel for schedule(static) if (planes * hw >= kParallelGrain)
  for (std::int64_t p = 0; p < planes; ++p) {
    float bx[kChunk];
    double sum = 0.0;
    for (std::int64_t o = 0; o < hw; o += kChunk) {
      const std::int64_t len = std::min(kChunk, hw - o);
      sum += vec::sum(read_f32(inp, p * hw + o, len, bx), len);
    }
    write1(out, p, static_cast<float>(sum / static_cast<double>(hw)));
  }
}

void CpuOps::global_avgpool_backward(Tensor& dinp, const Tensor& dout) {
  constexpr std::string_view op = "global_avgpool_backward";
  check_nchw(op, "dinp", dinp);
  check_float(op, "dout", dout);
  check_shape(op, "dout", dout, {dinp.dim(0), dinp.dim(1)});
  const std::int64_t planes = dinp.dim(0) * dinp.dim(1), hw = dinp.dim(2) * dinp.dim(3);
#pragma omp parallel for schedule(static) if (planes * hw >= kParallelGrain)
  for (std::int64_t p = 0; p < planes; ++p) {
    float bo[kChunk];
    const float g = read1(dout, p) / static_cast<float>(hw);
    for (std::int64_t o = 0; o < hw; o += kChunk) {
      const std::int64_t len = std::min(kChunk, hw - o);
      float* y = dest_f32(dinp, p * hw + o, bo);
      std::fill(y, y + len, g);
      write_f32(dinp, p * hw + o, len, y);
    }
  }
}

// argmax holds, per output element, the flat index ih·W + iw of the maximum within the input's
// own (H, W) plane (as torch's max_pool2d return_indices does); the first maximum wins ties.
void CpuOps::maxpool2d_forward(Tensor& out, Tensor& argmax, const Tensor& inp, int kernel,
                               int stride) {
  constexpr std::string_view op = "maxpool2d_forward";
  check_nchw(op, "inp", inp);
  check_float(op, "out", out);
  check_i32(op, "argmax", argmax);
  if (kernel < 1 || stride < 1) fail(op, "kernel {} and stride {} must be >= 1", kernel, stride);
  const std::int64_t h = inp.dim(2), w = inp.dim(3);
  if (h < kernel || w < kernel)
    fail(op, "kernel {} larger than the input {}", kernel, shape_str(inp.shape()));
  const std::int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  const Shape os{inp.dim(0), inp.dim(1), oh, ow};
  check_shape(op, "out", out, os);
  check_shape(op, "argmax", argmax, os);
  const std::int64_t planes = inp.dim(0) * inp.dim(1);
  std::int32_t* am = argmax.as<std::int32_t>();
#pragma omp parallel for schedule(static) if (inp.numel() >= kParallelGrain)
  for (std::int64_t p = 0; p < planes; ++p) {
    for (std::int64_t y = 0; y < oh; ++y) {
      for (std::int64_t x = 0; x < ow; ++x) {
        float best = -INFINITY;
        std::int64_t best_i = (y * stride) * w + x * stride;
        for (int ky = 0; ky < kernel; ++ky) {
          for (int kx = 0; kx < kernel; ++kx) {
            const std::int64_t i = (y * stride + ky) * w + x * stride + kx;
            const float v = read1(inp, p * h * w + i);
            // NaN propagates as in torch: the first NaN wins and is never replaced.
            if (!std::isnan(best) && (v > best || std::isnan(v))) {
              best = v;
              best_i = i;
            }
          }
        }
        const std::int64_t o = (p * oh + y) * ow + x;
        write1(out, o, best);
        am[o] = static_cast<std::int32_t>(best_i);
      }
    }
  }
}

void CpuOps::maxpool2d_backward(Tensor& dinp, const Tensor& dout, const Tensor& argmax) {
  constexpr std::string_view op = "maxpool2d_backward";
  check_nchw(op, "dinp", dinp);
  check_float(op, "dout", dout);
  check_i32(op, "argmax", argmax);
  check_shape(op, "argmax", argmax, dout.shape());
  if (dout.ndim() != 4 || dout.dim(0) != dinp.dim(0) || dout.dim(1) != dinp.dim(1))
    fail(op, "dout {} does not match dinp {}", shape_str(dout.shape()), shape_str(dinp.shape()));
  const std::int64_t planes = dinp.dim(0) * dinp.dim(1), hw = dinp.dim(2) * dinp.dim(3);
  const std::int64_t ohw = dout.dim(2) * dout.dim(3);
  const std::int32_t* am = argmax.as<std::int32_t>();
  for (std::int64_t i = 0; i < argmax.numel(); ++i)
    if (am[i] < 0 || am[i] >= hw) fail(op, "argmax {} out of range [0, {})", am[i], hw);
#pragma omp parallel for schedule(static) if (dinp.numel() >= kParallelGrain)
  for (std::int64_t p = 0; p < planes; ++p) {
    // Accumulate in fp32 one plane at a time (overlapping windows add up), then round once.
    float acc[kChunk], bo[kChunk];
    for (std::int64_t o = 0; o < hw; o += kChunk) {
      const std::int64_t len = std::min(kChunk, hw - o);
      std::fill(acc, acc + len, 0.0f);
      for (std::int64_t i = 0; i < ohw; ++i) {
        const std::int64_t a = am[p * ohw + i];
        if (a >= o && a < o + len) acc[a - o] += read1(dout, p * ohw + i);
      }
      float* y = dest_f32(dinp, p * hw + o, bo);
      std::copy(acc, acc + len, y);
      write_f32(dinp, p * hw + o, len, y);
    }
  }
}

}  // namespace memtrade::cpu
