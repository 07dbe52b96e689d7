// Token + position embedding (GPT-2): out (B·T, C) = wte[tokens] + wpe[t]. Saved: "tokens".
#pragma once

#include "models/layers/context.h"

namespace memtrade {

struct Embedding {
  ParamIndex wte = -1;  // (V, C), also the (tied) output head
  ParamIndex wpe = -1;  // (block_size, C)
};

// tokens (B, T) I32 -> returns (B·T, C) in the activation dtype, or under autocast in the
// weights' (fp32) (category activations: it is the residual stream). A copy of the tokens is saved
// when training.
Tensor embedding_forward(LayerCtx& c, const Tensor& tokens, const Embedding& e);
// Scatters dout (B·T, C) (reshaped in place and back) into the wte and wpe gradients; each honours
// its own accumulate flag (wte's is true here when the tied head already wrote into it).
void embedding_backward(LayerCtx& c, Tensor& dout, const Embedding& e);

}  // namespace memtrade
