// BlockModel: the forward/backward driver shared by the GPT, MLP and CNN families.
//
// Every family is stem -> n blocks -> head (+ cross-entropy). The driver owns the SavedTensors
// of the last forward and applies the checkpoint plan and the offload policy; a family only
// writes the three parts' forward and backward. Segments of SavedTensors: -1 the stem, i block i,
// n the head.
//
// Autocast (RunOptions::amp): one forward is one autocast region, and so is each recompute of a
// checkpointed segment in backward (torch's non-reentrant checkpoint re-enters autocast and casts
// the weights again); the driver clears the ParamStore's weight-cast cache when a region ends.
//
// Protocol of the parts:
//   - stem_forward returns x0, the first block's input (category activations, or a view of the
//     model input, which the caller keeps until backward);
//   - block_forward(i, x) returns block i's output; the driver, not the block, saves x under
//     (i, "x") when the block keeps its insides or starts a recomputed segment, unless the block
//     saved an "x" of its own: a block whose first op reads x through autocast's cast keeps the
//     cast instead (as autograd keeps it), and a recomputed segment still keeps x itself;
//   - head_forward takes the last block's output and returns the per-row losses;
//   - head_backward returns d(last block output); block_backward turns `dres` from
//     d(block output) into d(block input) in place; stem_backward consumes d(x0).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "models/layers/context.h"
#include "models/model.h"
#include "models/train/saved_tensors.h"

namespace memtrade {

class BlockModel : public Model {
 public:
  const std::vector<ParamSpec>& params() const override { return params_; }
  Tensor forward(Device& dev, ParamStore& store, const Tensor& input, const Tensor& targets,
                 const RunOptions& options) final;
  void backward(Device& dev, ParamStore& store, float dloss) final;
  FlopCount flops(std::int64_t batch, const RunOptions& options) const final;

  // The saved state of the last training forward (for tests); nullptr after backward.
  const SavedTensors* saved() const { return saved_.get(); }
  // Index of a parameter by name; throws std::invalid_argument when unknown.
  int param_index(std::string_view name) const;

 protected:
  // Registers a parameter and returns its index.
  int add_param(std::string name, Shape shape, float init_std, int block, bool trainable = true);
  // A trainable parameter of which this rank holds the slice `tp` (shape: the slice's), or a
  // replicated one whose gradient the tp group all-reduces under sequence parallelism.
  int add_param(std::string name, Shape shape, float init_std, int block, TpSlice tp,
                bool sequence_parallel_grad = false);
  // Expert parallelism: `n` parameters of the whole model that this rank does not hold (other
  // ranks' experts); the later ones keep the whole model's index as ParamSpec::init_index.
  void skip_params(int n) { skipped_ += n; }
  ParamSpec& mutable_param(int index) { return params_.at(static_cast<std::size_t>(index)); }

  virtual Tensor stem_forward(LayerCtx& c, const Tensor& input) = 0;
  virtual Tensor block_forward(LayerCtx& c, int block, const Tensor& x) = 0;
  virtual Tensor head_forward(LayerCtx& c, Tensor x, const Tensor& targets) = 0;
  virtual Tensor head_backward(LayerCtx& c, float dloss) = 0;
  virtual void block_backward(LayerCtx& c, int block, Tensor& dres) = 0;
  // Whether block_backward brings its offloaded tensors back itself (c.fetch_saved()), after
  // work that reads none of them, so that they arrive beside less; otherwise backward() fetches
  // them before it (the MLP: a block's ReLU mask reads only the output its consumer handed on).
  virtual bool block_backward_fetches() const { return false; }
  virtual void stem_backward(LayerCtx& c, Tensor& dres) = 0;

  // Forward FLOPs (2 per multiply-add of GEMMs/convs) of the parts, the extra forward work
  // selective checkpointing spends on one block in backward, and the work an attention kind
  // recomputes in backward (flash: the scores).
  virtual double stem_flops(std::int64_t batch) const = 0;
  virtual double block_flops(std::int64_t batch, int block) const = 0;
  virtual double head_flops(std::int64_t batch) const = 0;
  virtual double selective_recompute_flops(std::int64_t /*batch*/, int /*block*/,
                                           const RunOptions& /*options*/) const {
    return 0.0;
  }
  virtual double attention_recompute_flops(std::int64_t /*batch*/, int /*block*/,
                                           const RunOptions& /*options*/) const {
    return 0.0;
  }

  void check_io(const Tensor& input, const Tensor& targets, DType act) const;
  // Whether the last training forward's plan drops `block` and recomputes it in backward.
  bool recomputed(int block) const { return plan_.recomputed(block); }

 private:
  std::vector<ParamSpec> params_;
  std::unordered_map<std::string, int> index_;
  int skipped_ = 0;  // skip_params so far
  std::unique_ptr<SavedTensors> saved_;
  std::optional<RunOptions> last_;  // options of the forward that saved_ belongs to
  CheckpointPlan plan_;
};

}  // namespace memtrade
