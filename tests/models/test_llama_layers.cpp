// The llama_layers knob (models/families/llama.h): hf-eager keeps what HF's eager code keeps, and
// only that changes. Both values give the same bits (losses, gradients, updated parameters) in
// fp32 and under bf16 autocast, with every checkpoint kind; hf-eager saves exactly the extras of
// the eager code's formula at the end of forward; the knob applies to Llama-like models only.
#include <string>

#include "models/config/knobs.h"
#include "models/families/block_model.h"
#include "tests/models/test_store.h"
#include "tests/models/test_trainer_util.h"

namespace memtrade::testing {
namespace {

class LlamaLayersBits : public ::testing::TestWithParam<std::string> {};

// Three Adam steps: the extras are bytes autograd holds, never read by the fused ops, so every
// number must be the liger run's, whatever the precision, autocast policy or checkpoint plan.
TEST_P(LlamaLayersBits, SameBitsAsLiger) {
  struct Precision_ {
    Precision p;
    autocast::Policy policy;
    const char* name;
  };
  for (const Precision_ prec : {Precision_{Precision::fp32, autocast::Policy::torch_cuda, "fp32"},
                                {Precision::bf16, autocast::Policy::torch_cpu, "bf16 torch-cpu"},
                                {Precision::bf16, autocast::Policy::torch_cuda, "bf16 torch-cuda"}})
    for (const char* ck : {"0", "1", "0.5", "selective"}) {
      SCOPED_TRACE(GetParam() + " " + prec.name + " checkpoint " + ck);
      TrainConfig liger = base_config(GetParam(), 4);
      liger.precision = prec.p;
      liger.autocast_policy = prec.policy;
      liger.checkpoint = *Checkpoint::parse(ck);
      TrainConfig eager = liger;
      eager.llama_layers = LlamaLayers::hf_eager;
      const RunResult a = run_steps(liger, 3), b = run_steps(eager, 3);
      EXPECT_EQ(b.losses, a.losses);
      expect_identical(b.grads, a.grads, a.names, "grads");
      expect_identical(b.params_after, a.params_after, a.names, "params_after");
    }
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaLayersBits,
                         ::testing::Values("llama-tiny", "llama-tiny:tie_word_embeddings=true",
                                           "llama-tiny:n_kv_head=4"),
                         model_test_name);

// Bytes saved for backward at the end of a training forward (no checkpoint).
std::int64_t saved_after_forward(const std::string& name, std::int64_t batch, LlamaLayers layers,
                                 DType act, std::optional<AutocastSpec> amp,
                                 AttentionKind attention = AttentionKind::math,
                                 Checkpoint checkpoint = {}) {
  auto dev = make_device("cpu");
  auto model = make_model(name);
  auto& m = dynamic_cast<BlockModel&>(*model);
  TestStore store(*dev, m, DType::F32, 7);
  auto b = make_device_batch(*dev, m, 5, 0, batch, act);
  RunOptions o;
  o.act_dtype = act;
  o.amp = amp;
  o.llama_layers = layers;
  o.attention = attention;
  o.checkpoint = checkpoint;
  Tensor losses = m.forward(*dev, store, b.input, b.targets, o);
  return m.saved()->device_bytes();
}

// Per token, what HF's eager layers keep besides the fused ones' (rmsnorm.h, llama_mlp.h,
// attention.h): each RMSNorm's x² and normalised rows (fp32: the residual stream is fp32), two
// per layer and the final one; repeat_kv's expanded K and V beyond the NKV heads', and
// act_fn(gate), in the linears' output dtype; under autocast, k_proj's and v_proj's own input
// casts, and up_proj's, besides the one cast q_proj and gate_proj keep; and once per forward the
// rotary tables.
TEST(LlamaLayers, SavesTheEagerExtras) {
  for (const char* name : {"llama-tiny", "llama-tiny:n_kv_head=1"}) {
    const nlohmann::json h = make_model(name)->hyper();
    const auto L = h["n_layer"].get<std::int64_t>(), C = h["n_embd"].get<std::int64_t>(),
               I = h["intermediate_size"].get<std::int64_t>(), NH = h["n_head"].get<std::int64_t>(),
               NKV = h["n_kv_head"].get<std::int64_t>(), hd = h["head_dim"].get<std::int64_t>(),
               T = h["seq_len"].get<std::int64_t>();
    constexpr std::int64_t B = 3;
    for (const bool amp : {false, true}) {
      SCOPED_TRACE(std::string(name) + (amp ? " bf16 torch-cpu" : " fp32"));
      const std::optional<AutocastSpec> spec =
          amp ? std::optional<AutocastSpec>(AutocastSpec{DType::BF16, autocast::Policy::torch_cpu})
              : std::nullopt;
      const std::int64_t w = amp ? 2 : 4;  // the linears' output dtype
      const std::int64_t per_token =
          L * (2 * 2 * C * 4 + (2 * (NH - NKV) * hd + I) * w + (amp ? 3 * C * w : 0)) + 2 * C * 4;
      const std::int64_t liger = saved_after_forward(name, B, LlamaLayers::liger, DType::F32, spec);
      const std::int64_t eager =
          saved_after_forward(name, B, LlamaLayers::hf_eager, DType::F32, spec);
      const std::int64_t tables = 2 * T * hd * 4;  // cos and sin, once per forward, fp32
      EXPECT_EQ(eager - liger, B * T * per_token + tables);
    }
  }
}

// Selective checkpointing recomputes the math core, with repeat_kv's K and V in it, and keeps
// the fp32 rotated q and k the core's checkpoint takes under autocast; flash attention has no
// core to recompute, so there it keeps what no checkpoint keeps.
TEST(LlamaLayers, SelectiveRecomputesTheMathCoreOnly) {
  const nlohmann::json h = make_model("llama-tiny")->hyper();
  const auto L = h["n_layer"].get<std::int64_t>(), NH = h["n_head"].get<std::int64_t>(),
             NKV = h["n_kv_head"].get<std::int64_t>(), hd = h["head_dim"].get<std::int64_t>(),
             T = h["seq_len"].get<std::int64_t>();
  constexpr std::int64_t B = 3;
  const AutocastSpec bf16{DType::BF16, autocast::Policy::torch_cpu};
  const Checkpoint selective = *Checkpoint::parse("selective");
  const auto saved = [&](LlamaLayers l, AttentionKind a, Checkpoint ck) {
    return saved_after_forward("llama-tiny", B, l, DType::F32, bf16, a, ck);
  };
  for (const LlamaLayers l : {LlamaLayers::liger, LlamaLayers::hf_eager})
    EXPECT_EQ(saved(l, AttentionKind::flash, selective), saved(l, AttentionKind::flash, {}));
  const std::int64_t kv_rep = B * T * 2 * (NH - NKV) * hd * 2;  // bf16
  const std::int64_t qk_f32 = B * T * (NH + NKV) * hd * 2;      // fp32's 2 bytes more
  EXPECT_EQ(saved(LlamaLayers::hf_eager, AttentionKind::math, selective) -
                saved(LlamaLayers::liger, AttentionKind::math, selective),
            saved(LlamaLayers::hf_eager, AttentionKind::math, {}) -
                saved(LlamaLayers::liger, AttentionKind::math, {}) - L * kv_rep + L * qk_f32);
}

// A Llama-like model's axis: refused for the other families, left out of ids at its default.
TEST(LlamaLayers, OnlyLlamaLikeModels) {
  const Knob& k = knob("llama_layers");
  for (const char* model : {"gpt-tiny", "mlp-tiny", "cnn-tiny"}) {
    TrainConfig c = base_config(model);
    set_knob(c, k, "hf-eager");
    EXPECT_THROW(resolve_config(c), KnobError) << model;
    TrainConfig d = base_config(model);
    resolve_config(d);
    EXPECT_FALSE(k.applies(d)) << model;
  }
  TrainConfig c = base_config("llama-tiny");
  resolve_config(c);
  const std::string liger_id = point_id(c);
  EXPECT_EQ(liger_id.find("ll-"), std::string::npos);
  set_knob(c, k, "hf-eager");
  resolve_config(c);
  EXPECT_EQ(point_id(c), liger_id + "/ll-hf-eager");
  EXPECT_EQ(config_json(c)["llama_layers"], "hf-eager");
}

}  // namespace
}  // namespace memtrade::testing
