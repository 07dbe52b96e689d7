// TrainConfig: one point of the grid — every knob, with its default (the member initialisers
// below are the one home of the defaults).
//
// The harness builds it from flags or a grid file through the knob table (models/config/knobs.h);
// the Trainer obeys it. The spellings here are the contract: they appear in grid files, CLI flags,
// point ids and results JSON.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/ops.h"
#include "models/config/autocast_policy.h"

namespace memtrade {

struct ModelDesc;  // models/model_desc.h

// Precision: how dtypes are chosen for weights, activations and the update.
//   fp32, tf32: everything fp32 (tf32: tensor-core GEMMs on CUDA).
//   fp16, bf16: torch.autocast semantics. Weights, grads and the update stay fp32; each op runs
//     in the dtype the autocast policy (models/config/autocast_policy.h,
//     TrainConfig::autocast_policy) gives it, on 16-bit copies of its fp32 inputs where it computes
//     in 16 bits (weights from a per-forward cast cache, category casts).
//   fp16-o2, bf16-o2: Apex O2 / Megatron-style mixed precision: 16-bit weights and activations
//     everywhere, an fp32 master copy for the update.
//   fp16-pure, bf16-pure: 16-bit weights, activations and optimizer update, no master.
// fp16 of every kind scales the loss (GradScaler semantics, models/train/loss_scaler.h).
enum class Precision : std::uint8_t {
  fp32,
  tf32,
  fp16,
  bf16,
  fp16_o2,
  bf16_o2,
  fp16_pure,
  bf16_pure
};
// How torch.optim runs the update (torch/optim of PyTorch 2.x; models/train/optimizer.h has the
// temporaries of each): foreach = _multi_tensor_<kind>, PyTorch's default on CUDA since 2.0 (its
// temporaries the size of a whole parameter group's state); forloop = _single_tensor_<kind>, the
// CPU default (one parameter's temporaries at a time); fused = fused=True (none).
enum class OptimizerImpl : std::uint8_t { foreach, forloop, fused };
enum class Offload : std::uint8_t { none, activations, optimizer, params };
enum class ZeroGrad : std::uint8_t { set_to_none, zero };
enum class Mode : std::uint8_t { train, eval };
enum class EmptyCache : std::uint8_t { never, per_step };
enum class InputMemory : std::uint8_t { pinned, pageable };
// Data parallelism's sharding (models/train/data_parallel.h): none = DDP (replicated weights, grads
// all-reduced in 25 MiB buckets); zero1 = + optimizer state (and fp32 master) sharded; zero2 =
// + grads reduce-scattered; zero3 = + weights sharded, gathered per block (FSDP FULL_SHARD);
// torch_zero1 = torch's ZeroRedundancyOptimizer over DDP (whole parameters per rank).
enum class Sharding : std::uint8_t { none, zero1, zero2, zero3, torch_zero1 };
// Megatron's sequence parallelism under tensor parallelism (models/layers/tensor_parallel.h): the
// norms, residuals and the linears' saved inputs split along the tokens over the tp ranks.
enum class SequenceParallel : std::uint8_t { off, on };
// What a Llama-like model's layers keep (models/families/llama.h): liger = what fused kernels keep
// (Liger-Kernel's RMSNorm and SwiGLU, RoPE in place, grouped-query attention without repeated
// K/V); hf_eager = what HF transformers' eager modeling code keeps under autograd (4.46.3).
enum class LlamaLayers : std::uint8_t { liger, hf_eager };

// Activation checkpointing: a density in [0, 1] (fraction of blocks recomputed, evenly spaced),
// first<density> (the same number of blocks, the first ones: which blocks are recomputed), sqrt
// (√n segments: one kept block boundary every ⌈√n⌉ blocks) or selective (Megatron: recompute only
// the attention core of each block; CNN: bn1-relu-conv2).
struct Checkpoint {
  enum class Kind : std::uint8_t { density, first, sqrt, selective } kind = Kind::density;
  double density = 0.0;     // density and first
  std::string str() const;  // "0", "0.5", "1", "first0.5", "sqrt", "selective"
  static std::optional<Checkpoint> parse(std::string_view s);
  bool operator==(const Checkpoint&) const = default;
};

struct TrainConfig {
  std::string model = "mlp-tiny";  // a size-table name, with overrides ("llama-tiny:n_layer=4")
  // A Hugging Face config.json that defines the model instead (models/config/hf_config.h); "" =
  // none. model_config_sha256 is its SHA-256, taken when the knob is set: the id tells files apart.
  std::string model_config;
  std::string model_config_sha256;
  // model and model_config resolved (models/model_desc.h): made once where the config is made
  // (their knobs, a grid's values, the CLI's flags) and carried by every copy, so that make_model
  // neither parses the model value nor reads the file again. Not an axis: make_model uses it only
  // where it describes model and model_config, and resolves them itself otherwise.
  std::shared_ptr<const ModelDesc> model_desc;
  std::int64_t batch_size = 8;
  std::int64_t accumulation = 1;
  Precision precision = Precision::fp32;
  // Whose autocast op lists fp16/bf16 follow: PyTorch's CUDA lists (the default on every backend,
  // so that a CPU run predicts a CUDA run byte for byte) or PyTorch's CPU lists (for proofs
  // against real PyTorch on a machine without a GPU). Means nothing for other precisions.
  autocast::Policy autocast_policy = autocast::Policy::torch_cuda;
  Checkpoint checkpoint{};
  OptimizerKind optimizer = OptimizerKind::adam;
  Offload offload = Offload::none;
  ZeroGrad zero_grad = ZeroGrad::set_to_none;
  Mode mode = Mode::train;
  EmptyCache empty_cache = EmptyCache::never;
  InputMemory input = InputMemory::pinned;
  // Tokens per training sequence of a sequence model; 0 = the model's own (its block size).
  std::int64_t seq_len = 0;
  AttentionKind attention = AttentionKind::math;  // math (probabilities saved) or flash
  std::uint64_t seed = 0;
  float lr = 0.0f;                                 // 0 = the optimizer's default for this model
  std::int64_t loss_scale_growth_interval = 2000;  // fp16 dynamic loss scaling
  float loss_scale_init = 65536.0f;
  // Data parallelism: ranks (batch_size stays per rank: a step's global batch is
  // data_parallel × batch_size × accumulation), and what is sharded over them.
  std::int64_t data_parallel = 1;
  Sharding sharding = Sharding::none;
  OptimizerImpl optimizer_impl = OptimizerImpl::foreach;
  // Tensor parallelism (Megatron): ranks per model replica, inside a node; the world is
  // tensor_parallel × data_parallel ranks (kernels/parallel_state.h). batch_size stays per
  // data-parallel rank: the tp ranks of one replica train on the same samples.
  std::int64_t tensor_parallel = 1;
  SequenceParallel sequence_parallel = SequenceParallel::off;
  // Expert parallelism (models/layers/moe.h): the experts of each MoE layer split over groups of
  // expert_parallel consecutive ranks of the data-parallel group (it divides data_parallel), the
  // tokens exchanged by all-to-all. Not a world dimension: the ranks stay tp × dp.
  std::int64_t expert_parallel = 1;
  LlamaLayers llama_layers = LlamaLayers::liger;  // Llama-like models only
};

// The processes a point runs as: tensor_parallel × data_parallel.
std::int64_t world_size(const TrainConfig& c);

// The samples one optimizer step averages over: data_parallel × batch_size × accumulation.
std::int64_t samples_per_step(const TrainConfig& c);
// Whether the config runs only on the CUDA backend (tf32 is a tensor-core format).
bool needs_cuda(const TrainConfig& c);

// Spellings (the contract) and their parsers; parsers return nullopt on unknown text.
std::string_view precision_name(Precision p);
std::string_view optimizer_name(OptimizerKind o);
std::string_view optimizer_impl_name(OptimizerImpl i);  // "foreach", "forloop", "fused"
std::string_view offload_name(Offload o);
std::string_view zero_grad_name(ZeroGrad z);
std::string_view mode_name(Mode m);
std::string_view empty_cache_name(EmptyCache e);
std::string_view input_name(InputMemory i);
std::string_view attention_kind_name(AttentionKind a);        // "math", "flash"
std::string_view sharding_name(Sharding s);                   // "none", "zero1", "zero2", "zero3"
std::string_view sequence_parallel_name(SequenceParallel s);  // "off", "on"
std::string_view llama_layers_name(LlamaLayers l);            // "liger", "hf-eager"
std::optional<Precision> parse_precision(std::string_view s);
std::optional<OptimizerKind> parse_optimizer(std::string_view s);
std::optional<OptimizerImpl> parse_optimizer_impl(std::string_view s);
std::optional<Offload> parse_offload(std::string_view s);
std::optional<ZeroGrad> parse_zero_grad(std::string_view s);
std::optional<Mode> parse_mode(std::string_view s);
std::optional<EmptyCache> parse_empty_cache(std::string_view s);
std::optional<InputMemory> parse_input(std::string_view s);
std::optional<AttentionKind> parse_attention_kind(std::string_view s);
std::optional<Sharding> parse_sharding(std::string_view s);
std::optional<SequenceParallel> parse_sequence_parallel(std::string_view s);
std::optional<LlamaLayers> parse_llama_layers(std::string_view s);

// All accepted spellings of each axis, for help texts and error messages.
std::vector<std::string> precision_names();
std::vector<std::string> optimizer_names();
std::vector<std::string> optimizer_impl_names();
std::vector<std::string> offload_names();
std::vector<std::string> zero_grad_names();
std::vector<std::string> mode_names();
std::vector<std::string> empty_cache_names();
std::vector<std::string> input_names();
std::vector<std::string> attention_kind_names();
std::vector<std::string> sharding_names();
std::vector<std::string> sequence_parallel_names();
std::vector<std::string> llama_layers_names();

// The storage dtype of the weights on the device (and of every activation outside autocast),
// whether an fp32 master copy exists, and the loss scaling of fp16.
DType compute_dtype(Precision p);
bool has_master_copy(Precision p);
bool uses_loss_scaling(Precision p);
// The 16-bit dtype of an autocast precision (fp16: F16, bf16: BF16); nullopt for the others.
std::optional<DType> autocast_dtype(Precision p);

}  // namespace memtrade
