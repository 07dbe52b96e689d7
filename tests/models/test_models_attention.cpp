// The attention kind (RunOptions::attention): flash gives math's gradients to 1e-5 (fp32) on the
// GPT sizes CI runs, and saves exactly the formula's bytes: per block, no (B, NH, T, T)
// probabilities and one (B, NH, T) F32 log-sum-exp instead (its output is c_proj's input, saved
// either way). Checkpointing with flash leaves the numbers unchanged. The attention layer's
// grouped-query path (a Llama's) with both kinds.
#include <gtest/gtest.h>

#include <cstdio>

#include "models/layers/attention.h"
#include "tests/models/attention_run.h"

namespace memtrade {
namespace {

using testing::AttentionRun;
using testing::run_attention;

struct ModelCase {
  const char* model;
  std::int64_t batch;
};

class FlashVsMathModel : public ::testing::TestWithParam<ModelCase> {};

TEST_P(FlashVsMathModel, SameGradientsAndTheFormulasBytes) {
  const auto [name, batch] = GetParam();
  auto dev = make_device("cpu");
  const AttentionRun math = run_attention(*dev, name, batch, AttentionKind::math);
  const AttentionRun flash = run_attention(*dev, name, batch, AttentionKind::flash);
  EXPECT_NEAR(flash.loss, math.loss, 1e-5 * std::abs(math.loss));
  const auto [of_max, elementwise] = testing::expect_grads_close(flash, math, 1e-5);
  std::printf(
      "%-10s batch %lld: worst gradient error %.2e of the tensor's max, %.2e element-wise\n", name,
      static_cast<long long>(batch), of_max, elementwise);

  const nlohmann::json h = make_model(name)->hyper();
  const auto L = h["n_layer"].get<std::int64_t>(), NH = h["n_head"].get<std::int64_t>(),
             T = h["seq_len"].get<std::int64_t>();
  const std::int64_t att = batch * NH * T * T * 4, lse = batch * NH * T * 4;  // bytes, fp32
  EXPECT_EQ(math.blocks_with_att, L);
  EXPECT_EQ(math.blocks_with_lse, 0);
  EXPECT_EQ(flash.blocks_with_att, 0) << "no (T, T) tensor is saved";
  EXPECT_EQ(flash.blocks_with_lse, L);
  EXPECT_EQ(flash.saved_bytes, math.saved_bytes - L * att + L * lse);
  const auto rounded = [](std::int64_t n) {
    return static_cast<std::int64_t>(CachingAllocator::round_size(static_cast<std::size_t>(n)));
  };
  EXPECT_EQ(flash.activation_bytes, math.activation_bytes - L * rounded(att) + L * rounded(lse));
}

INSTANTIATE_TEST_SUITE_P(Gpt, FlashVsMathModel,
                         ::testing::Values(ModelCase{"gpt-test", 3}, ModelCase{"gpt-tiny", 4},
                                           ModelCase{"gpt-mini", 4}, ModelCase{"gpt-small", 8}),
                         [](const auto& param_info) {
                           std::string s = param_info.param.model;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// Llama: grouped-query heads (n_kv_head < n_head), RoPE on the packed qkv, untied (tiny) and
// tied with llama3 rope scaling (mini).
INSTANTIATE_TEST_SUITE_P(Llama, FlashVsMathModel,
                         ::testing::Values(ModelCase{"llama-test", 3}, ModelCase{"llama-tiny", 4},
                                           ModelCase{"llama-mini", 4}),
                         [](const auto& param_info) {
                           std::string s = param_info.param.model;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// Checkpointing trades memory for time only: with flash too, the gradients are bit-identical.
// Selective has nothing to drop in flash attention (the lse stays).
class FlashModel : public ::testing::TestWithParam<const char*> {};

TEST_P(FlashModel, CheckpointingLeavesGradientsUnchanged) {
  auto dev = make_device("cpu");
  const AttentionRun plain = run_attention(*dev, GetParam(), 4, AttentionKind::flash);
  for (const Checkpoint ck :
       {Checkpoint{Checkpoint::Kind::selective, 0.0}, Checkpoint{Checkpoint::Kind::density, 1.0}}) {
    SCOPED_TRACE(ck.str());
    const AttentionRun r = run_attention(*dev, GetParam(), 4, AttentionKind::flash, DType::F32, ck);
    EXPECT_EQ(r.loss, plain.loss);
    ASSERT_EQ(r.grads.size(), plain.grads.size());
    for (std::size_t i = 0; i < r.grads.size(); ++i)
      EXPECT_TRUE(testing::bit_equal(r.grads[i], plain.grads[i])) << "param #" << i;
    EXPECT_EQ(r.blocks_with_lse, ck.kind == Checkpoint::Kind::selective ? 2 : 0)
        << "recomputed blocks save only their input";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, FlashModel, ::testing::Values("gpt-tiny", "llama-tiny"),
                         [](const auto& param_info) {
                           std::string s = param_info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// ---- the layer with grouped-query heads --------------------------------------------------------

// Weights for one attention layer: c_attn ((NH + 2·NKV)·hd, C) and c_proj (C, NH·hd) with biases.
class LayerStore final : public ParamStore {
 public:
  LayerStore(Device& dev, const std::vector<Shape>& shapes) : dev_(dev) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      weights_.push_back(dev.empty(shapes[i], DType::F32, Category::params));
      dev.from_host_f32(weights_.back(), test_values(shape_numel(shapes[i]), 100 + i, 0.3f));
      grads_.push_back(dev.empty(shapes[i], DType::F32, Category::grads));
    }
  }
  Tensor& weight(int i) override { return weights_.at(i); }
  GradRef grad(int i) override { return {grads_.at(i), false}; }
  std::vector<float> grad_host(int i) { return dev_.to_host_f32(grads_.at(i)); }

  static std::vector<float> test_values(std::int64_t n, std::uint64_t seed, float scale) {
    SplitMix rng(seed, 0, 0);
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = scale * rng.normal();
    return v;
  }

 private:
  Device& dev_;
  std::vector<Tensor> weights_, grads_;
};

struct LayerRun {
  std::vector<float> out, dinp;
  std::vector<std::vector<float>> grads;
  bool saved_att = false, saved_lse = false;
};

LayerRun run_layer(Device& dev, int nh, int nkv, AttentionKind kind) {
  const std::int64_t B = 2, T = 37, hd = 12, C = 40, W = (nh + 2 * nkv) * hd;
  LayerStore store(dev, {{W, C}, {W}, {C, nh * hd}, {C}});
  const CausalSelfAttention a{{0, 1}, {2, 3}, nh, nkv, {}, std::nullopt, std::nullopt};
  SavedTensors saved(dev);
  LayerCtx c{dev, store, saved, DType::F32, std::nullopt};
  c.segment = 0;
  c.save = true;
  c.attention = kind;
  Tensor inp = dev.empty({B * T, C}, DType::F32, Category::activations);
  dev.from_host_f32(inp, LayerStore::test_values(B * T * C, 1, 1.0f));
  LayerRun r;
  Tensor out = attention_forward(c, std::move(inp), B, T, a);
  r.out = dev.to_host_f32(out);
  r.saved_att = saved.has(0, "attn.att");
  r.saved_lse = saved.has(0, "attn.lse");
  Tensor dout = dev.empty({B * T, C}, DType::F32, Category::temporaries);
  dev.from_host_f32(dout, LayerStore::test_values(B * T * C, 2, 1.0f));
  Tensor dinp = attention_backward(c, dout, a);
  r.dinp = dev.to_host_f32(dinp);
  for (int i = 0; i < 4; ++i) r.grads.push_back(store.grad_host(i));
  return r;
}

TEST(AttentionLayer, GroupedQueryFlashEqualsMath) {
  auto dev = make_device("cpu");
  for (int nkv : {4, 2, 1}) {
    SCOPED_TRACE("n_kv_head " + std::to_string(nkv));
    const LayerRun math = run_layer(*dev, 4, nkv, AttentionKind::math);
    const LayerRun flash = run_layer(*dev, 4, nkv, AttentionKind::flash);
    EXPECT_TRUE(math.saved_att && !math.saved_lse);
    EXPECT_TRUE(flash.saved_lse && !flash.saved_att);
    EXPECT_LE(testing::error_of_max(flash.out, math.out), 1e-5);
    EXPECT_LE(testing::error_of_max(flash.dinp, math.dinp), 1e-5);
    for (int i = 0; i < 4; ++i)
      EXPECT_LE(testing::error_of_max(flash.grads[i], math.grads[i]), 1e-5) << "param #" << i;
  }
}

}  // namespace
}  // namespace memtrade
