#include "models/layers/rmsnorm.h"

namespace memtrade {

void norm_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const RmsNorm& n) {
  ScopedRange scope(c.dev, "rmsnorm");  // names the trace's allocations
  c.expect_input(Op::rmsnorm, inp);
  Tensor rstd = c.dev.empty({inp.dim(0)}, DType::F32, c.cat());  // (N)
  c.ops().rmsnorm_forward(out, rstd, inp, c.weight(n.weight), n.eps, n.unit_offset);
  c.keep(n.key + ".rstd", std::move(rstd));
}

void norm_backward(LayerCtx& c, Tensor& dinp, const Tensor& dout, const Tensor& inp,
                   const RmsNorm& n) {
  ScopedRange scope(c.dev, "rmsnorm");  // names the trace's allocations
  GradRef gw = c.store.grad(n.weight);
  AccumulateBuffer eager = c.accumulate_buffer(n.weight, gw);
  c.ops().rmsnorm_backward(dinp, &gw.t, dout, inp, c.weight(n.weight), c.get(n.key + ".rstd"),
                           gw.accumulate, n.unit_offset);
}

void norm_backward_add(LayerCtx& c, Tensor& dres, const Tensor& dout, const Tensor& inp,
                       const RmsNorm& n) {
  ScopedRange scope(c.dev, "rmsnorm");  // names the trace's allocations
  Tensor dinp = c.temp(inp.shape());    // (N, C)
  norm_backward(c, dinp, dout, inp, n);
  c.ops().add_inplace(dres, dinp);
}

}  // namespace memtrade
