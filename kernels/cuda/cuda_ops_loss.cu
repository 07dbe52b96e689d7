// Token/position embeddings, cross-entropy, and reading a sum back to the host.
//
// The CPU backend validates token and target ids on the host; here they live in device memory
// and checking them would cost a device-to-host copy and a sync per call, so instead an
// out-of-range token makes its embedding row NaN, and a target >= V makes its loss and gradient
// row NaN (the trainer's non-finite-loss check then reports it). Targets < 0 are ignored (loss
// 0, no gradient), as on the CPU and as torch's ignore_index.
//
// dwte is accumulated deterministically without atomics and without a full fp32 copy: positions
// are sorted by token (stable CUB radix sort, so equal tokens keep position order) and one block
// per distinct token sums its rows in position order — the CPU backend's grouping exactly, with
// its (B·T) i32 `order` scratch (Category::temporaries); the sort's own buffers are workspace.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace memtrade::cuda {
namespace {

template <typename TO, typename TW>
__global__ void embedding_fwd_kernel(TO* out, const std::int32_t* tokens, const TW* wte, AnyIn wpe,
                                     std::int64_t bt, std::int64_t t_len, std::int64_t c,
                                     std::int64_t vocab) {
  const std::int64_t n = bt * c;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const std::int64_t row = i / c, j = i % c;
    const std::int32_t tok = tokens[row];
    // A negative token is no row (vocabulary parallelism: another rank's token).
    const float e = tok < 0 ? 0.0f : tok < vocab ? to_f(wte[tok * c + j]) : NAN;
    out[i] = from_f<TO>(wpe.p ? e + wpe[(row % t_len) * c + j] : e);  // wpe.p null: no positions
  }
}

// dwpe[t, j] (+)= Σ_b dout[b, t, j], b in order.
template <typename TG>
__global__ void dwpe_kernel(AnyOut dwpe, const TG* dout, std::int64_t batch, std::int64_t t_len,
                            std::int64_t c, bool accumulate) {
  const std::int64_t n = t_len * c;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    float acc = accumulate ? dwpe.load(i) : 0.0f;
    for (std::int64_t b = 0; b < batch; ++b) acc += to_f(dout[b * n + i]);
    dwpe.store(i, acc);
  }
}

__global__ void iota_kernel(std::int32_t* p, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    p[i] = static_cast<std::int32_t>(i);
}

// Block s owns the group of equal sorted tokens that starts at s (others exit at once).
template <typename TG>
__global__ void dwte_kernel(AnyOut dwte, const TG* dout, const std::int32_t* keys,
                            const std::int32_t* positions, std::int64_t bt, std::int64_t c,
                            std::int64_t vocab) {
  const std::int64_t s = blockIdx.x;
  const std::int32_t tok = keys[s];
  if ((s > 0 && keys[s - 1] == tok) || tok < 0 || tok >= vocab) return;
  __shared__ std::int64_t end;
  if (threadIdx.x == 0) {
    std::int64_t e = s + 1;
    while (e < bt && keys[e] == tok) ++e;
    end = e;
  }
  __syncthreads();
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const std::int64_t o = tok * c + j;
    float acc = dwte.load(o);  // zeroed first unless accumulating
    for (std::int64_t i = s; i < end; ++i) acc += to_f(dout[positions[i] * c + j]);
    dwte.store(o, acc);
  }
}

// A warp's pass over one row of v logits: its max and Σ exp(x − max), on every lane.
template <typename TL>
__device__ float2 row_max_sumexp(const TL* x, std::int64_t v, int lane) {
  float mx = -INFINITY;
  for (std::int64_t j = lane; j < v; j += 32) mx = fmaxf(mx, to_f(x[j]));
  mx = warp_max(mx);
  float sum = 0.0f;
  for (std::int64_t j = lane; j < v; j += 32) sum += expf(to_f(x[j]) - mx);
  return make_float2(mx, warp_sum(sum));
}

// One warp per row: loss = log Σ exp(x − max) + max − x[target].
template <typename TL>
__global__ void crossentropy_fwd_kernel(float* losses, const TL* logits,
                                        const std::int32_t* targets, std::int64_t rows,
                                        std::int64_t v) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
       r < rows; r += static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32)) {
    const std::int32_t tg = targets[r];
    if (tg < 0) {
      if (lane == 0) losses[r] = 0.0f;
      continue;
    }
    const TL* x = logits + r * v;
    const float2 ms = row_max_sumexp(x, v, lane);
    if (lane == 0) losses[r] = tg < v ? logf(ms.y) + ms.x - to_f(x[tg]) : NAN;
  }
}

template <typename TD, typename TL>
__global__ void crossentropy_bwd_kernel(TD* dlogits, const TL* logits, const std::int32_t* targets,
                                        std::int64_t rows, std::int64_t v, float dloss) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
       r < rows; r += static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32)) {
    const std::int32_t tg = targets[r];
    const TL* x = logits + r * v;
    TD* y = dlogits + r * v;
    if (tg < 0) {
      for (std::int64_t j = lane; j < v; j += 32) y[j] = from_f<TD>(0.0f);
      continue;
    }
    const float2 ms = row_max_sumexp(x, v, lane);
    const float mx = ms.x, inv = tg < v ? 1.0f / ms.y : NAN;
    // Each element is read before it is written by the same thread: dlogits may alias logits.
    for (std::int64_t j = lane; j < v; j += 32) {
      const float onehot = j == tg ? 1.0f : 0.0f;
      y[j] = from_f<TD>((expf(to_f(x[j]) - mx) * inv - onehot) * dloss);
    }
  }
}

// ---- vocabulary parallelism ----

__global__ void vocab_local_tokens_kernel(std::int32_t* local, const std::int32_t* tokens,
                                          std::int64_t n, std::int64_t offset, std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const std::int64_t t = static_cast<std::int64_t>(tokens[i]) - offset;
    local[i] = t >= 0 && t < count ? static_cast<std::int32_t>(t) : -1;
  }
}

// One warp per row: max, Σ exp(x − max) and the local target's logit.
template <typename TL>
__global__ void vocab_ce_stats_kernel(float* stats, const TL* logits, const std::int32_t* targets,
                                      std::int64_t rows, std::int64_t v, std::int64_t offset) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
       r < rows; r += static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32)) {
    const std::int32_t tg = targets[r];
    if (tg < 0) {
      if (lane == 0) stats[3 * r] = stats[3 * r + 1] = stats[3 * r + 2] = 0.0f;
      continue;
    }
    const TL* x = logits + r * v;
    const float2 ms = row_max_sumexp(x, v, lane);
    if (lane == 0) {
      const std::int64_t t = static_cast<std::int64_t>(tg) - offset;
      stats[3 * r] = ms.x;
      stats[3 * r + 1] = ms.y;
      stats[3 * r + 2] = t >= 0 && t < v ? to_f(x[t]) : 0.0f;
    }
  }
}

__global__ void vocab_ce_combine_kernel(float* losses, float* lse, const float* stats,
                                        const std::int32_t* targets, std::int64_t rows,
                                        std::int64_t ranks) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += stride) {
    if (targets[r] < 0) {
      losses[r] = lse[r] = 0.0f;
      continue;
    }
    float mx = -INFINITY;
    for (std::int64_t k = 0; k < ranks; ++k) mx = fmaxf(mx, stats[(k * rows + r) * 3]);
    double sum = 0.0, xt = 0.0;
    for (std::int64_t k = 0; k < ranks; ++k) {
      const float* s = stats + (k * rows + r) * 3;
      sum += static_cast<double>(s[1]) * exp(static_cast<double>(s[0]) - mx);
      xt += s[2];
    }
    const double l = log(sum) + mx;
    lse[r] = static_cast<float>(l);
    losses[r] = static_cast<float>(l - xt);
  }
}

template <typename TD, typename TL>
__global__ void vocab_ce_bwd_kernel(TD* dlogits, const TL* logits, const std::int32_t* targets,
                                    const float* lse, std::int64_t rows, std::int64_t v,
                                    std::int64_t offset, float dloss) {
  const std::int64_t n = rows * v;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const std::int64_t r = i / v, j = i % v;
    const std::int32_t tg = targets[r];
    if (tg < 0) {
      dlogits[i] = from_f<TD>(0.0f);
      continue;
    }
    const float onehot = j == static_cast<std::int64_t>(tg) - offset ? 1.0f : 0.0f;
    dlogits[i] = from_f<TD>(expf(to_f(logits[i]) - lse[r]) * dloss - onehot * dloss);
  }
}

// Sums in double: per-block partials, then one block adds them in order (deterministic).
constexpr int kSumBlocks = 256;
constexpr int kSumThreads = 512;

template <typename T>
__device__ __forceinline__ double load_d(const T* p, std::int64_t i) {
  if constexpr (std::is_same_v<T, std::int32_t>) {
    return static_cast<double>(p[i]);
  } else {
    return static_cast<double>(to_f(p[i]));
  }
}

template <typename T>
__global__ void sum_partials_kernel(double* partials, const T* x, std::int64_t n) {
  __shared__ double shared[32];
  double acc = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    acc += load_d(x, i);
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_final_kernel(double* out, const double* partials, int n) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *out = acc;
}

}  // namespace

void CudaOps::embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte,
                                const Tensor* wpe) {
  NvtxRange range("embedding_forward");
  constexpr std::string_view op = "embedding_forward";
  check_float(op, "out", out);
  check_i32(op, "tokens", tokens);
  check_embedding_shapes(op, out, tokens, &wte, wpe);
  const std::int64_t bt = tokens.numel(), t_len = tokens.dim(1), c = out.dim(2);
  if (bt * c == 0) return;
  dispatch_float(out.dtype(), op, [&](auto o) {
    dispatch_float(wte.dtype(), op, [&](auto w) {
      using TO = decltype(o);
      using TW = decltype(w);
      embedding_fwd_kernel<TO, TW><<<grid_for(bt * c), kThreads, 0, stream_>>>(
          out.as<TO>(), tokens.as<std::int32_t>(), wte.as<TW>(),
          AnyIn{wpe ? wpe->data() : nullptr, wpe ? wpe->dtype() : DType::F32}, bt, t_len, c,
          wte.dim(0));
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::embedding_backward(Tensor* dwte, Tensor* dwpe, const Tensor& dout,
                                 const Tensor& tokens, bool accumulate) {
  NvtxRange range("embedding_backward");
  constexpr std::string_view op = "embedding_backward";
  check_float(op, "dout", dout);
  check_i32(op, "tokens", tokens);
  check_embedding_shapes(op, dout, tokens, dwte, dwpe);
  const std::int64_t bt = tokens.numel(), t_len = tokens.dim(1), c = dout.dim(2);
  if (dwpe) {  // rows t >= T get nothing (zeroed unless accumulating)
    if (!accumulate) fill(*dwpe, 0.0f);
    if (t_len * c > 0) {
      dispatch_float(dout.dtype(), op, [&](auto g) {
        using TG = decltype(g);
        dwpe_kernel<TG><<<grid_for(t_len * c), kThreads, 0, stream_>>>(
            AnyOut{dwpe->data(), dwpe->dtype()}, dout.as<TG>(), tokens.dim(0), t_len, c, true);
        CUDA_CHECK_LAUNCH();
      });
    }
  }
  if (dwte) {
    if (!accumulate) fill(*dwte, 0.0f);
    if (bt == 0 || c == 0) return;
    if (bt > INT32_MAX) fail(op, "more than 2^31 tokens");
    CachingAllocator& alloc = *dwte->allocator();
    Tensor order(alloc, {bt}, DType::I32, Category::temporaries);  // positions, then sorted
    Tensor keys(alloc, {bt}, DType::I32, Category::workspace);
    Tensor positions(alloc, {bt}, DType::I32, Category::workspace);
    iota_kernel<<<grid_for(bt), kThreads, 0, stream_>>>(order.as<std::int32_t>(), bt);
    CUDA_CHECK_LAUNCH();
    const int items = static_cast<int>(bt);
    std::size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, temp_bytes, tokens.as<std::int32_t>(), keys.as<std::int32_t>(),
        order.as<std::int32_t>(), positions.as<std::int32_t>(), items, 0, 32, stream_));
    Tensor temp(alloc, {static_cast<std::int64_t>(temp_bytes / 4 + 1)}, DType::I32,
                Category::workspace);
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        temp.data(), temp_bytes, tokens.as<std::int32_t>(), keys.as<std::int32_t>(),
        order.as<std::int32_t>(), positions.as<std::int32_t>(), items, 0, 32, stream_));
    dispatch_float(dout.dtype(), op, [&](auto g) {
      using TG = decltype(g);
      dwte_kernel<TG><<<static_cast<unsigned>(bt), 128, 0, stream_>>>(
          AnyOut{dwte->data(), dwte->dtype()}, dout.as<TG>(), keys.as<std::int32_t>(),
          positions.as<std::int32_t>(), bt, c, dwte->dim(0));
      CUDA_CHECK_LAUNCH();
    });
  }
}

void CudaOps::crossentropy_forward(Tensor& losses, const Tensor& logits, const Tensor& targets) {
  NvtxRange range("crossentropy_forward");
  constexpr std::string_view op = "crossentropy_forward";
  const std::int64_t n = check_ce(op, logits, targets);
  check_float(op, "losses", losses);
  if (losses.numel() != n)
    fail(op,
         "losses " + shape_str(losses.shape()) + " must have " + std::to_string(n) + " elements");
  if (losses.dtype() != DType::F32) fail(op, "losses must be F32");
  if (n == 0) return;
  const std::int64_t v = logits.dim(-1);
  dispatch_float(logits.dtype(), op, [&](auto l) {
    using TL = decltype(l);
    crossentropy_fwd_kernel<TL><<<grid_for_rows(n), kThreads, 0, stream_>>>(
        losses.as<float>(), logits.as<TL>(), targets.as<std::int32_t>(), n, v);
    CUDA_CHECK_LAUNCH();
  });
}

void CudaOps::crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                    float dloss) {
  NvtxRange range("crossentropy_backward");
  constexpr std::string_view op = "crossentropy_backward";
  const std::int64_t n = check_ce(op, logits, targets);
  check_float(op, "dlogits", dlogits);
  check_shape(op, "dlogits", dlogits, logits.shape());
  if (n == 0) return;
  const std::int64_t v = logits.dim(-1);
  dispatch_float(dlogits.dtype(), op, [&](auto d) {
    dispatch_float(logits.dtype(), op, [&](auto l) {
      using TD = decltype(d);
      using TL = decltype(l);
      crossentropy_bwd_kernel<TD, TL><<<grid_for_rows(n), kThreads, 0, stream_>>>(
          dlogits.as<TD>(), logits.as<TL>(), targets.as<std::int32_t>(), n, v, dloss);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::vocab_local_tokens(Tensor& local, const Tensor& tokens, std::int64_t offset,
                                 std::int64_t count) {
  NvtxRange range("vocab_local_tokens");
  constexpr std::string_view op = "vocab_local_tokens";
  check_i32(op, "tokens", tokens);
  check_i32(op, "local", local);
  check_shape(op, "local", local, tokens.shape());
  const std::int64_t n = tokens.numel();
  if (n == 0) return;
  vocab_local_tokens_kernel<<<grid_for(n), kThreads, 0, stream_>>>(
      local.as<std::int32_t>(), tokens.as<std::int32_t>(), n, offset, count);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::vocab_crossentropy_stats(Tensor& stats, const Tensor& logits, const Tensor& targets,
                                       std::int64_t offset) {
  NvtxRange range("vocab_crossentropy_stats");
  constexpr std::string_view op = "vocab_crossentropy_stats";
  const std::int64_t n = check_ce(op, logits, targets);
  if (stats.dtype() != DType::F32 || stats.numel() != 3 * n) fail(op, "stats must be (N, 3) F32");
  if (n == 0) return;
  const std::int64_t v = logits.dim(-1);
  dispatch_float(logits.dtype(), op, [&](auto l) {
    using TL = decltype(l);
    vocab_ce_stats_kernel<TL><<<grid_for_rows(n), kThreads, 0, stream_>>>(
        stats.as<float>(), logits.as<TL>(), targets.as<std::int32_t>(), n, v, offset);
    CUDA_CHECK_LAUNCH();
  });
}

void CudaOps::vocab_crossentropy_combine(Tensor& losses, Tensor& lse, const Tensor& stats,
                                         const Tensor& targets) {
  NvtxRange range("vocab_crossentropy_combine");
  constexpr std::string_view op = "vocab_crossentropy_combine";
  check_i32(op, "targets", targets);
  const std::int64_t n = targets.numel();
  if (losses.dtype() != DType::F32 || lse.dtype() != DType::F32 || stats.dtype() != DType::F32 ||
      losses.numel() != n || lse.numel() != n || n == 0 || stats.numel() % (3 * n) != 0)
    fail(op, "losses, lse (N) and stats (R, N, 3) must be F32 and fit the targets");
  vocab_ce_combine_kernel<<<grid_for(n), kThreads, 0, stream_>>>(
      losses.as<float>(), lse.as<float>(), stats.as<float>(), targets.as<std::int32_t>(), n,
      stats.numel() / (3 * n));
  CUDA_CHECK_LAUNCH();
}

void CudaOps::vocab_crossentropy_backward(Tensor& dlogits, const Tensor& logits,
                                          const Tensor& targets, const Tensor& lse,
                                          std::int64_t offset, float dloss) {
  NvtxRange range("vocab_crossentropy_backward");
  constexpr std::string_view op = "vocab_crossentropy_backward";
  const std::int64_t n = check_ce(op, logits, targets);
  check_float(op, "dlogits", dlogits);
  check_shape(op, "dlogits", dlogits, logits.shape());
  if (lse.dtype() != DType::F32 || lse.numel() != n) fail(op, "lse must be (N) F32");
  if (n == 0) return;
  const std::int64_t v = logits.dim(-1);
  dispatch_float(dlogits.dtype(), op, [&](auto d) {
    dispatch_float(logits.dtype(), op, [&](auto l) {
      using TD = decltype(d);
      using TL = decltype(l);
      vocab_ce_bwd_kernel<TD, TL><<<grid_for(n * v), kThreads, 0, stream_>>>(
          dlogits.as<TD>(), logits.as<TL>(), targets.as<std::int32_t>(), lse.as<float>(), n, v,
          offset, dloss);
      CUDA_CHECK_LAUNCH();
    });
  });
}

double CudaOps::sum_to_host(const Tensor& t) {
  NvtxRange range("sum_to_host");
  if (!t.defined()) fail("sum_to_host", "tensor is undefined");
  const std::int64_t n = t.numel();
  if (n == 0) return 0.0;
  auto* partials = static_cast<double*>(small_scratch());
  double* result = partials + kSumBlocks;
  const auto blocks = static_cast<unsigned>(
      std::min<std::int64_t>(kSumBlocks, (n + kSumThreads - 1) / kSumThreads));
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    sum_partials_kernel<T><<<blocks, kSumThreads, 0, stream_>>>(partials, t.as<T>(), n);
    CUDA_CHECK_LAUNCH();
  };
  if (t.dtype() == DType::I32) {
    launch(std::int32_t{});
  } else {
    dispatch_float(t.dtype(), "sum_to_host", launch);
  }
  sum_final_kernel<<<1, kSumThreads, 0, stream_>>>(result, partials, static_cast<int>(blocks));
  CUDA_CHECK_LAUNCH();
  double host = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host;
}

}  // namespace memtrade::cuda
