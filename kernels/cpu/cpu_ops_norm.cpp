// Layer-norm, softmax and RMSNorm. Rows go to threads (when the tensor is large enough to pay for
// waking them); each row is streamed in kChunk pieces, so any row length works with fixed stack
// buffers. Statistics are accumulated in double, in kernels/cpu/cpu_vec.h's fixed lanes.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"

namespace memtrade::cpu {
namespace {

// y[j] = a[j] (+ y_old[j] when accumulate) for a per-column parameter gradient chunk.
void store_param_grad(Tensor& g, std::int64_t off, std::int64_t len, const float* acc,
                      bool accumulate) {
  float buf[kChunk], out[kChunk];
  float* y = dest_f32(g, off, out);
  if (accumulate) {
    const float* old = read_f32(g, off, len, buf);
    for (std::int64_t j = 0; j < len; ++j) y[j] = old[j] + acc[j];
  } else {
    std::copy(acc, acc + len, y);
  }
  write_f32(g, off, len, y);
}

}  // namespace

void CpuOps::layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                               const Tensor& weight, const Tensor& bias, float eps) {
  const auto [n, c] = check_layernorm_forward(out, mean, rstd, inp, weight, bias);
#pragma omp parallel for schedule(static) if (n * c >= kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    float bx[kChunk], bw[kChunk], bb[kChunk], bo[kChunk];
    const std::int64_t base = r * c;
    double sum = 0.0;
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      sum += vec::sum(read_f32(inp, base + o, len, bx), len);
    }
    const double mu = sum / static_cast<double>(c);
    double var = 0.0;
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      var += vec::sum_sq_dev(read_f32(inp, base + o, len, bx), mu, len);
    }
    const float m = static_cast<float>(mu);
    const float s = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(c) + eps));
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      const float* x = read_f32(inp, base + o, len, bx);
      const float* w = read_f32(weight, o, len, bw);
      const float* b = read_f32(bias, o, len, bb);
      float* y = dest_f32(out, base + o, bo);
      for (std::int64_t j = 0; j < len; ++j) y[j] = (x[j] - m) * s * w[j] + b[j];
      write_f32(out, base + o, len, y);
    }
    mean.as<float>()[r] = m;
    rstd.as<float>()[r] = s;
  }
}

void CpuOps::layernorm_backward(Tensor& dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                const Tensor& inp, const Tensor& weight, const Tensor& mean,
                                const Tensor& rstd, bool accumulate) {
  const auto [n, c] = check_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  const float* mu = mean.as<float>();
  const float* rs = rstd.as<float>();
  // Parameter gradients first (column blocks per thread, rows in order: deterministic), since
  // dinp may alias dout.
  if (dweight || dbias) {
    for_column_blocks(n, c, [&](std::int64_t o, std::int64_t len) {
      float accw[kChunk], accb[kChunk], bx[kChunk], bg[kChunk];
      std::fill(accw, accw + len, 0.0f);
      std::fill(accb, accb + len, 0.0f);
      for (std::int64_t r = 0; r < n; ++r) {
        const float* x = read_f32(inp, r * c + o, len, bx);
        const float* g = read_f32(dout, r * c + o, len, bg);
        for (std::int64_t j = 0; j < len; ++j) {
          accw[j] += (x[j] - mu[r]) * rs[r] * g[j];
          accb[j] += g[j];
        }
      }
      if (dweight) store_param_grad(*dweight, o, len, accw, accumulate);
      if (dbias) store_param_grad(*dbias, o, len, accb, accumulate);
    });
  }
#pragma omp parallel for schedule(static) if (n * c >= kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    float bx[kChunk], bg[kChunk], bw[kChunk], bo[kChunk];
    const std::int64_t base = r * c;
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      const float* x = read_f32(inp, base + o, len, bx);
      const float* g = read_f32(dout, base + o, len, bg);
      const float* w = read_f32(weight, o, len, bw);
      double a = 0.0, b = 0.0;
      vec::layernorm_backward_sums(x, g, w, mu[r], rs[r], len, a, b);
      dnorm_mean += a;
      dnorm_norm_mean += b;
    }
    const float dm = static_cast<float>(dnorm_mean / static_cast<double>(c));
    const float dnm = static_cast<float>(dnorm_norm_mean / static_cast<double>(c));
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      const float* x = read_f32(inp, base + o, len, bx);
      const float* g = read_f32(dout, base + o, len, bg);
      const float* w = read_f32(weight, o, len, bw);
      float* y = dest_f32(dinp, base + o, bo);
      for (std::int64_t j = 0; j < len; ++j) {
        const float norm = (x[j] - mu[r]) * rs[r];
        y[j] = (w[j] * g[j] - dm - norm * dnm) * rs[r];
      }
      write_f32(dinp, base + o, len, y);
    }
  }
}

void CpuOps::softmax_forward(Tensor& out, const Tensor& inp) {
  const RowDims dims = check_softmax_forward(out, inp);
  const std::int64_t n = dims.rows, c = dims.c;
#pragma omp parallel for schedule(static) if (n * c >= kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    float bx[kChunk], bo[kChunk];
    const std::int64_t base = r * c;
    float mx = -INFINITY;
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      mx = std::max(mx, vec::max(read_f32(inp, base + o, len, bx), len));
    }
    // An F32 out keeps the exps (out may alias inp: each is written where it was read), so
    // the last pass only scales; a 16-bit one recomputes them.
    const bool keep = out.dtype() == DType::F32;
    double sum = 0.0;
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      sum += vec::exp_sum(read_f32(inp, base + o, len, bx), mx,
                          keep ? out.as<float>() + base + o : nullptr, len);
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      float* y = dest_f32(out, base + o, bo);
      if (!keep) vec::exp_shifted(read_f32(inp, base + o, len, bx), mx, y, len);
      vec::scale(y, inv, y, len);
      write_f32(out, base + o, len, y);
    }
  }
}

void CpuOps::softmax_backward(Tensor& dinp, const Tensor& dout, const Tensor& out) {
  const RowDims dims = check_softmax_backward(dinp, dout, out);
  const std::int64_t n = dims.rows, c = dims.c;
#pragma omp parallel for schedule(static) if (n * c >= kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    float bg[kChunk], by[kChunk], bo[kChunk];
    const std::int64_t base = r * c;
    double dot = 0.0;
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      const float* g = read_f32(dout, base + o, len, bg);
      const float* y = read_f32(out, base + o, len, by);
      for (std::int64_t j = 0; j < len; ++j) dot += g[j] * y[j];
    }
    const float d = static_cast<float>(dot);
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      const float* g = read_f32(dout, base + o, len, bg);
      const float* y = read_f32(out, base + o, len, by);
      float* dx = dest_f32(dinp, base + o, bo);
      for (std::int64_t j = 0; j < len; ++j) dx[j] = y[j] * (g[j] - d);
      write_f32(dinp, base + o, len, dx);
    }
  }
}

// RMSNorm: the layout of layer-norm above without the mean and bias. x·rstd is rounded to inp's
// dtype before the weight multiplies it (HF's LlamaRMSNorm), hence round_f32 on each chunk;
// unit_offset (Gemma2RMSNorm) multiplies the unrounded x·rstd by 1 + w instead.
void CpuOps::rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                             float eps, bool unit_offset) {
  const auto [n, c] = check_rmsnorm_forward(out, rstd, inp, weight);
  if (c == 0) return;
#pragma omp parallel for schedule(static) if (n * c >= kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    float bx[kChunk], bw[kChunk], bo[kChunk], norm[kChunk];
    const std::int64_t base = r * c;
    double ss = 0.0;
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      const float* x = read_f32(inp, base + o, len, bx);
      for (std::int64_t j = 0; j < len; ++j) ss += static_cast<double>(x[j]) * x[j];
    }
    const float s = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + eps));
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      const float* x = read_f32(inp, base + o, len, bx);
      const float* w = read_f32(weight, o, len, bw);
      for (std::int64_t j = 0; j < len; ++j) norm[j] = x[j] * s;
      float* y = dest_f32(out, base + o, bo);
      if (unit_offset) {
        for (std::int64_t j = 0; j < len; ++j) y[j] = norm[j] * (1.0f + w[j]);
      } else {
        round_f32(norm, len, inp.dtype());
        for (std::int64_t j = 0; j < len; ++j) y[j] = w[j] * norm[j];
      }
      write_f32(out, base + o, len, y);
    }
    rstd.as<float>()[r] = s;
  }
}

void CpuOps::rmsnorm_backward(Tensor& dinp, Tensor* dweight, const Tensor& dout, const Tensor& inp,
                              const Tensor& weight, const Tensor& rstd, bool accumulate,
                              bool unit_offset) {
  const float off = unit_offset ? 1.0f : 0.0f;  // the weight is off + w
  const auto [n, c] = check_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd);
  const float* rs = rstd.as<float>();
  // The weight gradient first (column blocks per thread, rows in order: deterministic), since
  // dinp may alias dout.
  if (dweight) {
    for_column_blocks(n, c, [&](std::int64_t o, std::int64_t len) {
      float acc[kChunk], bx[kChunk], bg[kChunk], norm[kChunk];
      std::fill(acc, acc + len, 0.0f);
      for (std::int64_t r = 0; r < n; ++r) {
        const float* x = read_f32(inp, r * c + o, len, bx);
        const float* g = read_f32(dout, r * c + o, len, bg);
        for (std::int64_t j = 0; j < len; ++j) norm[j] = x[j] * rs[r];
        if (!unit_offset) round_f32(norm, len, inp.dtype());
        for (std::int64_t j = 0; j < len; ++j) acc[j] += g[j] * norm[j];
      }
      store_param_grad(*dweight, o, len, acc, accumulate);
    });
  }
  // dx = rstd · (w·g − n · mean(w·g·n)), n = x·rstd.
#pragma omp parallel for schedule(static) if (n * c >= kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    float bx[kChunk], bg[kChunk], bw[kChunk], bo[kChunk];
    const std::int64_t base = r * c;
    double dot = 0.0;
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      const float* x = read_f32(inp, base + o, len, bx);
      const float* g = read_f32(dout, base + o, len, bg);
      const float* w = read_f32(weight, o, len, bw);
      for (std::int64_t j = 0; j < len; ++j) dot += (off + w[j]) * g[j] * (x[j] * rs[r]);
    }
    const float m = static_cast<float>(dot / static_cast<double>(c));
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      const float* x = read_f32(inp, base + o, len, bx);
      const float* g = read_f32(dout, base + o, len, bg);
      const float* w = read_f32(weight, o, len, bw);
      float* y = dest_f32(dinp, base + o, bo);
      for (std::int64_t j = 0; j < len; ++j)
        y[j] = ((off + w[j]) * g[j] - x[j] * rs[r] * m) * rs[r];
      write_f32(dinp, base + o, len, y);
    }
  }
}

}  // namespace memtrade::cpu
