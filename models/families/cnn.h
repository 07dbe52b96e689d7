// Small ResNet-style CNN: stem conv3x3 (3 -> C0) + BN + ReLU; residual blocks
// [conv3x3(stride s) - BN - ReLU - conv3x3 - BN] + shortcut (identity, or conv1x1(stride s) + BN
// when the shape changes, torchvision's "downsample"), then ReLU; global average pool; Linear
// head. Convs have no bias. Names follow PyTorch modules: stem.conv.weight, stem.bn.{weight,
// bias,running_mean,running_var}, blocks.{i}.conv1.weight, blocks.{i}.bn1.*, blocks.{i}.conv2.*,
// blocks.{i}.bn2.*, blocks.{i}.downsample.0.weight, blocks.{i}.downsample.1.*, head.weight/.bias.
// BN running statistics are buffers (trainable = false, F32); num_batches_tracked is omitted.
// Init as torchvision: convs kaiming-normal (fan_out, ReLU): std √(2 / (Co·K·K)); BN 1 / 0;
// the head as nn.Linear's variance, normal(0, 1/√(3·in)), bias 0.
//
// Saved per block: its input, conv1 output + BN stats, the ReLU output (conv2 input; dropped and
// recomputed from conv1's output under selective checkpointing), conv2 output + stats, and the
// downsample conv output + stats. Every block input is a ReLU output (the stem's or the previous
// block's), so the consumer of a ReLU output applies its mask in backward (the MLP's blocks
// apply their own, as autograd does: models/families/mlp.h).
// Batch-norm always uses batch statistics (eval mode too: it is the no-grad path of a training
// model, so the loss equals the training loss); running stats are updated by training forwards
// only, never by a recompute.
#pragma once

#include <string>
#include <vector>

#include "models/families/block_model.h"
#include "models/layers/conv_bn.h"
#include "models/layers/linear.h"

namespace memtrade {

struct CnnConfig {
  std::string name;
  int image_size = 16;
  int classes = 10;
  int stem_channels = 8;
  struct BlockSpec {
    int channels;
    int stride;
  };
  std::vector<BlockSpec> blocks{{8, 1}, {16, 2}};
};

class CnnModel final : public BlockModel {
 public:
  explicit CnnModel(CnnConfig cfg);
  std::string name() const override { return cfg_.name; }
  std::string family() const override { return "cnn"; }
  nlohmann::json hyper() const override;
  int num_blocks() const override { return static_cast<int>(cfg_.blocks.size()); }
  Shape input_shape(std::int64_t batch) const override {
    return {batch, 3, cfg_.image_size, cfg_.image_size};
  }
  DType input_dtype(DType act) const override { return act; }
  Shape target_shape(std::int64_t batch) const override { return {batch}; }
  std::int64_t rows_per_sample() const override { return 1; }
  void make_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch,
                  std::vector<float>& input, std::vector<std::int32_t>& targets) const override;

 protected:
  Tensor stem_forward(LayerCtx& c, const Tensor& input) override;
  Tensor block_forward(LayerCtx& c, int block, const Tensor& x) override;
  Tensor head_forward(LayerCtx& c, Tensor x, const Tensor& targets) override;
  Tensor head_backward(LayerCtx& c, float dloss) override;
  void block_backward(LayerCtx& c, int block, Tensor& dres) override;
  void stem_backward(LayerCtx& c, Tensor& dres) override;
  double stem_flops(std::int64_t batch) const override;
  double block_flops(std::int64_t batch, int block) const override;
  double head_flops(std::int64_t batch) const override;

 private:
  struct Block {
    ConvBn c1, c2;
    bool downsample = false;
    ConvBn ds;
    int in_size = 0;  // input spatial size
  };
  ConvBn make_conv_bn(const std::string& conv, const std::string& bn, int ci, int co, int k,
                      int stride, int block, std::string key);
  CnnConfig cfg_;
  ConvBn stem_;
  std::vector<Block> blocks_;
  Linear head_;
  int final_size_ = 0;
};

}  // namespace memtrade
