// Whole-model gradient checks: analytic gradients vs central finite differences (fp32), on a
// few elements of every trainable tensor of the tiny test sizes.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>

#include "models/model.h"
#include "test_store.h"

namespace memtrade {
namespace {

using testing::TestStore;

struct GradCase {
  const char* model;
  std::int64_t batch;
  float eps;
  // ReLU networks are piecewise smooth: a pre-activation within eps of 0 bends the central
  // difference (and fp32 forbids a much smaller eps). A kink on one side leaves the other
  // one-sided difference clean, so there the analytic gradient must match one of central /
  // forward / backward differences; the few elements with kinks on both sides (at most 10%)
  // must still be within 15%.
  bool kinks;
  // Multiplies the init's std. Llama's 0.02 leaves the attention scores uniform and the q and
  // k gradients far below what an fp32 difference resolves; 20x (std 0.4) gives scores of
  // order 1, so a wrong RoPE backward shows.
  float init_scale = 1.0f;
};

class GradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(GradCheck, MatchesFiniteDifferences) {
  const GradCase gc = GetParam();
  auto dev = make_device("cpu");
  auto m = make_model(gc.model);
  TestStore store(*dev, *m, DType::F32, 42, gc.init_scale);
  auto b = testing::make_device_batch(*dev, *m, 9, 0, gc.batch, DType::F32);
  const double rows = static_cast<double>(gc.batch * m->rows_per_sample());

  RunOptions train;
  Tensor losses = m->forward(*dev, store, b.input, b.targets, train);
  losses.reset();
  m->backward(*dev, store, static_cast<float>(1.0 / rows));

  RunOptions eval;
  eval.training = false;
  auto mean_loss = [&] {
    Tensor l = m->forward(*dev, store, b.input, b.targets, eval);
    return dev->ops().sum_to_host(l) / rows;
  };

  SplitMix pick(3, 0, 0);
  int checked = 0, kinked = 0;
  const auto& specs = m->params();
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    if (!specs[i].trainable) continue;
    ASSERT_TRUE(store.has_grad(i)) << specs[i].name;
    const auto grad = store.grad_host(i);
    auto w = store.weight_host(i);
    for (int k = 0; k < 3; ++k) {
      const std::size_t e = pick.below(w.size());
      const float orig = w[e];
      w[e] = orig + gc.eps;
      store.set_weight_host(i, w);
      const double lp = mean_loss();
      w[e] = orig - gc.eps;
      store.set_weight_host(i, w);
      const double lm = mean_loss();
      w[e] = orig;
      store.set_weight_host(i, w);
      const double fd = (lp - lm) / (2.0 * gc.eps);
      const double an = grad[e];
      auto close = [&](double d) { return std::abs(an - d) <= 5e-4 + 2e-2 * std::abs(d); };
      if (!gc.kinks) {
        EXPECT_TRUE(close(fd)) << specs[i].name << "[" << e << "]: analytic " << an << ", central "
                               << fd;
      } else if (!close(fd)) {
        const double l0 = mean_loss();
        const double fwd = (lp - l0) / gc.eps, bwd = (l0 - lm) / gc.eps;
        if (!close(fwd) && !close(bwd)) ++kinked;  // kinks on both sides (or a bug)
        // Never far off: a wrong mask or a missing residual term is not a 15% effect.
        EXPECT_NEAR(an, fd, 1e-3 + 0.15 * std::abs(fd))
            << specs[i].name << "[" << e << "]: analytic " << an << ", central " << fd
            << ", forward " << fwd << ", backward " << bwd;
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 18);
  EXPECT_LE(kinked, checked / 10) << "too many elements off the strict tolerance";
}

INSTANTIATE_TEST_SUITE_P(
    Models, GradCheck,
    ::testing::Values(
        GradCase{"gpt-test", 2, 1e-2f, false}, GradCase{"llama-test", 2, 1e-3f, false, 20.0f},
        GradCase{"llama-test:tie_word_embeddings=true", 2, 1e-3f, false, 20.0f},
        GradCase{"llama-test:qkv_bias=true,o_bias=true,mlp_bias=true", 2, 1e-3f, false, 20.0f},
        // Phi-3's fused qkv_proj and gate_up_proj
        GradCase{"llama-test:fused_qkv=true,fused_gate_up=true", 2, 1e-3f, false, 20.0f},
        // Qwen3's per-head q/k RMSNorm
        GradCase{"llama-test:qk_norm=true", 2, 1e-3f, false, 20.0f},
        // Gemma 2's (1 + w) norms, four per layer, GeGLU, embedding scale, scale and soft-caps
        GradCase{"llama-test:gemma_norms=true,geglu=true,embed_scale=true,"
                 "query_pre_attn_scalar=3,attn_softcap=0.5,final_softcap=0.5",
                 2, 1e-3f, false, 20.0f},
        GradCase{"mlp-test", 4, 1e-3f, true}, GradCase{"cnn-test", 3, 1e-3f, true},
        GradCase{"mlp-tiny", 4, 1e-3f, true}),
    [](const auto& param_info) {
      std::string s = param_info.param.model;
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

}  // namespace
}  // namespace memtrade
