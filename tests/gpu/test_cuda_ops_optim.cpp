// unscale_and_check and every optimizer's update on CUDA against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace memtrade {
namespace {

using gputest::CudaVsCpu;
using gputest::CudaVsCpuDtype;
using gputest::Pair;
using gputest::Tol;

class CudaOptim : public CudaVsCpuDtype {};

TEST_P(CudaOptim, UnscaleAndCheckCleanGrads) {
  const DType t = GetParam();
  std::vector<Pair> grads;
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{123457}})
    grads.push_back(
        rand({n}, t, static_cast<std::uint32_t>(n), -1000.0f, 1000.0f, Category::grads));
  std::vector<Tensor*> cpu_list, gpu_list;
  for (auto& g : grads) {
    cpu_list.push_back(&g.cpu);
    gpu_list.push_back(&g.gpu);
  }
  cpu_list.push_back(nullptr);  // absent gradients are skipped
  gpu_list.push_back(nullptr);
  EXPECT_FALSE(cpu_ops().unscale_and_check(cpu_list, 1.0f / 1024.0f));
  EXPECT_FALSE(gpu_ops().unscale_and_check(gpu_list, 1.0f / 1024.0f));
  for (auto& g : grads) expect_close(g, Tol{0, 0, 0}, "unscaled");
}

TEST_P(CudaOptim, UnscaleAndCheckFindsInfAndNaNAnywhere) {
  const DType t = GetParam();
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    for (std::int64_t where : {std::int64_t{0}, std::int64_t{4095}, std::int64_t{99999}}) {
      Pair clean = rand({5000}, t, 1, -1.0f, 1.0f, Category::grads);
      std::vector<float> v = gputest::random_values(100000, 2);
      v[static_cast<std::size_t>(where)] = bad;
      Pair dirty = make({100000}, t, v, Category::grads);
      std::vector<Tensor*> cpu_list{&clean.cpu, &dirty.cpu}, gpu_list{&clean.gpu, &dirty.gpu};
      EXPECT_TRUE(cpu_ops().unscale_and_check(cpu_list, 0.5f));
      EXPECT_TRUE(gpu_ops().unscale_and_check(gpu_list, 0.5f)) << bad << " at " << where;
      // Every tensor is still unscaled, as torch does.
      expect_close(clean, Tol{0, 0, 0}, "clean tensor next to a bad one");
      expect_close(dirty, Tol{0, 0, 0}, "bad tensor");
    }
  }
  // Overflow by the scale itself (a finite value times inv_scale becoming inf) counts too.
  Pair big = full({10}, DType::F32, 3e38f, Category::grads);
  std::vector<Tensor*> g{&big.gpu};
  EXPECT_TRUE(gpu_ops().unscale_and_check(g, 10.0f));
  // And the flag is reset between calls.
  Pair ok = full({10}, t, 1.0f, Category::grads);
  std::vector<Tensor*> g2{&ok.gpu};
  EXPECT_FALSE(gpu_ops().unscale_and_check(g2, 10.0f));
}

struct OptCase {
  OptimizerKind kind;
  const char* name;
  float weight_decay;
  bool nesterov;
};

const OptCase kOptCases[] = {
    {OptimizerKind::sgd, "sgd", 0.0f, false},
    {OptimizerKind::sgd, "sgd_wd", 0.01f, false},
    {OptimizerKind::sgd_momentum, "momentum", 0.0f, false},
    {OptimizerKind::sgd_momentum, "momentum_wd_dampening", 0.01f, false},
    {OptimizerKind::sgd_momentum, "nesterov", 0.01f, true},
    {OptimizerKind::adam, "adam", 0.0f, false},
    {OptimizerKind::adam, "adam_wd", 0.01f, false},
    {OptimizerKind::adamw, "adamw", 0.01f, false},
    {OptimizerKind::adagrad, "adagrad", 0.01f, false},
    {OptimizerKind::rmsprop, "rmsprop", 0.01f, false},
};

// Three steps of each optimizer on a 16-bit or fp32 param with grads of every dtype.
TEST_P(CudaOptim, EveryKindMatchesTheCpuOverSteps) {
  const DType pt = GetParam();
  const std::int64_t n = 10007;
  for (const OptCase& oc : kOptCases) {
    for (DType gt : {DType::F32, DType::F16, DType::BF16}) {
      OptimizerHyper h;
      h.kind = oc.kind;
      h.lr = oc.kind == OptimizerKind::adagrad ? 0.05f : 0.01f;
      h.weight_decay = oc.weight_decay;
      h.nesterov = oc.nesterov;
      h.dampening = std::string(oc.name) == "momentum_wd_dampening" ? 0.1f : 0.0f;
      h.lr_decay = oc.kind == OptimizerKind::adagrad ? 0.01f : 0.0f;
      Pair param = rand({n}, pt, 1, -1.0f, 1.0f, Category::params);
      const int ns = optimizer_state_count(oc.kind);
      Pair s0 = full({n}, DType::F32, oc.kind == OptimizerKind::adagrad ? 0.1f : 0.0f,
                     Category::optimizer);
      Pair s1 = full({n}, DType::F32, 0.0f, Category::optimizer);
      for (std::int64_t step = 1; step <= 3; ++step) {
        h.step = step;
        Pair grad =
            rand({n}, gt, static_cast<std::uint32_t>(10 + step), -1.0f, 1.0f, Category::grads);
        cpu_ops().optimizer_update(h, param.cpu, grad.cpu, ns >= 1 ? &s0.cpu : nullptr,
                                   ns >= 2 ? &s1.cpu : nullptr);
        gpu_ops().optimizer_update(h, param.gpu, grad.gpu, ns >= 1 ? &s0.gpu : nullptr,
                                   ns >= 2 ? &s1.gpu : nullptr);
        const std::string tag = gputest::cat(oc.name, " param ", dtype_name(pt), " grad ",
                                             dtype_name(gt), " step ", step);
        // Same formulas; only FMA contraction differs (a few fp32 ulps), then the param rounds.
        expect_close(param, Tol{1e-6f, 0, 3}, gputest::cat(tag, " param"));
        if (ns >= 1) expect_close(s0, Tol{1e-7f, 0, 16}, gputest::cat(tag, " state0"));
        if (ns >= 2) expect_close(s1, Tol{1e-9f, 0, 16}, gputest::cat(tag, " state1"));
        // Resynchronise so that a 1-ulp rounding difference does not grow over steps.
        param = make({n}, pt, cpu_->to_host_f32(param.cpu), Category::params);
        s0 = make({n}, DType::F32, cpu_->to_host_f32(s0.cpu), Category::optimizer);
        s1 = make({n}, DType::F32, cpu_->to_host_f32(s1.cpu), Category::optimizer);
      }
    }
  }
}

TEST_P(CudaOptim, SixteenBitStates) {
  const DType t = GetParam();
  OptimizerHyper h;
  h.kind = OptimizerKind::adam;
  h.step = 5;
  Pair param = rand({999}, DType::F32, 3, -1.0f, 1.0f, Category::params);
  Pair grad = rand({999}, t, 4, -1.0f, 1.0f, Category::grads);
  Pair m = rand({999}, t, 5, -0.1f, 0.1f, Category::optimizer);
  Pair v = rand({999}, t, 6, 0.0f, 0.01f, Category::optimizer);
  cpu_ops().optimizer_update(h, param.cpu, grad.cpu, &m.cpu, &v.cpu);
  gpu_ops().optimizer_update(h, param.gpu, grad.gpu, &m.gpu, &v.gpu);
  expect_close(param, Tol{1e-6f, 0, 3}, "param");
  expect_close(m, Tol{1e-7f, 0, 3}, "exp_avg");
  expect_close(v, Tol{1e-9f, 0, 3}, "exp_avg_sq");
}

TEST_P(CudaOptim, RejectsMissingStateAndBadStep) {
  const DType t = GetParam();
  OptimizerHyper h;
  h.kind = OptimizerKind::adam;
  Pair param = rand({10}, t, 1, -1.0f, 1.0f, Category::params);
  Pair grad = rand({10}, t, 2, -1.0f, 1.0f, Category::grads);
  Pair s = full({10}, DType::F32, 0.0f, Category::optimizer);
  EXPECT_THROW(gpu_ops().optimizer_update(h, param.gpu, grad.gpu, &s.gpu, nullptr),
               std::invalid_argument);
  h.kind = OptimizerKind::sgd;
  h.step = 0;
  EXPECT_THROW(gpu_ops().optimizer_update(h, param.gpu, grad.gpu, nullptr, nullptr),
               std::invalid_argument);
}

MEMTRADE_INSTANTIATE_DTYPES(CudaOptim);

}  // namespace
}  // namespace memtrade
