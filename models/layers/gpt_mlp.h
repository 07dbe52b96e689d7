// The GPT-2 MLP: c_fc (4C, C) -> GELU (tanh) -> c_proj (C, 4C).
//
// Saved: "mlp.inp" (c_fc input), "mlp.h" (B·T, 4C) GELU input, "mlp.g" (B·T, 4C) c_proj input —
// what autograd keeps for nn.Linear, F.gelu and nn.Linear. Selective checkpointing keeps them
// all: it recomputes the attention core only (Megatron), models/layers/attention.h.
#pragma once

#include "models/layers/linear.h"

namespace memtrade {

struct GptMlp {
  Linear c_fc;
  Linear c_proj;
};

// inp (N, C), moved in (saved as c_fc's input, cast to its input dtype first) -> returns (N, C),
// a temporary.
Tensor mlp_forward(LayerCtx& c, Tensor inp, const GptMlp& m);
// dout (N, C) -> returns dL/dinp (N, C), a temporary in c_fc's input dtype.
Tensor mlp_backward(LayerCtx& c, const Tensor& dout, const GptMlp& m);

}  // namespace memtrade
