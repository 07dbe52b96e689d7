// The GPT-2 MLP: c_fc (4C, C) -> GELU (tanh) -> c_proj (C, 4C).
//
// Saved: "mlp.inp" (c_fc input), "mlp.h" (B·T, 4C) GELU input unless selective (then
// recomputed in backward from mlp.inp with c_fc), "mlp.g" (B·T, 4C) c_proj input.
#pragma once

#include "models/layers/linear.h"

namespace memtrade {

struct GptMlp {
  Linear c_fc;
  Linear c_proj;
};

// inp (N, C), moved in (saved as c_fc's input, cast to its input dtype first) -> returns (N, C),
// a temporary.
Tensor gpt_mlp_forward(LayerCtx& c, Tensor inp, const GptMlp& m);
// dout (N, C) -> returns dL/dinp (N, C), a temporary in c_fc's input dtype.
Tensor gpt_mlp_backward(LayerCtx& c, const Tensor& dout, const GptMlp& m);

}  // namespace memtrade
