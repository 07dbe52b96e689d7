#include "models/layers/attention.h"

#include <array>
#include <stdexcept>
#include <string>

#include "models/layers/rmsnorm.h"
#include "models/layers/tensor_parallel.h"

namespace memtrade {
namespace {

// Width of the attention output y, NH·hd, from the packed qkv width (NH + 2·NKV)·hd.
std::int64_t y_width(std::int64_t qkv_width, const CausalSelfAttention& a) {
  return a.n_head * (qkv_width / (a.n_head + 2 * std::int64_t{a.n_kv_head}));
}

// The probabilities' dtype: softmax's output dtype, fp32 where the model asks for it.
DType probs_dtype(const LayerCtx& c, const Tensor& qkv, const CausalSelfAttention& a) {
  if (a.softmax_fp32 && qkv.dtype() != DType::F32) return DType::F32;
  return c.out_dtype(Op::softmax, qkv);
}

// Keeps the probabilities and, where the ·V matmul reads them in another dtype, its cast.
void keep_probs(LayerCtx& c, Tensor att) {
  Tensor cast;
  c.cast_input(Op::matmul, att, cast);
  if (cast.defined()) c.keep("attn.att_mm", std::move(cast));
  c.keep("attn.att", std::move(att));
}

// Qwen3's q and k heads: (column, heads, weight, save key) of each normalised part of qkv.
struct NormedPart {
  std::int64_t col, heads;
  ParamIndex weight;
  const char* key;
};
std::array<NormedPart, 2> normed_parts(const CausalSelfAttention& a, std::int64_t hd) {
  return {NormedPart{0, a.n_head, a.qk_norm->q, "attn.q_norm"},
          NormedPart{a.n_head * hd, a.n_kv_head, a.qk_norm->k, "attn.k_norm"}};
}

// qkv (N, W), the projection's output: its q and k heads normalised in place.
void qk_norm_forward(LayerCtx& c, Tensor& qkv, const CausalSelfAttention& a) {
  const std::int64_t N = qkv.dim(0), hd = qkv.dim(1) / (a.n_head + 2 * std::int64_t{a.n_kv_head});
  const bool cast = c.in_dtype(Op::rmsnorm, qkv) != qkv.dtype();  // autocast: the norm reads fp32
  for (const NormedPart& p : normed_parts(a, hd)) {
    Tensor inp = cast ? c.temp({N, p.heads * hd}, qkv.dtype())
                      : c.act_tensor({N, p.heads * hd}, qkv.dtype());  // saved unless cast
    copy_columns(c, inp, qkv, p.col);
    inp.reshape({N * p.heads, hd});
    inp = c.cast_input(Op::rmsnorm, std::move(inp));
    const RmsNorm norm{p.weight, p.key, a.qk_norm->eps};
    Tensor out = c.temp({N * p.heads, hd}, c.out_dtype(Op::rmsnorm, inp));
    norm_forward(c, out, inp, norm);
    if (out.dtype() != qkv.dtype()) {
      Tensor rounded = c.temp(out.shape(), qkv.dtype());
      c.ops().cast(rounded, out);
      out = std::move(rounded);
    }
    out.reshape({N, p.heads * hd});
    place_columns(c, qkv, p.col, out);
    c.keep(std::string(p.key) + ".inp", std::move(inp));
  }
}

// dqkv (N, W), the gradient of the normalised qkv: its q and k columns become the gradient of
// the projection's output.
void qk_norm_backward(LayerCtx& c, Tensor& dqkv, const CausalSelfAttention& a) {
  const std::int64_t N = dqkv.dim(0);
  const std::int64_t hd = dqkv.dim(1) / (a.n_head + 2 * std::int64_t{a.n_kv_head});
  for (const NormedPart& p : normed_parts(a, hd)) {
    const Tensor& inp = c.get(std::string(p.key) + ".inp");  // (N·heads, hd)
    Tensor dout = c.temp({N, p.heads * hd}, dqkv.dtype());
    copy_columns(c, dout, dqkv, p.col);
    dout.reshape({N * p.heads, hd});
    dout = c.grad_as(std::move(dout), c.out_dtype(Op::rmsnorm, inp));
    Tensor dinp = c.temp_like(inp);
    norm_backward(c, dinp, dout, inp, RmsNorm{p.weight, p.key, a.qk_norm->eps});
    dout.reset();
    dinp = c.grad_as(std::move(dinp), dqkv.dtype());
    dinp.reshape({N, p.heads * hd});
    place_columns(c, dqkv, p.col, dinp);
  }
}

}  // namespace

Tensor attention_forward(LayerCtx& c, Tensor inp, std::int64_t B, std::int64_t T,
                         const CausalSelfAttention& a) {
  ScopedRange scope(c.dev, "attention");  // names the trace's allocations
  const std::int64_t C = inp.dim(1);
  const bool split = !a.qkv_proj.parts.empty();
  const std::int64_t W =
      split ? stacked_out_features(c, a.qkv_proj) : c.weight(a.c_attn.weight).dim(0);
  const std::int64_t Y = y_width(W, a), NH = a.n_head;
  const bool cast = c.in_dtype(Op::linear, inp) != inp.dtype();
  inp = c.cast_input(Op::linear, std::move(inp));
  // HF's eager code under autocast (hf_eager): q_proj, k_proj and v_proj each cast the input (an
  // op's input casts are not cached, only the weights'), and each keeps its own for backward.
  if (c.hf_eager && cast && split) {
    const auto extra = static_cast<std::int64_t>(a.qkv_proj.parts.size()) - 1;
    c.keep("attn.inp_casts", c.act_tensor({extra * inp.dim(0), C}, inp.dtype()));
  }
  Tensor qkv;  // (B·T, (NH + 2·NKV)·hd): this rank's heads
  {
    // Column-parallel: this rank's heads read every token (gathered under SP, and freed again:
    // backward gathers them anew, as Megatron saves only its own tokens).
    Tensor gathered;
    const Tensor& x = enter_column_parallel(c, inp, gathered, Category::temporaries);
    qkv = c.act_tensor({B * T, W}, c.out_dtype(Op::linear, inp));
    if (split)
      linear_forward(c, qkv, x, a.qkv_proj);
    else
      linear_forward(c, qkv, x, a.c_attn);
  }
  c.keep("attn.inp", std::move(inp));
  if (a.qk_norm) qk_norm_forward(c, qkv, a);
  qkv.reshape({B, T, W});
  if (a.rope) c.ops().rope_forward(qkv, a.n_head, a.n_kv_head, *a.rope);
  // HF's eager code (hf_eager): repeat_kv's expanded K and V, (B, NH, T, hd) each, are what the
  // scores' and the output's matmuls keep in place of the NKV heads' (which are freed); under
  // selective checkpointing they are part of the recomputed core.
  if (c.hf_eager) {
    const std::int64_t hd = W / (NH + 2 * std::int64_t{a.n_kv_head});
    // Selective checkpointing recomputes the math core (flash has none to recompute).
    const bool core_recomputed = c.selective && c.attention == AttentionKind::math;
    if (a.n_kv_head != a.n_head && !core_recomputed)
      c.keep("attn.kv_rep", c.act_tensor({B, T, 2 * (NH - a.n_kv_head) * hd}, qkv.dtype()));
    // Under autocast HF rotates the 16-bit q and k with fp32 cos and sin (computed from the fp32
    // hidden states), so the rotated q and k are fp32: transients that the scores' matmul casts
    // back to 16 bits, but what a selective checkpoint of the core keeps as its inputs. qkv holds
    // them in 16 bits; the rest of their bytes (2 more per element) is kept beside it.
    if (core_recomputed && a.rope_tables_fp32 && dtype_size(qkv.dtype()) == 2)
      c.keep("attn.qk_f32", c.act_tensor({B * T, (NH + a.n_kv_head) * (hd / 2)}, DType::F32));
    // Mistral's, Phi-3's, Gemma 2's and Mixtral's attention make their own rotary tables,
    // (1, T, hd) each in value_states' dtype, which the rotation's multiplies keep.
    if (a.rope && !a.rope_tables_fp32)
      c.keep("attn.rope_tables", c.act_tensor({2, T, hd}, qkv.dtype()));
  }

  // Allocation order (probabilities or lse, then y) is the one both backends and the memory
  // model make.
  const DType y_dtype = c.out_dtype(Op::attention, qkv);
  const bool softcap = a.scores.softcap > 0.0f;
  Tensor y;  // (B, T, NH·hd)
  if (c.attention == AttentionKind::flash) {
    const std::int64_t hd = W / (NH + 2 * std::int64_t{a.n_kv_head});
    if (softcap || a.scores.scale_for(hd) != AttentionScores{}.scale_for(hd))
      throw std::invalid_argument(
          "flash attention with attn_logit_softcapping or query_pre_attn_scalar (Gemma 2) is not "
          "modelled: use --attention math");
    Tensor lse(c.dev.memory(), {B, NH, T}, DType::F32, c.cat());
    y = c.act_tensor({B, T, Y}, y_dtype);
    c.ops().flash_attention_forward(y, lse, qkv, a.n_head, a.n_kv_head);
    c.keep("attn.qkv", std::move(qkv));
    c.keep("attn.lse", std::move(lse));
  } else {
    // Selective checkpointing drops the (B, NH, T, T) probabilities: the biggest tensor of the
    // block at long T, and only a QKᵀ + softmax away from qkv, which is saved anyway.
    const bool keep_att = c.save && !c.selective;
    const Category att_cat = keep_att ? Category::activations : Category::temporaries;
    Tensor tanh;  // Gemma 2: tanh of the scaled scores, kept with the probabilities
    if (softcap) tanh = Tensor(c.dev.memory(), {B, NH, T, T}, qkv.dtype(), att_cat);
    Tensor att(c.dev.memory(), {B, NH, T, T}, probs_dtype(c, qkv, a), att_cat);
    y = c.act_tensor({B, T, Y}, y_dtype);
    c.ops().attention_forward(y, att, qkv, a.n_head, a.n_kv_head, a.scores,
                              softcap ? &tanh : nullptr);
    c.keep("attn.qkv", std::move(qkv));
    if (keep_att) keep_probs(c, std::move(att));
    if (keep_att && softcap) c.keep("attn.tanh", std::move(tanh));
  }

  y.reshape({B * T, Y});
  y = c.cast_input(Op::linear, std::move(y));
  // (B·T, C): added into the residual by the block
  const DType out_dtype = c.out_dtype(Op::linear, y);
  Tensor out = a.output_saved ? c.act_tensor({B * T, C}, out_dtype) : c.temp({B * T, C}, out_dtype);
  row_parallel_forward(c, out, y, a.c_proj);  // this rank's tokens under SP
  c.keep("attn.y", std::move(y));
  return out;
}

Tensor attention_backward(LayerCtx& c, const Tensor& dout, const CausalSelfAttention& a) {
  ScopedRange scope(c.dev, "attention");  // names the trace's allocations
  Tensor& qkv = c.get("attn.qkv");        // (B, T, (NH + 2·NKV)·hd)
  const std::int64_t B = qkv.dim(0), T = qkv.dim(1), W = qkv.dim(2), Y = y_width(W, a);
  const std::int64_t NH = a.n_head;
  Tensor& y = c.get("attn.y");  // (B·T, NH·hd)

  Tensor dy = c.temp_like(y);
  row_parallel_backward(c, &dy, dout, y, a.c_proj);
  dy.reshape({B, T, Y});

  Tensor dqkv;  // (B, T, (NH + 2·NKV)·hd), after a recomputed att as on both backends
  if (c.attention == AttentionKind::flash) {
    dqkv = c.temp({B, T, W}, qkv.dtype());
    y.reshape({B, T, Y});  // the attention output, as the op sees it
    c.ops().flash_attention_backward(dqkv, dy, qkv, y, c.get("attn.lse"), a.n_head, a.n_kv_head);
    y.reshape({B * T, Y});
    dy.reset();
  } else {
    const bool softcap = a.scores.softcap > 0.0f;
    Tensor recomputed, recomputed_tanh;  // (B, NH, T, T) when selective
    const Tensor* att = nullptr;         // what the ·V matmul read: dV's
    const Tensor* probs = nullptr;       // the softmax's fp32 output, where it was fp32: dS's
    const Tensor* tanh = nullptr;
    if (c.has("attn.att")) {
      att = &c.get(c.has("attn.att_mm") ? "attn.att_mm" : "attn.att");
      probs = &c.get("attn.att");
      if (softcap) tanh = &c.get("attn.tanh");
    } else {
      if (softcap) recomputed_tanh = c.temp({B, NH, T, T}, qkv.dtype());
      recomputed = c.temp({B, NH, T, T}, probs_dtype(c, qkv, a));
      c.ops().attention_probs(recomputed, qkv, a.n_head, a.n_kv_head, a.scores,
                              softcap ? &recomputed_tanh : nullptr);
      att = probs = &recomputed;
      if (softcap) tanh = &recomputed_tanh;
    }
    // HF's softmax(..., dtype=torch.float32) under 16-bit qkv: autograd's softmax backward reads
    // its fp32 output (kernels/ops.h attention_backward).
    if (probs->dtype() != DType::F32 || qkv.dtype() == DType::F32) probs = nullptr;
    dqkv = c.temp({B, T, W}, qkv.dtype());
    c.ops().attention_backward(dqkv, dy, qkv, *att, a.n_head, a.n_kv_head, a.scores, tanh, probs);
    dy.reset();
  }

  for (const char* k : {"attn.kv_rep", "attn.qk_f32"})  // their matmuls have run
    if (c.has(k)) (void)c.saved.take(c.segment, k);
  // The rotation is orthogonal: its transpose takes d(rotated q, k) to d(q, k).
  if (a.rope) c.ops().rope_backward(dqkv, a.n_head, a.n_kv_head, *a.rope);
  if (c.has("attn.rope_tables")) (void)c.saved.take(c.segment, "attn.rope_tables");
  dqkv.reshape({B * T, W});
  if (a.qk_norm) qk_norm_backward(c, dqkv, a);
  const Tensor& inp = c.get("attn.inp");
  Tensor gathered;
  const Tensor& x = enter_column_parallel(c, inp, gathered, Category::temporaries);
  Tensor dinp = c.temp_like(x);
  if (!a.qkv_proj.parts.empty())
    linear_backward(c, &dinp, dqkv, x, a.qkv_proj);
  else
    linear_backward(c, &dinp, dqkv, x, a.c_attn);
  gathered.reset();
  dqkv.reset();
  if (c.has("attn.inp_casts")) (void)c.saved.take(c.segment, "attn.inp_casts");
  return enter_column_parallel_grad(c, std::move(dinp));
}

}  // namespace memtrade
