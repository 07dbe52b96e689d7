// Model: the interface between a network (GPT, MLP, CNN) and the Trainer that runs it.
//
// A model owns no weights. It describes its parameters (names, shapes, init) and runs forward
// and backward against a ParamStore that the Trainer implements; that is how precision (which
// dtype the weights have), zero_grad (whether a gradient is overwritten or added to) and
// `offload = params` (weights streamed in per block) stay out of model code. What a model saves
// for backward goes through SavedTensors (models/train/saved_tensors.h), where the checkpoint and
// activation-offload policies live.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/device.h"
#include "kernels/parallel_state.h"
#include "models/config/config.h"

namespace memtrade {

// Tensor parallelism: how this rank's tensor is cut out of the whole parameter (Megatron's
// partition_dim). dim -1: replicated (the whole parameter). Otherwise the whole parameter's
// dimension `dim` (of size `full`) is `groups` equal groups (GPT's packed c_attn: q, k and v),
// and this rank holds the elements [offset, offset + count) of each group along it, so its
// tensor has groups · count there.
struct TpSlice {
  int dim = -1;
  std::int64_t full = 0, groups = 1, offset = 0, count = 0;
  bool split() const { return dim >= 0; }
};

struct ParamSpec {
  std::string name;    // PyTorch module naming: "transformer.h.0.attn.c_attn.weight"
  Shape shape;         // PyTorch layout: nn.Linear weight is (out, in); this rank's slice
  float init_std = 0;  // > 0: normal(0, std); 0: zeros; < 0: ones
  int block = -1;      // index of the block it belongs to (-1: outside the repeated blocks)
  bool trainable =
      true;      // false for buffers (batch-norm running stats): F32, no grad, no optimizer
  TpSlice tp{};  // this rank's slice of the whole parameter (tensor parallelism)
  // Replicated over the tp ranks but fed by this rank's tokens only under sequence parallelism
  // (the norms, the row-parallel biases): its gradient is all-reduced over the tp group after
  // backward (Megatron's `sequence_parallel` parameter attribute).
  bool sequence_parallel_grad = false;
  // An expert's (expert parallelism, models/layers/moe.h): held by the ranks of one ep rank only,
  // so its gradient is reduced, and its copies sharded, over the expert-data-parallel group
  // (kernels/parallel_state.h) instead of the data-parallel one.
  bool expert = false;
  // Its index in the model that holds every expert (ep 1), which seeds its initial values: an ep
  // rank starts from the values ep 1 starts from. -1: its own index.
  int init_index = -1;

  // The whole parameter's shape (shape itself where it is not split).
  Shape full_shape() const;
};

// This rank's elements of the whole parameter's values (row-major, spec.full_shape()).
std::vector<float> tp_slice_of(const ParamSpec& spec, const std::vector<float>& whole);

// A gradient as handed to a layer's backward: write into `t`, adding when `accumulate`.
struct GradRef {
  Tensor& t;
  bool accumulate;
};

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // The weight of params()[index] on the device, in the compute dtype (buffers: F32, mutable).
  virtual Tensor& weight(int index) = 0;
  // The gradient of params()[index] (allocated on first use when grads were set to none). The
  // first call in a step with set_to_none says accumulate = false; later calls (a tied weight,
  // further micro-batches) say true.
  virtual GradRef grad(int index) = 0;
  // Called around each block's forward/backward/recompute so that streamed weights
  // (offload = params) can be brought in before use and dropped after.
  virtual void enter_block(int /*block*/) {}
  virtual void exit_block(int /*block*/) {}
  // Called after a block's backward (before its exit_block): its parameters' gradients of this
  // micro-batch are complete, so data parallelism may reduce them while backward goes on (the
  // moment torch's autograd hooks tell DDP and FSDP).
  virtual void block_grads_done(int /*block*/) {}
  // Called after a block's enter_block in backward, before its backward runs (torch FSDP's
  // pre-backward hook, where BACKWARD_PRE prefetches the next block's weights).
  virtual void block_backward_begins(int /*block*/) {}

  // ---- autocast's weight-cast cache (torch's cached_cast) --------------------------------------
  // weight(index) cast to `dtype` with `ops`: made on the first request of an autocast region
  // (one forward, or one recompute of a checkpointed segment), from the weight's own allocator
  // with Category::casts, and handed out again for every later request until clear_casts(),
  // which the model calls when the region ends. Owners beyond the cache (a saved tensor of the
  // op that read it, SavedTensors::share) keep a cast alive after that, as autograd's graph keeps
  // PyTorch's cached casts until the backward that uses them. `dtype` equal to the weight's: the
  // weight itself, not owned.
  std::shared_ptr<Tensor> weight_cast(int index, DType dtype, Ops& ops);
  void clear_casts() { casts_.clear(); }
  std::size_t cached_casts() const { return casts_.size(); }

 private:
  std::map<int, std::shared_ptr<Tensor>> casts_;  // by index: cleared in index order
};

// torch.autocast for a forward/backward pass: the 16-bit dtype and whose op lists decide the
// dtype of each op (models/config/autocast_policy.h).
struct AutocastSpec {
  DType dtype = DType::BF16;
  autocast::Policy policy = autocast::Policy::torch_cuda;
};

// How a forward/backward pass runs.
struct RunOptions {
  // The activations' dtype (the weights' too). Under autocast: the dtype of the model input and
  // of every op autocast leaves alone (fp32), the ops' own dtypes coming from `amp`.
  DType act_dtype = DType::F32;
  bool training = true;              // eval: nothing saved, no backward
  Checkpoint checkpoint{};           // which blocks are recomputed in backward
  bool offload_activations = false;  // saved activations go to pinned host memory
  // The attention layers' ops (kernels/ops.h): math saves the probabilities, flash does not.
  AttentionKind attention = AttentionKind::math;
  // What a Llama-like model's layers keep (the llama_layers knob; other families ignore it).
  LlamaLayers llama_layers = LlamaLayers::liger;
  std::optional<AutocastSpec> amp;  // set: autocast (fp16/bf16 precision)
  // The ranks and groups (tensor parallelism's collectives); null: one rank.
  const ParallelState* parallel = nullptr;

  // How a training (or eval) step of `cfg` runs its passes: the one translation of the knobs.
  static RunOptions from(const TrainConfig& cfg);
};

struct FlopCount {
  double forward = 0;    // per micro-batch
  double backward = 0;   // per micro-batch (≈ 2 × forward)
  double recompute = 0;  // extra forward work spent by checkpointing, per micro-batch
  double total() const { return forward + backward + recompute; }
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string name() const = 0;    // "gpt-tiny", "llama-tiny:n_layer=4"
  virtual std::string family() const = 0;  // "gpt" | "llama" | "mlp" | "cnn"
  // Hyper-parameters as written to meta.json and results ("family", "n_layer", "n_head", ...).
  virtual nlohmann::json hyper() const = 0;
  virtual const std::vector<ParamSpec>& params() const = 0;
  virtual int num_blocks() const = 0;  // the unit of checkpointing and parameter streaming
  // The longest training sequence a sequence model takes (its learned positions); 0 for a model
  // without a sequence (MLP, CNN).
  virtual std::int64_t max_seq_len() const { return 0; }
  std::int64_t num_params() const;  // trainable elements

  // One micro-batch of `batch` samples.
  virtual Shape input_shape(std::int64_t batch) const = 0;
  virtual DType input_dtype(DType act_dtype) const = 0;      // I32 tokens or float features
  virtual Shape target_shape(std::int64_t batch) const = 0;  // I32 class ids
  virtual std::int64_t rows_per_sample() const = 0;  // loss rows per sample (T for GPT, else 1)
  virtual FlopCount flops(std::int64_t batch, const RunOptions& options) const = 0;

  // Deterministic synthetic data with learnable structure: sample rows [first, first + batch)
  // of the stream defined by `seed`. `input` receives input_shape(batch) elements as float
  // (token ids for GPT, converted by the caller), `targets` the class ids.
  virtual void make_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch,
                          std::vector<float>& input, std::vector<std::int32_t>& targets) const = 0;

  // Forward of one micro-batch; returns per-row losses (N,) F32 on the device. In training
  // mode it keeps what backward needs (per options); in eval mode it keeps nothing. A training
  // forward may keep `input` itself for backward, as autograd does: the caller keeps it alive
  // and unchanged until backward().
  virtual Tensor forward(Device& dev, ParamStore& store, const Tensor& input, const Tensor& targets,
                         const RunOptions& options) = 0;
  // Backward of the last forward with dL/dloss_row = dloss for every row (the Trainer passes
  // loss_scale / rows of the whole effective batch). Releases everything forward saved.
  virtual void backward(Device& dev, ParamStore& store, float dloss) = 0;
};

// "gpt-tiny", "gpt-mini", "gpt2-124m", ..., "llama-tiny", "llama3-8b", "mlp-tiny", "cnn-tiny",
// ..., optionally with overrides of the family's hyper-parameters (gpt-* and llama-*):
// "llama-tiny:n_layer=4,n_kv_head=1" (keys as in the model's hyper(); models/families/gpt.h and
// models/families/llama.h list them). Throws std::invalid_argument naming the known models for an
// unknown name, the family's keys for an unknown key, or what is wrong with a value or the shape.
std::unique_ptr<Model> make_model(std::string_view name);
// One configuration's one spelling: keys sorted, values canonical ("5e5" -> "500000", "1" ->
// "true"), overrides equal to the base model's value dropped ("llama-tiny:n_layer=2" ->
// "llama-tiny"). Throws as make_model, which it checks the result with.
std::string canonical_model_name(std::string_view text);
// The model a point trains: cfg.model_config's file (models/config/hf_config.h) when set, else
// cfg.model, shaped by the config's seq_len. Throws std::invalid_argument for an unknown model,
// a seq_len it cannot take, or a model config file that cannot be read, is refused, or differs
// from the one the config was made with (cfg.model_config_sha256).
// Under tensor parallelism (cfg.tensor_parallel > 1) the model is tp rank `tp_rank`'s slice
// (its parameters' shapes); rank 0 holds the largest part of an uneven vocabulary split.
// Under expert parallelism (cfg.expert_parallel > 1) it holds ep rank `ep_rank`'s experts only
// (kernels/parallel_state.h's ep_rank_of). Built from model_desc_of(cfg): the config's own
// resolved model where it carries one.
std::unique_ptr<Model> make_model(const TrainConfig& cfg, int tp_rank = 0, int ep_rank = 0);
// The same from a resolved model (models/model_desc.h): `desc` is the model, cfg gives seq_len,
// tensor_parallel and expert_parallel. Nothing is parsed or read.
std::unique_ptr<Model> make_model(const ModelDesc& desc, const TrainConfig& cfg, int tp_rank = 0,
                                  int ep_rank = 0);

// Resolving a model, once (models/model_desc.h). A model value: its spec parsed and the overrides
// applied, throwing as make_model(name) (the shape is not built: make_model checks it). A model
// config file: read, hashed and parsed (read_hf_config). The model a config names:
// cfg.model_desc where it describes cfg, else resolved from cfg.model_config (its SHA-256 checked
// against cfg.model_config_sha256) or cfg.model.
std::shared_ptr<const ModelDesc> resolve_model(std::string_view model);
std::shared_ptr<const ModelDesc> resolve_model_config(const std::string& path);
std::shared_ptr<const ModelDesc> model_desc_of(const TrainConfig& cfg);
std::vector<std::string> model_names();

}  // namespace memtrade
