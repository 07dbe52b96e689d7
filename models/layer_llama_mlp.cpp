#include "models/layers/llama_mlp.h"

namespace memtrade {

Tensor mlp_forward(LayerCtx& c, Tensor inp, const LlamaMlp& m) {
  const std::int64_t N = inp.dim(0), C = inp.dim(1);
  const std::int64_t I = c.weight(m.gate_proj.weight).dim(0);
  Tensor gate = c.act_tensor({N, I});  // (N, I)
  linear_forward(c, gate, inp, m.gate_proj);
  Tensor up = c.act_tensor({N, I});  // (N, I)
  linear_forward(c, up, inp, m.up_proj);
  c.keep("mlp.inp", std::move(inp));
  // Selective checkpointing drops down_proj's input: swiglu(gate, up) again in backward.
  const bool keep_h = c.save && !c.selective;
  Tensor h(c.dev.memory(), {N, I}, c.act, keep_h ? Category::activations : Category::temporaries);
  c.ops().swiglu_forward(h, gate, up);
  c.keep("mlp.gate", std::move(gate));
  c.keep("mlp.up", std::move(up));
  Tensor out = c.temp({N, C});  // (N, C): added into the residual by the block
  linear_forward(c, out, h, m.down_proj);
  if (keep_h) c.keep("mlp.h", std::move(h));
  return out;
}

Tensor mlp_backward(LayerCtx& c, const Tensor& dout, const LlamaMlp& m) {
  const Tensor& gate = c.get("mlp.gate");
  const Tensor& up = c.get("mlp.up");
  const Tensor& inp = c.get("mlp.inp");
  const std::int64_t N = gate.dim(0), I = gate.dim(1);

  Tensor recomputed;  // (N, I) when selective
  const Tensor* h = nullptr;
  if (c.has("mlp.h")) {
    h = &c.get("mlp.h");
  } else {
    recomputed = c.temp({N, I});
    c.ops().swiglu_forward(recomputed, gate, up);
    h = &recomputed;
  }
  Tensor dgate = c.temp({N, I});  // d h first, then d gate in place
  linear_backward(c, &dgate, dout, *h, m.down_proj);
  recomputed.reset();
  Tensor dup = c.temp({N, I});
  c.ops().swiglu_backward(dgate, dup, dgate, gate, up);

  Tensor dinp = c.temp(inp.shape());  // (N, C)
  linear_backward(c, &dinp, dgate, inp, m.gate_proj);
  dgate.reset();
  Tensor dinp_up = c.temp(inp.shape());
  linear_backward(c, &dinp_up, dup, inp, m.up_proj);
  dup.reset();
  c.ops().add_inplace(dinp, dinp_up);
  return dinp;
}

}  // namespace memtrade
