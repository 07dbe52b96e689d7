// Linear (nn.Linear): out (N, OC) = inp (N, C) · weightᵀ + bias, weight (OC, C).
#pragma once

#include <vector>

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

// Several bias-free Linears of one input as one GEMM, their outputs side by side: HF Llama's
// q_proj, k_proj and v_proj give the packed qkv (N, (NH + 2·NKV)·hd) the attention ops take.
// The weight is their row-wise concatenation, which no parameter holds: forward copies the
// parts into a temporary (ΣOC, C) in the weights' dtype (Category::temporaries) for the GEMM;
// backward builds it again for dinp, frees it, then computes the stacked weight gradient in a
// temporary (ΣOC, C) in the gradients' dtype and copies each part's rows out (a part whose
// gradient accumulates is copied in first, so the GEMM adds to it). Three separate GEMMs, as
// PyTorch runs them, would write three separate outputs; the copies are exact, so the numbers
// are those of the three GEMMs and only the temporaries differ.
struct StackedLinear {
  std::vector<ParamIndex> parts;  // each (OC_i, C)
};

std::int64_t stacked_out_features(LayerCtx& c, const StackedLinear& l);  // ΣOC_i
void linear_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const StackedLinear& l);
void linear_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout, const Tensor& inp,
                     const StackedLinear& l);

}  // namespace memtrade
