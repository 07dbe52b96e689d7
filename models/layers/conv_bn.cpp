#include "models/layers/conv_bn.h"

#include <stdexcept>

namespace memtrade {

Shape conv_out_shape(const Shape& inp, std::int64_t out_channels, int kernel, int stride, int pad) {
  if (inp.size() != 4) throw std::invalid_argument("conv input must be (N, C, H, W)");
  const std::int64_t oh = (inp[2] + 2 * pad - kernel) / stride + 1;
  const std::int64_t ow = (inp[3] + 2 * pad - kernel) / stride + 1;
  return {inp[0], out_channels, oh, ow};
}

namespace {

// BN of the conv output `conv` into a new tensor; mean/invstd are saved or thrown away.
Tensor batchnorm(LayerCtx& c, const Tensor& conv, const ConvBn& l, Category out_category,
                 bool keep_stats, bool update_running) {
  const std::int64_t C = conv.dim(1);
  const Category stat_cat = keep_stats ? Category::activations : Category::temporaries;
  Tensor mean = c.dev.empty({C}, DType::F32, stat_cat);    // (C)
  Tensor invstd = c.dev.empty({C}, DType::F32, stat_cat);  // (C)
  Tensor out = c.dev.empty(conv.shape(), c.out_dtype(Op::batchnorm, conv), out_category);
  Tensor* rm = update_running ? &c.weight(l.running_mean) : nullptr;
  Tensor* rv = update_running ? &c.weight(l.running_var) : nullptr;
  c.ops().batchnorm_forward(out, mean, invstd, conv, c.weight(l.bn_weight), c.weight(l.bn_bias), rm,
                            rv, ConvBn::kEps, ConvBn::kMomentum);
  if (keep_stats) {
    c.keep(l.key + ".mean", std::move(mean));
    c.keep(l.key + ".invstd", std::move(invstd));
  }
  return out;
}

}  // namespace

Tensor conv_bn_forward(LayerCtx& c, const Tensor& inp, const ConvBn& l, Category out_category,
                       bool keep_weight_cast) {
  ScopedRange scope(c.dev, "conv_bn");  // names the trace's allocations
  c.expect_input(Op::conv2d, inp);
  const Tensor& w = c.op_weight(Op::conv2d, l.conv, keep_weight_cast);  // (Co, Ci, K, K)
  const int K = static_cast<int>(w.dim(2));
  Tensor conv = c.act_tensor(conv_out_shape(inp.shape(), w.dim(0), K, l.stride, l.pad),
                             c.out_dtype(Op::conv2d, inp));
  c.ops().conv2d_forward(conv, inp, w, nullptr, l.stride, l.pad);
  // Running statistics are a forward side effect: a recompute must not apply it twice.
  Tensor out = batchnorm(c, conv, l, out_category, c.save, !c.recompute);
  c.keep(l.key + ".conv", std::move(conv));
  return out;
}

Tensor conv_bn_reapply(LayerCtx& c, const ConvBn& l, Category out_category) {
  return batchnorm(c, c.get(l.key + ".conv"), l, out_category, false, false);
}

Tensor bn_backward(LayerCtx& c, Tensor& dout, bool last_use, const ConvBn& l) {
  ScopedRange scope(c.dev, "conv_bn");  // names the trace's allocations
  // Autograd's NativeBatchNormBackward: once it has run, its saved input (the conv output) and
  // statistics are freed, and so is its incoming gradient where no other node reads it.
  Tensor conv = c.saved.take(c.segment, l.key + ".conv");
  Tensor mean = c.saved.take(c.segment, l.key + ".mean");
  Tensor invstd = c.saved.take(c.segment, l.key + ".invstd");
  Tensor dconv = c.temp_like(conv);
  OpGrad gg = c.grad(l.bn_weight);
  OpGrad gb = c.grad(l.bn_bias);
  const Tensor& gamma = c.weight(l.bn_weight);
  if (gg.accumulate == gb.accumulate) {
    c.ops().batchnorm_backward(dconv, &gg.t, &gb.t, dout, conv, gamma, mean, invstd, gg.accumulate);
  } else {
    c.ops().batchnorm_backward(dconv, &gg.t, nullptr, dout, conv, gamma, mean, invstd,
                               gg.accumulate);
    Tensor scratch = c.temp_like(conv);
    c.ops().batchnorm_backward(scratch, nullptr, &gb.t, dout, conv, gamma, mean, invstd,
                               gb.accumulate);
  }
  if (last_use) dout.reset();
  return dconv;
}

Tensor conv_backward(LayerCtx& c, Tensor dconv, const Tensor& inp, const ConvBn& l, bool want_dinp,
                     std::optional<ParamGrad>* weight_grad) {
  ScopedRange scope(c.dev, "conv_bn");  // names the trace's allocations
  // Autograd's ConvolutionBackward: the input's gradient, then the weight's; once it has run,
  // its saved weight cast and its incoming gradient are freed before the weight's gradient goes
  // on through ToCopyBackward (ParamGrad::finish).
  Tensor dinp = want_dinp ? c.temp_like(inp) : Tensor();
  const Tensor& w = c.op_weight(Op::conv2d, l.conv);
  std::optional<ParamGrad> here;
  ParamGrad& gw = (weight_grad ? *weight_grad : here).emplace(c, l.conv, w.dtype());
  c.ops().conv2d_backward(want_dinp ? &dinp : nullptr, &gw.t(), nullptr, dconv, inp, w, l.stride,
                          l.pad, gw.accumulate());
  c.release_weight_cast(l.conv);
  dconv.reset();
  if (!weight_grad) gw.finish();
  return dinp;
}

}  // namespace memtrade
