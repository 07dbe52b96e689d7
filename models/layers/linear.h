// Linear (nn.Linear): out (N, OC) = inp (N, C) · weightᵀ + bias, weight (OC, C).
#pragma once

#include "models/layers/context.h"

namespace memtrade {

struct Linear {
  ParamIndex weight = -1;
  ParamIndex bias = -1;  // -1: no bias (the tied GPT head)
};

// `out` (N, OC) is allocated by the caller, which knows whether it is saved.
void linear_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const Linear& l);
// dinp (N, C) (nullptr: not wanted) and the parameter gradients, from dout (N, OC) and the
// forward input inp (N, C).
void linear_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout, const Tensor& inp,
                     const Linear& l);

}  // namespace memtrade
