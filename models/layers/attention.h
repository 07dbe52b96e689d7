// CausalSelfAttention (nanoGPT): c_attn (3C, C) -> causal softmax attention over n_head heads
// -> c_proj (C, C).
//
// Saved: "attn.inp" (c_attn input), "attn.qkv" (B, T, 3C), "attn.att" (B, NH, T, T) unless
// selective (then recomputed in backward with Ops::attention_probs), "attn.y" (c_proj input).
// Under autocast (models/layers/context.h) the probabilities have softmax's output dtype; where
// that is not the dtype the ·V matmul reads (torch-cuda: fp32 softmax, 16-bit matmul) autograd
// keeps them twice, softmax's fp32 output and matmul's 16-bit cast ("attn.att_mm"), and so does
// this layer. Ops::attention_backward reads one of them for both uses (the 16-bit copy: the op
// rounds the probabilities to qkv's dtype, so the two hold the same values); the fp32 one is
// held as PyTorch holds it for SoftmaxBackward.
#pragma once

#include "models/layers/linear.h"

namespace memtrade {

struct CausalSelfAttention {
  Linear c_attn;
  Linear c_proj;
  int n_head = 1;
};

// inp (B·T, C), moved in (it is saved as c_attn's input, cast to its input dtype first) ->
// returns (B·T, C), a temporary.
Tensor attention_forward(LayerCtx& c, Tensor inp, std::int64_t B, std::int64_t T,
                         const CausalSelfAttention& a);
// dout (B·T, C) -> returns dL/dinp (B·T, C), a temporary in c_attn's input dtype.
Tensor attention_backward(LayerCtx& c, const Tensor& dout, const CausalSelfAttention& a);

}  // namespace memtrade
