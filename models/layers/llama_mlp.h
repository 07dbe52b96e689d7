// The Llama MLP (HF LlamaMLP, SwiGLU): down_proj(silu(gate_proj(x)) · up_proj(x)); gate_proj and
// up_proj (I, C), down_proj (C, I), no biases.
//
// Saved: "mlp.inp" (the input of gate_proj and up_proj), "mlp.gate" and "mlp.up" (N, I) (the
// SwiGLU inputs), "mlp.h" (N, I) (down_proj's input). HF under autograd keeps silu(gate) (N, I)
// as well (the multiply's other operand); Ops::swiglu_backward recomputes it from gate instead.
// With llama_layers hf-eager (LayerCtx::hf_eager) this layer keeps what HF's eager
// act_fn(gate_proj(x)) * up_proj(x) keeps: act_fn(gate) ("mlp.act", gate's dtype) and, under
// autocast, up_proj's own 16-bit cast of the input ("mlp.inp_cast": autocast casts an op's
// inputs on every call and caches only the weights' casts); both freed after the SwiGLU's and
// the linears' backward, never read by the ops.
// Selective checkpointing keeps them all: it recomputes the attention core only (Megatron),
// models/layers/attention.h. Under autocast the linears cast their input to 16 bits and SwiGLU
// runs in the dtype it gets (SiLU and mul are on no autocast list: Op::swiglu).
//
// Gemma 2's MLP (transformers 4.46.3 modeling_gemma2.py Gemma2MLP) is this one with
// act_fn = ACT2FN["gelu_pytorch_tanh"] in place of silu (GeGLU): the same saved tensors; HF keeps
// gelu(gate) (N, I) as the multiply's other operand, which Ops::geglu_backward recomputes. Its
// output is kept by the post-feedforward norm (output_saved).
//
// Phi-3's MLP (HF Phi3MLP) is the same function with gate_proj and up_proj fused into one
// gate_up_proj (2I, C), gate's rows first (`gate, up = gate_up_proj(x).chunk(2, dim=-1)`). It
// saves "mlp.gate_up" (N, 2I) instead of "mlp.gate" and "mlp.up": the same bytes, as HF's chunk
// views keep the one (N, 2I) output. The SwiGLU ops take contiguous operands, so the two halves
// are copied into temporaries (N, I) around them, in forward and again in backward, and the two
// halves of the gradient into one (N, 2I) temporary for gate_up_proj's backward: temporaries that
// HF's views do not make; what is saved is equal.
#pragma once

#include <string>

#include "models/layers/linear.h"

namespace memtrade {

struct LlamaMlp {
  Linear gate_proj;
  Linear up_proj;
  Linear down_proj;
  Linear gate_up_proj;  // Phi-3: one (2I, C) weight; when set, gate_proj and up_proj are unused
  // Saved-tensor keys: key + "inp", "gate", ... ("mlp." for a block's MLP; a mixture-of-experts
  // layer's experts have their own, layers/moe.h). input_key: the input is the caller's saved
  // tensor of that key (mlp_forward_on), not saved again.
  std::string key = "mlp.";
  std::string input_key{};
  bool output_saved = false;  // the caller keeps the output (an expert's, Gemma 2's): an activation
  bool gelu = false;          // Gemma 2: GeGLU, gelu_pytorch_tanh(gate) · up (Ops::geglu_*)
};

// inp (N, C), moved in (saved as gate_proj's and up_proj's input, cast to their input dtype
// first) -> returns (N, C), a temporary.
Tensor mlp_forward(LayerCtx& c, Tensor inp, const LlamaMlp& m);
// The same on an input the caller has cast to linear's dtype and keeps under m.input_key (a
// shared expert reads the router's input); not for the fused gate_up_proj.
Tensor mlp_forward_on(LayerCtx& c, const Tensor& inp, const LlamaMlp& m);
// dout (N, C) -> returns dL/dinp (N, C), a temporary in gate_proj's input dtype.
Tensor mlp_backward(LayerCtx& c, const Tensor& dout, const LlamaMlp& m);

}  // namespace memtrade
