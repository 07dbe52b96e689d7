#include "models/families/cnn.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "models/layers/loss.h"
#include "models/train/data.h"

namespace memtrade {

ConvBn CnnModel::make_conv_bn(const std::string& conv, const std::string& bn, int ci, int co, int k,
                              int stride, int block, std::string key) {
  ConvBn l;
  const float std = std::sqrt(2.0f / static_cast<float>(co * k * k));
  l.conv = add_param(conv + ".weight", {co, ci, k, k}, std, block);
  l.bn_weight = add_param(bn + ".weight", {co}, -1.0f, block);
  l.bn_bias = add_param(bn + ".bias", {co}, 0.0f, block);
  l.running_mean = add_param(bn + ".running_mean", {co}, 0.0f, block, false);
  l.running_var = add_param(bn + ".running_var", {co}, -1.0f, block, false);
  l.stride = stride;
  l.pad = k / 2;
  l.key = std::move(key);
  return l;
}

CnnModel::CnnModel(CnnConfig cfg) : cfg_(std::move(cfg)) {
  stem_ = make_conv_bn("stem.conv", "stem.bn", 3, cfg_.stem_channels, 3, 1, -1, "stem");
  int ci = cfg_.stem_channels, size = cfg_.image_size;
  for (int i = 0; i < static_cast<int>(cfg_.blocks.size()); ++i) {
    const auto [co, s] = cfg_.blocks[i];
    const std::string p = fmt::format("blocks.{}.", i);
    Block b;
    b.in_size = size;
    b.c1 = make_conv_bn(p + "conv1", p + "bn1", ci, co, 3, s, i, "c1");
    b.c2 = make_conv_bn(p + "conv2", p + "bn2", co, co, 3, 1, i, "c2");
    b.downsample = s != 1 || ci != co;
    if (b.downsample)
      b.ds = make_conv_bn(p + "downsample.0", p + "downsample.1", ci, co, 1, s, i, "ds");
    blocks_.push_back(std::move(b));
    ci = co;
    size = (size + 2 - 3) / s + 1;
  }
  final_size_ = size;
  const float std = 1.0f / std::sqrt(3.0f * static_cast<float>(ci));
  head_ = {add_param("head.weight", {cfg_.classes, ci}, std, -1),
           add_param("head.bias", {cfg_.classes}, 0.0f, -1)};
}

nlohmann::json CnnModel::hyper() const {
  std::vector<int> widths, strides;
  for (const auto& b : cfg_.blocks) {
    widths.push_back(b.channels);
    strides.push_back(b.stride);
  }
  return {{"family", family()},
          {"image_size", cfg_.image_size},
          {"in_channels", 3},
          {"stem_channels", cfg_.stem_channels},
          {"widths", widths},
          {"strides", strides},
          {"blocks", cfg_.blocks.size()},
          {"classes", cfg_.classes},
          {"num_params", num_params()}};
}

void CnnModel::make_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch,
                          std::vector<float>& input, std::vector<std::int32_t>& targets) const {
  make_image_batch(seed, first, batch, cfg_.image_size, cfg_.classes, input, targets);
}

namespace {

Tensor relu(LayerCtx& c, const Tensor& x, Category category) {
  Tensor r = c.dev.empty(x.shape(), c.out_dtype(Op::relu, x), category);
  c.ops().relu_forward(r, x);
  return r;
}

// d(pre-activation) of a ReLU output `r` from d(r).
Tensor relu_mask(LayerCtx& c, const Tensor& d, const Tensor& r) {
  Tensor out = c.temp_like(r);
  c.ops().relu_backward(out, d, r);
  return out;
}

}  // namespace

// ---- forward ------------------------------------------------------------------------------------

Tensor CnnModel::stem_forward(LayerCtx& c, const Tensor& input) {
  // The conv's weight gradient needs its input: autocast's 16-bit cast of the image where the
  // conv reads one (kept, as autograd keeps it), else the image itself, as autograd saves the
  // batch it is handed (which exists before the step): no copy.
  Tensor cast;
  const Tensor& img = c.cast_input(Op::conv2d, input, cast);
  Tensor b = conv_bn_forward(c, img, stem_, Category::temporaries);  // (N, C0, S, S)
  if (c.save) c.keep("img", cast.defined() ? std::move(cast) : saved_in_place(input));
  return relu(c, b, Category::activations);
}

Tensor CnnModel::block_forward(LayerCtx& c, int block, const Tensor& x) {
  const Block& b = blocks_[block];
  Tensor b1 = conv_bn_forward(c, x, b.c1, Category::temporaries);  // (N, Co, OH, OW)
  // Selective: conv2's input is one BN + ReLU away from the saved conv1 output.
  const bool keep_r1 = c.save && !c.selective;
  Tensor r1 = relu(c, b1, keep_r1 ? Category::activations : Category::temporaries);
  b1.reset();
  // Selective: PyTorch's checkpoint around bn1 -> relu -> conv2 keeps none of it, conv2's
  // weight cast included (its recompute makes it again).
  Tensor y = conv_bn_forward(c, r1, b.c2, Category::temporaries, !c.selective);
  if (keep_r1) c.keep("r1", std::move(r1));
  r1.reset();
  // relu(y + shortcut) as eager evaluates it: the sum is a new tensor, and y and the sum are
  // freed once the ReLU has run (a recompute's peak holds all three).
  Tensor sum = c.temp(y.shape(), y.dtype());
  if (b.downsample) {
    Tensor sc = conv_bn_forward(c, x, b.ds, Category::temporaries);
    c.ops().add(sum, y, sc);
  } else {
    c.ops().add(sum, y, x);
  }
  return relu(c, sum, Category::activations);
}

Tensor CnnModel::head_forward(LayerCtx& c, Tensor x, const Tensor& targets) {
  const std::int64_t N = x.dim(0), C = x.dim(1);
  Tensor pooled = c.act_tensor({N, C}, c.out_dtype(Op::avgpool, x));  // (N, C)
  c.ops().global_avgpool_forward(pooled, x);
  c.keep("x", std::move(x));  // the last ReLU output: its mask is applied in head_backward
  pooled = c.cast_input(Op::linear, std::move(pooled));
  Tensor logits = c.act_tensor({N, cfg_.classes}, c.out_dtype(Op::linear, pooled));
  linear_forward(c, logits, pooled, head_);
  c.keep("pooled", std::move(pooled));
  return crossentropy_loss_forward(c, std::move(logits), targets);
}

// ---- backward -----------------------------------------------------------------------------------

Tensor CnnModel::head_backward(LayerCtx& c, float dloss) {
  const Tensor& pooled = c.get("pooled");
  Tensor dlogits =
      crossentropy_loss_backward(c, dloss, c.out_dtype(Op::linear, pooled));  // (N, classes)
  Tensor dpooled = c.temp_like(pooled);
  linear_backward(c, &dpooled, dlogits, pooled, head_);
  dlogits.reset();
  const Tensor& x = c.get("x");
  Tensor dx = c.temp_like(x);
  c.ops().global_avgpool_backward(dx, dpooled);
  return relu_mask(c, dx, x);
}

void CnnModel::block_backward(LayerCtx& c, int block, Tensor& dres) {
  const Block& b = blocks_[block];
  const Tensor& x = c.get("x");  // (N, Ci, H, W)
  // dres = d(sum) of this block's output ReLU (masked by the consumer). Autograd runs the nodes
  // made last first: the shortcut's BN and conv, then conv2's BN (after which nothing reads
  // dres, unless it is the identity shortcut's gradient), conv2, the ReLU, conv1's BN and conv1;
  // each node frees what it saved once it has run.
  Tensor dshort;  // d(x) through the shortcut; the identity's is dres itself
  if (b.downsample) dshort = conv_backward(c, bn_backward(c, dres, false, b.ds), x, b.ds, true);
  Tensor dc2 = bn_backward(c, dres, b.downsample, b.c2);
  // Selective: the ReLU output again from the saved conv1 output, where PyTorch's checkpoint
  // around bn1 -> relu -> conv2 recomputes it: after bn2's backward.
  Tensor r1;
  if (c.has("r1")) {
    r1 = c.saved.take(c.segment, "r1");
  } else {
    Tensor b1 = conv_bn_reapply(c, b.c1, Category::temporaries);
    r1 = relu(c, b1, Category::temporaries);
    b1.reset();
    // conv2's weight cast, made again and kept for its backward alone (the recompute's autocast
    // region ends here: the cache lets go of it, conv_backward frees it).
    c.recompute = true;
    c.op_weight(Op::conv2d, b.c2.conv);
    c.recompute = false;
    c.store.clear_casts();
  }
  Tensor dr1 = conv_backward(c, std::move(dc2), r1, b.c2, true);
  Tensor db1 = relu_mask(c, dr1, r1);
  dr1.reset();
  r1.reset();
  std::optional<ParamGrad> gw1;
  Tensor dx1 = conv_backward(c, bn_backward(c, db1, true, b.c1), x, b.c1, true, &gw1);
  // Autograd's input buffer of x adds its two gradients into a new tensor as conv1's node hands
  // dx1 on; then conv1's weight cast's ToCopyBackward runs (made after the ReLU that produced x,
  // so before that ReLU's backward).
  Tensor dx = c.temp_like(x);
  c.ops().add(dx, b.downsample ? dshort : dres, dx1);
  dshort.reset();
  dres.reset();
  dx1.reset();
  gw1->finish();
  dres = relu_mask(c, dx, x);  // x is the previous ReLU output
}

void CnnModel::stem_backward(LayerCtx& c, Tensor& dres) {
  conv_backward(c, bn_backward(c, dres, true, stem_), c.get("img"), stem_, false);
  dres.reset();
}

// ---- FLOPs --------------------------------------------------------------------------------------

namespace {
double conv_flops(std::int64_t n, int ci, int co, int k, int out_size) {
  return 2.0 * static_cast<double>(n) * out_size * out_size * co * ci * k * k;
}
}  // namespace

double CnnModel::stem_flops(std::int64_t batch) const {
  return conv_flops(batch, 3, cfg_.stem_channels, 3, cfg_.image_size);
}

double CnnModel::block_flops(std::int64_t batch, int block) const {
  const Block& b = blocks_[block];
  const int ci = block == 0 ? cfg_.stem_channels : cfg_.blocks[block - 1].channels;
  const auto [co, s] = cfg_.blocks[block];
  const int out = (b.in_size + 2 - 3) / s + 1;
  double f = conv_flops(batch, ci, co, 3, out) + conv_flops(batch, co, co, 3, out);
  if (b.downsample) f += conv_flops(batch, ci, co, 1, out);
  return f;
}

double CnnModel::head_flops(std::int64_t batch) const {
  return 2.0 * static_cast<double>(batch) * cfg_.blocks.back().channels * cfg_.classes;
}

}  // namespace memtrade
