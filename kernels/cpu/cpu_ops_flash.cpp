// Flash attention on the CPU: FlashAttention-2's tiled online softmax, forward and backward, on
// packed (grouped-query) qkv. No (T, T) tensor exists: a task holds one (query tile × key tile)
// block of scores at a time.
//
// Forward: one task per (sequence, query head, query tile of kBr rows). It walks the key tiles
// of kBc keys up to the causal diagonal: S = scale·Q·Kᵀ (one GEMM), the row maxima and sums
// updated online (the running output rescaled by exp(m_old − m_new)), O += P·V (one GEMM); at
// the end O /= l and lse = m + log l.
// Backward: one task per (sequence, kv head), which owns its kv head's dk, dv and its query
// heads' dq and rows of D = rowsum(dO ∘ O). For each query head of the group (its D first),
// each query tile and each key tile up to the diagonal: P = exp(S − lse), dV += Pᵀ·dO, dP = dO·Vᵀ,
// dS = P ∘ (dP − D), dQ += scale·dS·K, dK += scale·dSᵀ·Q — five GEMMs, all on strided views of
// the packed tensors. A task's sums run in one fixed order, so the result is the same for any
// thread count (no atomics, no reduction across threads).
//
// Tasks run one per thread when sgemm nests (each GEMM then single-threaded, see
// cpu_ops_impl.h), else in turn. Memory (the contract in kernels/ops.h):
//   - Category::temporaries, as on CUDA: backward's D (B, NH, T) F32;
//   - Category::workspace (CPU only): fp32 copies of 16-bit qkv (forward and backward) and dout,
//     and an fp32 dqkv when dqkv is 16-bit, rounded once at the end; whole tensors, so the
//     sizes do not depend on the thread count;
//   - per-task tiles on the stack: forward S (kBr, kBc) and O (kBr, hd <= 256), about 80 KiB;
//     backward S and dP (kBr, kBc), 32 KiB; well inside an OpenMP thread's stack.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"

namespace memtrade::cpu {
namespace {

using Dims = AttentionDims;  // kernels/op_checks.h

// Query rows and key columns of a tile: GEMMs of 64 × 64 × hd are large enough for OpenBLAS's
// kernels and the tiles small enough for the stack; equal sizes keep a query tile's last key
// tile on its diagonal.
constexpr std::int64_t kBr = 64;
constexpr std::int64_t kBc = 64;
static_assert(kBr * kBc >= kFlashMaxHeadDim, "backward reads a row of O into a tile");

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// Keys of the key tile starting at j0 that query row r0 + r may see (causal), clamped to the
// tile's nc columns; 0 when the row precedes the whole tile.
std::int64_t visible(std::int64_t r0, std::int64_t r, std::int64_t j0, std::int64_t nc) {
  return std::clamp<std::int64_t>(r0 + r - j0 + 1, 0, nc);
}

}  // namespace

void CpuOps::flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head,
                                     int n_kv_head) {
  const Dims d = check_flash_attention_forward(out, lse, qkv, n_head, n_kv_head);
  if (d.b == 0 || d.t == 0) return;
  const F32In qkv32(qkv, *out.allocator());
  const float* x = qkv32.data();
  float* lse_p = lse.as<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hd));
  const std::int64_t tiles = ceil_div(d.t, kBr), tasks = d.b * d.nh * tiles;
#pragma omp parallel for schedule(dynamic) if (sgemm_nests())
  for (std::int64_t task = 0; task < tasks; ++task) {
    // The last query tiles see the most keys: hand them out first.
    const std::int64_t i = tiles - 1 - task % tiles, bh = task / tiles;
    const std::int64_t b = bh / d.nh, h = bh % d.nh;
    const std::int64_t r0 = i * kBr, nr = std::min(kBr, d.t - r0), kend = r0 + nr;
    const float* q = x + (b * d.t + r0) * d.w + d.q_col(h);
    const float* k = x + b * d.t * d.w + d.k_col(h);
    const float* v = x + b * d.t * d.w + d.v_col(h);
    float s[kBr * kBc], o[kBr * kFlashMaxHeadDim], m[kBr], l[kBr];
    std::fill_n(o, nr * d.hd, 0.0f);
    std::fill_n(m, nr, -INFINITY);
    std::fill_n(l, nr, 0.0f);
    for (std::int64_t j0 = 0; j0 < kend; j0 += kBc) {
      const std::int64_t nc = std::min(kBc, kend - j0);
      sgemm(false, true, nr, nc, d.hd, scale, q, d.w, k + j0 * d.w, d.w, 0.0f, s, kBc);
      for (std::int64_t r = 0; r < nr; ++r) {
        float* row = s + r * kBc;
        const std::int64_t n = visible(r0, r, j0, nc);
        const float mx = std::max(m[r], vec::max(row, n));
        // exp(−inf) = 0 rescales nothing on the first tile; a row that sees none of this tile
        // keeps its maximum (and its first tile always has a key: its own position).
        const float alpha = n > 0 ? std::exp(m[r] - mx) : 1.0f;
        vec::exp_shifted(row, mx, row, n);
        float sum = 0.0f;
        for (std::int64_t c = 0; c < n; ++c) sum += row[c];
        std::fill(row + n, row + nc, 0.0f);
        l[r] = l[r] * alpha + sum;
        m[r] = mx;
        for (std::int64_t c = 0; c < d.hd; ++c) o[r * d.hd + c] *= alpha;
      }
      sgemm(false, false, nr, d.hd, nc, 1.0f, s, kBc, v + j0 * d.w, d.w, 1.0f, o, d.hd);
    }
    for (std::int64_t r = 0; r < nr; ++r) {
      const float inv = 1.0f / l[r];
      for (std::int64_t c = 0; c < d.hd; ++c) o[r * d.hd + c] *= inv;
      write_f32(out, (b * d.t + r0 + r) * d.c + d.q_col(h), d.hd, o + r * d.hd);
      lse_p[(b * d.nh + h) * d.t + r0 + r] = m[r] + std::log(l[r]);
    }
  }
}

void CpuOps::flash_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                      const Tensor& out, const Tensor& lse, int n_head,
                                      int n_kv_head) {
  const Dims d = check_flash_attention_backward(dqkv, dout, qkv, out, lse, n_head, n_kv_head);
  if (d.b == 0 || d.t == 0) return;
  CachingAllocator& alloc = *dqkv.allocator();
  Tensor dsum(alloc, {d.b, d.nh, d.t}, DType::F32, Category::temporaries);  // D
  float* dsum_p = dsum.as<float>();
  const F32In qkv32(qkv, alloc);
  const F32In dout32(dout, alloc);
  F32Out dqkv32(dqkv, false);
  const float* lse_p = lse.as<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hd));
  const std::int64_t tiles = ceil_div(d.t, kBr);
#pragma omp parallel for schedule(static) if (sgemm_nests())
  for (std::int64_t task = 0; task < d.b * d.nkv; ++task) {
    const std::int64_t b = task / d.nkv, g = task % d.nkv, h0 = g * d.group();
    const float* x = qkv32.data() + b * d.t * d.w;  // sequence b
    const float* go = dout32.data() + b * d.t * d.c;
    float* dx = dqkv32.data() + b * d.t * d.w;
    const float* k = x + d.k_col(h0);
    const float* v = x + d.v_col(h0);
    float* dk = dx + d.k_col(h0);
    float* dv = dx + d.v_col(h0);
    for (std::int64_t t = 0; t < d.t; ++t) {
      std::fill_n(dk + t * d.w, d.hd, 0.0f);
      std::fill_n(dv + t * d.w, d.hd, 0.0f);
    }
    float p[kBr * kBc], ds[kBr * kBc];
    for (std::int64_t h = h0; h < h0 + d.group(); ++h) {
      const float* row_lse = lse_p + (b * d.nh + h) * d.t;
      float* row_d = dsum_p + (b * d.nh + h) * d.t;
      for (std::int64_t t = 0; t < d.t; ++t) {  // D = rowsum(dO ∘ O) of this head's rows
        const float* o = read_f32(out, (b * d.t + t) * d.c + d.q_col(h), d.hd, p);
        const float* gt = go + t * d.c + d.q_col(h);
        float sum = 0.0f;
        for (std::int64_t c = 0; c < d.hd; ++c) sum += o[c] * gt[c];
        row_d[t] = sum;
      }
      for (std::int64_t i = 0; i < tiles; ++i) {
        const std::int64_t r0 = i * kBr, nr = std::min(kBr, d.t - r0), kend = r0 + nr;
        const float* q = x + r0 * d.w + d.q_col(h);
        const float* gq = go + r0 * d.c + d.q_col(h);
        float* dq = dx + r0 * d.w + d.q_col(h);
        for (std::int64_t j0 = 0; j0 < kend; j0 += kBc) {
          const std::int64_t nc = std::min(kBc, kend - j0);
          sgemm(false, true, nr, nc, d.hd, scale, q, d.w, k + j0 * d.w, d.w, 0.0f, p, kBc);
          for (std::int64_t r = 0; r < nr; ++r) {
            float* row = p + r * kBc;
            const std::int64_t n = visible(r0, r, j0, nc);
            vec::exp_shifted(row, row_lse[r0 + r], row, n);
            std::fill(row + n, row + nc, 0.0f);
          }
          // dV += Pᵀ·dO; dP = dO·Vᵀ
          sgemm(true, false, nc, d.hd, nr, 1.0f, p, kBc, gq, d.c, 1.0f, dv + j0 * d.w, d.w);
          sgemm(false, true, nr, nc, d.hd, 1.0f, gq, d.c, v + j0 * d.w, d.w, 0.0f, ds, kBc);
          for (std::int64_t r = 0; r < nr; ++r)  // dS = P ∘ (dP − D): 0 where P is masked
            for (std::int64_t c = 0; c < nc; ++c)
              ds[r * kBc + c] = p[r * kBc + c] * (ds[r * kBc + c] - row_d[r0 + r]);
          // dQ (+)= scale·dS·K (the first key tile overwrites); dK += scale·dSᵀ·Q
          sgemm(false, false, nr, d.hd, nc, scale, ds, kBc, k + j0 * d.w, d.w,
                j0 == 0 ? 0.0f : 1.0f, dq, d.w);
          sgemm(true, false, nc, d.hd, nr, scale, ds, kBc, q, d.w, 1.0f, dk + j0 * d.w, d.w);
        }
      }
    }
  }
  dqkv32.commit();
}

}  // namespace memtrade::cpu
