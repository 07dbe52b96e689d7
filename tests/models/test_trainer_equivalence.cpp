// Knobs that trade memory for time must not change the numbers: checkpointing, every offload
// mode, zero_grad=zero, pageable input and empty_cache give bit-identical losses, gradients and
// updated parameters to the plain run, in fp32 and under bf16 autocast. Accumulation splits the
// same samples differently, so it agrees to rounding only.
#include <string>
#include <utility>

#include "tests/models/test_trainer_util.h"

namespace memtrade::testing {
namespace {

class KnobEquivalence : public ::testing::TestWithParam<std::string> {};

TEST_P(KnobEquivalence, BitIdenticalToPlainFp32Adam) {
  // 3 steps: the second and third use Adam's state and, for zero_grad=zero, kept grads.
  expect_knobs_bit_identical(
      GetParam(), [](const TrainConfig& cfg, int steps) { return run_steps(cfg, steps); });
}

// The same under bf16 autocast: recomputed segments cast the weights again, checkpointed MLP
// blocks keep the fp32 input instead of its cast, offloaded weights are cast when streamed in, and
// 16-bit weight gradients are added into kept fp32 grads (zero_grad=zero, accumulation): all of
// it must leave the numbers alone. (torch-cpu: its softmax stays 16-bit, a different path.)
TEST_P(KnobEquivalence, BitIdenticalToPlainBf16AutocastAdam) {
  for (autocast::Policy p : {autocast::Policy::torch_cuda, autocast::Policy::torch_cpu}) {
    SCOPED_TRACE(std::string(autocast::policy_name(p)));
    expect_knobs_bit_identical(
        GetParam(), [](const TrainConfig& cfg, int steps) { return run_steps(cfg, steps); }, 3,
        Precision::bf16, p);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KnobEquivalence,
                         ::testing::Values("gpt-tiny", "llama-tiny",
                                           "llama-tiny:tie_word_embeddings=true",
                                           "llama-tiny:qkv_bias=true,o_bias=true,mlp_bias=true",
                                           "mlp-tiny", "cnn-tiny"),
                         model_test_name);

// The comparison above must be able to fail: a run that really differs is caught.
TEST(KnobEquivalence, DetectsADifferentRun) {
  TrainConfig a = base_config("mlp-tiny", 4);
  TrainConfig b = a;
  b.seed = 2;
  const RunResult ra = run_steps(a, 1), rb = run_steps(b, 1);
  EXPECT_NE(ra.losses, rb.losses);
  EXPECT_NE(ra.grads, rb.grads);
}

class Accumulation : public ::testing::TestWithParam<std::string> {};

// 8×1, 4×2 and 2×4 see the same 8 samples per step, so grads of the mean loss and the SGD
// update agree to float rounding (summation order differs): 2e-6 relative to each tensor's
// largest element (fp32 eps is 1.2e-7; GPT sums 256 rows per weight gradient in a different
// order, measured up to 1.1e-6). Not the CNN: batch-norm normalises with the statistics of
// each micro-batch, so accumulation changes its numbers, exactly as in PyTorch.
TEST_P(Accumulation, SplitsOfTheSameBatchAgree) {
  const std::string model = GetParam();
  auto cfg_of = [&](std::int64_t b, std::int64_t k) {
    TrainConfig c = base_config(model, b);
    c.accumulation = k;
    c.optimizer = OptimizerKind::sgd;
    return c;
  };
  const RunResult ref = run_steps(cfg_of(8, 1), 2);
  for (auto [b, k] : {std::pair<std::int64_t, std::int64_t>{4, 2}, {2, 4}}) {
    SCOPED_TRACE(model + " " + std::to_string(b) + "x" + std::to_string(k));
    const RunResult r = run_steps(cfg_of(b, k), 2);
    ASSERT_EQ(r.losses.size(), ref.losses.size());
    for (std::size_t s = 0; s < r.losses.size(); ++s)
      EXPECT_NEAR(r.losses[s], ref.losses[s], 2e-6 * std::abs(ref.losses[s]));
    for (std::size_t p = 0; p < ref.grads.size(); ++p) {
      EXPECT_LE(max_rel_err(r.grads[p], ref.grads[p]), 2e-6) << ref.names[p];
      EXPECT_LE(max_rel_err(r.params_after[p], ref.params_after[p]), 2e-6) << ref.names[p];
    }
  }
  // And a different batch (4×1: half the samples) is clearly different.
  const RunResult half = run_steps(cfg_of(4, 1), 2);
  double worst = 0;
  for (std::size_t p = 0; p < ref.grads.size(); ++p)
    worst = std::max(worst, max_rel_err(half.grads[p], ref.grads[p]));
  EXPECT_GT(worst, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Models, Accumulation,
                         ::testing::Values("gpt-tiny", "llama-tiny", "mlp-tiny"), model_test_name);

}  // namespace
}  // namespace memtrade::testing
