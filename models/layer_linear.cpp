#include "models/layers/linear.h"

#include <cstddef>

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

namespace {

// Copies the parts (rows of one (ΣOC, C) matrix) into `stacked`, or back out of it.
enum class Direction : std::uint8_t { in, out };
void copy_parts(LayerCtx& c, Tensor& stacked, const std::vector<Tensor*>& parts, Direction d) {
  auto* base = static_cast<std::byte*>(stacked.data());
  std::size_t offset = 0;
  for (Tensor* p : parts) {
    if (d == Direction::in)
      c.dev.copy(base + offset, p->data(), p->nbytes(), CopyKind::device_to_device);
    else
      c.dev.copy(p->data(), base + offset, p->nbytes(), CopyKind::device_to_device);
    offset += p->nbytes();
  }
}

// The stacked weight, a temporary in the weights' dtype.
Tensor stacked_weight(LayerCtx& c, const StackedLinear& l) {
  const Tensor& first = c.weight(l.parts.front());
  Tensor w = c.temp({stacked_out_features(c, l), first.dim(1)}, first.dtype());
  std::vector<Tensor*> parts;
  for (ParamIndex i : l.parts) parts.push_back(&c.weight(i));
  copy_parts(c, w, parts, Direction::in);
  return w;
}

}  // namespace

std::int64_t stacked_out_features(LayerCtx& c, const StackedLinear& l) {
  std::int64_t rows = 0;
  for (ParamIndex i : l.parts) rows += c.weight(i).dim(0);
  return rows;
}

void linear_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const StackedLinear& l) {
  Tensor w = stacked_weight(c, l);
  c.ops().linear_forward(out, inp, w, nullptr);
}

void linear_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout, const Tensor& inp,
                     const StackedLinear& l) {
  if (dinp) {
    Tensor w = stacked_weight(c, l);
    c.ops().linear_backward(dinp, nullptr, nullptr, dout, inp, w, false);
  }
  std::vector<GradRef> refs;
  for (ParamIndex i : l.parts) refs.push_back(c.store.grad(i));
  std::vector<Tensor*> grads;
  bool accumulate = false;
  for (const GradRef& g : refs) {
    grads.push_back(&g.t);
    accumulate = accumulate || g.accumulate;
  }
  // dW (ΣOC, C) (+)= doutᵀ · inp, the GEMM linear_backward runs for one weight.
  Tensor dw = c.temp({dout.dim(1), inp.dim(1)}, grads.front()->dtype());
  if (accumulate) {
    // A part that is overwritten while another accumulates enters the GEMM as zeros.
    for (const GradRef& g : refs)
      if (!g.accumulate) c.ops().fill(g.t, 0.0f);
    copy_parts(c, dw, grads, Direction::in);
  }
  c.ops().matmul(dw, dout, inp, true, false, 1.0f, accumulate ? 1.0f : 0.0f);
  copy_parts(c, dw, grads, Direction::out);
}

}  // namespace memtrade
