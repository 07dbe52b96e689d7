// The Llama family: HF's parameter names and shapes, the published parameter counts of the real
// configurations (from the size table and from their config.json through --model-config's
// reader), hyper-parameters, FLOPs, and model overrides ("llama-tiny:n_layer=4").
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "models/config/knobs.h"
#include "models/families/block_model.h"
#include "models/model.h"

namespace memtrade {
namespace {

std::string fixture(const char* name) {
  return std::string(MEMTRADE_SOURCE_DIR) + "/tests/models/fixtures/hf/" + name + ".json";
}

const ParamSpec& find(const Model& m, std::string_view name) {
  for (const auto& s : m.params())
    if (s.name == name) return s;
  throw std::runtime_error("missing " + std::string(name));
}

TEST(Llama, NamesAreHfLlamaForCausalLM) {
  auto m = make_model("llama-tiny");  // 2 layers, untied
  std::vector<std::string> want = {"model.embed_tokens.weight"};
  for (int i = 0; i < 2; ++i)
    for (const char* s :
         {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"})
      want.push_back(fmt::format("model.layers.{}.{}", i, s));
  want.push_back("model.norm.weight");
  want.push_back("lm_head.weight");
  std::vector<std::string> got;
  for (const auto& p : m->params()) got.push_back(p.name);
  EXPECT_EQ(got, want);
  // Tied: the head is embed_tokens, nothing of its own (as GPT's, and as HF's parameters()).
  auto tied = make_model("llama-tiny:tie_word_embeddings=true");
  EXPECT_EQ(tied->params().size(), want.size() - 1);
  EXPECT_EQ(tied->params().back().name, "model.norm.weight");
  EXPECT_EQ(m->num_params() - tied->num_params(), 256 * 64);
}

TEST(Llama, ShapesBlocksInitAndData) {
  auto m = make_model("llama-tiny");  // C 64, NH 4, NKV 2 (hd 16), I 176, V 256, T 32
  EXPECT_EQ(find(*m, "model.embed_tokens.weight").shape, (Shape{256, 64}));
  EXPECT_EQ(find(*m, "model.layers.1.self_attn.q_proj.weight").shape, (Shape{64, 64}));
  EXPECT_EQ(find(*m, "model.layers.1.self_attn.k_proj.weight").shape, (Shape{32, 64}));
  EXPECT_EQ(find(*m, "model.layers.1.self_attn.v_proj.weight").shape, (Shape{32, 64}));
  EXPECT_EQ(find(*m, "model.layers.1.self_attn.o_proj.weight").shape, (Shape{64, 64}));
  EXPECT_EQ(find(*m, "model.layers.0.mlp.gate_proj.weight").shape, (Shape{176, 64}));
  EXPECT_EQ(find(*m, "model.layers.0.mlp.down_proj.weight").shape, (Shape{64, 176}));
  EXPECT_EQ(find(*m, "model.layers.0.input_layernorm.weight").shape, (Shape{64}));
  EXPECT_EQ(find(*m, "lm_head.weight").shape, (Shape{256, 64}));
  EXPECT_EQ(find(*m, "model.layers.1.mlp.up_proj.weight").block, 1);
  EXPECT_EQ(find(*m, "model.norm.weight").block, -1);
  EXPECT_EQ(find(*m, "lm_head.weight").block, -1);
  for (const auto& p : m->params()) {
    if (p.shape.size() == 2) {
      EXPECT_FLOAT_EQ(p.init_std, 0.02f) << p.name;  // initializer_range, every matrix
    } else {
      EXPECT_LT(p.init_std, 0.0f) << p.name;  // RMSNorm weights: ones
    }
  }
  EXPECT_EQ(m->num_blocks(), 2);
  EXPECT_EQ(m->max_seq_len(), 32);
  EXPECT_EQ(m->input_shape(3), (Shape{3, 32}));
  EXPECT_EQ(m->input_dtype(DType::BF16), DType::I32);
  EXPECT_EQ(m->rows_per_sample(), 32);
  EXPECT_EQ(m->family(), "llama");
}

// The published counts (the Hub's safetensors totals; tests/python/test_hf_configs.py derives
// them from the config files too).
struct Published {
  const char* model;
  const char* config;
  std::int64_t params;
};
constexpr Published kPublished[] = {
    {"llama3.2-1b", "Llama-3.2-1B", 1'235'814'400},
    {"llama3.2-3b", "Llama-3.2-3B", 3'212'749'824},
    {"llama3-8b", "Meta-Llama-3-8B", 8'030'261'248},
};

TEST(Llama, RealConfigurationsHaveThePublishedCountsExactly) {
  for (const Published& p : kPublished) {
    SCOPED_TRACE(p.model);
    auto table = make_model(p.model);
    EXPECT_EQ(table->num_params(), p.params);
    // The same model from its config.json: every parameter, name and shape, and the math's
    // hyper-parameters equal the size table's.
    TrainConfig cfg;
    set_knob(cfg, knob("model_config"), fixture(p.config));
    resolve_config(cfg);
    auto file = make_model(cfg);
    EXPECT_EQ(file->num_params(), p.params);
    EXPECT_EQ(file->name(), p.config);
    ASSERT_EQ(file->params().size(), table->params().size());
    for (std::size_t i = 0; i < table->params().size(); ++i) {
      EXPECT_EQ(file->params()[i].name, table->params()[i].name);
      EXPECT_EQ(file->params()[i].shape, table->params()[i].shape);
    }
    nlohmann::json a = table->hyper(), b = file->hyper();
    EXPECT_EQ(b["model_config"]["name"], p.config);
    EXPECT_EQ(b["model_config"]["sha256"].get<std::string>().size(), 64u);
    b.erase("model_config");
    EXPECT_EQ(a, b);
  }
}

TEST(Llama, HyperParameters) {
  const nlohmann::json h = make_model("llama3.2-1b")->hyper();
  EXPECT_EQ(h["family"], "llama");
  EXPECT_EQ(h["n_layer"], 16);
  EXPECT_EQ(h["n_head"], 32);
  EXPECT_EQ(h["n_kv_head"], 8);
  EXPECT_EQ(h["n_embd"], 2048);
  EXPECT_EQ(h["head_dim"], 64);
  EXPECT_EQ(h["intermediate_size"], 8192);
  EXPECT_EQ(h["vocab_size"], 128256);
  EXPECT_EQ(h["block_size"], 131072);
  EXPECT_EQ(h["seq_len"], 131072);
  EXPECT_EQ(h["rope_theta"], 500000.0);
  EXPECT_EQ(h["norm_eps"], 1e-5);
  EXPECT_EQ(h["tie_word_embeddings"], true);
  EXPECT_EQ(h["rope_scaling"], (nlohmann::json{{"rope_type", "llama3"},
                                               {"factor", 32.0},
                                               {"low_freq_factor", 1.0},
                                               {"high_freq_factor", 4.0},
                                               {"original_max_position_embeddings", 8192}}));
  EXPECT_EQ(h["num_params"], 1'235'814'400);
  EXPECT_TRUE(make_model("llama3-8b")->hyper()["rope_scaling"].is_null());
  EXPECT_EQ(make_model("llama-tiny")->hyper()["tie_word_embeddings"], false);
}

TEST(Llama, Flops) {
  auto m = make_model("llama3-8b");
  const double B = 2, T = 8192, C = 4096, KV = 1024, I = 14336, V = 128256, L = 32;
  RunOptions o;
  const FlopCount f = m->flops(2, o);
  // q, o C²; k, v C·KV; gate, up, down C·I multiply-adds per token; QKᵀ and att·V B·T²·C each.
  const double scores = 2 * B * T * T * C;
  const double block = 2 * B * T * (2 * C * C + 2 * C * KV + 3 * C * I) + 2 * scores;
  EXPECT_DOUBLE_EQ(f.forward, L * block + 2 * B * T * C * V);
  EXPECT_DOUBLE_EQ(f.backward, 2 * f.forward);
  o.checkpoint = {Checkpoint::Kind::density, 1.0};
  EXPECT_DOUBLE_EQ(m->flops(2, o).recompute, L * block);
  // Selective drops the probabilities (a QKᵀ again) and the SwiGLU output (element-wise).
  o.checkpoint = {Checkpoint::Kind::selective, 0.0};
  EXPECT_DOUBLE_EQ(m->flops(2, o).recompute, L * scores);
  o.attention = AttentionKind::flash;  // no probabilities to drop; backward recomputes scores
  EXPECT_DOUBLE_EQ(m->flops(2, o).recompute, L * scores);
}

// ---- overrides --------------------------------------------------------------------------------

TEST(ModelOverrides, ChangeTheHyperParametersAndNameTheModel) {
  auto m = make_model("llama-tiny:n_layer=4,n_kv_head=1");
  EXPECT_EQ(m->name(), "llama-tiny:n_kv_head=1,n_layer=4");
  EXPECT_EQ(m->num_blocks(), 4);
  EXPECT_EQ(m->hyper()["n_kv_head"], 1);
  EXPECT_EQ(find(*m, "model.layers.3.self_attn.k_proj.weight").shape, (Shape{16, 64}));
  EXPECT_EQ(make_model("llama-tiny:rope_theta=5e5")->hyper()["rope_theta"], 500000.0);
  EXPECT_EQ(make_model("gpt-tiny:n_layer=3,tie_word_embeddings=false")->params().back().name,
            "lm_head.weight");
  EXPECT_EQ(make_model("gpt-tiny:n_layer=3")->num_blocks(), 3);
}

TEST(ModelOverrides, OneSpellingPerConfiguration) {
  // Keys sorted, values canonical, values equal to the base model's dropped.
  EXPECT_EQ(canonical_model_name("llama-tiny:n_layer=4,n_kv_head=1"),
            "llama-tiny:n_kv_head=1,n_layer=4");
  EXPECT_EQ(canonical_model_name("llama-tiny:n_kv_head=1,n_layer=04"),
            "llama-tiny:n_kv_head=1,n_layer=4");
  EXPECT_EQ(canonical_model_name("llama-tiny:rope_theta=5e5,tie_word_embeddings=1"),
            "llama-tiny:rope_theta=500000,tie_word_embeddings=true");
  EXPECT_EQ(canonical_model_name("llama-tiny:n_layer=2"), "llama-tiny");
  EXPECT_EQ(canonical_model_name("llama-tiny:norm_eps=0.00001"), "llama-tiny");
  EXPECT_EQ(canonical_model_name("llama-tiny"), "llama-tiny");
  TrainConfig a, b;
  set_knob(a, knob("model"), "llama-tiny:n_layer=4,n_kv_head=1");
  EXPECT_EQ(point_id(a).rfind("llama-tiny:n_kv_head=1,n_layer=4/b8/", 0), 0u) << point_id(a);
  set_knob(b, knob("model"), "llama-tiny:n_kv_head=1,n_layer=4");
  EXPECT_EQ(point_id(a), point_id(b));
  TrainConfig c;
  set_knob(c, knob("model"), "llama-tiny:n_layer=4");
  EXPECT_NE(point_id(a), point_id(c));
}

TEST(ModelOverrides, BadOnesAreOneLineErrors) {
  auto message = [](const std::string& text) {
    TrainConfig c;
    try {
      set_knob(c, knob("model"), text);
    } catch (const KnobError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      return m;
    }
    ADD_FAILURE() << text << " accepted";
    return std::string();
  };
  EXPECT_EQ(message("llama-tiny:n_layers=4"),
            "model: llama-tiny: unknown hyper-parameter 'n_layers' (llama takes: n_layer, "
            "n_head, n_kv_head, n_embd, intermediate_size, vocab_size, block_size, rope_theta, "
            "norm_eps, tie_word_embeddings, qkv_bias, o_bias, mlp_bias, sliding_window, "
            "fused_qkv, fused_gate_up, qk_norm, gemma_norms, geglu, embed_scale, "
            "query_pre_attn_scalar, attn_softcap, final_softcap)");
  EXPECT_EQ(message("llama-tiny:n_layer=0"),
            "model: llama-tiny: n_layer: expected a positive integer, got '0'");
  EXPECT_EQ(message("llama-tiny:tie_word_embeddings=yes"),
            "model: llama-tiny: tie_word_embeddings: expected true or false, got 'yes'");
  EXPECT_EQ(message("llama-tiny:n_kv_head=3"),
            "model: llama-tiny:n_kv_head=3: n_head 4 not divisible by n_kv_head 3 (grouped-query "
            "attention)");
  EXPECT_EQ(message("llama-tiny:n_layer"),
            "model: 'llama-tiny:n_layer': override 'n_layer' is not key=value");
  EXPECT_EQ(message("llama-tiny:"), "model: 'llama-tiny:': no override after ':' (key=value,...)");
  EXPECT_EQ(message("llama-tiny:n_layer=3,n_layer=4"),
            "model: 'llama-tiny:n_layer=3,n_layer=4': n_layer is overridden twice");
  EXPECT_EQ(message("mlp-tiny:hidden=3"),
            "model: mlp-tiny: its family takes no overrides (gpt-* and llama-* do)");
  EXPECT_EQ(message("llama-huge:n_layer=3").rfind("model: unknown value 'llama-huge:n_layer=3'", 0),
            0u);
  EXPECT_EQ(message("gpt-tiny:n_kv_head=1").rfind("model: gpt-tiny: unknown hyper-parameter", 0),
            0u);
}

}  // namespace
}  // namespace memtrade
