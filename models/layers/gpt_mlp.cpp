#include "models/layers/gpt_mlp.h"

#include "models/layers/tensor_parallel.h"

namespace memtrade {

Tensor mlp_forward(LayerCtx& c, Tensor inp, const GptMlp& m) {
  ScopedRange scope(c.dev, "mlp");  // names the trace's allocations
  inp = c.cast_input(Op::linear, std::move(inp));
  Tensor h;  // (N, 4C/tp): this rank's columns of c_fc, for every token
  {
    Tensor gathered;  // SP: every rank's tokens, for the column-parallel c_fc
    const Tensor& x = enter_column_parallel(c, inp, gathered, Category::temporaries);
    h = c.act_tensor({x.dim(0), c.weight(m.c_fc.weight).dim(0)}, c.out_dtype(Op::linear, inp));
    linear_forward(c, h, x, m.c_fc);
  }
  const std::int64_t C = inp.dim(1);
  c.keep("mlp.inp", std::move(inp));
  Tensor g = c.act_tensor(h.shape(), c.out_dtype(Op::gelu, h));  // (N, 4C/tp)
  c.ops().gelu_forward(g, h);
  c.keep("mlp.h", std::move(h));
  g = c.cast_input(Op::linear, std::move(g));
  // (N, C): added into the residual by the block (this rank's tokens under SP)
  Tensor out = c.temp({g.dim(0), C}, c.out_dtype(Op::linear, g));
  row_parallel_forward(c, out, g, m.c_proj);
  c.keep("mlp.g", std::move(g));
  return out;
}

Tensor mlp_backward(LayerCtx& c, const Tensor& dout, const GptMlp& m) {
  ScopedRange scope(c.dev, "mlp");  // names the trace's allocations
  // Each saved tensor is freed as soon as the last op that reads it has run its backward, as
  // autograd releases a node's saved variables once the node has run: the gelu output after
  // c_proj's, the c_fc output after gelu's, the input after c_fc's.
  Tensor dg;
  {
    Tensor g = c.saved.take(c.segment, "mlp.g");
    dg = c.temp_like(g);
    row_parallel_backward(c, &dg, dout, g, m.c_proj);
  }
  Tensor dh;
  {
    Tensor h = c.saved.take(c.segment, "mlp.h");
    dh = c.temp_like(h);
    c.ops().gelu_backward(dh, dg, h);
    dg.reset();
  }

  Tensor inp = c.saved.take(c.segment, "mlp.inp");
  Tensor gathered;
  const Tensor& x = enter_column_parallel(c, inp, gathered, Category::temporaries);
  Tensor dinp = c.temp_like(x);
  linear_backward(c, &dinp, dh, x, m.c_fc);
  gathered.reset();
  dh.reset();
  inp.reset();
  return enter_column_parallel_grad(c, std::move(dinp));
}

}  // namespace memtrade
