// make_model, the size table of every family, model overrides and model config files.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/config/hf_config.h"
#include "models/config/input_text.h"
#include "models/model_desc.h"

namespace memtrade {
namespace {

struct SizeRow {
  bool listed;  // hidden rows (test sizes) are made by make_model but not listed
  FamilyConfig config;
};

// Llama 3.1/3.2's rope_scaling (their config.json files).
constexpr Llama3RopeScaling kLlama3{32.0, 1.0, 4.0, 8192};

const std::vector<SizeRow>& size_table() {
  static const std::vector<SizeRow> table = {
      // GPT: n_layer, n_head, n_embd, vocab, block_size (= training sequence length).
      {false, GptConfig{"gpt-test", 2, 2, 8, 11, 5}},
      {true, GptConfig{"gpt-tiny", 2, 2, 64, 256, 32}},
      {true, GptConfig{"gpt-mini", 4, 4, 128, 512, 64}},
      {true, GptConfig{"gpt-small", 6, 6, 384, 8192, 256}},
      {true, GptConfig{"gpt2-124m", 12, 12, 768, 50257, 1024}},
      {true, GptConfig{"gpt2-350m", 24, 16, 1024, 50257, 1024}},
      {true, GptConfig{"gpt2-774m", 36, 20, 1280, 50257, 1024}},
      {true, GptConfig{"gpt2-1558m", 48, 25, 1600, 50257, 1024}},
      // Llama: n_layer, n_head, n_kv_head, n_embd, intermediate_size, vocab, positions,
      // rope_theta, rms_norm_eps, tied head, rope_scaling. The CI sizes have grouped-query heads;
      // llama-tiny is untied, llama-mini tied with Llama 3.2's rope scaling. The real ones are
      // the published configurations (tests/models/fixtures/hf/).
      {false, LlamaConfig{"llama-test", 2, 4, 2, 16, 24, 11, 5, 1e4, 1e-5, false}},
      {true, LlamaConfig{"llama-tiny", 2, 4, 2, 64, 176, 256, 32, 1e4, 1e-5, false}},
      {true, LlamaConfig{"llama-mini", 4, 8, 2, 128, 352, 512, 64, 5e5, 1e-5, true, kLlama3}},
      {true,
       LlamaConfig{"llama3.2-1b", 16, 32, 8, 2048, 8192, 128256, 131072, 5e5, 1e-5, true, kLlama3}},
      {true,
       LlamaConfig{"llama3.2-3b", 28, 24, 8, 3072, 8192, 128256, 131072, 5e5, 1e-5, true, kLlama3}},
      {true, LlamaConfig{"llama3-8b", 32, 32, 8, 4096, 14336, 128256, 8192, 5e5, 1e-5, false}},
      // MLP: in_features, hidden widths, classes.
      {false, MlpConfig{"mlp-test", 6, {5, 4}, 3}},
      {true, MlpConfig{"mlp-tiny", 32, {64, 64}, 10}},
      {true, MlpConfig{"mlp-small", 256, {1024, 1024, 1024}, 100}},
      {true, MlpConfig{"mlp-large", 1024, {4096, 4096, 4096, 4096}, 1000}},
      // CNN: image size, classes, stem channels, blocks (channels, stride).
      {false, CnnConfig{"cnn-test", 8, 3, 4, {{4, 1}, {6, 2}}}},
      {true, CnnConfig{"cnn-tiny", 16, 10, 8, {{8, 1}, {16, 2}}}},
      {true, CnnConfig{"cnn-small", 32, 100, 32, {{32, 1}, {64, 2}, {128, 2}, {128, 1}}}},
  };
  return table;
}

std::string name_of(const FamilyConfig& f) {
  return std::visit([](const auto& c) { return c.name; }, f);
}

// The model of a family config, trained on sequences of seq_len (0: its own).
std::unique_ptr<Model> build(FamilyConfig f, std::int64_t seq_len, TpSplit tp = {},
                             EpSplit ep = {}) {
  return std::visit(
      [&](auto& c) -> std::unique_ptr<Model> {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, GptConfig> || std::is_same_v<C, LlamaConfig>) {
          if (seq_len < 0 || seq_len > kMaxPositions.max)  // range-checked before narrowing
            throw std::invalid_argument(
                above_bound("seq_len", seq_len, kMaxPositions).value_or("seq_len is negative"));
          c.seq_len = static_cast<int>(seq_len);
          if constexpr (std::is_same_v<C, GptConfig>) {
            if (ep.size != 1)
              throw std::invalid_argument(
                  fmt::format("{} has no experts (a mixture-of-experts model has)", c.name));
            return std::make_unique<GptModel>(c, tp);
          } else {
            return std::make_unique<LlamaModel>(c, tp, ep);
          }
        } else {
          if (ep.size != 1)
            throw std::invalid_argument(
                fmt::format("{} has no experts (a mixture-of-experts model has)", c.name));
          if (tp.size != 1)
            throw std::invalid_argument(fmt::format(
                "tensor_parallel: {} is not a decoder (GPT and Llama models split)", c.name));
          if (seq_len != 0)
            throw std::invalid_argument(
                fmt::format("seq_len: {} has no sequence length (a GPT-style model has)", c.name));
          if constexpr (std::is_same_v<C, MlpConfig>)
            return std::make_unique<MlpModel>(c);
          else
            return std::make_unique<CnnModel>(c);
        }
      },
      f);
}

// ---- overrides: "llama-tiny:n_layer=4,n_kv_head=1" ---------------------------------------------

struct ModelSpec {
  std::string base;
  std::map<std::string, std::string> overrides;  // key -> text as given
};

ModelSpec parse_spec(std::string_view text) {
  ModelSpec s;
  const auto colon = text.find(':');
  s.base = std::string(text.substr(0, colon));
  if (colon == std::string_view::npos) return s;
  std::string_view rest = text.substr(colon + 1);
  if (rest.empty())
    throw std::invalid_argument(
        fmt::format("'{}': no override after ':' (key=value,...)", echo(text)));
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      throw std::invalid_argument(
          fmt::format("'{}': override '{}' is not key=value", echo(text), echo(item)));
    if (!s.overrides.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)))
             .second)
      throw std::invalid_argument(
          fmt::format("'{}': {} is overridden twice", echo(text), echo(item.substr(0, eq))));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return s;
}

const FamilyConfig& row_config(std::string_view name) {
  for (const auto& row : size_table())
    if (name_of(row.config) == name) return row.config;
  throw std::invalid_argument(
      fmt::format("unknown model '{}' (known: {})", echo(name), fmt::join(model_names(), ", ")));
}

// Applies the overrides to a GPT or Llama config and names it canonically: base name, then the
// overrides that change a value, sorted by key, each value in canonical text.
template <typename Config>
void apply_overrides(Config& c, const std::vector<HyperField<Config>>& fields,
                     std::string_view family, const ModelSpec& spec) {
  const Config base = c;
  std::string canonical;
  for (const auto& [key, value] : spec.overrides) {  // std::map: sorted by key
    const HyperField<Config>* f = find_hyper(fields, key);
    if (f == nullptr) {
      std::vector<std::string_view> keys;
      for (const auto& field : fields) keys.push_back(field.key);
      throw std::invalid_argument(fmt::format("{}: unknown hyper-parameter '{}' ({} takes: {})",
                                              spec.base, echo(key), family, fmt::join(keys, ", ")));
    }
    if (auto err = set_hyper(c, *f, value))
      throw std::invalid_argument(fmt::format("{}: {}: {}", spec.base, key, *err));
    if (hyper_text(c, *f) != hyper_text(base, *f))
      canonical += fmt::format("{}{}={}", canonical.empty() ? ":" : ",", key, hyper_text(c, *f));
  }
  c.name = spec.base + canonical;
}

// The family config a model value names, overrides applied.
FamilyConfig spec_config(std::string_view text) {
  const ModelSpec spec = parse_spec(text);
  FamilyConfig f = row_config(spec.base);
  if (spec.overrides.empty()) return f;
  std::visit(
      [&](auto& c) {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, GptConfig>)
          apply_overrides(c, gpt_hyper_fields(), "gpt", spec);
        else if constexpr (std::is_same_v<C, LlamaConfig>)
          apply_overrides(c, llama_hyper_fields(), "llama", spec);
        else
          throw std::invalid_argument(
              fmt::format("{}: its family takes no overrides (gpt-* and llama-* do)", spec.base));
      },
      f);
  return f;
}

}  // namespace

std::unique_ptr<Model> make_model(std::string_view name) {
  return build(spec_config(name), 0);
}

std::string canonical_model_name(std::string_view text) {
  FamilyConfig f = spec_config(text);
  std::string name = name_of(f);
  (void)build(std::move(f), 0);  // a shape the model cannot take throws here
  return name;
}

std::shared_ptr<const ModelDesc> resolve_model(std::string_view model) {
  auto d = std::make_shared<ModelDesc>();
  d->family = spec_config(model);
  d->model = name_of(d->family);
  return d;
}

std::shared_ptr<const ModelDesc> resolve_model_config(const std::string& path) {
  HfModelConfig hf = read_hf_config(path);
  auto d = std::make_shared<ModelDesc>();
  d->model_config = path;
  d->sha256 = std::visit([](const auto& c) { return c.file.sha256; }, hf);
  d->family = std::visit([](auto& c) { return FamilyConfig(std::move(c)); }, hf);
  return d;
}

std::shared_ptr<const ModelDesc> model_desc_of(const TrainConfig& cfg) {
  if (cfg.model_desc && cfg.model_desc->describes(cfg)) return cfg.model_desc;
  if (cfg.model_config.empty()) return resolve_model(cfg.model);
  auto d = resolve_model_config(cfg.model_config);
  if (!cfg.model_config_sha256.empty() && d->sha256 != cfg.model_config_sha256)
    throw std::invalid_argument(fmt::format("model_config: {} changed since it was read",
                                            echo(cfg.model_config, kEchoPathMax)));
  return d;
}

namespace {
// The ranges make_model checks before the model is resolved (as it always has).
void check_parallel_sizes(const TrainConfig& cfg) {
  if (cfg.tensor_parallel < 1 || cfg.tensor_parallel > 4096)
    throw std::invalid_argument(
        fmt::format("tensor_parallel {} must be in [1, 4096]", cfg.tensor_parallel));
  if (cfg.expert_parallel < 1 || cfg.expert_parallel > 65536)
    throw std::invalid_argument(
        fmt::format("expert_parallel {} must be in [1, 65536]", cfg.expert_parallel));
}
}  // namespace

std::unique_ptr<Model> make_model(const ModelDesc& desc, const TrainConfig& cfg, int tp_rank,
                                  int ep_rank) {
  check_parallel_sizes(cfg);
  return build(desc.family, cfg.seq_len, TpSplit{static_cast<int>(cfg.tensor_parallel), tp_rank},
               EpSplit{static_cast<int>(cfg.expert_parallel), ep_rank});
}

std::unique_ptr<Model> make_model(const TrainConfig& cfg, int tp_rank, int ep_rank) {
  check_parallel_sizes(cfg);
  return make_model(*model_desc_of(cfg), cfg, tp_rank, ep_rank);
}

std::vector<std::string> model_names() {
  std::vector<std::string> out;
  for (const auto& row : size_table())
    if (row.listed) out.push_back(name_of(row.config));
  return out;
}

std::shared_ptr<Tensor> ParamStore::weight_cast(int index, DType dtype, Ops& ops) {
  Tensor& w = weight(index);
  if (w.dtype() == dtype) return std::shared_ptr<Tensor>(std::shared_ptr<Tensor>{}, &w);
  std::shared_ptr<Tensor>& cast = casts_[index];
  if (!cast) {
    cast = std::make_shared<Tensor>(*w.allocator(), w.shape(), dtype, Category::casts);
    ops.cast(*cast, w);
  } else if (cast->dtype() != dtype) {
    throw std::logic_error(fmt::format("weight {} cast to {} and to {} in one autocast region",
                                       index, dtype_name(cast->dtype()), dtype_name(dtype)));
  }
  return cast;
}

RunOptions RunOptions::from(const TrainConfig& cfg) {
  RunOptions o;
  o.act_dtype = compute_dtype(cfg.precision);
  o.training = cfg.mode == Mode::train;
  o.checkpoint = cfg.checkpoint;
  o.offload_activations = cfg.offload == Offload::activations;
  o.attention = cfg.attention;
  o.llama_layers = cfg.llama_layers;
  if (auto dt = autocast_dtype(cfg.precision)) o.amp = AutocastSpec{*dt, cfg.autocast_policy};
  return o;
}

std::int64_t Model::num_params() const {
  std::int64_t total = 0;  // the whole model's, whatever slice of it this rank holds
  for (const auto& p : params()) {
    if (!p.trainable) continue;
    total += shape_numel(p.full_shape());
  }
  return total;
}

Shape ParamSpec::full_shape() const {
  Shape s = shape;
  if (tp.split()) s[static_cast<std::size_t>(tp.dim)] = tp.full;
  return s;
}

std::vector<float> tp_slice_of(const ParamSpec& spec, const std::vector<float>& whole) {
  if (!spec.tp.split()) return whole;
  const Shape full = spec.full_shape();
  const auto dim = static_cast<std::size_t>(spec.tp.dim);
  std::int64_t outer = 1, inner = 1;  // elements before and after the split dimension
  for (std::size_t d = 0; d < dim; ++d) outer *= full[d];
  for (std::size_t d = dim + 1; d < full.size(); ++d) inner *= full[d];
  const std::int64_t group = spec.tp.full / spec.tp.groups;
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(shape_numel(spec.shape)));
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t g = 0; g < spec.tp.groups; ++g) {
      const std::int64_t first = (o * spec.tp.full + g * group + spec.tp.offset) * inner;
      out.insert(out.end(), whole.begin() + first, whole.begin() + first + spec.tp.count * inner);
    }
  return out;
}

}  // namespace memtrade
