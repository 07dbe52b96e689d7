// Conv2d (no bias, as in ResNet) followed by BatchNorm2d (eps 1e-5, momentum 0.1).
//
// Saved under the layer's key: "<key>.conv" (the conv output = BN input), "<key>.mean",
// "<key>.invstd". The conv input is saved by whoever owns it (it is the block input or the
// previous ReLU output). Under autocast the conv computes in 16 bits on its weight's cached cast
// (kept for backward) and batch-norm runs in its input's dtype with fp32 weights and statistics.
#pragma once

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
// Running statistics are updated unless c.recompute.
Tensor conv_bn_forward(LayerCtx& c, const Tensor& inp, const ConvBn& l, Category out_category);
// The BN output again from the saved conv output (selective recompute; no stat updates).
Tensor conv_bn_reapply(LayerCtx& c, const ConvBn& l, Category out_category);
// dinp (N, Ci, H, W) (nullptr: not wanted) and parameter gradients from dout (N, Co, OH, OW)
// and the forward input.
void conv_bn_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout, const Tensor& inp,
                      const ConvBn& l);
Shape conv_out_shape(const Shape& inp, std::int64_t out_channels, int kernel, int stride, int pad);

}  // namespace memtrade
