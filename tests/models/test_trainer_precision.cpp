// Autocast, O2 and pure 16-bit precision: grads agree with fp32 within the dtype's tolerance,
// dynamic loss scaling skips overflowing steps and grows the scale like torch's GradScaler.
#include <limits>
#include <string>

#include "models/train/loss_scaler.h"
#include "tests/models/test_trainer_util.h"

namespace memtrade::testing {
namespace {

// ||a - b||₂ / ||b||₂ of one tensor.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t j = 0; j < b.size(); ++j) {
    const double d = static_cast<double>(a[j]) - b[j];
    num += d * d;
    den += static_cast<double>(b[j]) * b[j];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

class PrecisionGrads : public ::testing::TestWithParam<std::string> {};

// Tolerance, per tensor, on the relative L2 error of the first step's grads against fp32:
//   gpt, mlp: 4·eps(dtype). Every activation and weight is rounded to 16 bits (one rounding,
//     relative error <= eps, per stored tensor; autocast rounds fewer of them); the errors are
//     independent, so the grads' relative error stays around eps (measured: at most 0.8·eps,
//     bf16 and fp16 alike).
//   cnn: 4·√eps. ReLU masks and max-pool argmaxes flip where rounding moves a value across
//     zero or a tie; each flip is an O(1) error on one element and the flips number ∝ eps, so
//     the L2 error grows like √eps (measured: 1.8·√eps for bf16 and fp16).
// Without unscaling (fp16 grads 65536× too large) or with grads of the wrong batch, the error
// is O(1) or more and the test fails.
TEST_P(PrecisionGrads, WithinDtypeToleranceOfFp32) {
  const std::string model = GetParam();
  const bool masks = model.rfind("cnn", 0) == 0;
  const RunResult ref = run_steps(base_config(model, 8), 1);
  for (Precision p : {Precision::bf16, Precision::fp16, Precision::bf16_o2, Precision::fp16_o2,
                      Precision::bf16_pure, Precision::fp16_pure}) {
    SCOPED_TRACE(model + " " + std::string(precision_name(p)));
    TrainConfig cfg = base_config(model, 8);
    cfg.precision = p;
    const RunResult r = run_steps(cfg, 1);
    ASSERT_FALSE(r.skipped[0]);
    const double eps = dtype_eps(autocast_dtype(p).value_or(compute_dtype(p)));
    const double tol = masks ? 4 * std::sqrt(eps) : 4 * eps;
    EXPECT_NEAR(r.losses[0], ref.losses[0], 16 * eps * ref.losses[0]);
    bool any_different = false;
    for (std::size_t i = 0; i < ref.grads.size(); ++i) {
      ASSERT_EQ(r.grads[i].size(), ref.grads[i].size()) << ref.names[i];
      const double err = rel_l2(r.grads[i], ref.grads[i]);
      EXPECT_LE(err, tol) << ref.names[i];
      any_different = any_different || err > 0;
    }
    EXPECT_TRUE(any_different) << "16-bit run gave exactly the fp32 grads: precision ignored?";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PrecisionGrads,
                         ::testing::Values("gpt-tiny", "mlp-tiny", "cnn-tiny"), model_test_name);

TEST(LossScaler, GradScalerSemantics) {
  LossScaler s(true, 1024.0f, 3);
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(false);  // third clean step in a row: ×2
  EXPECT_EQ(s.scale(), 2048.0f);
  s.update(false);
  s.update(true);  // overflow: ×0.5 and the run of clean steps restarts
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.skipped_steps(), 1);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 2048.0f);

  LossScaler off(false, 1024.0f, 3);
  EXPECT_EQ(off.scale(), 1.0f);
  off.update(true);
  EXPECT_EQ(off.scale(), 1.0f);
  EXPECT_THROW(LossScaler(true, 0.0f, 3), std::invalid_argument);
  EXPECT_THROW(LossScaler(true, 1.0f, 0), std::invalid_argument);
}

class Overflow : public ::testing::TestWithParam<Precision> {};

// A scale of 1e38 makes the scaled grads overflow fp16 (max 65504): the step is skipped, no
// parameter moves, the optimizer does not count it, and the scale halves.
TEST_P(Overflow, SkipsTheStepAndHalvesTheScale) {
  auto dev = cpu_device();
  auto model = make_model("mlp-tiny");
  TrainConfig cfg = base_config("mlp-tiny", 4);
  cfg.precision = GetParam();
  cfg.loss_scale_init = 1e38f;
  Trainer trainer(*dev, *model, cfg);
  trainer.set_capture_grads(true);
  std::vector<std::vector<float>> before;
  for (int i = 0; i < static_cast<int>(model->params().size()); ++i)
    before.push_back(trainer.param_f32(i));
  const StepResult r = trainer.step();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.loss_scale, 1e38f);
  EXPECT_EQ(trainer.loss_scale(), 0.5e38f);
  EXPECT_EQ(trainer.skipped_steps(), 1);
  EXPECT_EQ(trainer.optimizer_steps(), 0);
  ASSERT_NE(trainer.optimizer(), nullptr);
  EXPECT_EQ(trainer.optimizer()->state_bytes(), 0);  // state is created at the first real update
  EXPECT_TRUE(std::isfinite(r.loss));
  bool any_inf = false;
  for (int i = 0; i < static_cast<int>(model->params().size()); ++i) {
    EXPECT_EQ(trainer.param_f32(i), before[static_cast<std::size_t>(i)]) << i;
    for (float g : trainer.grad_f32(i)) any_inf = any_inf || !std::isfinite(g);
  }
  EXPECT_TRUE(any_inf) << "the captured grads of a skipped step keep their inf/nan";

  // Scale backs off each step until the grads fit; then updates happen again.
  int steps = 0;
  while (trainer.step().skipped && ++steps < 200) {
  }
  ASSERT_LT(steps, 200);
  EXPECT_EQ(trainer.optimizer_steps(), 1);
  bool moved = false;
  for (int i = 0; i < static_cast<int>(model->params().size()); ++i)
    moved = moved || trainer.param_f32(i) != before[static_cast<std::size_t>(i)];
  EXPECT_TRUE(moved);
}

INSTANTIATE_TEST_SUITE_P(Fp16, Overflow,
                         ::testing::Values(Precision::fp16, Precision::fp16_o2,
                                           Precision::fp16_pure),
                         [](const auto& p) {
                           return p.param == Precision::fp16      ? std::string("autocast")
                                  : p.param == Precision::fp16_o2 ? std::string("o2")
                                                                  : std::string("pure");
                         });

TEST(LossScaling, CleanStepsGrowTheScale) {
  auto dev = cpu_device();
  auto model = make_model("gpt-tiny");
  TrainConfig cfg = base_config("gpt-tiny", 2);
  cfg.precision = Precision::fp16;
  cfg.loss_scale_init = 1024.0f;
  cfg.loss_scale_growth_interval = 3;
  Trainer trainer(*dev, *model, cfg);
  EXPECT_EQ(trainer.step().loss_scale, 1024.0f);
  EXPECT_EQ(trainer.step().loss_scale, 1024.0f);
  const StepResult third = trainer.step();
  EXPECT_FALSE(third.skipped);
  EXPECT_EQ(third.loss_scale, 1024.0f);  // the scale this step ran with
  EXPECT_EQ(trainer.loss_scale(), 2048.0f);
  EXPECT_EQ(trainer.step().loss_scale, 2048.0f);
  EXPECT_EQ(trainer.optimizer_steps(), 4);
}

TEST(LossScaling, OnlyFp16Scales) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16, Precision::bf16_o2,
                      Precision::bf16_pure}) {
    auto dev = cpu_device();
    auto model = make_model("mlp-tiny");
    TrainConfig cfg = base_config("mlp-tiny", 2);
    cfg.precision = p;
    cfg.loss_scale_init = 1e38f;  // ignored without scaling
    Trainer trainer(*dev, *model, cfg);
    const StepResult r = trainer.step();
    EXPECT_FALSE(r.skipped) << precision_name(p);
    EXPECT_EQ(r.loss_scale, 1.0f) << precision_name(p);
  }
}

// tf32 is fp32 on the CPU backend: bit-identical.
TEST(Precision, Tf32IsFp32OnCpu) {
  TrainConfig a = base_config("gpt-tiny", 2);
  TrainConfig b = a;
  b.precision = Precision::tf32;
  const RunResult ra = run_steps(a, 2), rb = run_steps(b, 2);
  EXPECT_EQ(ra.losses, rb.losses);
  expect_identical(rb.params_after, ra.params_after, ra.names, "params_after");
}

}  // namespace
}  // namespace memtrade::testing
