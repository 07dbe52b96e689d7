// TrainConfig: one point of the grid — every knob, with its default (the member initialisers
// below are the one home of the defaults).
//
// The harness builds it from flags or a grid file through the knob table (models/knobs.h); the
// Trainer obeys it. The spellings here are the contract: they appear in grid files, CLI flags,
// point ids and results JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/ops.h"

namespace memtrade {

enum class Precision : std::uint8_t { fp32, tf32, fp16, bf16, fp16_pure, bf16_pure };
enum class Offload : std::uint8_t { none, activations, optimizer, params };
enum class ZeroGrad : std::uint8_t { set_to_none, zero };
enum class Mode : std::uint8_t { train, eval };
enum class EmptyCache : std::uint8_t { never, per_step };
enum class InputMemory : std::uint8_t { pinned, pageable };

// Activation checkpointing: a density in [0, 1] (fraction of blocks recomputed, evenly spaced),
// first<density> (the same number of blocks, the first ones: which blocks are recomputed), sqrt
// (√n segments: one kept block boundary every ⌈√n⌉ blocks) or selective (recompute only cheap big
// tensors: attention probabilities and the GELU input).
struct Checkpoint {
  enum class Kind : std::uint8_t { density, first, sqrt, selective } kind = Kind::density;
  double density = 0.0;     // density and first
  std::string str() const;  // "0", "0.5", "1", "first0.5", "sqrt", "selective"
  static std::optional<Checkpoint> parse(std::string_view s);
  bool operator==(const Checkpoint&) const = default;
};

struct TrainConfig {
  std::string model = "mlp-tiny";
  std::int64_t batch_size = 8;
  std::int64_t accumulation = 1;
  Precision precision = Precision::fp32;
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
};

// The samples one optimizer step averages over: batch_size × accumulation.
std::int64_t samples_per_step(const TrainConfig& c);
// Whether the config runs only on the CUDA backend (tf32 is a tensor-core format).
bool needs_cuda(const TrainConfig& c);

// Spellings (the contract) and their parsers; parsers return nullopt on unknown text.
std::string_view precision_name(Precision p);
std::string_view optimizer_name(OptimizerKind o);
std::string_view offload_name(Offload o);
std::string_view zero_grad_name(ZeroGrad z);
std::string_view mode_name(Mode m);
std::string_view empty_cache_name(EmptyCache e);
std::string_view input_name(InputMemory i);
std::string_view attention_kind_name(AttentionKind a);  // "math", "flash"
std::optional<Precision> parse_precision(std::string_view s);
std::optional<OptimizerKind> parse_optimizer(std::string_view s);
std::optional<Offload> parse_offload(std::string_view s);
std::optional<ZeroGrad> parse_zero_grad(std::string_view s);
std::optional<Mode> parse_mode(std::string_view s);
std::optional<EmptyCache> parse_empty_cache(std::string_view s);
std::optional<InputMemory> parse_input(std::string_view s);
std::optional<AttentionKind> parse_attention_kind(std::string_view s);

// All accepted spellings of each axis, for help texts and error messages.
std::vector<std::string> precision_names();
std::vector<std::string> optimizer_names();
std::vector<std::string> offload_names();
std::vector<std::string> zero_grad_names();
std::vector<std::string> mode_names();
std::vector<std::string> empty_cache_names();
std::vector<std::string> input_names();
std::vector<std::string> attention_kind_names();

// The storage dtype of weights/activations and whether an fp32 master copy exists.
DType compute_dtype(Precision p);
bool has_master_copy(Precision p);
bool uses_loss_scaling(Precision p);

}  // namespace memtrade
