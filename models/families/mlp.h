// MLP classifier: Linear -> ReLU -> ... -> Linear, cross-entropy over classes.
//
// Parameters are layers.{j}.weight (out, in) / .bias with j the index of the Linear among the
// Linears (0 .. hidden.size(); the last one is the head), not its nn.Sequential index. Init as
// nn.Linear's variance: weights normal(0, 1/√(3·in)) (kaiming-uniform has that std), biases 0.
// One block = one hidden Linear + its ReLU.
//
// Saved per block: only its input. The ReLU mask of a block's output is applied by the consumer
// of that output (the next block or the head), which holds it as its own input; so a block's
// backward returns d(previous pre-activation) directly and nothing else needs saving. Per-block
// checkpointing therefore saves no memory here (as with torch.utils.checkpoint on such a
// block); sqrt does, by dropping the inputs inside a segment; selective changes nothing.
#pragma once

#include <string>
#include <vector>

#include "models/families/block_model.h"
#include "models/layers/linear.h"

namespace memtrade {

struct MlpConfig {
  std::string name;
  int in_features = 32;
  std::vector<int> hidden{64, 64};
  int classes = 10;
};

class MlpModel final : public BlockModel {
 public:
  explicit MlpModel(MlpConfig cfg);
  std::string name() const override { return cfg_.name; }
  std::string family() const override { return "mlp"; }
  nlohmann::json hyper() const override;
  int num_blocks() const override { return static_cast<int>(cfg_.hidden.size()); }
  Shape input_shape(std::int64_t batch) const override { return {batch, cfg_.in_features}; }
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
  void stem_backward(LayerCtx&, Tensor& dres) override { dres.reset(); }
  double stem_flops(std::int64_t) const override { return 0.0; }
  double block_flops(std::int64_t batch, int block) const override;
  double head_flops(std::int64_t batch) const override;

 private:
  MlpConfig cfg_;
  std::vector<Linear> layers_;  // hidden layers then the head
};

}  // namespace memtrade
