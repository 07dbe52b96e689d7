// CausalSelfAttention (nanoGPT): c_attn (3C, C) -> causal softmax attention over n_head heads
// -> c_proj (C, C).
//
// Saved: "attn.inp" (c_attn input), "attn.qkv" (B, T, 3C), "attn.att" (B, NH, T, T) unless
// selective (then recomputed in backward with Ops::attention_probs), "attn.y" (c_proj input).
#pragma once

#include "models/layers/linear.h"

namespace memtrade {

struct CausalSelfAttention {
  Linear c_attn;
  Linear c_proj;
  int n_head = 1;
};

// inp (B·T, C), moved in (it is saved as c_attn's input) -> returns (B·T, C), a temporary.
Tensor attention_forward(LayerCtx& c, Tensor inp, std::int64_t B, std::int64_t T,
                         const CausalSelfAttention& a);
// dout (B·T, C) -> returns dL/dinp (B·T, C), a temporary.
Tensor attention_backward(LayerCtx& c, const Tensor& dout, const CausalSelfAttention& a);

}  // namespace memtrade
