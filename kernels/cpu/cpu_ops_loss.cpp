// Token/position embeddings, cross-entropy, and reading a sum back to the host.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"

namespace memtrade::cpu {
namespace {

void check_tokens(std::string_view op, const Tensor& tokens, std::int64_t vocab) {
  check_i32(op, "tokens", tokens);
  const std::int32_t* tk = tokens.as<std::int32_t>();
  for (std::int64_t i = 0; i < tokens.numel(); ++i)
    if (tk[i] >= vocab) fail(op, "token {} at {} out of range [0, {})", tk[i], i, vocab);
}

// The shared shape checks, then the target values (readable here): targets >= V are an error;
// targets < 0 are ignored (loss 0, no gradient), as torch's ignore_index.
std::int64_t check_ce_targets(std::string_view op, const Tensor& logits, const Tensor& targets) {
  const std::int64_t n = check_ce(op, logits, targets), v = logits.dim(-1);
  const std::int32_t* tg = targets.as<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i)
    if (tg[i] >= v) fail(op, "target {} at {} out of range [0, {})", tg[i], i, v);
  return n;
}

float row_max(const Tensor& logits, std::int64_t base, std::int64_t v) {
  float buf[kChunk];
  float mx = -INFINITY;
  for (std::int64_t o = 0; o < v; o += kChunk) {
    const std::int64_t len = std::min(kChunk, v - o);
    mx = std::max(mx, vec::max(read_f32(logits, base + o, len, buf), len));
  }
  return mx;
}

// Max and Σexp(x − max) of one logits row.
void row_logsumexp(const Tensor& logits, std::int64_t base, std::int64_t v, float& mx,
                   double& sum) {
  float buf[kChunk];
  mx = row_max(logits, base, v);
  sum = 0.0;
  for (std::int64_t o = 0; o < v; o += kChunk) {
    const std::int64_t len = std::min(kChunk, v - o);
    sum += vec::exp_sum(read_f32(logits, base + o, len, buf), mx, nullptr, len);
  }
}

}  // namespace

void CpuOps::embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte,
                               const Tensor* wpe) {
  constexpr std::string_view op = "embedding_forward";
  check_float(op, "out", out);
  check_i32(op, "tokens", tokens);
  check_embedding_shapes(op, out, tokens, &wte, wpe);
  check_tokens(op, tokens, wte.dim(0));
  const std::int64_t bt = tokens.numel(), t_len = tokens.dim(1), c = out.dim(2);
  const std::int32_t* tk = tokens.as<std::int32_t>();
#pragma omp parallel for schedule(static) if (bt * c >= kParallelGrain)
  for (std::int64_t i = 0; i < bt; ++i) {
    float be[kChunk], bp[kChunk], bo[kChunk];
    for (std::int64_t o = 0; o < c; o += kChunk) {
      const std::int64_t len = std::min(kChunk, c - o);
      // A negative token is no row (vocabulary parallelism: another rank's token).
      if (tk[i] < 0) std::fill(be, be + len, 0.0f);
      const float* e = tk[i] < 0 ? be : read_f32(wte, tk[i] * c + o, len, be);
      float* y = dest_f32(out, i * c + o, bo);
      if (wpe) {
        const float* p = read_f32(*wpe, (i % t_len) * c + o, len, bp);
        for (std::int64_t j = 0; j < len; ++j) y[j] = e[j] + p[j];
      } else {
        std::copy(e, e + len, y);
      }
      write_f32(out, i * c + o, len, y);
    }
  }
}

void CpuOps::embedding_backward(Tensor* dwte, Tensor* dwpe, const Tensor& dout,
                                const Tensor& tokens, bool accumulate) {
  constexpr std::string_view op = "embedding_backward";
  check_float(op, "dout", dout);
  check_i32(op, "tokens", tokens);
  check_embedding_shapes(op, dout, tokens, dwte, dwpe);
  const std::int64_t bt = tokens.numel(), t_len = tokens.dim(1), c = dout.dim(2);
  if (dwpe) {  // dwpe[t] (+)= Σ_b dout[b, t]; rows t >= T get nothing
    if (!accumulate) fill(*dwpe, 0.0f);
    const std::int64_t batch = tokens.dim(0);
#pragma omp parallel for schedule(static) if (bt * c >= kParallelGrain)
    for (std::int64_t t = 0; t < t_len; ++t) {
      float acc[kChunk], bg[kChunk], bo[kChunk];
      for (std::int64_t o = 0; o < c; o += kChunk) {
        const std::int64_t len = std::min(kChunk, c - o);
        const float* old = read_f32(*dwpe, t * c + o, len, bo);
        std::copy(old, old + len, acc);
        for (std::int64_t b = 0; b < batch; ++b) {
          const float* g = read_f32(dout, (b * t_len + t) * c + o, len, bg);
          for (std::int64_t j = 0; j < len; ++j) acc[j] += g[j];
        }
        float* y = dest_f32(*dwpe, t * c + o, bo);
        std::copy(acc, acc + len, y);
        write_f32(*dwpe, t * c + o, len, y);
      }
    }
  }
  if (dwte) {
    check_tokens(op, tokens, dwte->dim(0));
    if (!accumulate) fill(*dwte, 0.0f);
    // Group positions by token (sorted by (token, position)) so that every row of dwte has
    // one writer and a fixed summation order: no atomics, deterministic, one rounding per row.
    Tensor order(*dwte->allocator(), {bt}, DType::I32, Category::temporaries);
    std::int32_t* ord = order.as<std::int32_t>();
    const std::int32_t* tk = tokens.as<std::int32_t>();
    for (std::int64_t i = 0; i < bt; ++i) ord[i] = static_cast<std::int32_t>(i);
    std::sort(ord, ord + bt, [tk](std::int32_t a, std::int32_t b) {
      return tk[a] != tk[b] ? tk[a] < tk[b] : a < b;
    });
#pragma omp parallel for schedule(dynamic, 16) if (bt * c >= kParallelGrain)
    for (std::int64_t s = 0; s < bt; ++s) {
      const std::int32_t tok = tk[ord[s]];
      if (tok < 0) continue;                         // no row (another rank's token)
      if (s > 0 && tk[ord[s - 1]] == tok) continue;  // not the start of a group
      std::int64_t e = s;
      while (e < bt && tk[ord[e]] == tok) ++e;
      float acc[kChunk], bg[kChunk], bo[kChunk];
      for (std::int64_t o = 0; o < c; o += kChunk) {
        const std::int64_t len = std::min(kChunk, c - o);
        const float* old = read_f32(*dwte, tok * c + o, len, bo);
        std::copy(old, old + len, acc);
        for (std::int64_t i = s; i < e; ++i) {
          const float* g = read_f32(dout, ord[i] * c + o, len, bg);
          for (std::int64_t j = 0; j < len; ++j) acc[j] += g[j];
        }
        float* y = dest_f32(*dwte, tok * c + o, bo);
        std::copy(acc, acc + len, y);
        write_f32(*dwte, tok * c + o, len, y);
      }
    }
  }
}

void CpuOps::crossentropy_forward(Tensor& losses, const Tensor& logits, const Tensor& targets) {
  constexpr std::string_view op = "crossentropy_forward";
  const std::int64_t n = check_ce_targets(op, logits, targets);
  check_float(op, "losses", losses);
  if (losses.numel() != n)
    fail(op, "losses {} must have {} elements", shape_str(losses.shape()), n);
  const std::int64_t v = logits.dim(-1);
  const std::int32_t* tg = targets.as<std::int32_t>();
#pragma omp parallel for schedule(static) if (n * v >= kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    float loss = 0.0f;
    if (tg[r] >= 0) {
      float mx;
      double sum;
      row_logsumexp(logits, r * v, v, mx, sum);
      const float xt = load_as_float(logits.data(), logits.dtype(), r * v + tg[r]);
      loss = static_cast<float>(std::log(sum) + mx - xt);
    }
    store_from_float(losses.data(), losses.dtype(), r, loss);
  }
}

void CpuOps::crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                   float dloss) {
  constexpr std::string_view op = "crossentropy_backward";
  const std::int64_t n = check_ce_targets(op, logits, targets);
  check_float(op, "dlogits", dlogits);
  check_shape(op, "dlogits", dlogits, logits.shape());
  const std::int64_t v = logits.dim(-1);
  const std::int32_t* tg = targets.as<std::int32_t>();
  // An F32 dlogits receives each row's exps in the pass that sums them (dlogits may alias
  // logits: each is written where it was read), so the row is exponentiated once; 16-bit
  // dlogits recompute them. Either way y = (e·inv − onehot)·dloss, and (e·inv − 0)·dloss is
  // e·inv·dloss: only the target's element subtracts.
  const bool keep = dlogits.dtype() == DType::F32;
#pragma omp parallel for schedule(static) if (n * v >= kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    float bx[kChunk], bo[kChunk];
    const std::int64_t t = tg[r];
    if (t < 0) {
      for (std::int64_t o = 0; o < v; o += kChunk) {
        const std::int64_t len = std::min(kChunk, v - o);
        float* y = dest_f32(dlogits, r * v + o, bo);
        std::fill(y, y + len, 0.0f);
        write_f32(dlogits, r * v + o, len, y);
      }
      continue;
    }
    const float mx = row_max(logits, r * v, v);
    double sum = 0.0;
    for (std::int64_t o = 0; o < v; o += kChunk) {
      const std::int64_t len = std::min(kChunk, v - o);
      sum += vec::exp_sum(read_f32(logits, r * v + o, len, bx), mx,
                          keep ? dlogits.as<float>() + r * v + o : nullptr, len);
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (std::int64_t o = 0; o < v; o += kChunk) {
      const std::int64_t len = std::min(kChunk, v - o);
      float* y = dest_f32(dlogits, r * v + o, bo);
      if (!keep) vec::exp_shifted(read_f32(logits, r * v + o, len, bx), mx, y, len);
      const bool has_target = t >= o && t < o + len;
      const float e_target = has_target ? y[t - o] : 0.0f;
      for (std::int64_t j = 0; j < len; ++j) y[j] = y[j] * inv * dloss;
      if (has_target) y[t - o] = (e_target * inv - 1.0f) * dloss;
      write_f32(dlogits, r * v + o, len, y);
    }
  }
}

void CpuOps::vocab_local_tokens(Tensor& local, const Tensor& tokens, std::int64_t offset,
                                std::int64_t count) {
  constexpr std::string_view op = "vocab_local_tokens";
  check_i32(op, "tokens", tokens);
  check_i32(op, "local", local);
  check_shape(op, "local", local, tokens.shape());
  const std::int32_t* tk = tokens.as<std::int32_t>();
  std::int32_t* out = local.as<std::int32_t>();
  for (std::int64_t i = 0; i < tokens.numel(); ++i) {
    const std::int64_t t = std::int64_t{tk[i]} - offset;
    out[i] = t >= 0 && t < count ? static_cast<std::int32_t>(t) : -1;
  }
}

void CpuOps::vocab_crossentropy_stats(Tensor& stats, const Tensor& logits, const Tensor& targets,
                                      std::int64_t offset) {
  constexpr std::string_view op = "vocab_crossentropy_stats";
  const std::int64_t n = check_ce(op, logits, targets), v = logits.dim(-1);
  check_float(op, "stats", stats);
  if (stats.numel() != 3 * n) fail(op, "stats {} must be ({}, 3)", shape_str(stats.shape()), n);
  const std::int32_t* tg = targets.as<std::int32_t>();
  float* st = stats.as<float>();
#pragma omp parallel for schedule(static) if (n * v >= kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    float mx = 0.0f;
    double sum = 0.0;
    float xt = 0.0f;
    if (tg[r] >= 0) {
      row_logsumexp(logits, r * v, v, mx, sum);
      const std::int64_t t = std::int64_t{tg[r]} - offset;
      if (t >= 0 && t < v) xt = load_as_float(logits.data(), logits.dtype(), r * v + t);
    }
    st[3 * r] = mx;
    st[3 * r + 1] = static_cast<float>(sum);
    st[3 * r + 2] = xt;
  }
}

void CpuOps::vocab_crossentropy_combine(Tensor& losses, Tensor& lse, const Tensor& stats,
                                        const Tensor& targets) {
  constexpr std::string_view op = "vocab_crossentropy_combine";
  check_i32(op, "targets", targets);
  check_float(op, "stats", stats);
  const std::int64_t n = targets.numel();
  if (losses.numel() != n || lse.numel() != n || n == 0 || stats.numel() % (3 * n) != 0)
    fail(op, "losses {}, lse {} and stats {} do not fit {} targets", shape_str(losses.shape()),
         shape_str(lse.shape()), shape_str(stats.shape()), n);
  const std::int64_t ranks = stats.numel() / (3 * n);
  const std::int32_t* tg = targets.as<std::int32_t>();
  const float* st = stats.as<float>();
  for (std::int64_t r = 0; r < n; ++r) {
    if (tg[r] < 0) {
      store_from_float(losses.data(), losses.dtype(), r, 0.0f);
      store_from_float(lse.data(), lse.dtype(), r, 0.0f);
      continue;
    }
    float mx = -INFINITY;
    for (std::int64_t k = 0; k < ranks; ++k) mx = std::max(mx, st[(k * n + r) * 3]);
    double sum = 0.0, xt = 0.0;
    for (std::int64_t k = 0; k < ranks; ++k) {
      const float* s = st + (k * n + r) * 3;
      sum += static_cast<double>(s[1]) * std::exp(static_cast<double>(s[0]) - mx);
      xt += s[2];
    }
    const double l = std::log(sum) + mx;
    store_from_float(lse.data(), lse.dtype(), r, static_cast<float>(l));
    store_from_float(losses.data(), losses.dtype(), r, static_cast<float>(l - xt));
  }
}

void CpuOps::vocab_crossentropy_backward(Tensor& dlogits, const Tensor& logits,
                                         const Tensor& targets, const Tensor& lse,
                                         std::int64_t offset, float dloss) {
  constexpr std::string_view op = "vocab_crossentropy_backward";
  const std::int64_t n = check_ce(op, logits, targets), v = logits.dim(-1);
  check_float(op, "dlogits", dlogits);
  check_shape(op, "dlogits", dlogits, logits.shape());
  check_float(op, "lse", lse);
  if (lse.numel() != n) fail(op, "lse {} must have {} elements", shape_str(lse.shape()), n);
  const std::int32_t* tg = targets.as<std::int32_t>();
#pragma omp parallel for schedule(static) if (n * v >= kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    float bx[kChunk], bo[kChunk];
    const float l = load_as_float(lse.data(), lse.dtype(), r);
    const std::int64_t t = tg[r] < 0 ? -1 : std::int64_t{tg[r]} - offset;
    for (std::int64_t o = 0; o < v; o += kChunk) {
      const std::int64_t len = std::min(kChunk, v - o);
      float* y = dest_f32(dlogits, r * v + o, bo);
      if (tg[r] < 0) {
        std::fill(y, y + len, 0.0f);
      } else {
        vec::exp_shifted(read_f32(logits, r * v + o, len, bx), l, y, len);
        for (std::int64_t j = 0; j < len; ++j) y[j] *= dloss;
        if (t >= o && t < o + len) y[t - o] -= dloss;
      }
      write_f32(dlogits, r * v + o, len, y);
    }
  }
}

double CpuOps::sum_to_host(const Tensor& t) {
  if (!t.defined()) fail("sum_to_host", "tensor is undefined");
  // Serial on purpose: a fixed summation order gives the same loss bits on every run.
  double sum = 0.0;
  float buf[kChunk];
  for (std::int64_t o = 0; o < t.numel(); o += kChunk) {
    const std::int64_t len = std::min(kChunk, t.numel() - o);
    if (t.dtype() == DType::I32) {
      for (std::int64_t j = 0; j < len; ++j) sum += t.as<std::int32_t>()[o + j];
      continue;
    }
    const float* x = read_f32(t, o, len, buf);
    for (std::int64_t j = 0; j < len; ++j) sum += x[j];
  }
  return sum;
}

}  // namespace memtrade::cpu
