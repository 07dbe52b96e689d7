// Layer-norm, RMSNorm, row softmax (plain and causal, for attention) and column sums. One warp per
// row: rows are short enough (C, T, V up to tens of thousands) that a warp streaming them from L2
// is bandwidth-bound already, and warp shuffles need no shared memory. Statistics are fp32.
// Parameter gradients are column reductions in which one block owns 32 columns and walks all
// rows in a fixed order: deterministic, no atomics. The plain column sum (linear's bias gradient)
// also splits long columns into row chunks, since ceil(C / 32) blocks alone leave most SMs idle.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace memtrade::cuda {
namespace {

// Row loop for one warp per row: calls f(row) with the warp's rows.
#define MEMTRADE_FOR_WARP_ROWS(r, rows)                                                \
  for (std::int64_t r =                                                                \
           blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32; \
       r < (rows); r += static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32))

template <typename TO, typename TI>
__global__ void layernorm_fwd_kernel(TO* out, float* mean, float* rstd, const TI* inp, AnyIn w,
                                     AnyIn b, std::int64_t rows, std::int64_t c, float eps) {
  const int lane = threadIdx.x % 32;
  MEMTRADE_FOR_WARP_ROWS(r, rows) {
    const TI* x = inp + r * c;
    // Statistics in double, as on the CPU: an fp32 mean of rows far from zero (an offset of
    // 100 at C = 768) puts the normalised output several ulps off.
    double sum = 0.0;
    for (std::int64_t j = lane; j < c; j += 32) sum += to_f(x[j]);
    const double md = warp_sum(sum) / static_cast<double>(c);
    double ss = 0.0;
    for (std::int64_t j = lane; j < c; j += 32) {
      const double d = to_f(x[j]) - md;
      ss += d * d;
    }
    const float m = static_cast<float>(md);
    const float s = static_cast<float>(1.0 / sqrt(warp_sum(ss) / static_cast<double>(c) + eps));
    TO* y = out + r * c;
    for (std::int64_t j = lane; j < c; j += 32)
      y[j] = from_f<TO>((to_f(x[j]) - m) * s * w[j] + b[j]);
    if (lane == 0) {
      mean[r] = m;
      rstd[r] = s;
    }
  }
}

template <typename TD, typename TG, typename TI>
__global__ void layernorm_bwd_kernel(TD* dinp, const TG* dout, const TI* inp, AnyIn w,
                                     const float* mean, const float* rstd, std::int64_t rows,
                                     std::int64_t c) {
  const int lane = threadIdx.x % 32;
  MEMTRADE_FOR_WARP_ROWS(r, rows) {
    const TG* g = dout + r * c;
    const TI* x = inp + r * c;
    const float mu = mean[r], rs = rstd[r];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (std::int64_t j = lane; j < c; j += 32) {
      const float dnorm = w[j] * to_f(g[j]);
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (to_f(x[j]) - mu) * rs;
    }
    const float dm = warp_sum(dnorm_mean) / static_cast<float>(c);
    const float dnm = warp_sum(dnorm_norm_mean) / static_cast<float>(c);
    TD* dx = dinp + r * c;
    for (std::int64_t j = lane; j < c; j += 32) {
      const float norm = (to_f(x[j]) - mu) * rs;
      dx[j] = from_f<TD>((w[j] * to_f(g[j]) - dm - norm * dnm) * rs);
    }
  }
}

// Column reductions: block (32, kColRows) owns 32 columns; thread (x, y) sums rows y, y + kColRows,
// ... of column x, then the kColRows partials are summed in shared memory.
constexpr int kColRows = 16;

template <typename TG, typename TI>
__global__ void layernorm_param_grad_kernel(AnyOut dweight, AnyOut dbias, const TG* dout,
                                            const TI* inp, const float* mean, const float* rstd,
                                            std::int64_t rows, std::int64_t c, bool accumulate) {
  __shared__ float sw[kColRows][33];
  __shared__ float sb[kColRows][33];
  const std::int64_t col = blockIdx.x * 32 + threadIdx.x;
  float aw = 0.0f, ab = 0.0f;
  if (col < c) {
    for (std::int64_t r = threadIdx.y; r < rows; r += kColRows) {
      const float g = to_f(dout[r * c + col]);
      aw += (to_f(inp[r * c + col]) - mean[r]) * rstd[r] * g;
      ab += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float tw = 0.0f, tb = 0.0f;
    for (int y = 0; y < kColRows; ++y) {
      tw += sw[y][threadIdx.x];
      tb += sb[y][threadIdx.x];
    }
    if (dweight.p) dweight.store(col, (accumulate ? dweight.load(col) : 0.0f) + tw);
    if (dbias.p) dbias.store(col, (accumulate ? dbias.load(col) : 0.0f) + tb);
  }
}

// dweight (+)= Σ_rows dout · (x·rstd rounded to inp's dtype), layer-norm's column scheme.
template <typename TG, typename TI>
__global__ void rmsnorm_param_grad_kernel(AnyOut dweight, const TG* dout, const TI* inp,
                                          const float* rstd, std::int64_t rows, std::int64_t c,
                                          bool accumulate, bool unit_offset) {
  __shared__ float sw[kColRows][33];
  const std::int64_t col = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < c) {
    for (std::int64_t r = threadIdx.y; r < rows; r += kColRows) {
      const float raw = to_f(inp[r * c + col]) * rstd[r];  // unrounded with unit_offset
      const float norm = unit_offset ? raw : to_f(from_f<TI>(raw));
      acc += to_f(dout[r * c + col]) * norm;
    }
  }
  sw[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float t = 0.0f;
    for (int y = 0; y < kColRows; ++y) t += sw[y][threadIdx.x];
    dweight.store(col, (accumulate ? dweight.load(col) : 0.0f) + t);
  }
}

template <typename TS>
__global__ void col_sum_kernel(AnyOut dst, const TS* src, std::int64_t rows, std::int64_t cols,
                               bool accumulate) {
  __shared__ float s[kColRows][33];
  const std::int64_t col = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < cols)
    for (std::int64_t r = threadIdx.y; r < rows; r += kColRows) acc += to_f(src[r * cols + col]);
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float t = 0.0f;
    for (int y = 0; y < kColRows; ++y) t += s[y][threadIdx.x];
    dst.store(col, (accumulate ? dst.load(col) : 0.0f) + t);
  }
}

// Pass 1 of the chunked column sum: block (x, y) sums rows [y·rows_per_chunk, ...) of its 32
// columns into partial[y·cols + col].
template <typename TS>
__global__ void col_sum_partial_kernel(float* partial, const TS* src, std::int64_t rows,
                                       std::int64_t cols, std::int64_t rows_per_chunk) {
  __shared__ float s[kColRows][33];
  const std::int64_t col = blockIdx.x * 32 + threadIdx.x;
  const std::int64_t r0 = blockIdx.y * rows_per_chunk;
  const std::int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc = 0.0f;
  if (col < cols)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) acc += to_f(src[r * cols + col]);
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float t = 0.0f;
    for (int y = 0; y < kColRows; ++y) t += s[y][threadIdx.x];
    partial[blockIdx.y * cols + col] = t;
  }
}

// Pass 2: the chunks of each column in order.
__global__ void col_sum_finish_kernel(AnyOut dst, const float* partial, int chunks,
                                      std::int64_t cols, bool accumulate) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float t = 0.0f;
    for (int k = 0; k < chunks; ++k) t += partial[k * cols + c];
    dst.store(c, (accumulate ? dst.load(c) : 0.0f) + t);
  }
}

template <typename TO, typename TI>
__global__ void softmax_fwd_kernel(TO* out, const TI* inp, std::int64_t rows, std::int64_t c) {
  const int lane = threadIdx.x % 32;
  MEMTRADE_FOR_WARP_ROWS(r, rows) {
    const TI* x = inp + r * c;
    float mx = -INFINITY;
    for (std::int64_t j = lane; j < c; j += 32) mx = fmaxf(mx, to_f(x[j]));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (std::int64_t j = lane; j < c; j += 32) sum += expf(to_f(x[j]) - mx);
    const float inv = 1.0f / warp_sum(sum);
    TO* y = out + r * c;
    for (std::int64_t j = lane; j < c; j += 32) y[j] = from_f<TO>(expf(to_f(x[j]) - mx) * inv);
  }
}

template <typename TD, typename TG, typename TY>
__global__ void softmax_bwd_kernel(TD* dinp, const TG* dout, const TY* out, std::int64_t rows,
                                   std::int64_t c) {
  const int lane = threadIdx.x % 32;
  MEMTRADE_FOR_WARP_ROWS(r, rows) {
    const TG* g = dout + r * c;
    const TY* y = out + r * c;
    float dot = 0.0f;
    for (std::int64_t j = lane; j < c; j += 32) dot += to_f(g[j]) * to_f(y[j]);
    dot = warp_sum(dot);
    TD* dx = dinp + r * c;
    for (std::int64_t j = lane; j < c; j += 32) dx[j] = from_f<TD>(to_f(y[j]) * (to_f(g[j]) - dot));
  }
}

// Row r is query position t = r % len of its (b, h) slice: keys 0..t are live. p32, when not
// null, also receives the probabilities unrounded (HF's softmax(..., dtype=torch.float32)).
template <typename T>
__global__ void causal_softmax_kernel(T* att, float* p32, std::int64_t rows, std::int64_t len) {
  const int lane = threadIdx.x % 32;
  MEMTRADE_FOR_WARP_ROWS(r, rows) {
    T* row = att + r * len;
    const std::int64_t t = r % len;
    float mx = -INFINITY;
    for (std::int64_t j = lane; j <= t; j += 32) mx = fmaxf(mx, to_f(row[j]));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (std::int64_t j = lane; j <= t; j += 32) sum += expf(to_f(row[j]) - mx);
    const float inv = 1.0f / warp_sum(sum);
    for (std::int64_t j = lane; j < len; j += 32) {
      const float p = j <= t ? expf(to_f(row[j]) - mx) * inv : 0.0f;
      if (p32) p32[r * len + j] = p;
      row[j] = from_f<T>(p);
    }
  }
}

template <typename TD, typename TP>
__global__ void causal_softmax_bwd_kernel(TD* dp, const TP* p, std::int64_t rows,
                                          std::int64_t len) {
  const int lane = threadIdx.x % 32;
  MEMTRADE_FOR_WARP_ROWS(r, rows) {
    TD* d = dp + r * len;
    const TP* pr = p + r * len;
    const std::int64_t t = r % len;
    float dot = 0.0f;
    for (std::int64_t j = lane; j <= t; j += 32) dot += to_f(pr[j]) * to_f(d[j]);
    dot = warp_sum(dot);
    for (std::int64_t j = lane; j < len; j += 32)
      d[j] = from_f<TD>(j <= t ? to_f(pr[j]) * (to_f(d[j]) - dot) : 0.0f);
  }
}

// RMSNorm: layer-norm's kernels without the mean and bias; x·rstd is rounded to inp's dtype
// before the weight multiplies it (HF's LlamaRMSNorm), as on the CPU; unit_offset
// (Gemma2RMSNorm): (x·rstd)·(1 + w) in fp32, rounded once.
template <typename TO, typename TI>
__global__ void rmsnorm_fwd_kernel(TO* out, float* rstd, const TI* inp, AnyIn w, std::int64_t rows,
                                   std::int64_t c, float eps, bool unit_offset) {
  const int lane = threadIdx.x % 32;
  MEMTRADE_FOR_WARP_ROWS(r, rows) {
    const TI* x = inp + r * c;
    double ss = 0.0;  // in double, as on the CPU
    for (std::int64_t j = lane; j < c; j += 32) {
      const double v = to_f(x[j]);
      ss += v * v;
    }
    const float s = static_cast<float>(1.0 / sqrt(warp_sum(ss) / static_cast<double>(c) + eps));
    TO* y = out + r * c;
    for (std::int64_t j = lane; j < c; j += 32)
      y[j] = from_f<TO>(unit_offset ? to_f(x[j]) * s * (1.0f + w[j])
                                    : w[j] * to_f(from_f<TI>(to_f(x[j]) * s)));
    if (lane == 0) rstd[r] = s;
  }
}

template <typename TD, typename TG, typename TI>
__global__ void rmsnorm_bwd_kernel(TD* dinp, const TG* dout, const TI* inp, AnyIn w,
                                   const float* rstd, std::int64_t rows, std::int64_t c,
                                   float off) {  // the weight is off + w
  const int lane = threadIdx.x % 32;
  MEMTRADE_FOR_WARP_ROWS(r, rows) {
    const TG* g = dout + r * c;
    const TI* x = inp + r * c;
    const float rs = rstd[r];
    double dot = 0.0;
    for (std::int64_t j = lane; j < c; j += 32)
      dot += (off + w[j]) * to_f(g[j]) * (to_f(x[j]) * rs);
    const float m = static_cast<float>(warp_sum(dot) / static_cast<double>(c));
    TD* dx = dinp + r * c;
    for (std::int64_t j = lane; j < c; j += 32)
      dx[j] = from_f<TD>(((off + w[j]) * to_f(g[j]) - to_f(x[j]) * rs * m) * rs);
  }
}

#undef MEMTRADE_FOR_WARP_ROWS

unsigned col_blocks(std::int64_t cols) {
  return static_cast<unsigned>((cols + 31) / 32);
}

}  // namespace

void launch_col_sum(void* dst, DType dt, const void* src, DType st, std::int64_t rows,
                    std::int64_t cols, bool accumulate, float* scratch, std::size_t scratch_bytes,
                    cudaStream_t s) {
  if (cols == 0) return;
  // Row chunks: about two blocks per SM in all (GPT-2's C = 768 alone gives 24 blocks), at least
  // 256 rows each, and the fp32 partials (chunks x cols) within the scratch. The chunk count
  // depends on the shape and the SM count only, so the summation order is fixed for a GPU.
  const std::int64_t blocks = col_blocks(cols);
  std::int64_t chunks = (2 * static_cast<std::int64_t>(sm_count()) + blocks - 1) / blocks;
  chunks = std::min(chunks, rows / 256);
  chunks = std::min(chunks, static_cast<std::int64_t>(scratch_bytes / sizeof(float)) / cols);
  chunks = std::min<std::int64_t>(chunks, 65535);  // gridDim.y
  dispatch_float(st, "column sum", [&](auto tag) {
    using TS = decltype(tag);
    if (chunks < 2 || scratch == nullptr) {
      col_sum_kernel<TS><<<col_blocks(cols), dim3(32, kColRows), 0, s>>>(
          AnyOut{dst, dt}, static_cast<const TS*>(src), rows, cols, accumulate);
      CUDA_CHECK_LAUNCH();
      return;
    }
    const std::int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
    col_sum_partial_kernel<TS>
        <<<dim3(col_blocks(cols), static_cast<unsigned>(chunks)), dim3(32, kColRows), 0, s>>>(
            scratch, static_cast<const TS*>(src), rows, cols, rows_per_chunk);
    CUDA_CHECK_LAUNCH();
    col_sum_finish_kernel<<<grid_for(cols), kThreads, 0, s>>>(
        AnyOut{dst, dt}, scratch, static_cast<int>(chunks), cols, accumulate);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_causal_softmax(void* att, DType t, std::int64_t rows, std::int64_t len, cudaStream_t s,
                           float* p32) {
  if (rows == 0 || len == 0) return;
  dispatch_float(t, "attention softmax", [&](auto tag) {
    using T = decltype(tag);
    causal_softmax_kernel<T>
        <<<grid_for_rows(rows), kThreads, 0, s>>>(static_cast<T*>(att), p32, rows, len);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_causal_softmax_backward(void* dp, DType dpt, const void* p, DType pt, std::int64_t rows,
                                    std::int64_t len, cudaStream_t s) {
  if (rows == 0 || len == 0) return;
  dispatch_float(dpt, "attention softmax backward", [&](auto d) {
    dispatch_float(pt, "attention softmax backward", [&](auto q) {
      using TD = decltype(d);
      using TP = decltype(q);
      causal_softmax_bwd_kernel<TD, TP><<<grid_for_rows(rows), kThreads, 0, s>>>(
          static_cast<TD*>(dp), static_cast<const TP*>(p), rows, len);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                const Tensor& weight, const Tensor& bias, float eps) {
  NvtxRange range("layernorm_forward");
  constexpr std::string_view op = "layernorm_forward";
  const RowDims dims = check_layernorm_forward(out, mean, rstd, inp, weight, bias);
  const std::int64_t n = dims.rows, c = dims.c;  // plain names: the lambdas below capture them
  if (n == 0 || c == 0) return;
  dispatch_float(out.dtype(), op, [&](auto o) {
    dispatch_float(inp.dtype(), op, [&](auto x) {
      using TO = decltype(o);
      using TI = decltype(x);
      layernorm_fwd_kernel<TO, TI><<<grid_for_rows(n), kThreads, 0, stream_>>>(
          out.as<TO>(), mean.as<float>(), rstd.as<float>(), inp.as<TI>(),
          AnyIn{weight.data(), weight.dtype()}, AnyIn{bias.data(), bias.dtype()}, n, c, eps);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::layernorm_backward(Tensor& dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                 const Tensor& inp, const Tensor& weight, const Tensor& mean,
                                 const Tensor& rstd, bool accumulate) {
  NvtxRange range("layernorm_backward");
  constexpr std::string_view op = "layernorm_backward";
  const RowDims dims =
      check_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  const std::int64_t n = dims.rows, c = dims.c;  // plain names: the lambdas below capture them
  if (c == 0) return;
  // Parameter gradients first: dinp may alias dout.
  if (dweight || dbias) {
    const AnyOut dw{dweight ? dweight->data() : nullptr, dweight ? dweight->dtype() : DType::F32};
    const AnyOut db{dbias ? dbias->data() : nullptr, dbias ? dbias->dtype() : DType::F32};
    dispatch_float(dout.dtype(), op, [&](auto g) {
      dispatch_float(inp.dtype(), op, [&](auto x) {
        using TG = decltype(g);
        using TI = decltype(x);
        layernorm_param_grad_kernel<TG, TI><<<col_blocks(c), dim3(32, kColRows), 0, stream_>>>(
            dw, db, dout.as<TG>(), inp.as<TI>(), mean.as<float>(), rstd.as<float>(), n, c,
            accumulate);
        CUDA_CHECK_LAUNCH();
      });
    });
  }
  if (n == 0) return;
  dispatch_float(dinp.dtype(), op, [&](auto d) {
    dispatch_float(dout.dtype(), op, [&](auto g) {
      dispatch_float(inp.dtype(), op, [&](auto x) {
        using TD = decltype(d);
        using TG = decltype(g);
        using TI = decltype(x);
        layernorm_bwd_kernel<TD, TG, TI><<<grid_for_rows(n), kThreads, 0, stream_>>>(
            dinp.as<TD>(), dout.as<TG>(), inp.as<TI>(), AnyIn{weight.data(), weight.dtype()},
            mean.as<float>(), rstd.as<float>(), n, c);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void CudaOps::softmax_forward(Tensor& out, const Tensor& inp) {
  NvtxRange range("softmax_forward");
  constexpr std::string_view op = "softmax_forward";
  const RowDims dims = check_softmax_forward(out, inp);
  const std::int64_t n = dims.rows, c = dims.c;
  if (n == 0 || c == 0) return;
  dispatch_float(out.dtype(), op, [&](auto o) {
    dispatch_float(inp.dtype(), op, [&](auto x) {
      using TO = decltype(o);
      using TI = decltype(x);
      softmax_fwd_kernel<TO, TI>
          <<<grid_for_rows(n), kThreads, 0, stream_>>>(out.as<TO>(), inp.as<TI>(), n, c);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::softmax_backward(Tensor& dinp, const Tensor& dout, const Tensor& out) {
  NvtxRange range("softmax_backward");
  constexpr std::string_view op = "softmax_backward";
  const RowDims dims = check_softmax_backward(dinp, dout, out);
  const std::int64_t n = dims.rows, c = dims.c;
  if (n == 0 || c == 0) return;
  dispatch_float(dinp.dtype(), op, [&](auto d) {
    dispatch_float(dout.dtype(), op, [&](auto g) {
      dispatch_float(out.dtype(), op, [&](auto y) {
        using TD = decltype(d);
        using TG = decltype(g);
        using TY = decltype(y);
        softmax_bwd_kernel<TD, TG, TY><<<grid_for_rows(n), kThreads, 0, stream_>>>(
            dinp.as<TD>(), dout.as<TG>(), out.as<TY>(), n, c);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void CudaOps::rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                              float eps, bool unit_offset) {
  NvtxRange range("rmsnorm_forward");
  constexpr std::string_view op = "rmsnorm_forward";
  const RowDims dims = check_rmsnorm_forward(out, rstd, inp, weight);
  const std::int64_t n = dims.rows, c = dims.c;  // plain names: the lambdas below capture them
  if (n == 0 || c == 0) return;
  dispatch_float(out.dtype(), op, [&](auto o) {
    dispatch_float(inp.dtype(), op, [&](auto x) {
      using TO = decltype(o);
      using TI = decltype(x);
      rmsnorm_fwd_kernel<TO, TI><<<grid_for_rows(n), kThreads, 0, stream_>>>(
          out.as<TO>(), rstd.as<float>(), inp.as<TI>(), AnyIn{weight.data(), weight.dtype()}, n, c,
          eps, unit_offset);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::rmsnorm_backward(Tensor& dinp, Tensor* dweight, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& rstd, bool accumulate,
                               bool unit_offset) {
  NvtxRange range("rmsnorm_backward");
  constexpr std::string_view op = "rmsnorm_backward";
  const RowDims dims = check_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd);
  const std::int64_t n = dims.rows, c = dims.c;  // plain names: the lambdas below capture them
  if (c == 0) return;
  // The weight gradient first: dinp may alias dout.
  if (dweight) {
    dispatch_float(dout.dtype(), op, [&](auto g) {
      dispatch_float(inp.dtype(), op, [&](auto x) {
        using TG = decltype(g);
        using TI = decltype(x);
        rmsnorm_param_grad_kernel<TG, TI><<<col_blocks(c), dim3(32, kColRows), 0, stream_>>>(
            AnyOut{dweight->data(), dweight->dtype()}, dout.as<TG>(), inp.as<TI>(),
            rstd.as<float>(), n, c, accumulate, unit_offset);
        CUDA_CHECK_LAUNCH();
      });
    });
  }
  if (n == 0) return;
  dispatch_float(dinp.dtype(), op, [&](auto d) {
    dispatch_float(dout.dtype(), op, [&](auto g) {
      dispatch_float(inp.dtype(), op, [&](auto x) {
        using TD = decltype(d);
        using TG = decltype(g);
        using TI = decltype(x);
        rmsnorm_bwd_kernel<TD, TG, TI><<<grid_for_rows(n), kThreads, 0, stream_>>>(
            dinp.as<TD>(), dout.as<TG>(), inp.as<TI>(), AnyIn{weight.data(), weight.dtype()},
            rstd.as<float>(), n, c, unit_offset ? 1.0f : 0.0f);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace memtrade::cuda
