// CausalSelfAttention (nanoGPT, generalised to grouped-query attention and HF Llama's): a qkv
// projection ((NH + 2·NKV)·hd, C) -> optional RoPE on q and k -> causal softmax attention of
// n_head query heads over n_kv_head key/value heads (kernels/ops.h: the packed layout and HF's
// repeat_kv mapping) -> c_proj (C, NH·hd). The projection is GPT's c_attn (one weight, the
// (B, T, 3C) layout, NKV = NH) or Llama's q_proj, k_proj, v_proj (a StackedLinear, no bias); the
// rotation is Llama's (rotate_half, kernels/ops.h rope_forward), in place on the projection's
// output, so what is saved as qkv is rotated, as HF's q and k after apply_rotary_pos_emb.
//
// The attention ops are those of RunOptions::attention (LayerCtx::attention). Saved:
//   - both kinds: "attn.inp" (the projection's input), "attn.qkv" (B, T, (NH + 2·NKV)·hd),
//     "attn.y" (B·T, NH·hd), c_proj's input and the attention output;
//   - math: "attn.att" (B, NH, T, T) unless selective (then recomputed in backward with
//     Ops::attention_probs);
//   - flash: "attn.lse" (B, NH, T) F32 (backward recomputes the scores from qkv, y and lse);
//     there is no (T, T) tensor, so selective checkpointing drops nothing here.
// Under autocast (models/layers/context.h) the math probabilities have softmax's output dtype,
// and fp32 with 16-bit qkv where the model's code asks for it (softmax_fp32: HF's
// softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype), with or without
// autocast); where that is not the dtype the ·V matmul reads (torch-cuda: fp32 softmax, 16-bit
// matmul) autograd keeps them twice, softmax's fp32 output and matmul's 16-bit cast
// ("attn.att_mm"), and so does this layer. Ops::attention_backward reads each for its use, as
// autograd does: the 16-bit cast for dV (MmBackward), the fp32 probabilities for dS
// (SoftmaxBackward). Flash under autocast runs in the 16-bit
// compute dtype (scaled_dot_product_attention is on PyTorch's lower-precision list) and keeps
// its lse in fp32. RoPE runs in qkv's dtype (Op::rope: HF rotates the linear's 16-bit output
// with cos and sin cast to it), so the rotated qkv is saved as the linear's output would be.
//
// With llama_layers hf-eager (LayerCtx::hf_eager: HF's eager LlamaAttention, transformers 4.46.3)
// the layer also keeps repeat_kv's expanded K and V beyond the NKV heads' ("attn.kv_rep",
// (B, T, 2·(NH − NKV)·hd) in qkv's dtype: what the scores' and the output's matmuls keep in
// place of the NKV heads; with flash, SDPA's inputs, as LlamaSdpaAttention repeats them too),
// unless selective checkpointing recomputes them with the math core; under autocast, k_proj's
// and v_proj's own 16-bit casts of the input ("attn.inp_casts"), and, under selective
// checkpointing, the rest of the bytes of the fp32 rotated q and k that the core's checkpoint
// keeps ("attn.qk_f32", where rope_tables_fp32: HF's cos and sin are fp32, made from the fp32
// hidden states, so q·cos + rotate_half(q)·sin promotes); and the rotary tables cos and sin,
// (1, T, hd) each, which the rotation's multiplies keep: once per forward with the stem, fp32,
// where rope_tables_fp32 ("rope.tables", models/families/decoder.cpp), else per layer in qkv's
// dtype ("attn.rope_tables"). None is read by the ops: the arithmetic is liger's.
//
// Qwen3 (transformers 4.51.0 modeling_qwen3.py, Qwen3Attention) normalises each query and key head
// before the rotation: q = q_norm(q_proj(x).view(B, T, NH, hd)), k likewise with k_norm, RMSNorms
// over hd (weights (hd), eps rms_norm_eps). Here the projection writes the packed qkv, the q and k
// columns are copied out as (B·T·heads, hd) rows ("attn.q_norm.inp", "attn.k_norm.inp": the
// norms' inputs, saved as HF saves them, with "attn.{q,k}_norm.rstd"), normalised by the RMSNorm
// op and written back before RoPE. Under autocast the norm reads fp32 (HF's RMSNorm casts to
// fp32; the fp32 cast is what is saved) and its fp32 output is rounded into the packed 16-bit
// qkv (HF rotates in fp32 and rounds at the QKᵀ matmul: one rounding at another place).
//
// Gemma 2 (transformers 4.46.3 modeling_gemma2.py Gemma2Attention): scores = q·kᵀ ·
// query_pre_attn_scalar^-0.5, then tanh(scores / cap)·cap with cap = attn_logit_softcapping
// (kernels/ops.h AttentionScores). Math attention saves "attn.tanh" (B, NH, T, T) in qkv's dtype
// besides the probabilities, as autograd keeps torch.tanh's output (selective: recomputed with
// them). Flash attention with soft-capping is not modelled (FlashAttention-2 has a softcap; this
// flash op does not): refused, std::invalid_argument.
#pragma once

#include <optional>

#include "models/layers/linear.h"

namespace memtrade {

struct QkNorm {
  ParamIndex q = -1;  // q_norm.weight (hd)
  ParamIndex k = -1;  // k_norm.weight (hd)
  float eps = 1e-6f;
};

// Under tensor parallelism (models/layers/tensor_parallel.h) a rank holds n_head / tp query
// heads and n_kv_head / tp key/value heads: the projection is column-parallel (its rows of q, k
// and v), c_proj row-parallel (its input columns), and n_head, n_kv_head count this rank's.
// Under sequence parallelism inp and the output hold this rank's tokens, and "attn.inp" is
// saved as such (the projection's input is all-gathered in forward and again in backward).
struct CausalSelfAttention {
  Linear c_attn;  // GPT's packed projection; unused when qkv_proj has parts
  Linear c_proj;  // Llama's o_proj
  int n_head = 1;
  int n_kv_head = 1;               // n_head's divisor; = n_head for multi-head attention
  StackedLinear qkv_proj;          // Llama's q_proj, k_proj, v_proj (empty: c_attn)
  std::optional<RopeConfig> rope;  // Llama: rotary embeddings on q and k
  std::optional<QkNorm> qk_norm;   // Qwen3: per-head RMSNorm of q and k before the rotation
  AttentionScores scores{};        // Gemma 2: query_pre_attn_scalar's scale, soft-capping
  bool output_saved = false;       // Gemma 2: the output is an activation its post-norm keeps
  bool softmax_fp32 = false;       // HF's eager attention: fp32 probabilities for 16-bit q, k
  // HF makes cos and sin once per forward from the fp32 hidden states (LlamaModel.rotary_emb),
  // not per layer from value_states in its dtype (Mistral, Phi-3, Gemma 2, Mixtral in 4.46.3):
  // under autocast its rotated q and k are fp32 (hf_eager, above).
  bool rope_tables_fp32 = false;
};

// inp (B·T, C), moved in (it is saved as c_attn's input, cast to its input dtype first) ->
// returns (B·T, C), a temporary (an activation with output_saved).
Tensor attention_forward(LayerCtx& c, Tensor inp, std::int64_t B, std::int64_t T,
                         const CausalSelfAttention& a);
// dout (B·T, C) -> returns dL/dinp (B·T, C), a temporary in c_attn's input dtype.
Tensor attention_backward(LayerCtx& c, const Tensor& dout, const CausalSelfAttention& a);

}  // namespace memtrade
