// Training works: with default hyper-parameters the loss falls clearly within 100 steps.
#include <numeric>
#include <string>

#include "tests/models/test_trainer_util.h"

namespace memtrade::testing {
namespace {

class Convergence : public ::testing::TestWithParam<std::string> {};

// Threshold: the mean of the last 10 losses below 0.8 × the mean of the first 10. The first
// steps sit near chance (ln(classes)); the 10-step means of batch-8 losses fluctuate by a few
// percent, so a 20% drop is learning, not noise. Measured with Adam at the default lr:
// gpt-tiny 0.64, mlp-tiny 0.63, cnn-tiny 0.73.
void expect_loss_falls(const TrainConfig& cfg) {
  auto dev = cpu_device();
  auto model = make_model(cfg.model);
  Trainer trainer(*dev, *model, cfg);
  std::vector<double> losses;
  for (int s = 0; s < 100; ++s) {
    const StepResult r = trainer.step();
    ASSERT_TRUE(std::isfinite(r.loss)) << "step " << s;
    losses.push_back(r.loss);
  }
  const double first = std::accumulate(losses.begin(), losses.begin() + 10, 0.0) / 10;
  const double last = std::accumulate(losses.end() - 10, losses.end(), 0.0) / 10;
  EXPECT_LT(last, 0.8 * first) << cfg.model << ": first " << first << " last " << last;
  EXPECT_EQ(trainer.steps_done(), 100);
}

TEST_P(Convergence, LossFallsWithin100Steps) {
  expect_loss_falls(base_config(GetParam(), 8));
}

// Autocast trains as well: bf16, and fp16 with its loss scaling (no step skipped at the default
// scale for these models).
TEST_P(Convergence, LossFallsWithin100StepsUnderAutocast) {
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(std::string(precision_name(p)));
    TrainConfig cfg = base_config(GetParam(), 8);
    cfg.precision = p;
    expect_loss_falls(cfg);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Convergence, ::testing::Values("gpt-tiny", "mlp-tiny", "cnn-tiny"),
                         model_test_name);

// Eval mode runs forward only: the loss does not change from step to step on the same data
// stream position, and nothing is updated.
TEST(EvalMode, ForwardOnlyMeanLoss) {
  TrainConfig train = base_config("gpt-tiny", 4);
  TrainConfig eval = train;
  eval.mode = Mode::eval;
  const RunResult rt = run_steps(train, 1);
  const RunResult re = run_steps(eval, 2);
  EXPECT_EQ(re.losses[0], rt.losses[0]);  // same params, same first batch, same forward
  EXPECT_NE(re.losses[1], re.losses[0]);  // the next batch
  for (std::size_t p = 0; p < re.grads.size(); ++p) EXPECT_TRUE(re.grads[p].empty());
  expect_identical(re.params_after, re.params_before, re.names, "eval params");
}

}  // namespace
}  // namespace memtrade::testing
