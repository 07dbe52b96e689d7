// Conv2d (no bias, as in ResNet) followed by BatchNorm2d (eps 1e-5, momentum 0.1).
//
// Saved under the layer's key: "<key>.conv" (the conv output = BN input), "<key>.mean",
// "<key>.invstd". The conv input is saved by whoever owns it (it is the block input or the
// previous ReLU output). Under autocast the conv computes in 16 bits on its weight's cached cast
// (kept for backward) and batch-norm runs in its input's dtype with fp32 weights and statistics.
#pragma once

#include <optional>
#include <string>

#include "models/layers/context.h"

namespace memtrade {

struct ConvBn {
  ParamIndex conv = -1;  // (Co, Ci, K, K)
  ParamIndex bn_weight = -1, bn_bias = -1;
  ParamIndex running_mean = -1, running_var = -1;  // buffers, F32
  int stride = 1;
  int pad = 1;
  std::string key;
  static constexpr float kEps = 1e-5f;
  static constexpr float kMomentum = 0.1f;
};

// inp (N, Ci, H, W), already in conv's input dtype (c.cast_input) -> returns the BN output
// (N, Co, OH, OW) with category `out_category`.
// Running statistics are updated unless c.recompute. Under autocast the conv's weight cast is
// kept for backward unless `keep_weight_cast` is false (a backward that makes it again).
Tensor conv_bn_forward(LayerCtx& c, const Tensor& inp, const ConvBn& l, Category out_category,
                       bool keep_weight_cast = true);
// The BN output again from the saved conv output (selective recompute; no stat updates).
Tensor conv_bn_reapply(LayerCtx& c, const ConvBn& l, Category out_category);
// Backward as autograd's two nodes run it, each freeing what it saved once it has run (see
// bn_backward and conv_backward). BN's: the gradient of the conv output from `dout`
// (N, Co, OH, OW), and BN's parameter gradients; `dout` is freed when `last_use` (no other
// node reads it).
Tensor bn_backward(LayerCtx& c, Tensor& dout, bool last_use, const ConvBn& l);
// The conv's: its weight gradient, and its input's gradient (N, Ci, H, W) when `want_dinp`
// (else undefined), from `dconv` (freed here) and the forward input `inp`. With `weight_grad`
// the weight gradient's ParamGrad is left there for the caller to finish(): autograd runs the
// weight cast's ToCopyBackward as a node of its own, which may come after others.
Tensor conv_backward(LayerCtx& c, Tensor dconv, const Tensor& inp, const ConvBn& l, bool want_dinp,
                     std::optional<ParamGrad>* weight_grad = nullptr);
Shape conv_out_shape(const Shape& inp, std::int64_t out_channels, int kernel, int stride, int pad);

}  // namespace memtrade
