#include "models/layers/llama_mlp.h"

#include "models/layers/tensor_parallel.h"

namespace memtrade {

Tensor mlp_forward(LayerCtx& c, Tensor inp, const LlamaMlp& m) {
  const std::int64_t C = inp.dim(1);
  const std::int64_t I = c.weight(m.gate_proj.weight).dim(0);  // this rank's I / tp
  inp = c.cast_input(Op::linear, std::move(inp));
  Tensor gate, up;  // (N, I): gate_proj and up_proj are column-parallel
  {
    Tensor gathered;  // SP: every rank's tokens
    const Tensor& x = enter_column_parallel(c, inp, gathered, Category::temporaries);
    const std::int64_t N = x.dim(0);
    gate = c.act_tensor({N, I}, c.out_dtype(Op::linear, inp));
    linear_forward(c, gate, x, m.gate_proj);
    up = c.act_tensor({N, I}, c.out_dtype(Op::linear, inp));
    linear_forward(c, up, x, m.up_proj);
  }
  const std::int64_t N = gate.dim(0);
  c.keep("mlp.inp", std::move(inp));
  Tensor h = c.act_tensor({N, I}, c.out_dtype(Op::swiglu, gate));  // (N, I)
  c.ops().swiglu_forward(h, gate, up);
  c.keep("mlp.gate", std::move(gate));
  c.keep("mlp.up", std::move(up));
  h = c.cast_input(Op::linear, std::move(h));
  // (N, C): added into the residual (this rank's tokens under SP); down_proj is row-parallel
  Tensor out = c.temp({N, C}, c.out_dtype(Op::linear, h));
  row_parallel_forward(c, out, h, m.down_proj);
  c.keep("mlp.h", std::move(h));
  return out;
}

Tensor mlp_backward(LayerCtx& c, const Tensor& dout, const LlamaMlp& m) {
  const Tensor& gate = c.get("mlp.gate");
  const Tensor& up = c.get("mlp.up");
  const Tensor& inp = c.get("mlp.inp");
  const Tensor& h = c.get("mlp.h");
  Tensor dh = c.temp_like(h);
  row_parallel_backward(c, &dh, dout, h, m.down_proj);
  // d h, then d gate in place (the SwiGLU output has gate's dtype); d up beside it.
  Tensor dgate = c.grad_as(std::move(dh), c.out_dtype(Op::swiglu, gate));
  Tensor dup = c.temp_like(up);
  c.ops().swiglu_backward(dgate, dup, dgate, gate, up);

  Tensor gathered;
  const Tensor& x = enter_column_parallel(c, inp, gathered, Category::temporaries);
  Tensor dinp = c.temp_like(x);  // (N, C): gate_proj's and up_proj's contributions added
  linear_backward(c, &dinp, dgate, x, m.gate_proj);
  dgate.reset();
  Tensor dinp_up = c.temp_like(x);
  linear_backward(c, &dinp_up, dup, x, m.up_proj);
  dup.reset();
  c.ops().add_inplace(dinp, dinp_up);
  dinp_up.reset();
  gathered.reset();
  return enter_column_parallel_grad(c, std::move(dinp));
}

}  // namespace memtrade
