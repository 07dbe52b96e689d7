#include "models/layers/linear.h"

namespace memtrade {

void linear_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const Linear& l) {
  c.expect_input(Op::linear, inp);
  const Tensor& w = c.op_weight(Op::linear, l.weight, l.input_grad);
  const Tensor* bias = l.bias >= 0 ? &c.op_weight(Op::linear, l.bias, false) : nullptr;
  c.ops().linear_forward(out, inp, w, bias);
}

void linear_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout_in, const Tensor& inp,
                     const Linear& l) {
  Tensor dout_cast;
  const Tensor& dout = c.grad_as(dout_in, c.out_dtype(Op::linear, inp), dout_cast);
  // The weight only matters for dinp (without it, the op reads just its shape).
  const Tensor& w = dinp ? c.op_weight(Op::linear, l.weight) : c.weight(l.weight);
  ParamGrad gw(c, l.weight, c.weight_dtype(Op::linear, l.weight));
  if (l.bias < 0) {
    c.ops().linear_backward(dinp, &gw.t(), nullptr, dout, inp, w, gw.accumulate());
    gw.finish();
    return;
  }
  ParamGrad gb(c, l.bias, c.weight_dtype(Op::linear, l.bias));
  if (gb.accumulate() == gw.accumulate()) {
    c.ops().linear_backward(dinp, &gw.t(), &gb.t(), dout, inp, w, gw.accumulate());
  } else {  // one op call takes one accumulate flag; never the case for a plain Trainer
    c.ops().linear_backward(dinp, &gw.t(), nullptr, dout, inp, w, gw.accumulate());
    c.ops().linear_backward(nullptr, nullptr, &gb.t(), dout, inp, w, gb.accumulate());
  }
  gw.finish();
  gb.finish();
}

}  // namespace memtrade
