#include "models/layers/linear.h"

#include <cstddef>

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

namespace {

// The parts as consecutive rows of `stacked` (ΣOC, C), and back.
void stack(LayerCtx& c, Tensor& stacked, const std::vector<const Tensor*>& parts) {
  std::size_t offset = 0;
  for (const Tensor* p : parts) {
    c.dev.copy(static_cast<std::byte*>(stacked.data()) + offset, p->data(), p->nbytes(),
               CopyKind::device_to_device);
    offset += p->nbytes();
  }
}
void unstack(LayerCtx& c, const Tensor& stacked, const std::vector<Tensor*>& parts) {
  std::size_t offset = 0;
  for (Tensor* p : parts) {
    c.dev.copy(p->data(), static_cast<const std::byte*>(stacked.data()) + offset, p->nbytes(),
               CopyKind::device_to_device);
    offset += p->nbytes();
  }
}

// The stacked weight, a temporary in the dtype linear reads the weights in (under autocast
// their cached 16-bit casts, kept for backward as a single Linear keeps its weight's).
Tensor stacked_weight(LayerCtx& c, const StackedLinear& l) {
  std::vector<const Tensor*> parts;
  for (ParamIndex i : l.parts) parts.push_back(&c.op_weight(Op::linear, i));
  Tensor w = c.temp({stacked_out_features(c, l), parts.front()->dim(1)}, parts.front()->dtype());
  stack(c, w, parts);
  return w;
}

// The stacked bias (ΣOC), a temporary in the dtype linear adds it in (under autocast its cast,
// not kept for backward, as a single Linear's bias).
Tensor stacked_bias(LayerCtx& c, const StackedLinear& l) {
  std::vector<const Tensor*> parts;
  for (ParamIndex i : l.biases) parts.push_back(&c.op_weight(Op::linear, i, false));
  Tensor b = c.temp({stacked_out_features(c, l)}, parts.front()->dtype());
  stack(c, b, parts);
  return b;
}

}  // namespace

std::int64_t stacked_out_features(LayerCtx& c, const StackedLinear& l) {
  std::int64_t rows = 0;
  for (ParamIndex i : l.parts) rows += c.weight(i).dim(0);
  return rows;
}

void linear_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const StackedLinear& l) {
  c.expect_input(Op::linear, inp);
  Tensor w = stacked_weight(c, l);
  Tensor b = l.biases.empty() ? Tensor() : stacked_bias(c, l);
  c.ops().linear_forward(out, inp, w, l.biases.empty() ? nullptr : &b);
}

void linear_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout_in, const Tensor& inp,
                     const StackedLinear& l) {
  Tensor dout_cast;
  const Tensor& dout = c.grad_as(dout_in, c.out_dtype(Op::linear, inp), dout_cast);
  if (dinp) {
    Tensor w = stacked_weight(c, l);
    c.ops().linear_backward(dinp, nullptr, nullptr, dout, inp, w, false);
  }
  std::vector<ParamGrad> grads;
  grads.reserve(l.parts.size());
  for (ParamIndex i : l.parts) grads.emplace_back(c, i, c.weight_dtype(Op::linear, i));
  std::vector<Tensor*> targets;
  bool accumulate = false;
  for (ParamGrad& g : grads) {
    targets.push_back(&g.t());
    accumulate = accumulate || g.accumulate();
  }
  // dW (ΣOC, C) (+)= doutᵀ · inp: the GEMM linear_backward runs for one weight.
  Tensor dw = c.temp({dout.dim(1), inp.dim(1)}, targets.front()->dtype());
  if (accumulate) {
    // A part that is overwritten while another accumulates enters the GEMM as zeros.
    for (ParamGrad& g : grads)
      if (!g.accumulate()) c.ops().fill(g.t(), 0.0f);
    stack(c, dw, {targets.begin(), targets.end()});
  }
  c.ops().matmul(dw, dout, inp, true, false, 1.0f, accumulate ? 1.0f : 0.0f);
  unstack(c, dw, targets);
  if (!l.biases.empty()) {
    // db (ΣOC) (+)= the column sums of dout, as linear_backward's own bias gradient (dw gives the
    // op the stacked weight's shape; it reads nothing else of it).
    std::vector<ParamGrad> bgrads;
    bgrads.reserve(l.biases.size());
    for (ParamIndex i : l.biases) bgrads.emplace_back(c, i, c.weight_dtype(Op::linear, i));
    std::vector<Tensor*> btargets;
    bool bacc = false;
    for (ParamGrad& g : bgrads) {
      btargets.push_back(&g.t());
      bacc = bacc || g.accumulate();
    }
    Tensor db = c.temp({dout.dim(1)}, btargets.front()->dtype());
    if (bacc) {
      for (ParamGrad& g : bgrads)
        if (!g.accumulate()) c.ops().fill(g.t(), 0.0f);
      stack(c, db, {btargets.begin(), btargets.end()});
    }
    c.ops().linear_backward(nullptr, nullptr, &db, dout, inp, dw, bacc);
    unstack(c, db, btargets);
    db.reset();
    for (ParamGrad& g : bgrads) g.finish();
  }
  dw.reset();
  for (ParamGrad& g : grads) g.finish();
}

}  // namespace memtrade
