// MLP classifier: Linear -> ReLU -> ... -> Linear, cross-entropy over classes.
//
// Parameters are layers.{j}.weight (out, in) / .bias with j the index of the Linear among the
// Linears (0 .. hidden.size(); the last one is the head), not its nn.Sequential index. Init as
// nn.Linear's variance: weights normal(0, 1/√(3·in)) (kaiming-uniform has that std), biases 0.
// One block = one hidden Linear + its ReLU.
//
// Saved per block: its input (the previous block's ReLU output, or block 0's input, under
// autocast its 16-bit cast) and its ReLU output, which its ReLU backward reads, as autograd's
// ReluBackward saves its result. Each block's backward applies its own ReLU's mask, then its
// linear's backward, in autograd's node order. The ReLU output of block j is block j+1's (or the
// head's) input, one storage: the main forward saves it once, as its consumer's input, and the
// consumer's backward hands it on to block j (MlpModel::pass_on) instead of freeing it. Where
// block j is recomputed the consumer frees its copy (autograd frees a checkpoint's output once
// the AddmmBackward that saved it has run) and the recompute keeps block j's own, which a
// consumer inside the segment saves as a view. Per-block checkpointing therefore saves no memory
// here (as with torch.utils.checkpoint on such a block); sqrt does, by dropping the inputs inside
// a segment; selective changes nothing. Under activation offload the handed-on output stays on
// the device until block j's mask, and block j's input comes back only after it
// (block_backward_fetches), as autograd unpacks AddmmBackward's input after ReluBackward ran.
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
  bool block_backward_fetches() const override { return true; }
  void stem_backward(LayerCtx&, Tensor& dres) override { dres.reset(); }
  double stem_flops(std::int64_t) const override { return 0.0; }
  double block_flops(std::int64_t batch, int block) const override;
  double head_flops(std::int64_t batch) const override;

 private:
  void pass_on(LayerCtx& c, int prev, Tensor& x) const;

  MlpConfig cfg_;
  std::vector<Linear> layers_;  // hidden layers then the head
};

}  // namespace memtrade
