// LayerNorm (nn.LayerNorm) over the last dim of (N, C); mean/rstd (N) F32 are saved. The norm_*
// overloads (here and in rmsnorm.h) are what the decoder blocks call (models/families/decoder.h).
//
// Under autocast the input must already have layer norm's input dtype (the GPT's residual stream
// is fp32 under both policies, so no cast is ever needed there; a 16-bit input under torch-cuda
// would need autocast's fp32 cast kept as the saved input, which the callers do not make).
#pragma once

#include <string>

#include "models/layers/context.h"

namespace memtrade {

struct LayerNorm {
  ParamIndex weight = -1;
  ParamIndex bias = -1;
  std::string key;    // save prefix: "ln_1" -> "ln_1.mean", "ln_1.rstd"
  float eps = 1e-5f;  // GPT-2's layer_norm_epsilon
};

// out (N, C), of dtype c.out_dtype(Op::layernorm, inp), from inp (N, C); the caller saves inp if
// it is not saved elsewhere.
void norm_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const LayerNorm& ln);
// dinp (N, C) = dL/dinp from dout (N, C) and the forward input (overwritten).
void norm_backward(LayerCtx& c, Tensor& dinp, const Tensor& dout, const Tensor& inp,
                   const LayerNorm& ln);
// dres (N, C) += dL/dinp, from dout (N, C) and the forward input (residual-stream style).
void norm_backward_add(LayerCtx& c, Tensor& dres, const Tensor& dout, const Tensor& inp,
                       const LayerNorm& ln);

}  // namespace memtrade
