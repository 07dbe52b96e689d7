// Linear (nn.Linear): out (N, OC) = inp (N, C) · weightᵀ + bias, weight (OC, C).
//
// Under autocast (models/layers/context.h) linear computes in 16 bits on the cached casts of its
// weight (kept for backward when the input needs a gradient) and bias (not kept), and its weight
// gradients are computed in 16 bits and cast into the fp32 gradients (ParamGrad).
#pragma once

#include <functional>

#include <vector>

#include "models/layers/context.h"

namespace memtrade {

struct Linear {
  ParamIndex weight = -1;
  ParamIndex bias = -1;    // -1: no bias (the tied GPT head)
  bool input_grad = true;  // false: the input needs no gradient (a network's first layer), so
                           // backward reads no weight and autocast keeps no cast of it (addmm
                           // saves its weight only for the input's gradient; a convolution
                           // saves it always, so ConvBn has no such flag)
};

// `out` (N, OC), of dtype c.out_dtype(Op::linear, inp), is allocated by the caller, which knows
// whether it is saved; `inp` (N, C) is already in linear's input dtype (c.cast_input: the caller
// keeps what backward needs, the cast).
void linear_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const Linear& l);
// dinp (N, C) (nullptr: not wanted; always so without input_grad) and the parameter gradients,
// from dout (N, OC) and the
// forward input inp (N, C). dout of another dtype than linear's output (the fp32 gradient of a
// promoting add) is cast to it first, as autograd hands each output its own dtype's gradient.
// `node_done` runs once the GEMMs have, before the weight gradient's cast (ParamGrad::finish):
// where autograd's AddmmBackward frees its incoming gradient and saved input, before the weight
// cast's ToCopyBackward runs, the caller frees its own there.
void linear_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout, const Tensor& inp,
                     const Linear& l, const std::function<void()>& node_done = {});

// Several Linears of one input as one GEMM, their outputs side by side: HF Llama's q_proj, k_proj
// and v_proj give the packed qkv (N, (NH + 2·NKV)·hd) the attention ops take. Their biases, where
// they have them (Qwen2's q/k/v, Llama's attention_bias), are stacked the same way into a
// temporary (ΣOC) that the GEMM adds (its bias gradient is one reduction, unstacked per part).
// The weight is their row-wise concatenation, which no parameter holds: forward copies the
// parts as linear reads them (the weights, or under autocast their cached 16-bit casts, kept for
// backward as a Linear's are) into a temporary (ΣOC, C) (Category::temporaries) for the GEMM;
// backward builds it again for dinp, frees it, then computes the stacked weight gradient in a
// temporary (ΣOC, C) in the gradients' computed dtype and copies each part's rows out (a part
// whose gradient accumulates is copied in first, so the GEMM adds to it; under autocast each
// 16-bit part is then cast into its fp32 gradient, ParamGrad). PyTorch runs three GEMMs into
// three outputs; the copies are exact, so the numbers are those of one GEMM per part and only
// the temporaries (one (ΣOC, C) at a time) differ.
struct StackedLinear {
  std::vector<ParamIndex> parts;   // each (OC_i, C)
  std::vector<ParamIndex> biases;  // empty (no biases), or one (OC_i) per part
};

std::int64_t stacked_out_features(LayerCtx& c, const StackedLinear& l);  // ΣOC_i
void linear_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const StackedLinear& l);
void linear_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout, const Tensor& inp,
                     const StackedLinear& l);

}  // namespace memtrade
