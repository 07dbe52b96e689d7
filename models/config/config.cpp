#include "models/config/config.h"

#include <array>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

namespace memtrade {
namespace {

template <typename E, std::size_t N>
std::optional<E> lookup(const std::array<std::pair<std::string_view, E>, N>& table,
                        std::string_view s) {
  for (const auto& [name, value] : table)
    if (name == s) return value;
  return std::nullopt;
}
template <typename E, std::size_t N>
std::string_view name_of(const std::array<std::pair<std::string_view, E>, N>& table, E e) {
  for (const auto& [name, value] : table)
    if (value == e) return name;
  return "?";
}
template <typename E, std::size_t N>
std::vector<std::string> names(const std::array<std::pair<std::string_view, E>, N>& table) {
  std::vector<std::string> out;
  for (const auto& entry : table) out.emplace_back(entry.first);
  return out;
}

constexpr std::array<std::pair<std::string_view, Precision>, 8> kPrecisions{{
    {"fp32", Precision::fp32},
    {"tf32", Precision::tf32},
    {"fp16", Precision::fp16},
    {"bf16", Precision::bf16},
    {"fp16-o2", Precision::fp16_o2},
    {"bf16-o2", Precision::bf16_o2},
    {"fp16-pure", Precision::fp16_pure},
    {"bf16-pure", Precision::bf16_pure},
}};
constexpr std::array<std::pair<std::string_view, OptimizerKind>, 6> kOptimizers{{
    {"sgd", OptimizerKind::sgd},
    {"sgd-momentum", OptimizerKind::sgd_momentum},
    {"adam", OptimizerKind::adam},
    {"adamw", OptimizerKind::adamw},
    {"adagrad", OptimizerKind::adagrad},
    {"rmsprop", OptimizerKind::rmsprop},
}};
constexpr std::array<std::pair<std::string_view, OptimizerImpl>, 3> kOptimizerImpls{{
    {"foreach", OptimizerImpl::foreach},
    {"forloop", OptimizerImpl::forloop},
    {"fused", OptimizerImpl::fused},
}};
constexpr std::array<std::pair<std::string_view, Offload>, 4> kOffloads{{
    {"none", Offload::none},
    {"activations", Offload::activations},
    {"optimizer", Offload::optimizer},
    {"params", Offload::params},
}};
constexpr std::array<std::pair<std::string_view, ZeroGrad>, 2> kZeroGrads{{
    {"set_to_none", ZeroGrad::set_to_none},
    {"zero", ZeroGrad::zero},
}};
constexpr std::array<std::pair<std::string_view, Mode>, 2> kModes{{
    {"train", Mode::train},
    {"eval", Mode::eval},
}};
constexpr std::array<std::pair<std::string_view, EmptyCache>, 2> kEmptyCaches{{
    {"never", EmptyCache::never},
    {"per_step", EmptyCache::per_step},
}};
constexpr std::array<std::pair<std::string_view, InputMemory>, 2> kInputs{{
    {"pinned", InputMemory::pinned},
    {"pageable", InputMemory::pageable},
}};
constexpr std::array<std::pair<std::string_view, AttentionKind>, 2> kAttentionKinds{{
    {"math", AttentionKind::math},
    {"flash", AttentionKind::flash},
}};

constexpr std::array<std::pair<std::string_view, Sharding>, 5> kShardings{{
    {"none", Sharding::none},
    {"zero1", Sharding::zero1},
    {"zero2", Sharding::zero2},
    {"zero3", Sharding::zero3},
    {"torch-zero1", Sharding::torch_zero1},
}};

constexpr std::array<std::pair<std::string_view, SequenceParallel>, 2> kSequenceParallel{{
    {"off", SequenceParallel::off},
    {"on", SequenceParallel::on},
}};
constexpr std::array<std::pair<std::string_view, LlamaLayers>, 2> kLlamaLayers{{
    {"liger", LlamaLayers::liger},
    {"hf-eager", LlamaLayers::hf_eager},
}};

}  // namespace

std::int64_t world_size(const TrainConfig& c) {
  return c.tensor_parallel * c.data_parallel;
}

std::string_view sequence_parallel_name(SequenceParallel s) {
  return name_of(kSequenceParallel, s);
}
std::optional<SequenceParallel> parse_sequence_parallel(std::string_view s) {
  return lookup(kSequenceParallel, s);
}
std::vector<std::string> sequence_parallel_names() {
  return names(kSequenceParallel);
}

std::string_view llama_layers_name(LlamaLayers l) {
  return name_of(kLlamaLayers, l);
}
std::optional<LlamaLayers> parse_llama_layers(std::string_view s) {
  return lookup(kLlamaLayers, s);
}
std::vector<std::string> llama_layers_names() {
  return names(kLlamaLayers);
}

std::int64_t samples_per_step(const TrainConfig& c) {
  return c.data_parallel * c.batch_size * c.accumulation;
}

std::string_view sharding_name(Sharding s) {
  return name_of(kShardings, s);
}
std::optional<Sharding> parse_sharding(std::string_view s) {
  return lookup(kShardings, s);
}
std::vector<std::string> sharding_names() {
  return names(kShardings);
}

bool needs_cuda(const TrainConfig& c) {
  return c.precision == Precision::tf32;
}

std::string Checkpoint::str() const {
  switch (kind) {
    case Kind::sqrt:
      return "sqrt";
    case Kind::selective:
      return "selective";
    case Kind::first:
      return fmt::format("first{}", density);
    case Kind::density:
      break;
  }
  return fmt::format("{}", density);  // shortest round-trip form: "0", "0.5", "1"
}

std::optional<Checkpoint> Checkpoint::parse(std::string_view s) {
  if (s == "sqrt") return Checkpoint{Kind::sqrt, 0.0};
  if (s == "selective") return Checkpoint{Kind::selective, 0.0};
  Kind kind = Kind::density;
  if (s.starts_with("first")) {
    kind = Kind::first;
    s.remove_prefix(5);
  }
  double d = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(d) || d < 0.0 || d > 1.0)
    return std::nullopt;
  return Checkpoint{kind, d};
}

std::string_view precision_name(Precision p) {
  return name_of(kPrecisions, p);
}
std::string_view optimizer_name(OptimizerKind o) {
  return name_of(kOptimizers, o);
}
std::string_view optimizer_impl_name(OptimizerImpl i) {
  return name_of(kOptimizerImpls, i);
}
std::string_view offload_name(Offload o) {
  return name_of(kOffloads, o);
}
std::string_view zero_grad_name(ZeroGrad z) {
  return name_of(kZeroGrads, z);
}
std::string_view mode_name(Mode m) {
  return name_of(kModes, m);
}
std::string_view empty_cache_name(EmptyCache e) {
  return name_of(kEmptyCaches, e);
}
std::string_view input_name(InputMemory i) {
  return name_of(kInputs, i);
}
std::string_view attention_kind_name(AttentionKind a) {
  return name_of(kAttentionKinds, a);
}

std::optional<Precision> parse_precision(std::string_view s) {
  return lookup(kPrecisions, s);
}
std::optional<OptimizerKind> parse_optimizer(std::string_view s) {
  return lookup(kOptimizers, s);
}
std::optional<OptimizerImpl> parse_optimizer_impl(std::string_view s) {
  return lookup(kOptimizerImpls, s);
}
std::optional<Offload> parse_offload(std::string_view s) {
  return lookup(kOffloads, s);
}
std::optional<ZeroGrad> parse_zero_grad(std::string_view s) {
  return lookup(kZeroGrads, s);
}
std::optional<Mode> parse_mode(std::string_view s) {
  return lookup(kModes, s);
}
std::optional<EmptyCache> parse_empty_cache(std::string_view s) {
  return lookup(kEmptyCaches, s);
}
std::optional<InputMemory> parse_input(std::string_view s) {
  return lookup(kInputs, s);
}
std::optional<AttentionKind> parse_attention_kind(std::string_view s) {
  return lookup(kAttentionKinds, s);
}

std::vector<std::string> precision_names() {
  return names(kPrecisions);
}
std::vector<std::string> optimizer_names() {
  return names(kOptimizers);
}
std::vector<std::string> optimizer_impl_names() {
  return names(kOptimizerImpls);
}
std::vector<std::string> offload_names() {
  return names(kOffloads);
}
std::vector<std::string> zero_grad_names() {
  return names(kZeroGrads);
}
std::vector<std::string> mode_names() {
  return names(kModes);
}
std::vector<std::string> empty_cache_names() {
  return names(kEmptyCaches);
}
std::vector<std::string> input_names() {
  return names(kInputs);
}
std::vector<std::string> attention_kind_names() {
  return names(kAttentionKinds);
}

DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::fp32:
    case Precision::tf32:
    case Precision::fp16:  // autocast: fp32 weights, 16-bit casts per op
    case Precision::bf16:
      return DType::F32;
    case Precision::fp16_o2:
    case Precision::fp16_pure:
      return DType::F16;
    case Precision::bf16_o2:
    case Precision::bf16_pure:
      return DType::BF16;
  }
  return DType::F32;
}

bool has_master_copy(Precision p) {
  return p == Precision::fp16_o2 || p == Precision::bf16_o2;
}
bool uses_loss_scaling(Precision p) {
  return p == Precision::fp16 || p == Precision::fp16_o2 || p == Precision::fp16_pure;
}

std::optional<DType> autocast_dtype(Precision p) {
  if (p == Precision::fp16) return DType::F16;
  if (p == Precision::bf16) return DType::BF16;
  return std::nullopt;
}

}  // namespace memtrade
