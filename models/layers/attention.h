// CausalSelfAttention (nanoGPT, generalised to grouped-query attention): c_attn
// ((NH + 2·NKV)·hd, C) -> causal softmax attention of n_head query heads over n_kv_head key/value
// heads (kernels/ops.h: the packed layout and HF's repeat_kv mapping; GPT: NKV = NH, the
// (B, T, 3C) layout) -> c_proj (C, NH·hd).
//
// The attention ops are those of RunOptions::attention (LayerCtx::attention). Saved:
//   - both kinds: "attn.inp" (c_attn input), "attn.qkv" (B, T, (NH + 2·NKV)·hd), "attn.y"
//     (B·T, NH·hd), c_proj's input and the attention output;
//   - math: "attn.att" (B, NH, T, T) unless selective (then recomputed in backward with
//     Ops::attention_probs);
//   - flash: "attn.lse" (B, NH, T) F32 (backward recomputes the scores from qkv, y and lse);
//     there is no (T, T) tensor, so selective checkpointing drops nothing here.
// Under autocast (models/layers/context.h) the math probabilities have softmax's output dtype;
// where that is not the dtype the ·V matmul reads (torch-cuda: fp32 softmax, 16-bit matmul)
// autograd keeps them twice, softmax's fp32 output and matmul's 16-bit cast ("attn.att_mm"), and
// so does this layer. Ops::attention_backward reads one of them for both uses (the 16-bit copy:
// the op rounds the probabilities to qkv's dtype, so the two hold the same values); the fp32 one
// is held as PyTorch holds it for SoftmaxBackward. Flash under autocast runs in the 16-bit
// compute dtype (scaled_dot_product_attention is on PyTorch's lower-precision list) and keeps
// its lse in fp32.
#pragma once

#include "models/layers/linear.h"

namespace memtrade {

struct CausalSelfAttention {
  Linear c_attn;
  Linear c_proj;
  int n_head = 1;
  int n_kv_head = 1;  // n_head's divisor; = n_head for multi-head attention
};

// inp (B·T, C), moved in (it is saved as c_attn's input, cast to its input dtype first) ->
// returns (B·T, C), a temporary.
Tensor attention_forward(LayerCtx& c, Tensor inp, std::int64_t B, std::int64_t T,
                         const CausalSelfAttention& a);
// dout (B·T, C) -> returns dL/dinp (B·T, C), a temporary in c_attn's input dtype.
Tensor attention_backward(LayerCtx& c, const Tensor& dout, const CausalSelfAttention& a);

}  // namespace memtrade
