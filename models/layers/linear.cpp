#include "models/layers/linear.h"

#include <cstddef>
#include <optional>

namespace memtrade {

void linear_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const Linear& l) {
  ScopedRange scope(c.dev, "linear");  // names the trace's allocations
  c.expect_input(Op::linear, inp);
  const Tensor& w = c.op_weight(Op::linear, l.weight, l.input_grad);
  const Tensor* bias = l.bias >= 0 ? &c.op_weight(Op::linear, l.bias, false) : nullptr;
  c.ops().linear_forward(out, inp, w, bias);
}

void linear_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout_in, const Tensor& inp,
                     const Linear& l, const std::function<void()>& node_done) {
  ScopedRange scope(c.dev, "linear");  // names the trace's allocations
  // Once the GEMMs have run, autograd frees the node's saved cast of the weight and the cast
  // of the incoming gradient (its input buffer) before the weight's gradient goes on through
  // ToCopyBackward (ParamGrad::finish): so do these.
  Tensor dout_cast;
  const Tensor& dout = c.grad_as(dout_in, c.out_dtype(Op::linear, inp), dout_cast);
  // The weight only matters for dinp (without it, the op reads just its shape).
  const Tensor& w = dinp ? c.op_weight(Op::linear, l.weight) : c.weight(l.weight);
  ParamGrad gw(c, l.weight, c.weight_dtype(Op::linear, l.weight));
  std::optional<ParamGrad> gb;
  if (l.bias >= 0) gb.emplace(c, l.bias, c.weight_dtype(Op::linear, l.bias));
  if (!gb || gb->accumulate() == gw.accumulate()) {
    c.ops().linear_backward(dinp, &gw.t(), gb ? &gb->t() : nullptr, dout, inp, w, gw.accumulate());
  } else {  // one op call takes one accumulate flag; never the case for a plain Trainer
    c.ops().linear_backward(dinp, &gw.t(), nullptr, dout, inp, w, gw.accumulate());
    c.ops().linear_backward(nullptr, nullptr, &gb->t(), dout, inp, w, gb->accumulate());
  }
  if (dinp) c.release_weight_cast(l.weight);
  dout_cast.reset();
  if (node_done) node_done();
  gw.finish();
  if (gb) gb->finish();
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

// The gradients of stacked parameters as one tensor (ΣOC, ...), a temporary in their computed
// dtype, for one op to write: where a part accumulates it holds the parts' gradients so far (a
// part overwritten while another accumulates enters as zeros); finish() copies each part's rows
// out and finishes its gradient (under autocast, the cast into the fp32 gradient: ParamGrad).
class StackedGrads {
 public:
  StackedGrads(LayerCtx& c, const std::vector<ParamIndex>& params, std::vector<std::int64_t> shape)
      : c_(c) {
    grads_.reserve(params.size());
    // The stacked gradient stands for eager's buffers (each part's, which AccumulateGrad adds in).
    for (ParamIndex i : params)
      grads_.emplace_back(c, i, c.weight_dtype(Op::linear, i), /*eager_buffer=*/false);
    for (ParamGrad& g : grads_) {
      targets_.push_back(&g.t());
      accumulate_ = accumulate_ || g.accumulate();
    }
    stacked_ = c.temp(std::move(shape), targets_.front()->dtype());
    if (!accumulate_) return;
    for (ParamGrad& g : grads_)
      if (!g.accumulate()) c.ops().fill(g.t(), 0.0f);
    stack(c, stacked_, {targets_.begin(), targets_.end()});
  }
  Tensor& t() { return stacked_; }
  bool accumulate() const { return accumulate_; }
  void finish() {
    unstack(c_, stacked_, targets_);
    stacked_.reset();
    for (ParamGrad& g : grads_) g.finish();
  }

 private:
  LayerCtx& c_;
  std::vector<ParamGrad> grads_;
  std::vector<Tensor*> targets_;
  bool accumulate_ = false;
  Tensor stacked_;
};

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
  ScopedRange scope(c.dev, "linear");  // names the trace's allocations
  c.expect_input(Op::linear, inp);
  Tensor w = stacked_weight(c, l);
  Tensor b = l.biases.empty() ? Tensor() : stacked_bias(c, l);
  c.ops().linear_forward(out, inp, w, l.biases.empty() ? nullptr : &b);
}

void linear_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout_in, const Tensor& inp,
                     const StackedLinear& l) {
  ScopedRange scope(c.dev, "linear");  // names the trace's allocations
  Tensor dout_cast;
  const Tensor& dout = c.grad_as(dout_in, c.out_dtype(Op::linear, inp), dout_cast);
  if (dinp) {
    Tensor w = stacked_weight(c, l);
    c.ops().linear_backward(dinp, nullptr, nullptr, dout, inp, w, false);
  }
  // dW (ΣOC, C) (+)= doutᵀ · inp: the GEMM linear_backward runs for one weight.
  StackedGrads dw(c, l.parts, {dout.dim(1), inp.dim(1)});
  c.ops().matmul(dw.t(), dout, inp, true, false, 1.0f, dw.accumulate() ? 1.0f : 0.0f);
  if (!l.biases.empty()) {
    // db (ΣOC) (+)= the column sums of dout, as linear_backward's own bias gradient (the stacked
    // dW gives the op the weight's shape; it reads nothing else of it).
    StackedGrads db(c, l.biases, {dout.dim(1)});
    c.ops().linear_backward(nullptr, nullptr, &db.t(), dout, inp, dw.t(), db.accumulate());
    db.finish();
  }
  dw.finish();
}

}  // namespace memtrade
