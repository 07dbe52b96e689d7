// Every optimizer through the Trainer: three steps of mlp-tiny checked against a host double-
// precision reimplementation of torch.optim's formulas applied to the Trainer's own grads, and
// the state it keeps. (The op tests check the kernels; this checks hyper-parameters, the step
// count and state handling across steps.)
#include <algorithm>
#include <cmath>
#include <string>

#include "models/config/knobs.h"
#include "models/train/optimizer.h"
#include "tests/models/test_trainer_util.h"

namespace memtrade::testing {
namespace {

// torch.optim.{SGD, Adam, AdamW, Adagrad, RMSprop}.step() for one parameter, in double.
struct RefOptimizer {
  OptimizerHyper h;
  std::vector<double> s0, s1;

  void step(std::vector<double>& p, const std::vector<float>& grad, std::int64_t t) {
    if (s0.empty()) {
      s0.assign(p.size(), h.kind == OptimizerKind::adagrad ? h.initial_accumulator_value : 0.0);
      s1.assign(p.size(), 0.0);
    }
    for (std::size_t j = 0; j < p.size(); ++j) {
      double g = grad[j];
      switch (h.kind) {
        case OptimizerKind::sgd:
          g += h.weight_decay * p[j];
          p[j] -= h.lr * g;
          break;
        case OptimizerKind::sgd_momentum: {
          g += h.weight_decay * p[j];
          s0[j] = t == 1 ? g : h.momentum * s0[j] + (1 - h.dampening) * g;
          const double d = h.nesterov ? g + h.momentum * s0[j] : s0[j];
          p[j] -= h.lr * d;
          break;
        }
        case OptimizerKind::adam:
        case OptimizerKind::adamw: {
          if (h.kind == OptimizerKind::adamw)
            p[j] *= 1 - static_cast<double>(h.lr) * h.weight_decay;
          else
            g += h.weight_decay * p[j];
          s0[j] = h.beta1 * s0[j] + (1 - static_cast<double>(h.beta1)) * g;
          s1[j] = h.beta2 * s1[j] + (1 - static_cast<double>(h.beta2)) * g * g;
          const double bc1 = 1 - std::pow(static_cast<double>(h.beta1), static_cast<double>(t));
          const double bc2 = 1 - std::pow(static_cast<double>(h.beta2), static_cast<double>(t));
          const double denom = std::sqrt(s1[j]) / std::sqrt(bc2) + h.eps;
          p[j] -= h.lr / bc1 * s0[j] / denom;
          break;
        }
        case OptimizerKind::adagrad: {
          const double clr = h.lr / (1 + static_cast<double>(t - 1) * h.lr_decay);
          g += h.weight_decay * p[j];
          s0[j] += g * g;
          p[j] -= clr * g / (std::sqrt(s0[j]) + h.eps);
          break;
        }
        case OptimizerKind::rmsprop: {
          g += h.weight_decay * p[j];
          s0[j] = h.alpha * s0[j] + (1 - static_cast<double>(h.alpha)) * g * g;
          p[j] -= h.lr * g / (std::sqrt(s0[j]) + h.eps);
          break;
        }
      }
    }
  }
};

class Optimizers : public ::testing::TestWithParam<OptimizerKind> {};

TEST_P(Optimizers, ThreeStepsMatchTorchFormulas) {
  const OptimizerKind kind = GetParam();
  auto dev = cpu_device();
  auto model = make_model("mlp-tiny");
  TrainConfig cfg = base_config("mlp-tiny", 8);
  cfg.optimizer = kind;
  Trainer trainer(*dev, *model, cfg);
  trainer.set_capture_grads(true);
  const OptimizerHyper& h = trainer.optimizer_hyper();
  EXPECT_EQ(h.kind, kind);
  EXPECT_EQ(h.lr, default_lr(kind, "mlp"));
  EXPECT_EQ(h.weight_decay, kind == OptimizerKind::adamw ? 1e-2f : 0.0f);
  EXPECT_EQ(h.eps, kind == OptimizerKind::adagrad ? 1e-10f : 1e-8f);

  const int n = static_cast<int>(model->params().size());
  std::vector<std::vector<double>> ref(static_cast<std::size_t>(n));
  std::vector<RefOptimizer> opt(static_cast<std::size_t>(n), RefOptimizer{h, {}, {}});
  std::int64_t numel = 0;
  for (const auto& s : model->params()) numel += shape_numel(s.shape);

  for (std::int64_t t = 1; t <= 3; ++t) {
    // The reference starts each step from the Trainer's parameters, so only the update rule
    // (and the state carried from earlier steps) is compared.
    for (int i = 0; i < n; ++i) {
      const auto v = trainer.param_f32(i);
      ref[static_cast<std::size_t>(i)].assign(v.begin(), v.end());
    }
    ASSERT_FALSE(trainer.step().skipped);
    EXPECT_EQ(trainer.optimizer_steps(), t);
    for (int i = 0; i < n; ++i) {
      auto& p = ref[static_cast<std::size_t>(i)];
      opt[static_cast<std::size_t>(i)].step(p, trainer.grad_f32(i), t);
      const auto got = trainer.param_f32(i);
      double worst = -1;  // max over elements of |got - ref| - (1e-6 + 1e-5·|ref|)
      for (std::size_t j = 0; j < p.size(); ++j)
        worst = std::max(worst, std::abs(got[j] - p[j]) - (1e-6 + 1e-5 * std::abs(p[j])));
      EXPECT_LE(worst, 0.0) << optimizer_name(kind) << " step " << t << " "
                            << model->params()[static_cast<std::size_t>(i)].name;
    }
    // One fp32 state tensor per parameter and state slot, created at the first step.
    EXPECT_EQ(trainer.optimizer()->state_bytes(), optimizer_state_count(kind) * numel * 4);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Optimizers,
                         ::testing::Values(OptimizerKind::sgd, OptimizerKind::sgd_momentum,
                                           OptimizerKind::adam, OptimizerKind::adamw,
                                           OptimizerKind::adagrad, OptimizerKind::rmsprop),
                         [](const auto& p) {
                           std::string s(optimizer_name(p.param));
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// An explicit lr wins over the default; pure precision keeps 16-bit state.
TEST(Optimizers, ExplicitLrAndPureState) {
  auto dev = cpu_device();
  auto model = make_model("mlp-tiny");
  TrainConfig cfg = base_config("mlp-tiny", 4);
  cfg.lr = 0.25f;
  cfg.precision = Precision::bf16_pure;
  Trainer trainer(*dev, *model, cfg);
  EXPECT_EQ(trainer.optimizer_hyper().lr, 0.25f);
  EXPECT_EQ(trainer.optimizer(), nullptr);  // no state before the first step
  trainer.step();
  ASSERT_NE(trainer.optimizer(), nullptr);
  EXPECT_EQ(trainer.optimizer()->state(0, 0).dtype(), DType::BF16);
  EXPECT_EQ(trainer.optimizer()->state(0, 1).dtype(), DType::BF16);
  cfg.lr = -1.0f;
  EXPECT_THROW(Trainer(*dev, *model, cfg), std::invalid_argument);
}

// The temporaries of each optimizer_impl, as torch 2.x's _multi_tensor_* / _single_tensor_*
// make them (models/train/optimizer.h): the peak of requested bytes during the second update
// (state exists) above its start, for three fp32 parameters of a, b, c elements.
TEST(OptimizerImpl, TemporariesAsTorchMakesThem) {
  const std::int64_t a = 3000, b = 1000, c = 5000, all = a + b + c;
  const std::int64_t forloop_two = std::max({2 * a, a + 2 * b, b + 2 * c});  // denom + sqrt, div
  const std::int64_t forloop_one = std::max({a, a + b, b + c});              // previous + new
  struct Case {
    OptimizerKind kind;
    std::int64_t foreach, forloop;  // elements; fused makes none
  };
  const Case cases[] = {
      {OptimizerKind::sgd, 0, 0},
      {OptimizerKind::sgd_momentum, 0, 0},
      {OptimizerKind::adam, all, forloop_two},
      {OptimizerKind::adamw, all, forloop_two},
      {OptimizerKind::adagrad, 2 * all, forloop_one},
      {OptimizerKind::rmsprop, all, forloop_one},
  };
  for (const Case& k : cases)
    for (OptimizerImpl impl :
         {OptimizerImpl::foreach, OptimizerImpl::forloop, OptimizerImpl::fused}) {
      SCOPED_TRACE(std::string(optimizer_name(k.kind)) + " " +
                   std::string(optimizer_impl_name(impl)));
      auto dev = cpu_device();
      CachingAllocator& mem = dev->memory();
      std::vector<Tensor> params, grads;
      for (std::int64_t n : {a, b, c}) {
        params.push_back(Tensor(mem, {n}, DType::F32, Category::params));
        grads.push_back(Tensor(mem, {n}, DType::F32, Category::grads));
        dev->ops().fill(params.back(), 0.5f);
        dev->ops().fill(grads.back(), 0.25f);
      }
      Optimizer opt(default_hyper(k.kind, "mlp", 0.0f), 3, impl);
      std::vector<Optimizer::Item> items;
      for (int i = 0; i < 3; ++i) items.push_back({i, &params[i], &grads[i]});
      opt.update_many(dev->ops(), items);  // creates the state
      opt.finish_step();
      const std::int64_t start = mem.stats().requested.current;
      mem.reset_peak();
      opt.update_many(dev->ops(), items);
      const std::int64_t expected = impl == OptimizerImpl::foreach   ? k.foreach
                                    : impl == OptimizerImpl::forloop ? k.forloop
                                                                     : 0;
      EXPECT_EQ(mem.stats().requested.peak - start, expected * 4);
      EXPECT_EQ(mem.stats().requested.current, start);  // every temporary freed
    }
}

// The implementation changes the memory of the step, never its arithmetic: three steps of
// every optimizer give the same bits with each (fused is the plain run).
TEST(OptimizerImpl, SameBitsWithEveryImpl) {
  for (OptimizerKind kind :
       {OptimizerKind::sgd, OptimizerKind::sgd_momentum, OptimizerKind::adam, OptimizerKind::adamw,
        OptimizerKind::adagrad, OptimizerKind::rmsprop}) {
    TrainConfig cfg = base_config("mlp-tiny", 4);
    cfg.optimizer = kind;
    cfg.optimizer_impl = OptimizerImpl::forloop;
    const RunResult ref = run_steps(cfg, 3);
    for (OptimizerImpl impl : {OptimizerImpl::foreach, OptimizerImpl::fused}) {
      if (impl == OptimizerImpl::fused && kind == OptimizerKind::rmsprop) continue;
      SCOPED_TRACE(std::string(optimizer_name(kind)) + " " +
                   std::string(optimizer_impl_name(impl)));
      cfg.optimizer_impl = impl;
      const RunResult r = run_steps(cfg, 3);
      EXPECT_EQ(r.losses, ref.losses);
      expect_identical(r.params_after, ref.params_after, ref.names, "params_after");
    }
  }
}

// torch.optim.RMSprop has no fused=True: refused as a knob value (one line, exit 2 in the CLI).
TEST(OptimizerImpl, FusedRmspropRefused) {
  TrainConfig cfg;
  cfg.optimizer = OptimizerKind::rmsprop;
  set_knob(cfg, knob("optimizer_impl"), "fused");
  EXPECT_THROW(resolve_config(cfg), KnobError);
  cfg.mode = Mode::eval;  // no optimizer step: the axis does not apply
  EXPECT_NO_THROW(resolve_config(cfg));
  EXPECT_EQ(cfg.optimizer_impl, OptimizerImpl::foreach);
}

}  // namespace
}  // namespace memtrade::testing
