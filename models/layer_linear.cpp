#include "models/layers/linear.h"

namespace memtrade {

void linear_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const Linear& l) {
  const Tensor* bias = l.bias >= 0 ? &c.weight(l.bias) : nullptr;
  c.ops().linear_forward(out, inp, c.weight(l.weight), bias);
}

void linear_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout, const Tensor& inp,
                     const Linear& l) {
  const Tensor& w = c.weight(l.weight);
  GradRef gw = c.store.grad(l.weight);
  if (l.bias < 0) {
    c.ops().linear_backward(dinp, &gw.t, nullptr, dout, inp, w, gw.accumulate);
    return;
  }
  GradRef gb = c.store.grad(l.bias);
  if (gb.accumulate == gw.accumulate) {
    c.ops().linear_backward(dinp, &gw.t, &gb.t, dout, inp, w, gw.accumulate);
  } else {  // one op call takes one accumulate flag; never the case for a plain Trainer
    c.ops().linear_backward(dinp, &gw.t, nullptr, dout, inp, w, gw.accumulate);
    c.ops().linear_backward(nullptr, nullptr, &gb.t, dout, inp, w, gb.accumulate);
  }
}

}  // namespace memtrade
