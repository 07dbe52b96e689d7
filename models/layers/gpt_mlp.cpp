#include "models/layers/gpt_mlp.h"

namespace memtrade {

Tensor mlp_forward(LayerCtx& c, Tensor inp, const GptMlp& m) {
  const std::int64_t N = inp.dim(0), C = inp.dim(1);
  inp = c.cast_input(Op::linear, std::move(inp));
  Tensor h = c.act_tensor({N, 4 * C}, c.out_dtype(Op::linear, inp));  // (N, 4C)
  linear_forward(c, h, inp, m.c_fc);
  c.keep("mlp.inp", std::move(inp));
  Tensor g = c.act_tensor({N, 4 * C}, c.out_dtype(Op::gelu, h));  // (N, 4C)
  c.ops().gelu_forward(g, h);
  c.keep("mlp.h", std::move(h));
  g = c.cast_input(Op::linear, std::move(g));
  Tensor out = c.temp({N, C}, c.out_dtype(Op::linear, g));  // (N, C): added into the residual
  linear_forward(c, out, g, m.c_proj);
  c.keep("mlp.g", std::move(g));
  return out;
}

Tensor mlp_backward(LayerCtx& c, const Tensor& dout, const GptMlp& m) {
  const Tensor& g = c.get("mlp.g");
  const Tensor& inp = c.get("mlp.inp");
  Tensor dg = c.temp_like(g);
  linear_backward(c, &dg, dout, g, m.c_proj);

  const Tensor& h = c.get("mlp.h");
  Tensor dh = c.temp_like(h);
  c.ops().gelu_backward(dh, dg, h);
  dg.reset();

  Tensor dinp = c.temp_like(inp);
  linear_backward(c, &dinp, dh, inp, m.c_fc);
  return dinp;
}

}  // namespace memtrade
