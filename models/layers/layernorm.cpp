#include "models/layers/layernorm.h"

namespace memtrade {

void norm_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const LayerNorm& ln) {
  ScopedRange scope(c.dev, "layernorm");  // names the trace's allocations
  c.expect_input(Op::layernorm, inp);
  const std::int64_t N = inp.dim(0);
  Tensor mean = c.dev.empty({N}, DType::F32, c.cat());  // (N)
  Tensor rstd = c.dev.empty({N}, DType::F32, c.cat());  // (N)
  c.ops().layernorm_forward(out, mean, rstd, inp, c.weight(ln.weight), c.weight(ln.bias), ln.eps);
  c.keep(ln.key + ".mean", std::move(mean));
  c.keep(ln.key + ".rstd", std::move(rstd));
}

void norm_backward(LayerCtx& c, Tensor& dinp, const Tensor& dout, const Tensor& inp,
                   const LayerNorm& ln) {
  ScopedRange scope(c.dev, "layernorm");  // names the trace's allocations
  OpGrad gw = c.grad(ln.weight);
  OpGrad gb = c.grad(ln.bias);
  const Tensor& mean = c.get(ln.key + ".mean");
  const Tensor& rstd = c.get(ln.key + ".rstd");
  const Tensor& w = c.weight(ln.weight);
  if (gw.accumulate == gb.accumulate) {
    c.ops().layernorm_backward(dinp, &gw.t, &gb.t, dout, inp, w, mean, rstd, gw.accumulate);
  } else {
    c.ops().layernorm_backward(dinp, &gw.t, nullptr, dout, inp, w, mean, rstd, gw.accumulate);
    Tensor scratch = c.temp_like(inp);
    c.ops().layernorm_backward(scratch, nullptr, &gb.t, dout, inp, w, mean, rstd, gb.accumulate);
  }
}

void norm_backward_add(LayerCtx& c, Tensor& dres, const Tensor& dout, const Tensor& inp,
                       const LayerNorm& ln) {
  ScopedRange scope(c.dev, "layernorm");  // names the trace's allocations
  Tensor dinp = c.temp_like(inp);         // (N, C)
  norm_backward(c, dinp, dout, inp, ln);
  c.ops().add_inplace(dres, dinp);
}

}  // namespace memtrade
