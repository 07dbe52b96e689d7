// The Hugging Face config reader (models/config/hf_config.h) on the published configs and on what
// the real files carry besides the keys memtrade reads; SHA-256 against FIPS 180-4's examples. (The
// CLI's one-line errors and exit code: tests/harness/test_model_config.cpp.)
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/config/hf_config.h"
#include "models/config/sha256.h"

namespace memtrade {
namespace {

using nlohmann::json;

json fixture(const char* name) {
  std::ifstream in(std::string(MEMTRADE_SOURCE_DIR) + "/tests/models/fixtures/hf/" + name +
                   ".json");
  return json::parse(in);
}

HfModelConfig parse(const json& j) {
  return parse_hf_config(j.dump(), ConfigFile{"x", "0"});
}

TEST(Sha256, FipsExamples) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the padding needs a second block.
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(HfConfig, Llama32_1B) {
  const LlamaConfig c = std::get<LlamaConfig>(parse(fixture("Llama-3.2-1B")));
  EXPECT_EQ(c.name, "x");
  EXPECT_EQ(c.n_layer, 16);
  EXPECT_EQ(c.n_head, 32);
  EXPECT_EQ(c.n_kv_head, 8);
  EXPECT_EQ(c.n_embd, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.block_size, 131072);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
}

TEST(HfConfig, Llama3_8BAndGpt2) {
  const LlamaConfig l = std::get<LlamaConfig>(parse(fixture("Meta-Llama-3-8B")));
  EXPECT_EQ(l.n_layer, 32);
  EXPECT_EQ(l.intermediate_size, 14336);
  EXPECT_EQ(l.block_size, 8192);
  EXPECT_FALSE(l.tie_word_embeddings);
  EXPECT_EQ(l.rope_scaling.factor, 0.0);  // null: none
  const GptConfig g = std::get<GptConfig>(parse(fixture("gpt2")));
  EXPECT_EQ(g.n_layer, 12);
  EXPECT_EQ(g.n_head, 12);
  EXPECT_EQ(g.n_embd, 768);
  EXPECT_EQ(g.vocab_size, 50257);
  EXPECT_EQ(g.block_size, 1024);
  EXPECT_EQ(g.norm_eps, 1e-5);
  EXPECT_TRUE(g.tie_word_embeddings);  // GPT-2 configs leave it to PretrainedConfig's default
}

// HF's LlamaConfig defaults for the keys a config may leave out.
TEST(HfConfig, LlamaDefaults) {
  json j = fixture("Meta-Llama-3-8B");
  for (const char* key : {"num_key_value_heads", "rope_theta", "rms_norm_eps",
                          "tie_word_embeddings", "rope_scaling", "head_dim"})
    j.erase(key);
  const LlamaConfig c = std::get<LlamaConfig>(parse(j));
  EXPECT_EQ(c.n_kv_head, 32);  // multi-head attention
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(std::get<LlamaConfig>(parse(j)).rope_scaling.factor, 0.0);
  j["rope_scaling"] = {{"type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  EXPECT_EQ(std::get<LlamaConfig>(parse(j)).rope_scaling.factor, 8.0);  // the older key
  j["num_key_value_heads"] = nullptr;                                   // null is absent, as in HF
  EXPECT_EQ(std::get<LlamaConfig>(parse(j)).n_kv_head, 32);
}

// Keys that change neither memory nor math, whatever their values, change nothing.
TEST(HfConfig, IgnoredKeysChangeNothing) {
  const json base = fixture("Llama-3.2-1B");
  json other = base;
  other["torch_dtype"] = "float32";
  other["use_cache"] = false;
  other["bos_token_id"] = 1;
  other["eos_token_id"] = {1, 2};
  other["pretraining_tp"] = 2;
  other["initializer_range"] = 0.5;
  other["transformers_version"] = "9.9.9";
  other["some_future_key"] = {{"a", 1}};
  const LlamaConfig a = std::get<LlamaConfig>(parse(base));
  const LlamaConfig b = std::get<LlamaConfig>(parse(other));
  EXPECT_EQ(LlamaModel(a).hyper(), LlamaModel(b).hyper());
  json gpt = fixture("gpt2");
  gpt["resid_pdrop"] = 0.0;
  gpt["n_ctx"] = 7;
  EXPECT_EQ(GptModel(std::get<GptConfig>(parse(gpt))).hyper(),
            GptModel(std::get<GptConfig>(parse(fixture("gpt2")))).hyper());
}

// Every problem is one line naming it.
std::string error_of(const json& j) {
  try {
    parse(j);
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  }
  ADD_FAILURE() << "accepted: " << j.dump();
  return {};
}

// Mistral and Phi-3 are Llama's decoder under another mapping of their keys (transformers
// 4.46.3 configuration_mistral.py, configuration_phi3.py defaults).
TEST(HfConfig, MistralAndPhi3) {
  json j = fixture("Llama-3.2-3B");
  j["architectures"] = {"MistralForCausalLM"};
  j.erase("rope_scaling");  // MistralRotaryEmbedding reads none
  LlamaConfig m = std::get<LlamaConfig>(parse(j));
  EXPECT_EQ(m.architecture, "MistralForCausalLM");
  EXPECT_EQ(m.sliding_window, 4096);  // MistralConfig's default when the key is absent
  EXPECT_EQ(m.hd(), 128);
  EXPECT_FALSE(m.qkv_bias || m.o_bias || m.mlp_bias || m.fused_qkv || m.fused_gate_up);
  j["sliding_window"] = nullptr;
  j["head_dim"] = 64;  // Mistral's attention takes head_dim as it is (NH·64 = 1536 != 3072)
  m = std::get<LlamaConfig>(parse(j));
  EXPECT_EQ(m.sliding_window, 0);
  EXPECT_EQ(m.hd(), 64);
  j["architectures"] = {"Phi3ForCausalLM"};
  j.erase("head_dim");
  j.erase("rms_norm_eps");
  LlamaConfig p = std::get<LlamaConfig>(parse(j));
  EXPECT_TRUE(p.fused_qkv && p.fused_gate_up);
  EXPECT_EQ(p.sliding_window, 0);  // Phi3Config's default: none
  EXPECT_EQ(p.norm_eps, 1e-5);     // Phi3Config's default
  j["sliding_window"] = 2047;
  EXPECT_EQ(std::get<LlamaConfig>(parse(j)).sliding_window, 2047);
}

// Gemma2ForCausalLM (transformers 4.46.3 configuration_gemma2.py's defaults and
// modeling_gemma2.py's reads): the public Gemma-2-9B, then the defaults where keys are absent,
// null soft-caps, and what is refused.
TEST(HfConfig, Gemma2) {
  json j = fixture("gemma-2-9b");
  LlamaConfig g = std::get<LlamaConfig>(parse(j));
  EXPECT_EQ(g.architecture, "Gemma2ForCausalLM");
  EXPECT_EQ(g.hd(), 256);  // head_dim, not 3584 / 16
  EXPECT_TRUE(g.tie_word_embeddings && g.gemma_norms && g.geglu && g.embed_scale);
  EXPECT_FALSE(g.qkv_bias || g.o_bias || g.mlp_bias || g.fused_qkv || g.qk_norm);
  EXPECT_EQ(g.query_pre_attn_scalar, 256);
  EXPECT_EQ(g.attn_softcap, 50);
  EXPECT_EQ(g.final_softcap, 30);
  EXPECT_EQ(g.sliding_window, 4096);
  for (const char* key :
       {"head_dim", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
        "sliding_window", "hidden_act", "hidden_activation", "attention_bias"})
    j.erase(key);
  g = std::get<LlamaConfig>(parse(j));
  EXPECT_EQ(g.hd(), 256);
  EXPECT_EQ(g.query_pre_attn_scalar, 224);
  EXPECT_EQ(g.attn_softcap, 50);
  EXPECT_EQ(g.final_softcap, 30);
  EXPECT_EQ(g.sliding_window, 4096);
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  j["sliding_window"] = nullptr;
  j["attention_bias"] = true;
  j["hidden_act"] = "silu";  // not read by Gemma2MLP
  g = std::get<LlamaConfig>(parse(j));
  EXPECT_EQ(g.attn_softcap, 0);
  EXPECT_EQ(g.final_softcap, 0);
  EXPECT_EQ(g.sliding_window, 0);
  EXPECT_TRUE(g.qkv_bias && g.o_bias);
  j["hidden_activation"] = "gelu";
  EXPECT_EQ(error_of(j), "unsupported hidden_activation \"gelu\" (the MLP is GeGLU, tanh GELU)");
  j.erase("hidden_activation");
  j["attn_logit_softcapping"] = 0;
  EXPECT_EQ(error_of(j), "key 'attn_logit_softcapping' must be a positive number, got 0");
}

TEST(HfConfig, RefusedConfigs) {
  const json llama = fixture("Llama-3.2-3B");
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "vocab_size", "max_position_embeddings"}) {
    json j = llama;
    j.erase(key);
    EXPECT_EQ(error_of(j), fmt::format("missing key '{}' (required for LlamaForCausalLM)", key));
  }
  const json gpt = fixture("gpt2");
  for (const char* key : {"n_embd", "n_layer", "n_head", "vocab_size", "n_positions"}) {
    json j = gpt;
    j.erase(key);
    EXPECT_EQ(error_of(j), fmt::format("missing key '{}' (required for GPT2LMHeadModel)", key));
  }
  auto with = [](json j, const char* key, json value) {
    j[key] = std::move(value);
    return j;
  };
  EXPECT_EQ(error_of(with(llama, "architectures", {"FalconForCausalLM"})),
            "unsupported architecture 'FalconForCausalLM' (memtrade reads LlamaForCausalLM, "
            "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Phi3ForCausalLM, "
            "Gemma2ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM and GPT2LMHeadModel)");
  json no_arch = llama;
  no_arch.erase("architectures");
  EXPECT_EQ(error_of(no_arch),
            "missing key 'architectures' (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
            "MistralForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, MixtralForCausalLM, "
            "Qwen2MoeForCausalLM and GPT2LMHeadModel)");
  json yarn = llama;
  yarn["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_EQ(error_of(yarn),
            "unsupported rope_scaling type 'yarn' (memtrade implements llama3 and default)");
  json no_factor = llama;
  no_factor["rope_scaling"].erase("factor");
  EXPECT_EQ(error_of(no_factor), "missing key 'rope_scaling.factor' (required for llama3)");
  EXPECT_EQ(error_of(with(llama, "hidden_act", "gelu")),
            "unsupported hidden_act \"gelu\" (the MLP is SwiGLU, silu)");
  // Biases are read (attention_bias: q, k, v and o; mlp_bias: gate, up, down); a Qwen2 config
  // with a sliding window is refused, naming the key.
  json qwen2 = with(llama, "architectures", {"Qwen2ForCausalLM"});
  EXPECT_EQ(error_of(with(qwen2, "use_sliding_window", true)),
            "unsupported use_sliding_window true (full causal attention in every layer)");
  EXPECT_EQ(error_of(with(llama, "attention_dropout", 0.1)),
            "unsupported attention_dropout 0.1 (no dropout)");
  EXPECT_EQ(error_of(with(qwen2, "head_dim", 64)),
            "unsupported head_dim 64: Qwen2ForCausalLM has hidden_size / num_attention_heads = "
            "3072/24");
  // Phi-3: longrope and dropout are refused, naming the key.
  json phi3 = with(with(llama, "architectures", {"Phi3ForCausalLM"}), "rope_scaling", nullptr);
  EXPECT_EQ(error_of(with(phi3, "resid_pdrop", 0.1)), "unsupported resid_pdrop 0.1 (no dropout)");
  EXPECT_EQ(error_of(with(phi3, "embd_pdrop", 0.1)), "unsupported embd_pdrop 0.1 (no dropout)");
  EXPECT_EQ(error_of(with(phi3, "rope_scaling", {{"type", "longrope"}})),
            "unsupported rope_scaling {\"type\":\"longrope\"} (memtrade's Phi-3 has plain rotary "
            "embeddings, rope_scaling null)");
  EXPECT_EQ(error_of(with(llama, "hidden_size", "3072")),
            "key 'hidden_size' must be a positive integer, got \"3072\"");
  EXPECT_EQ(error_of(with(llama, "rope_theta", -1)),
            "key 'rope_theta' must be a positive number, got -1");
  EXPECT_EQ(error_of(with(gpt, "n_inner", 1000)), "unsupported n_inner 1000 (the MLP is 4·n_embd)");
  EXPECT_EQ(error_of(with(gpt, "activation_function", "relu")),
            "unsupported activation_function \"relu\" (GELU, tanh approximation)");
  EXPECT_EQ(error_of(with(gpt, "scale_attn_by_inverse_layer_idx", true)),
            "unsupported scale_attn_by_inverse_layer_idx true (scores / √hd)");
  EXPECT_EQ(error_of(json::array()), "not a JSON object");
  try {
    parse_hf_config("{\"architectures\": [", ConfigFile{});
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("not JSON (", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace memtrade
