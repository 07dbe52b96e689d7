// The Llama MLP (HF LlamaMLP, SwiGLU): down_proj(silu(gate_proj(x)) · up_proj(x)); gate_proj and
// up_proj (I, C), down_proj (C, I), no biases.
//
// Saved: "mlp.inp" (the input of gate_proj and up_proj), "mlp.gate" and "mlp.up" (N, I) (the
// SwiGLU inputs), "mlp.h" (N, I) (down_proj's input) unless selective: then backward recomputes
// it from gate and up with Ops::swiglu_forward, element-wise, no GEMM. HF under autograd keeps
// silu(gate) (N, I) as well (the multiply's other operand); Ops::swiglu_backward recomputes it.
#pragma once

#include "models/layers/linear.h"

namespace memtrade {

struct LlamaMlp {
  Linear gate_proj;
  Linear up_proj;
  Linear down_proj;
};

// inp (N, C), moved in -> returns (N, C), a temporary.
Tensor mlp_forward(LayerCtx& c, Tensor inp, const LlamaMlp& m);
// dout (N, C) -> returns dL/dinp (N, C), a temporary.
Tensor mlp_backward(LayerCtx& c, const Tensor& dout, const LlamaMlp& m);

}  // namespace memtrade
