// Causal self-attention on packed qkv (B, T, 3C) in the straightforward form: strided batched
// GEMMs straight on the packed tensor (q, k, v of head h are columns h·hd.. of their third, row
// stride 3C), a causal softmax kernel in place on att, and att·v. One batched GEMM covers the NH
// heads of one sequence (head h starts hd elements after head h-1: a uniform batch stride);
// sequences are a host loop because the (b, h) offsets are not one stride.
//
// GEMMs run in qkv's dtype; att, out, dout and dqkv of another dtype go through cast scratch
// (Category::workspace). The scratch contract shared with the CPU backend
// (kernels/cpu/cpu_ops_attention.cpp): forward and probs allocate no temporaries; backward
// allocates dP (NH, T, T) in qkv's dtype (Category::temporaries) once and reuses it for every
// sequence, so both backends make the same allocation sequence outside the workspace. The
// scaled scores, the probabilities, dP and dS are rounded to qkv's dtype here, and the CPU
// rounds them at the same places.

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

// A batched-over-heads GEMM of one sequence; the caller fills pointers and leading dims.
GemmDesc head_gemm(DType d, const Dims& dm, std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmDesc g;
  g.ab = d;
  g.c_type = d;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = dm.nh;
  return g;
}

}  // namespace

void CudaOps::attention_impl(Tensor* out, Tensor& att, const Tensor& qkv, int n_head,
                             std::string_view op) {
  const Dims d = check_attention_forward(op, out, att, qkv, n_head);
  if (d.b == 0 || d.t == 0) return;
  const DType dt = qkv.dtype();
  const std::int64_t tt = d.t, c3 = 3 * d.c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hd));
  AsDTypeOut att_(att, dt, false, stream_);
  for (std::int64_t b = 0; b < d.b; ++b) {
    // att[b, h] (T, T) = scale · q[b, :, h] (T, hd) · k[b, :, h]ᵀ
    GemmDesc g = head_gemm(dt, d, tt, tt, d.hd);
    g.a = at(qkv.data(), dt, b * tt * c3);
    g.b = at(qkv.data(), dt, b * tt * c3 + d.c);
    g.c = at(att_.data(), dt, b * d.nh * tt * tt);
    g.trans_b = true;
    g.lda = c3;
    g.ldb = c3;
    g.ldc = tt;
    g.stride_a = d.hd;
    g.stride_b = d.hd;
    g.stride_c = tt * tt;
    g.alpha = scale;
    gemm(g);
  }
  launch_causal_softmax(att_.data(), dt, d.b * d.nh * tt, tt, stream_);
  if (out) {
    AsDTypeOut out_(*out, dt, false, stream_);
    for (std::int64_t b = 0; b < d.b; ++b) {
      // out[b, :, h] (T, hd) = att[b, h] (T, T) · v[b, :, h] (T, hd)
      GemmDesc g = head_gemm(dt, d, tt, d.hd, tt);
      g.a = at(att_.data(), dt, b * d.nh * tt * tt);
      g.b = at(qkv.data(), dt, b * tt * c3 + 2 * d.c);
      g.c = at(out_.data(), dt, b * tt * d.c);
      g.lda = tt;
      g.ldb = c3;
      g.ldc = d.c;
      g.stride_a = tt * tt;
      g.stride_b = d.hd;
      g.stride_c = d.hd;
      gemm(g);
    }
    out_.commit();
  }
  att_.commit();
}

void CudaOps::attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head) {
  NvtxRange range("attention_forward");
  attention_impl(&out, att, qkv, n_head, "attention_forward");
}

void CudaOps::attention_probs(Tensor& att, const Tensor& qkv, int n_head) {
  NvtxRange range("attention_probs");
  attention_impl(nullptr, att, qkv, n_head, "attention_probs");
}

void CudaOps::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& att, int n_head) {
  NvtxRange range("attention_backward");
  const Dims d = check_attention_backward(dqkv, dout, qkv, att, n_head);
  if (d.b == 0 || d.t == 0) return;
  const DType dt = qkv.dtype();
  const std::int64_t tt = d.t, c3 = 3 * d.c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hd));
  CachingAllocator& alloc = *dqkv.allocator();
  AsDType att_(att, dt, alloc, stream_);
  AsDType dout_(dout, dt, alloc, stream_);
  AsDTypeOut dqkv_(dqkv, dt, false, stream_);
  Tensor dp(alloc, {d.nh, tt, tt}, dt, Category::temporaries);  // one sequence's heads
  for (std::int64_t b = 0; b < d.b; ++b) {
    const std::int64_t seq = b * tt * c3;          // qkv / dqkv offset of sequence b
    const std::int64_t slab = b * d.nh * tt * tt;  // att offset of sequence b
    {  // dP[h] (T, T) = dout[b, :, h] (T, hd) · v[b, :, h]ᵀ
      GemmDesc g = head_gemm(dt, d, tt, tt, d.hd);
      g.a = at(dout_.data(), dt, b * tt * d.c);
      g.b = at(qkv.data(), dt, seq + 2 * d.c);
      g.c = dp.data();
      g.trans_b = true;
      g.lda = d.c;
      g.ldb = c3;
      g.ldc = tt;
      g.stride_a = d.hd;
      g.stride_b = d.hd;
      g.stride_c = tt * tt;
      gemm(g);
    }
    {  // dv[b, :, h] (T, hd) = att[b, h]ᵀ (T, T) · dout[b, :, h] (T, hd)
      GemmDesc g = head_gemm(dt, d, tt, d.hd, tt);
      g.a = at(att_.data(), dt, slab);
      g.b = at(dout_.data(), dt, b * tt * d.c);
      g.c = at(dqkv_.data(), dt, seq + 2 * d.c);
      g.trans_a = true;
      g.lda = tt;
      g.ldb = d.c;
      g.ldc = c3;
      g.stride_a = tt * tt;
      g.stride_b = d.hd;
      g.stride_c = d.hd;
      gemm(g);
    }
    // dS = P ⊙ (dP − Σ_j P·dP), in place; the 1/√hd of the scores goes into the GEMMs' alpha.
    launch_causal_softmax_backward(dp.data(), dt, at(att_.data(), dt, slab), dt, d.nh * tt, tt,
                                   stream_);
    {  // dq[b, :, h] (T, hd) = scale · dS[h] (T, T) · k[b, :, h] (T, hd)
      GemmDesc g = head_gemm(dt, d, tt, d.hd, tt);
      g.a = dp.data();
      g.b = at(qkv.data(), dt, seq + d.c);
      g.c = at(dqkv_.data(), dt, seq);
      g.lda = tt;
      g.ldb = c3;
      g.ldc = c3;
      g.stride_a = tt * tt;
      g.stride_b = d.hd;
      g.stride_c = d.hd;
      g.alpha = scale;
      gemm(g);
    }
    {  // dk[b, :, h] (T, hd) = scale · dS[h]ᵀ (T, T) · q[b, :, h] (T, hd)
      GemmDesc g = head_gemm(dt, d, tt, d.hd, tt);
      g.a = dp.data();
      g.b = at(qkv.data(), dt, seq);
      g.c = at(dqkv_.data(), dt, seq + d.c);
      g.trans_a = true;
      g.lda = tt;
      g.ldb = c3;
      g.ldc = c3;
      g.stride_a = tt * tt;
      g.stride_b = d.hd;
      g.stride_c = d.hd;
      g.alpha = scale;
      gemm(g);
    }
  }
  dqkv_.commit();
}

}  // namespace memtrade::cuda
