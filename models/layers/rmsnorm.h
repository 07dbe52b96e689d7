// RMSNorm (HF LlamaRMSNorm): out = weight · x/√(mean(x²) + eps) over the last dim of (N, C),
// no bias. Saved: "<key>.rstd" (N) F32; the input is saved by its owner (the block's input or
// residual). memtrade's op recomputes x·rstd from x in backward (kernels/ops.h rmsnorm_backward),
// as a fused kernel does (llama_layers liger, the default).
//
// HF's eager code under autograd keeps more, and with llama_layers hf-eager (LayerCtx::hf_eager)
// so does this layer, op by op (transformers 4.46.3 LlamaRMSNorm.forward on torch 1.13):
// x.to(float32) for a 16-bit x ("<key>.f32", kept by pow and the multiply), pow(2)'s x² (N, C)
// F32 ("<key>.sq": torch 1.13's MeanBackward1 keeps its input), the mean and its + eps (N, 1)
// transients, rsqrt (the rstd above), x · rsqrt (N, C) F32 rounded to x's dtype
// ("<key>.normed", the weight's multiplicand; Gemma2RMSNorm keeps it in fp32, and its (1 + w)
// (C) F32, "<key>.w1"). They are freed when the norm's backward has run, as autograd frees a
// node's saved tensors; the op reads none of them, so the arithmetic is liger's, bit for bit.
//
// Gemma 2 (transformers 4.46.3 modeling_gemma2.py Gemma2RMSNorm): the weight enters as 1 + w
// (zeros at init) and the normalised row is not rounded before it; HF's output is type_as(x),
// which for the residual stream's fp32 is the same dtype as here (the decoder casts the 16-bit
// inputs of its post-norms itself, models/families/decoder.cpp).
//
// Under autocast the input must already be fp32 (Op::rmsnorm: HF casts to fp32 itself; the
// Llama's residual stream is fp32, so no cast is needed) and the output is fp32 (the fp32 weight
// times the normalised rows promotes).
#pragma once

#include <string>

#include "models/layers/context.h"

namespace memtrade {

struct RmsNorm {
  ParamIndex weight = -1;    // (C)
  std::string key;           // save prefix: "input_layernorm" -> "input_layernorm.rstd"
  float eps = 1e-5f;         // rms_norm_eps
  bool unit_offset = false;  // Gemma2RMSNorm: (x·rstd)·(1 + w) in fp32 (kernels/ops.h)
};

// out (N, C), of dtype c.out_dtype(Op::rmsnorm, inp), from inp (N, C); the caller saves inp if
// it is not saved elsewhere.
void norm_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const RmsNorm& n);
// dinp (N, C) = dL/dinp from dout (N, C) and the forward input (overwritten).
void norm_backward(LayerCtx& c, Tensor& dinp, const Tensor& dout, const Tensor& inp,
                   const RmsNorm& n);
// dres (N, C) += dL/dinp, from dout (N, C) and the forward input (residual-stream style).
void norm_backward_add(LayerCtx& c, Tensor& dres, const Tensor& dout, const Tensor& inp,
                       const RmsNorm& n);

}  // namespace memtrade
