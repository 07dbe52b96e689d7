// Causal self-attention on packed qkv (the math kind: materialised probabilities), one
// (batch, head) slice at a time; grouped-query heads share their kv head's columns.
//
// Each slice is strided GEMMs straight on the packed tensors (lda = qkv's row) when they are
// F32; 16-bit operands of a slice are converted into fp32 scratch sized for one slice only
// (Category::workspace: OpenBLAS has no 16-bit GEMM, like the casts cuBLASLt needs on CUDA).
// The GEMMs skip what the causal mask zeroes: in blocks of kCausalBlock query rows, rows
// [r0, r1) multiply only keys [0, r1) (and the transposed products only rows t >= c0 of a key
// block [c0, c1)), which at T = 256 is 10/16 of the square. Softmax rows run cpu_vec.h's loops.
// When every operand is F32 there is no scratch and the slices run one per thread (each GEMM
// single-threaded: OpenMP OpenBLAS nests; a slice's GEMMs are T·T·hd, too small to thread well).
// Otherwise slices run in turn, sharing one slice of conversion scratch, and OpenBLAS threads
// each GEMM: scratch stays one slice whatever the thread count, so the allocation sequence is
// the same on every machine. (With the pthreads OpenBLAS, whose pool fights OpenMP's — B=4
// T=256 forward+backward took 4.8 s with parallel rows and 0.18 s without — slices always run
// in turn: sgemm_nests().)
//
// The scratch contract shared with the CUDA backend (kernels/cuda/cuda_ops_attention.cpp):
// forward and probs allocate no temporaries; backward allocates dP (NH, T, T) in qkv's dtype
// (Category::temporaries) once and reuses it for every sequence. The scaled scores, the
// probabilities, dP and dS are rounded to qkv's dtype where CUDA writes them in it, and att, dout,
// out and dqkv of another dtype pass through qkv's dtype as CUDA's casts do, so both backends
// round at the same places (kernels/ops.h). Backward runs a kv head's query heads in turn in one
// task, summing their dk and dv in fp32 (in dqkv when it is F32, else in the slice scratch), so the
// sum's order is fixed and it is rounded once; in parallel, a thread owns whole kv heads across
// the batch, since dP holds one sequence's heads.
// An F32 att of 16-bit qkv (HF's softmax(..., dtype=torch.float32)) is written unrounded, and a
// backward given those fp32 probabilities (`probs`) reads them for the softmax's dS, as autograd
// does, and att (their 16-bit cast) for dV (kernels/ops.h).
#include <algorithm>
#include <cmath>
#include <optional>

#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"

namespace memtrade::cpu {
namespace {

using Dims = AttentionDims;  // kernels/op_checks.h

// Slices one per thread when the op's GEMMs (B·NH slices of T·T·hd multiply-adds each) outweigh
// waking the pool: one parallel region for the whole op, so even gpt-tiny's 16 slices of
// 32·32·32 (0.5 M multiply-adds per GEMM) pay for it.
bool slices_in_parallel(const Dims& d) {
  return d.b * d.nh * d.t * d.t * d.hd >= (std::int64_t{1} << 18) && sgemm_nests();
}

// Query rows per block of the causal GEMMs (fixed, so results do not depend on the machine).
constexpr std::int64_t kCausalBlock = 64;

// Calls f(r0, r1) for the row blocks [r0, r1) of a causal (T, T) product.
template <typename F>
void causal_blocks(std::int64_t t, F&& f) {
  for (std::int64_t r0 = 0; r0 < t; r0 += kCausalBlock) f(r0, std::min(t, r0 + kCausalBlock));
}

// fp32 pointers to q, k, v of one (b, h) slice: into qkv when F32, else converted into `buf`
// (3, T, hd). ld is the row stride of the three.
struct QkvSlice {
  const float *q, *k, *v;
  std::int64_t ld;
};

QkvSlice qkv_slice(const Tensor& qkv, const Dims& d, std::int64_t b, std::int64_t h, Tensor* buf) {
  const std::int64_t row0 = b * d.t * d.w;
  const std::int64_t cols[3] = {d.q_col(h), d.k_col(h), d.v_col(h)};
  if (!buf) {
    const float* p = qkv.as<float>() + row0;
    return {p + cols[0], p + cols[1], p + cols[2], d.w};
  }
  float* s = buf->as<float>();
  for (std::int64_t t = 0; t < d.t; ++t)
    for (std::int64_t part = 0; part < 3; ++part)
      read_f32(qkv, row0 + t * d.w + cols[part], d.hd, s + (part * d.t + t) * d.hd);
  return {s, s + d.t * d.hd, s + 2 * d.t * d.hd, d.hd};
}

std::optional<Tensor> scratch_if(bool need, CachingAllocator& alloc, Shape shape) {
  if (!need) return std::nullopt;
  return Tensor(alloc, std::move(shape), DType::F32, Category::workspace);
}

// n values of t from element `off` into buf, whatever t's dtype.
void copy_f32(const Tensor& t, std::int64_t off, std::int64_t n, float* buf) {
  const float* src = read_f32(t, off, n, buf);
  if (src != buf) std::copy(src, src + n, buf);
}

// Rounds n fp32 values to dtype t in place (no-op for F32), as a GEMM writing t would.
void round_to(DType t, float* p, std::int64_t n) {
  if (t == DType::F32) return;
  if (t == DType::BF16) {  // bit operations the compiler vectorises in place
    for (std::int64_t i = 0; i < n; ++i) p[i] = bf16_to_float(float_to_bf16(p[i]));
    return;
  }
  std::uint16_t half[kChunk];  // fp16 through the bulk conversions (F16C where the CPU has it)
  for (std::int64_t o = 0; o < n; o += kChunk) {
    const std::int64_t len = std::min(kChunk, n - o);
    convert_from_f32(p + o, t, len, half);
    convert_to_f32(half, t, len, p + o);
  }
}

// Soft-capping of one row's n rounded scores in place (Gemma 2): tanh(s / cap) into tanh_out
// from element `off` (rounded once to its dtype), s = cap·tanh rounded to dtype t.
void softcap_row(float* row, std::int64_t n, float cap, Tensor& tanh_out, std::int64_t off,
                 DType t) {
  for (std::int64_t o = 0; o < n; o += kChunk) {
    const std::int64_t len = std::min(kChunk, n - o);
    float th[kChunk];
    for (std::int64_t j = 0; j < len; ++j) th[j] = std::tanh(row[o + j] / cap);
    for (std::int64_t j = 0; j < len; ++j) row[o + j] = cap * th[j];
    write_f32(tanh_out, off + o, len, th);
  }
  round_to(t, row, n);
}

// att (B, NH, T, T) = causal softmax(scores(q·kᵀ)), and optionally out (B, T, NH·hd) = att · v.
void attention_impl(Tensor* out, Tensor& att, const Tensor& qkv, int n_head, int n_kv_head,
                    std::string_view op, const AttentionScores& scores, Tensor* tanh_out) {
  const Dims d = check_attention_forward(op, out, att, qkv, n_head, n_kv_head);
  check_attention_scores(op, scores, tanh_out, att, qkv);
  CachingAllocator& alloc = *(out ? out : &att)->allocator();
  // An F32 att of 16-bit qkv receives fp32 P (HF's softmax(..., dtype=float32)); the ·V product
  // reads its .to(qkv dtype) copy, rounded in the scratch.
  const bool fp32_probs = qkv.dtype() != DType::F32 && att.dtype() == DType::F32;
  auto qkv_buf = scratch_if(qkv.dtype() != DType::F32, alloc, {3, d.t, d.hd});
  auto att_buf = scratch_if(att.dtype() != DType::F32 || fp32_probs, alloc, {d.t, d.t});
  auto out_buf = scratch_if(out && out->dtype() != DType::F32, alloc, {d.t, d.hd});
  const float scale = scores.scale_for(d.hd);
  const std::int64_t tt = d.t;
  const bool lowp = qkv.dtype() != DType::F32;
  auto slice = [&](std::int64_t b, std::int64_t h) {
    const QkvSlice s = qkv_slice(qkv, d, b, h, qkv_buf ? &*qkv_buf : nullptr);
    const std::int64_t att_off = (b * d.nh + h) * tt * tt;
    float* p = att_buf ? att_buf->as<float>() : att.as<float>() + att_off;
    causal_blocks(tt, [&](std::int64_t r0, std::int64_t r1) {  // S[r0:r1, 0:r1] = s·Q·Kᵀ
      sgemm(false, true, r1 - r0, r1, d.hd, scale, s.q + r0 * s.ld, s.ld, s.k, s.ld, 0.0f,
            p + r0 * tt, tt);
    });
    for (std::int64_t t = 0; t < tt; ++t) {
      float* row = p + t * tt;
      const std::int64_t n = t + 1;
      round_to(qkv.dtype(), row, n);  // the scores, as CUDA's GEMM writes them
      if (tanh_out) {                 // masked entries of tanh are 0, as CUDA writes them
        softcap_row(row, n, scores.softcap, *tanh_out, att_off + t * tt, qkv.dtype());
        static const float kZeros[kChunk] = {};
        for (std::int64_t j = n; j < tt; j += kChunk)
          write_f32(*tanh_out, att_off + t * tt + j, std::min(kChunk, tt - j), kZeros);
      }
      const float mx = vec::max(row, n);
      const float inv = static_cast<float>(1.0 / vec::exp_sum(row, mx, row, n));
      vec::scale(row, inv, row, n);
      std::fill(row + n, row + tt, 0.0f);  // causal mask: future positions get 0
    }
    if (fp32_probs) write_f32(att, att_off, tt * tt, p);  // unrounded
    round_to(qkv.dtype(), p, tt * tt);  // CUDA's softmax writes the probabilities in it
    if (att_buf && !fp32_probs) write_f32(att, att_off, tt * tt, p);
    if (!out) return;
    const std::int64_t out_off = b * tt * d.c + d.q_col(h);
    float* o = out_buf ? out_buf->as<float>() : out->as<float>() + out_off;
    const std::int64_t ldo = out_buf ? d.hd : d.c;
    causal_blocks(tt, [&](std::int64_t r0, std::int64_t r1) {  // O[r0:r1] = P[r0:r1, 0:r1]·V
      sgemm(false, false, r1 - r0, d.hd, r1, 1.0f, p + r0 * tt, tt, s.v, s.ld, 0.0f, o + r0 * ldo,
            ldo);
    });
    if (lowp && out->dtype() != qkv.dtype())  // CUDA's GEMM writes it in qkv's dtype first
      for (std::int64_t t = 0; t < tt; ++t) round_to(qkv.dtype(), o + t * ldo, d.hd);
    if (out_buf)
      for (std::int64_t t = 0; t < tt; ++t) write_f32(*out, out_off + t * d.c, d.hd, o + t * d.hd);
  };
  // All-fp32 slices touch only their own parts of att and out: one slice per thread, each
  // GEMM single-threaded (small T·T·hd GEMMs gain little from threads). Otherwise the slices
  // share the conversion scratch and run in turn with threaded GEMMs.
  if (!qkv_buf && !att_buf && !out_buf && slices_in_parallel(d)) {
#pragma omp parallel for collapse(2) schedule(static)
    for (std::int64_t b = 0; b < d.b; ++b)
      for (std::int64_t h = 0; h < d.nh; ++h) slice(b, h);
  } else {
    for (std::int64_t b = 0; b < d.b; ++b)
      for (std::int64_t h = 0; h < d.nh; ++h) slice(b, h);
  }
}

}  // namespace

void CpuOps::attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head,
                               int n_kv_head, const AttentionScores& scores, Tensor* tanh_out) {
  attention_impl(&out, att, qkv, n_head, n_kv_head, "attention_forward", scores, tanh_out);
}

void CpuOps::attention_probs(Tensor& att, const Tensor& qkv, int n_head, int n_kv_head,
                             const AttentionScores& scores, Tensor* tanh_out) {
  attention_impl(nullptr, att, qkv, n_head, n_kv_head, "attention_probs", scores, tanh_out);
}

void CpuOps::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                const Tensor& att, int n_head, int n_kv_head,
                                const AttentionScores& scores, const Tensor* tanh_in,
                                const Tensor* probs) {
  const Dims d = check_attention_backward(dqkv, dout, qkv, att, n_head, n_kv_head, probs);
  check_attention_scores("attention_backward", scores, tanh_in, att, qkv);
  CachingAllocator& alloc = *dqkv.allocator();
  const std::int64_t tt = d.t, hd = d.hd;
  const DType dt = qkv.dtype();
  // dP / dS of one sequence's heads (NH, T, T) in qkv's dtype, as on CUDA; fp32 copies of
  // 16-bit operands of one slice (workspace), including the fp32 dS of a 16-bit dP. With 16-bit
  // qkv, att and dout are copied whatever their dtype, to be read as qkv's dtype (ops.h).
  // dqkv_buf holds one head's dq and its kv head's dk and dv, summed over the group before written.
  const bool lowp = dt != DType::F32;
  Tensor dp(alloc, {d.nh, tt, tt}, dt, Category::temporaries);
  auto qkv_buf = scratch_if(lowp, alloc, {3, tt, hd});
  auto att_buf = scratch_if(att.dtype() != DType::F32 || lowp, alloc, {tt, tt});
  auto dout_buf = scratch_if(dout.dtype() != DType::F32 || lowp, alloc, {tt, hd});
  auto dqkv_buf = scratch_if(dqkv.dtype() != DType::F32, alloc, {3, tt, hd});
  auto ds_buf = scratch_if(lowp, alloc, {tt, tt});
  // dqkv of another dtype than a 16-bit qkv is computed in qkv's dtype first, as CUDA's GEMMs
  // write it: dq per head, dk and dv once their group is summed.
  const bool round_dqkv = lowp && dqkv.dtype() != dt;
  const float scale = scores.scale_for(hd);
  // Query head h of sequence b; `first` says whether it is the first of its kv head's group
  // (its dk, dv overwrite rather than add).
  auto slice = [&](std::int64_t b, std::int64_t h, bool first) {
    const QkvSlice s = qkv_slice(qkv, d, b, h, qkv_buf ? &*qkv_buf : nullptr);
    const std::int64_t att_off = (b * d.nh + h) * tt * tt;
    const float* p = att_buf ? att_buf->as<float>() : att.as<float>() + att_off;
    if (att_buf) copy_f32(att, att_off, tt * tt, att_buf->as<float>());
    if (lowp && att.dtype() != dt) round_to(dt, att_buf->as<float>(), tt * tt);
    const std::int64_t out_off = b * tt * d.c + d.q_col(h);
    const float* g = dout_buf ? dout_buf->as<float>() : dout.as<float>() + out_off;
    const std::int64_t ldg = dout_buf ? hd : d.c;
    if (dout_buf)
      for (std::int64_t t = 0; t < tt; ++t)
        copy_f32(dout, out_off + t * d.c, hd, dout_buf->as<float>() + t * hd);
    if (lowp && dout.dtype() != dt) round_to(dt, dout_buf->as<float>(), tt * hd);
    const std::int64_t seq = b * tt * d.w;  // sequence b's first element in qkv and dqkv
    float* dq = dqkv_buf ? dqkv_buf->as<float>() : dqkv.as<float>() + seq + d.q_col(h);
    float* dk = dqkv_buf ? dq + tt * hd : dqkv.as<float>() + seq + d.k_col(h);
    float* dv = dqkv_buf ? dq + 2 * tt * hd : dqkv.as<float>() + seq + d.v_col(h);
    const std::int64_t ldd = dqkv_buf ? hd : d.w;
    const float beta = first ? 0.0f : 1.0f;  // dk, dv: sum over the group's query heads
    const std::int64_t dp_off = h * tt * tt;
    float* ds = ds_buf ? ds_buf->as<float>() : dp.as<float>() + dp_off;
    // Key blocks [c0, c1) of the transposed products see query rows t >= c0 only.
    causal_blocks(tt, [&](std::int64_t c0, std::int64_t c1) {  // dV (+)= Pᵀ·dO
      sgemm(true, false, c1 - c0, hd, tt - c0, 1.0f, p + c0 * tt + c0, tt, g + c0 * ldg, ldg, beta,
            dv + c0 * ldd, ldd);
    });
    causal_blocks(tt, [&](std::int64_t r0, std::int64_t r1) {  // dP = dO·Vᵀ
      sgemm(false, true, r1 - r0, r1, hd, 1.0f, g + r0 * ldg, ldg, s.v, s.ld, 0.0f, ds + r0 * tt,
            tt);
    });
    // Softmax backward per row: dS = P ⊙ (dP − Σ_j P·dP); masked entries have P = 0. CUDA
    // keeps dP, then dS, in qkv's dtype: round as it does. (For 16-bit qkv the CPU computes in
    // fp32 scratch, and dP is held only for the shared memory figures: the CPU gate speaks for
    // the GPU.)
    // The softmax's P: the fp32 one where given (F32, read in place), else att's as dV read it.
    const float* ps = probs ? probs->as<float>() + att_off : p;
    for (std::int64_t t = 0; t < tt; ++t) {
      const float* pr = ps + t * tt;
      float* dr = ds + t * tt;
      round_to(dt, dr, t + 1);
      const auto dot = static_cast<float>(vec::dot(pr, dr, t + 1));
      for (std::int64_t j = 0; j <= t; ++j) dr[j] = pr[j] * (dr[j] - dot);
      std::fill(dr + t + 1, dr + tt, 0.0f);
      if (tanh_in) {  // soft-capping: dS of the raw scores, after CUDA's rounding of dS
        round_to(dt, dr, t + 1);
        for (std::int64_t o = 0; o <= t; o += kChunk) {
          const std::int64_t len = std::min(kChunk, t + 1 - o);
          float bt[kChunk];
          const float* th = read_f32(*tanh_in, att_off + t * tt + o, len, bt);
          for (std::int64_t j = 0; j < len; ++j) dr[o + j] *= 1.0f - th[j] * th[j];
        }
      }
    }
    round_to(dt, ds, tt * tt);
    causal_blocks(tt, [&](std::int64_t r0, std::int64_t r1) {  // dQ = s·dS·K
      sgemm(false, false, r1 - r0, hd, r1, scale, ds + r0 * tt, tt, s.k, s.ld, 0.0f, dq + r0 * ldd,
            ldd);
    });
    causal_blocks(tt, [&](std::int64_t c0, std::int64_t c1) {  // dK (+)= s·dSᵀ·Q
      sgemm(true, false, c1 - c0, hd, tt - c0, scale, ds + c0 * tt + c0, tt, s.q + c0 * s.ld, s.ld,
            beta, dk + c0 * ldd, ldd);
    });
    if (round_dqkv)
      for (std::int64_t t = 0; t < tt; ++t) round_to(dt, dq + t * ldd, hd);
    if (dqkv_buf)  // this head's dq; the group's dk, dv once summed
      for (std::int64_t t = 0; t < tt; ++t)
        write_f32(dqkv, seq + t * d.w + d.q_col(h), hd, dqkv_buf->as<float>() + t * hd);
  };
  auto group = [&](std::int64_t b, std::int64_t g) {
    for (std::int64_t r = 0; r < d.group(); ++r) slice(b, g * d.group() + r, r == 0);
    const std::int64_t h = g * d.group();
    if (round_dqkv) {  // the group's summed dk, dv (in dqkv_buf, or F32 dqkv itself)
      float* base = dqkv_buf ? dqkv_buf->as<float>() : dqkv.as<float>() + b * tt * d.w;
      const std::int64_t ldd = dqkv_buf ? hd : d.w;
      for (std::int64_t part = 1; part < 3; ++part) {
        float* col =
            dqkv_buf ? base + part * tt * hd : base + (part == 1 ? d.k_col(h) : d.v_col(h));
        for (std::int64_t t = 0; t < tt; ++t) round_to(dt, col + t * ldd, hd);
      }
    }
    if (!dqkv_buf) return;
    for (std::int64_t t = 0; t < tt; ++t)
      for (std::int64_t part = 1; part < 3; ++part)
        write_f32(dqkv, (b * tt + t) * d.w + (part == 1 ? d.k_col(h) : d.v_col(h)), hd,
                  dqkv_buf->as<float>() + (part * tt + t) * hd);
  };
  // As in forward: all-fp32 groups run one per thread, each kv head's group on one thread for
  // the whole batch (its heads' slices of dP, which holds one sequence, and its own dk, dv
  // columns), in one parallel region; with fewer kv heads than threads, the groups of one
  // sequence at a time. Otherwise in turn, sharing the scratch.
  const bool parallel =
      !qkv_buf && !att_buf && !dout_buf && !dqkv_buf && !ds_buf && slices_in_parallel(d);
  if (parallel && d.nkv >= cpu_thread_count()) {
#pragma omp parallel for schedule(static)
    for (std::int64_t g = 0; g < d.nkv; ++g)
      for (std::int64_t b = 0; b < d.b; ++b) group(b, g);
    return;
  }
  for (std::int64_t b = 0; b < d.b; ++b) {
    if (parallel) {
#pragma omp parallel for schedule(static)
      for (std::int64_t g = 0; g < d.nkv; ++g) group(b, g);
    } else {
      for (std::int64_t g = 0; g < d.nkv; ++g) group(b, g);
    }
  }
}

}  // namespace memtrade::cpu
