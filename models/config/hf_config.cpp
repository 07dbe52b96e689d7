#include "models/config/hf_config.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/config/input_text.h"
#include "models/config/sha256.h"

namespace memtrade {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument(what);
}

// A JSON integer as int64 (nullopt for anything else, or one beyond int64).
std::optional<std::int64_t> as_int64(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<std::int64_t>();
  return std::nullopt;
}

constexpr std::string_view kArchitectures =
    "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Phi3ForCausalLM, "
    "Gemma2ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM and GPT2LMHeadModel";

// head_dim as a projection's split: at most what the rotary kernels take (kernels/ops.h).
constexpr DecoderBound kMaxHeadDim{"head dim", kRopeMaxHeadDim};

// No bound beyond what an int holds (a value the model does not size itself by).
constexpr DecoderBound kAnyInt{"", std::numeric_limits<int>::max()};

// The keys of one architecture, read with their types checked.
class Keys {
 public:
  Keys(const json& j, std::string_view arch) : j_(j), arch_(arch) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  // A positive integer up to `bound` (range-checked before it is narrowed to an int).
  int positive_int(const char* key, const DecoderBound& bound = kAnyInt) const {
    if (!has(key)) fail(fmt::format("missing key '{}' (required for {})", key, arch_));
    const json& v = j_.at(key);
    const auto i = as_int64(v);
    if (!i || *i < 1 || (bound.what.empty() && *i > bound.max))
      fail(fmt::format("key '{}' must be a positive integer, got {}", key, echo_json(v)));
    if (auto problem = above_bound(fmt::format("key '{}'", key), *i, bound)) fail(*problem);
    return static_cast<int>(*i);
  }
  int positive_int(const char* key, int fallback, const DecoderBound& bound = kAnyInt) const {
    return has(key) ? positive_int(key, bound) : fallback;
  }
  double positive_number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      fail(fmt::format("key '{}' must be a positive number, got {}", key, echo_json(v)));
    return v.get<double>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_number())
      fail(fmt::format("key '{}' must be a number, got {}", key, echo_json(j_.at(key))));
    return j_.at(key).get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_boolean())
      fail(fmt::format("key '{}' must be true or false, got {}", key, echo_json(j_.at(key))));
    return j_.at(key).get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_string())
      fail(fmt::format("key '{}' must be a string, got {}", key, echo_json(j_.at(key))));
    return j_.at(key).get<std::string>();
  }
  // A key whose other values change the math memtrade does not model.
  template <typename T>
  void require(const char* key, T supported, T value, std::string_view why) const {
    if (value != supported)
      fail(fmt::format("unsupported {} {} ({})", key, echo_json(json(value)), why));
  }

 private:
  const json& j_;
  std::string_view arch_;
};

Llama3RopeScaling llama3_scaling(const json& s) {
  if (!s.is_object())
    fail(fmt::format("rope_scaling must be an object or null, got {}", echo_json(s)));
  const Keys k(s, "rope_scaling");
  // HF reads "rope_type", and the older "type".
  const std::string type = k.text("rope_type", k.text("type", ""));
  if (type == "default") return {};
  if (type != "llama3")
    fail(fmt::format("unsupported rope_scaling type '{}' (memtrade implements llama3 and default)",
                     echo(type)));
  Llama3RopeScaling r;
  for (const char* key :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
    if (!k.has(key)) fail(fmt::format("missing key 'rope_scaling.{}' (required for llama3)", key));
  r.factor = k.positive_number("factor", 0);
  r.low_freq_factor = k.positive_number("low_freq_factor", 0);
  r.high_freq_factor = k.positive_number("high_freq_factor", 0);
  r.original_max_position_embeddings = k.positive_int("original_max_position_embeddings");
  return r;
}

// LlamaForCausalLM, and the architectures that are it with another mapping of their keys
// (transformers 4.46.3: modeling_llama.py, modeling_qwen2.py, modeling_mistral.py,
// modeling_phi3.py, modeling_gemma2.py; Qwen3, which 4.46.3 lacks: 4.51.0's modeling_qwen3.py).
// One place per family below says what it reads differently.
LlamaConfig llama_from(const json& j, const ConfigFile& file, const std::string& arch) {
  const Keys k(j, arch.c_str());
  const bool llama = arch == "LlamaForCausalLM", qwen2 = arch == "Qwen2ForCausalLM";
  const bool mistral = arch == "MistralForCausalLM", phi3 = arch == "Phi3ForCausalLM";
  const bool qwen3 = arch == "Qwen3ForCausalLM", gemma2 = arch == "Gemma2ForCausalLM";
  LlamaConfig c;
  c.name = file.name;
  c.file = file;
  c.n_embd = k.positive_int("hidden_size", kMaxHidden);
  c.n_layer = k.positive_int("num_hidden_layers", kMaxLayers);
  c.n_head = k.positive_int("num_attention_heads", kMaxHeads);
  c.intermediate_size = k.positive_int("intermediate_size", kMaxIntermediate);
  c.vocab_size = k.positive_int("vocab_size", kMaxVocab);
  c.block_size = k.positive_int("max_position_embeddings", kMaxPositions);
  c.n_kv_head = k.positive_int("num_key_value_heads", c.n_head, kMaxHeads);
  c.rope_theta = k.positive_number("rope_theta", 10000.0);
  // The configs' defaults: LlamaConfig's, Qwen2Config's and MistralConfig's 1e-6, Phi3Config's
  // 1e-5.
  c.norm_eps = k.positive_number("rms_norm_eps", phi3 ? 1e-5 : 1e-6);
  // Gemma2Config ties by default, the others not.
  c.tie_word_embeddings = k.boolean("tie_word_embeddings", gemma2);
  c.architecture = arch;
  if (gemma2) {
    // Gemma2Attention: config.head_dim (Gemma2Config's default 256).
    c.head_dim = k.positive_int("head_dim", 256, kMaxHeadDim);
  } else if (llama || mistral || qwen3) {
    // LlamaAttention reads getattr(config, "head_dim", hidden_size // num_heads), Mistral's
    // config.head_dim (default the same), Qwen3's too (Qwen3Config's default 128): the
    // projections are NH·head_dim wide, whatever C is.
    if (k.has("head_dim"))
      c.head_dim = k.positive_int("head_dim", kMaxHeadDim);
    else if (qwen3)
      c.head_dim = 128;
  } else if (k.has("head_dim") && std::int64_t{k.positive_int("head_dim")} * c.n_head != c.n_embd) {
    // Qwen2's and Phi-3's attention take hidden_size / num_heads (and HF refuses another split);
    // a head_dim key that says otherwise is a config for another model. (64 bits: in an int,
    // 4 × 1073741840 wraps to 64.)
    fail(fmt::format("unsupported head_dim {}: {} has hidden_size / num_attention_heads = {}/{}",
                     k.positive_int("head_dim"), arch, c.n_embd, c.n_head));
  }
  if (!c.head_dim && c.n_embd % c.n_head != 0)
    fail(fmt::format("hidden_size {} is not divisible by num_attention_heads {}", c.n_embd,
                     c.n_head));
  // Mistral's rotary embedding reads no rope_scaling (MistralRotaryEmbedding(head_dim,
  // max_position_embeddings, base)); Phi-3's longrope is not memtrade's.
  if (llama || qwen2 || qwen3) {
    if (k.has("rope_scaling")) c.rope_scaling = llama3_scaling(j.at("rope_scaling"));
  } else if (phi3 && k.has("rope_scaling")) {
    fail(
        fmt::format("unsupported rope_scaling {} (memtrade's Phi-3 has plain rotary embeddings, "
                    "rope_scaling null)",
                    echo_json(j.at("rope_scaling"))));
  }
  if (gemma2) {
    // Gemma2MLP reads ACT2FN[config.hidden_activation] (hidden_act is not read in 4.46.3).
    k.require("hidden_activation", std::string("gelu_pytorch_tanh"),
              k.text("hidden_activation", "gelu_pytorch_tanh"), "the MLP is GeGLU, tanh GELU");
  } else {
    k.require("hidden_act", std::string("silu"), k.text("hidden_act", "silu"),
              "the MLP is SwiGLU, silu");
  }
  if (gemma2) {
    // Gemma2Model / Gemma2DecoderLayer / Gemma2Attention / Gemma2ForCausalLM (modeling_gemma2.py):
    // (1 + w) RMSNorms and four per layer, GeGLU, embeddings · √hidden_size, scaling =
    // query_pre_attn_scalar**-0.5 (default 224), attn_logit_softcapping (50.0) and
    // final_logit_softcapping (30.0; null: none), q/k/v/o bias = attention_bias (false);
    // sliding_window (4096) bands the layers with an even index, checked against the sequence
    // length as Mistral's (models/families/llama.h). Its rotary embedding reads no rope_scaling.
    c.gemma_norms = c.geglu = c.embed_scale = true;
    c.qkv_bias = c.o_bias = k.boolean("attention_bias", false);
    c.query_pre_attn_scalar = k.positive_number("query_pre_attn_scalar", 224.0);
    const auto cap = [&](const char* key, double fallback) {
      if (j.contains(key) && j.at(key).is_null()) return 0.0;  // null: no soft-capping
      return k.positive_number(key, fallback);
    };
    c.attn_softcap = cap("attn_logit_softcapping", 50.0);
    c.final_softcap = cap("final_logit_softcapping", 30.0);
    if (k.has("sliding_window"))
      c.sliding_window = k.positive_int("sliding_window");
    else if (!j.contains("sliding_window"))
      c.sliding_window = 4096;
  } else if (qwen3) {
    // Qwen3Attention (transformers 4.51.0 modeling_qwen3.py): q/k/v and o_proj bias =
    // attention_bias (default false), q_norm and k_norm; Qwen3MLP bias-free. The sliding window
    // as Qwen2's.
    c.qk_norm = true;
    c.qkv_bias = c.o_bias = k.boolean("attention_bias", false);
    k.require("use_sliding_window", false, k.boolean("use_sliding_window", false),
              "full causal attention in every layer");
  } else if (qwen2) {
    // Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False; no attention_bias or mlp_bias key.
    c.qkv_bias = true;
    // A window of use_sliding_window limits attention to the last sliding_window tokens in the
    // layers from max_window_layers on; memtrade's Qwen2 attends to every earlier token.
    k.require("use_sliding_window", false, k.boolean("use_sliding_window", false),
              "full causal attention in every layer");
  } else if (llama) {
    c.qkv_bias = c.o_bias = k.boolean("attention_bias", false);  // q, k, v and o_proj
    c.mlp_bias = k.boolean("mlp_bias", false);
  } else {
    // Mistral's and Phi-3's causal mask bands every layer by sliding_window (Mistral's default
    // 4096 when the key is absent, Phi-3's none; null: none). The model checks it against the
    // sequence length (models/families/llama.h).
    if (k.has("sliding_window"))
      c.sliding_window = k.positive_int("sliding_window");
    else if (mistral && !j.contains("sliding_window"))
      c.sliding_window = 4096;
  }
  if (phi3) {
    // Phi3Attention.qkv_proj and Phi3MLP.gate_up_proj, bias=False; dropout after the embedding
    // and on both residual branches.
    c.fused_qkv = c.fused_gate_up = true;
    k.require("embd_pdrop", 0.0, k.number("embd_pdrop", 0.0), "no dropout");
    k.require("resid_pdrop", 0.0, k.number("resid_pdrop", 0.0), "no dropout");
  }
  k.require("attention_dropout", 0.0, k.number("attention_dropout", 0.0), "no dropout");
  return c;
}

// Mixture of experts (models/layers/moe.h), transformers 4.46.3: MixtralForCausalLM
// (modeling_mixtral.py, configuration_mixtral.py) is Mistral's decoder (MixtralAttention: no
// biases, head_dim = hidden_size // num_heads, plain rotary embeddings of rope_theta, the mask
// banded by sliding_window, default None) with MixtralSparseMoeBlock in every layer;
// Qwen2MoeForCausalLM (modeling_qwen2_moe.py) is Qwen2's (q/k/v biases) with
// Qwen2MoeSparseMoeBlock where Qwen2MoeDecoderLayer puts one (decoder_sparse_step,
// mlp_only_layers) and Qwen2MoeMLP(intermediate_size) elsewhere. The attention keys are read by
// llama_from as Mistral's and Qwen2's, with the MoE configs' own defaults.
LlamaConfig moe_from(const json& j, const ConfigFile& file, const std::string& arch) {
  const Keys k(j, arch);
  const bool mixtral = arch == "MixtralForCausalLM";
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "vocab_size", "max_position_embeddings"})
    (void)k.positive_int(key);  // required here: named with this architecture when missing
  LlamaConfig c = llama_from(j, file, mixtral ? "MistralForCausalLM" : "Qwen2ForCausalLM");
  c.architecture = arch;
  if (mixtral) {
    // MixtralConfig's defaults where Mistral's differ; no head_dim key (MixtralAttention).
    if (k.has("head_dim") && std::int64_t{k.positive_int("head_dim")} * c.n_head != c.n_embd)
      fail(fmt::format("unsupported head_dim {}: {} has hidden_size / num_attention_heads = {}/{}",
                       k.positive_int("head_dim"), arch, c.n_embd, c.n_head));
    c.head_dim = 0;
    c.n_kv_head = k.positive_int("num_key_value_heads", 8, kMaxHeads);
    c.norm_eps = k.positive_number("rms_norm_eps", 1e-5);
    c.rope_theta = k.positive_number("rope_theta", 1e6);
    c.sliding_window = k.has("sliding_window") ? k.positive_int("sliding_window") : 0;
    c.num_experts = k.positive_int("num_local_experts", 8);
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;  // routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
    c.moe_prefix = "block_sparse_moe.";
    c.expert_names_w = true;
    // In training, jitter multiplies the router's input by uniform noise: not modelled.
    k.require("router_jitter_noise", 0.0, k.number("router_jitter_noise", 0.0), "no router jitter");
  } else {
    // Qwen2MoeConfig: num_experts 0 makes every layer Qwen2MoeMLP.
    if (k.has("num_experts") && as_int64(j.at("num_experts")) == 0)
      c.num_experts = 0;
    else
      c.num_experts = k.positive_int("num_experts", 60);
    c.moe_intermediate_size = k.positive_int("moe_intermediate_size", 1408, kMaxIntermediate);
    c.shared_expert_intermediate_size =
        k.positive_int("shared_expert_intermediate_size", 5632, kMaxIntermediate);
    c.norm_topk_prob = k.boolean("norm_topk_prob", false);
    c.decoder_sparse_step = k.positive_int("decoder_sparse_step", 1);
    if (k.has("mlp_only_layers")) {
      const json& v = j.at("mlp_only_layers");
      if (!v.is_array())
        fail(fmt::format("key 'mlp_only_layers' must be a list of layer indices, got {}",
                         echo_json(v)));
      for (const json& x : v) {
        const auto i = as_int64(x);
        if (!i || *i < 0 || *i >= c.n_layer)
          fail(fmt::format("key 'mlp_only_layers': {} is not a layer index in [0, {})",
                           echo_json(x), c.n_layer));
        c.mlp_only_layers.push_back(static_cast<int>(*i));
      }
    }
  }
  c.top_k = k.positive_int("num_experts_per_tok", mixtral ? 2 : 4);
  if (c.num_experts > 0 && c.top_k > c.num_experts)
    fail(fmt::format("num_experts_per_tok {} is above the {} experts", c.top_k, c.num_experts));
  // The forward adds router_aux_loss_coef · load_balancing_loss_func(...) to the loss only when
  // output_router_logits (default false).
  const double coef = k.number("router_aux_loss_coef", 0.001);
  if (coef < 0 || !std::isfinite(coef))
    fail(fmt::format("key 'router_aux_loss_coef' must be at least 0, got {}", coef));
  if (k.boolean("output_router_logits", false)) c.router_aux_loss_coef = coef;
  return c;
}

GptConfig gpt2_from(const json& j, const ConfigFile& file) {
  const Keys k(j, "GPT2LMHeadModel");
  GptConfig c;
  c.name = file.name;
  c.file = file;
  c.n_embd = k.positive_int("n_embd", kMaxHidden);
  c.n_layer = k.positive_int("n_layer", kMaxLayers);
  c.n_head = k.positive_int("n_head", kMaxHeads);
  c.vocab_size = k.positive_int("vocab_size", kMaxVocab);
  c.block_size = k.positive_int("n_positions", kMaxPositions);
  c.norm_eps = k.positive_number("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = k.boolean("tie_word_embeddings", true);
  k.require("n_inner", 4 * c.n_embd, k.positive_int("n_inner", 4 * c.n_embd),
            "the MLP is 4·n_embd");
  const std::string act = k.text("activation_function", "gelu_new");
  if (act != "gelu_pytorch_tanh")
    k.require("activation_function", std::string("gelu_new"), act, "GELU, tanh approximation");
  k.require("scale_attn_weights", true, k.boolean("scale_attn_weights", true), "scores / √hd");
  k.require("scale_attn_by_inverse_layer_idx", false,
            k.boolean("scale_attn_by_inverse_layer_idx", false), "scores / √hd");
  return c;
}

}  // namespace

HfModelConfig parse_hf_config(std::string_view text, const ConfigFile& file) {
  const json j = parse_json_input(text);
  if (!j.is_object()) fail("not a JSON object");
  if (!j.contains("architectures"))
    fail(fmt::format("missing key 'architectures' ({})", kArchitectures));
  const json& arch = j.at("architectures");
  if (!arch.is_array() || arch.size() != 1 || !arch[0].is_string())
    fail(fmt::format("architectures must name one architecture, got {}", echo_json(arch)));
  const std::string name = arch[0].get<std::string>();
  if (name == "LlamaForCausalLM" || name == "Qwen2ForCausalLM" || name == "MistralForCausalLM" ||
      name == "Phi3ForCausalLM" || name == "Qwen3ForCausalLM" || name == "Gemma2ForCausalLM")
    return llama_from(j, file, name);
  if (name == "MixtralForCausalLM" || name == "Qwen2MoeForCausalLM") return moe_from(j, file, name);
  if (name == "GPT2LMHeadModel") return gpt2_from(j, file);
  fail(
      fmt::format("unsupported architecture '{}' (memtrade reads {})", echo(name), kArchitectures));
}

namespace {
std::atomic<std::uint64_t> g_reads{0};
}  // namespace

std::uint64_t hf_config_reads() {
  return g_reads.load();
}

HfModelConfig read_hf_config(const std::string& path) {
  ++g_reads;
  const std::string shown = echo(path, kEchoPathMax);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(fmt::format("{}: is a directory", shown));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(fmt::format("{}: cannot read the file", shown));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string text = bytes.str();
  const ConfigFile file{std::filesystem::path(path).stem().string(), sha256_hex(text)};
  try {
    return parse_hf_config(text, file);
  } catch (const std::invalid_argument& e) {
    fail(fmt::format("{}: {}", shown, e.what()));
  }
}

}  // namespace memtrade
