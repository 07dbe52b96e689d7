// Causal self-attention on packed qkv (the math kind: materialised probabilities) in the
// straightforward form: strided batched GEMMs straight on the packed tensor (q, k, v of a head
// are hd columns of the row, row stride (NH + 2·NKV)·hd), a causal softmax kernel in place on
// att, and att·v. One batched GEMM covers, for one sequence and one r < NH/NKV, the query heads
// h = g·(NH/NKV) + r of every kv head g: their q columns, probabilities and outputs are a
// uniform stride apart, and so are the kv heads' columns (multi-head attention: r = 0 only, all
// NH heads in one GEMM). Sequences are a host loop because the (b, h) offsets are not one stride.
//
// GEMMs run in qkv's dtype; att, out, dout and dqkv of another dtype go through cast scratch
// (Category::workspace), and so does a 16-bit dqkv of grouped-query attention, whose dk and dv
// are summed over a group's query heads in fp32 (GEMMs with beta = 1 into fp32) and rounded once,
// as on the CPU. The scratch contract shared with the CPU backend
// (kernels/cpu/cpu_ops_attention.cpp): forward and probs allocate no temporaries; backward
// allocates dP (NH, T, T) in qkv's dtype (Category::temporaries) once and reuses it for every
// sequence, so both backends make the same allocation sequence outside the workspace. The
// scaled scores, the probabilities, dP and dS are rounded to qkv's dtype here, and the CPU
// rounds them at the same places; an F32 att of 16-bit qkv gets the fp32 probabilities, and a
// backward given them (`probs`) reads them for dS (kernels/ops.h).

#include <cmath>

#include "kernels/cuda/cuda_ops.h"

namespace memtrade::cuda {
namespace {

using Dims = AttentionDims;  // kernels/op_checks.h

const void* at(const void* p, DType t, std::int64_t elems) {
  return static_cast<const unsigned char*>(p) + elems * static_cast<std::int64_t>(dtype_size(t));
}
void* at(void* p, DType t, std::int64_t elems) {
  return static_cast<unsigned char*>(p) + elems * static_cast<std::int64_t>(dtype_size(t));
}

// A GEMM batched over the kv heads of one sequence (query heads g·group + r for one r); the
// caller fills pointers, leading dims and strides.
GemmDesc head_gemm(DType d, const Dims& dm, std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmDesc g;
  g.ab = d;
  g.c_type = d;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = dm.nkv;
  return g;
}

}  // namespace

void CudaOps::attention_impl(Tensor* out, Tensor& att, const Tensor& qkv, int n_head, int n_kv_head,
                             std::string_view op, const AttentionScores& scores, Tensor* tanh_out) {
  const Dims d = check_attention_forward(op, out, att, qkv, n_head, n_kv_head);
  check_attention_scores(op, scores, tanh_out, att, qkv);
  if (d.b == 0 || d.t == 0) return;
  const DType dt = qkv.dtype();
  const std::int64_t tt = d.t, rep = d.group();
  const float scale = scores.scale_for(d.hd);
  // An F32 att of 16-bit qkv receives fp32 P (HF's softmax(..., dtype=float32)), written by the
  // softmax beside the rounded P that the ·V GEMM reads in the scratch (its .to(qkv dtype)).
  const bool fp32_probs = dt != DType::F32 && att.dtype() == DType::F32;
  AsDTypeOut att_(att, dt, false, stream_);
  for (std::int64_t b = 0; b < d.b; ++b)
    for (std::int64_t r = 0; r < rep; ++r) {
      // att[b, h] (T, T) = scale · q[b, :, h] (T, hd) · k[b, :, g]ᵀ, h = g·rep + r
      GemmDesc g = head_gemm(dt, d, tt, tt, d.hd);
      g.a = at(qkv.data(), dt, b * tt * d.w + d.q_col(r));
      g.b = at(qkv.data(), dt, b * tt * d.w + d.k_col(r));
      g.c = at(att_.data(), dt, (b * d.nh + r) * tt * tt);
      g.trans_b = true;
      g.lda = d.w;
      g.ldb = d.w;
      g.ldc = tt;
      g.stride_a = rep * d.hd;
      g.stride_b = d.hd;
      g.stride_c = rep * tt * tt;
      g.alpha = scale;
      gemm(g);
    }
  if (tanh_out)  // soft-capping of the rounded scores, before the softmax
    launch_softcap_scores(att_.data(), tanh_out->data(), dt, d.b * d.nh * tt * tt, tt,
                          scores.softcap, stream_);
  launch_causal_softmax(att_.data(), dt, d.b * d.nh * tt, tt, stream_,
                        fp32_probs ? static_cast<float*>(att.data()) : nullptr);
  if (out) {
    AsDTypeOut out_(*out, dt, false, stream_);
    for (std::int64_t b = 0; b < d.b; ++b)
      for (std::int64_t r = 0; r < rep; ++r) {
        // out[b, :, h] (T, hd) = att[b, h] (T, T) · v[b, :, g] (T, hd)
        GemmDesc g = head_gemm(dt, d, tt, d.hd, tt);
        g.a = at(att_.data(), dt, (b * d.nh + r) * tt * tt);
        g.b = at(qkv.data(), dt, b * tt * d.w + d.v_col(r));
        g.c = at(out_.data(), dt, b * tt * d.c + d.q_col(r));
        g.lda = tt;
        g.ldb = d.w;
        g.ldc = d.c;
        g.stride_a = rep * tt * tt;
        g.stride_b = d.hd;
        g.stride_c = rep * d.hd;
        gemm(g);
      }
    out_.commit();
  }
  if (!fp32_probs) att_.commit();
}

void CudaOps::attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head,
                                int n_kv_head, const AttentionScores& scores, Tensor* tanh_out) {
  NvtxRange range("attention_forward");
  attention_impl(&out, att, qkv, n_head, n_kv_head, "attention_forward", scores, tanh_out);
}

void CudaOps::attention_probs(Tensor& att, const Tensor& qkv, int n_head, int n_kv_head,
                              const AttentionScores& scores, Tensor* tanh_out) {
  NvtxRange range("attention_probs");
  attention_impl(nullptr, att, qkv, n_head, n_kv_head, "attention_probs", scores, tanh_out);
}

void CudaOps::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& att, int n_head, int n_kv_head,
                                 const AttentionScores& scores, const Tensor* tanh_in,
                                 const Tensor* probs) {
  NvtxRange range("attention_backward");
  const Dims d = check_attention_backward(dqkv, dout, qkv, att, n_head, n_kv_head, probs);
  check_attention_scores("attention_backward", scores, tanh_in, att, qkv);
  if (d.b == 0 || d.t == 0) return;
  const DType dt = qkv.dtype();
  const std::int64_t tt = d.t, rep = d.group();
  const float scale = scores.scale_for(d.hd);
  // dq, dk, dv in qkv's dtype, or fp32 when dk and dv sum over several query heads.
  const DType acc = rep > 1 ? DType::F32 : dt;
  CachingAllocator& alloc = *dqkv.allocator();
  AsDType att_(att, dt, alloc, stream_);
  AsDType dout_(dout, dt, alloc, stream_);
  AsDTypeOut dqkv_(dqkv, acc, false, stream_);
  Tensor dp(alloc, {d.nh, tt, tt}, dt, Category::temporaries);  // one sequence's heads
  for (std::int64_t b = 0; b < d.b; ++b) {
    const std::int64_t seq = b * tt * d.w;         // qkv / dqkv offset of sequence b
    const std::int64_t slab = b * d.nh * tt * tt;  // att offset of sequence b
    for (std::int64_t r = 0; r < rep; ++r) {
      {  // dP[h] (T, T) = dout[b, :, h] (T, hd) · v[b, :, g]ᵀ
        GemmDesc g = head_gemm(dt, d, tt, tt, d.hd);
        g.a = at(dout_.data(), dt, b * tt * d.c + d.q_col(r));
        g.b = at(qkv.data(), dt, seq + d.v_col(r));
        g.c = at(dp.data(), dt, r * tt * tt);
        g.trans_b = true;
        g.lda = d.c;
        g.ldb = d.w;
        g.ldc = tt;
        g.stride_a = rep * d.hd;
        g.stride_b = d.hd;
        g.stride_c = rep * tt * tt;
        gemm(g);
      }
      {  // dv[b, :, g] (T, hd) (+)= att[b, h]ᵀ (T, T) · dout[b, :, h] (T, hd)
        GemmDesc g = head_gemm(dt, d, tt, d.hd, tt);
        g.c_type = acc;
        g.a = at(att_.data(), dt, slab + r * tt * tt);
        g.b = at(dout_.data(), dt, b * tt * d.c + d.q_col(r));
        g.c = at(dqkv_.data(), acc, seq + d.v_col(r));
        g.trans_a = true;
        g.lda = tt;
        g.ldb = d.c;
        g.ldc = d.w;
        g.stride_a = rep * tt * tt;
        g.stride_b = rep * d.hd;
        g.stride_c = d.hd;
        g.beta = r == 0 ? 0.0f : 1.0f;
        gemm(g);
      }
    }
    // dS = P ⊙ (dP − Σ_j P·dP), in place; the 1/√hd of the scores goes into the GEMMs' alpha.
    // P: the fp32 probabilities where given, else att as dV read it.
    if (probs)
      launch_causal_softmax_backward(dp.data(), dt, at(probs->data(), DType::F32, slab), DType::F32,
                                     d.nh * tt, tt, stream_);
    else
      launch_causal_softmax_backward(dp.data(), dt, at(att_.data(), dt, slab), dt, d.nh * tt, tt,
                                     stream_);
    if (tanh_in)  // soft-capping: dS of the raw scores
      launch_softcap_scores_backward(dp.data(), at(tanh_in->data(), dt, slab), dt, d.nh * tt * tt,
                                     stream_);
    for (std::int64_t r = 0; r < rep; ++r) {
      {  // dq[b, :, h] (T, hd) = scale · dS[h] (T, T) · k[b, :, g] (T, hd)
        GemmDesc g = head_gemm(dt, d, tt, d.hd, tt);
        g.c_type = acc;
        g.a = at(dp.data(), dt, r * tt * tt);
        g.b = at(qkv.data(), dt, seq + d.k_col(r));
        g.c = at(dqkv_.data(), acc, seq + d.q_col(r));
        g.lda = tt;
        g.ldb = d.w;
        g.ldc = d.w;
        g.stride_a = rep * tt * tt;
        g.stride_b = d.hd;
        g.stride_c = rep * d.hd;
        g.alpha = scale;
        gemm(g);
      }
      {  // dk[b, :, g] (T, hd) (+)= scale · dS[h]ᵀ (T, T) · q[b, :, h] (T, hd)
        GemmDesc g = head_gemm(dt, d, tt, d.hd, tt);
        g.c_type = acc;
        g.a = at(dp.data(), dt, r * tt * tt);
        g.b = at(qkv.data(), dt, seq + d.q_col(r));
        g.c = at(dqkv_.data(), acc, seq + d.k_col(r));
        g.trans_a = true;
        g.lda = tt;
        g.ldb = d.w;
        g.ldc = d.w;
        g.stride_a = rep * tt * tt;
        g.stride_b = rep * d.hd;
        g.stride_c = d.hd;
        g.alpha = scale;
        g.beta = r == 0 ? 0.0f : 1.0f;
        gemm(g);
      }
    }
  }
  dqkv_.commit();
}

}  // namespace memtrade::cuda
