// unscale_and_check and every optimizer's update on CUDA against the CPU: bit for bit (ops.h,
// rounding rules).
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
    // State in fp32 (next to a master) and in the param's dtype (pure precision, as the Trainer
    // allocates it: Optimizer::update uses param.dtype()).
    for (DType st :
         pt == DType::F32 ? std::vector<DType>{DType::F32} : std::vector<DType>{DType::F32, pt}) {
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
        Pair s0 =
            full({n}, st, oc.kind == OptimizerKind::adagrad ? 0.1f : 0.0f, Category::optimizer);
        Pair s1 = full({n}, st, 0.0f, Category::optimizer);
        for (std::int64_t step = 1; step <= 3; ++step) {
          h.step = step;
          Pair grad =
              rand({n}, gt, static_cast<std::uint32_t>(10 + step), -1.0f, 1.0f, Category::grads);
          cpu_ops().optimizer_update(h, param.cpu, grad.cpu, ns >= 1 ? &s0.cpu : nullptr,
                                     ns >= 2 ? &s1.cpu : nullptr);
          gpu_ops().optimizer_update(h, param.gpu, grad.gpu, ns >= 1 ? &s0.gpu : nullptr,
                                     ns >= 2 ? &s1.gpu : nullptr);
          const std::string tag =
              gputest::cat(oc.name, " param ", dtype_name(pt), " grad ", dtype_name(gt), " state ",
                           dtype_name(st), " step ", step);
          // One arithmetic for both (kernels/optimizer_math.h), rounded alike: the same bits,
          // which offload=optimizer/params rely on (their update runs on the host).
          expect_close(param, Tol{0, 0, 0}, gputest::cat(tag, " param"));
          if (ns >= 1) expect_close(s0, Tol{0, 0, 0}, gputest::cat(tag, " state0"));
          if (ns >= 2) expect_close(s1, Tol{0, 0, 0}, gputest::cat(tag, " state1"));
        }
      }
    }
  }
}

// The multi-tensor kernel against the CPU's one-by-one updates: more parameters than one
// launch's metadata holds (24 tensors, 320 blocks of 65536 elements), tensors straddling
// launches, empty ones, mixed param/grad dtypes (several launch groups), and grad_scale.
TEST_P(CudaOptim, UpdateManyMatchesTheCpuAcrossLaunches) {
  const DType pt = GetParam();
  for (OptimizerKind kind : {OptimizerKind::sgd_momentum, OptimizerKind::adamw}) {
    OptimizerHyper h;
    h.kind = kind;
    h.lr = 0.01f;
    h.weight_decay = 0.01f;
    h.momentum = 0.9f;
    h.grad_scale = 1.0f / 256.0f;
    std::vector<std::int64_t> sizes;
    for (int i = 0; i < 30; ++i) sizes.push_back(1 + 777 * i);  // 30 tensors: two launches
    sizes.push_back(0);
    sizes.push_back(320 * 65536 + 5);  // straddles the block table
    sizes.push_back(65536);
    const int ns = optimizer_state_count(kind);
    std::vector<Pair> params, grads, s0, s1;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const auto seed = static_cast<std::uint32_t>(100 + i);
      const DType gt = i % 3 == 0 ? DType::F32 : pt;  // two dtype groups
      params.push_back(rand({sizes[i]}, pt, seed, -1.0f, 1.0f, Category::params));
      grads.push_back(rand({sizes[i]}, gt, seed + 1000, -256.0f, 256.0f, Category::grads));
      // Step 2 with states already there (momentum buffer, Adam's m and v > 0).
      s0.push_back(rand({sizes[i]}, DType::F32, seed + 2000, -0.1f, 0.1f, Category::optimizer));
      s1.push_back(rand({sizes[i]}, DType::F32, seed + 3000, 1e-4f, 1e-2f, Category::optimizer));
    }
    h.step = 2;
    std::vector<OptimizerSlot> slots;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      cpu_ops().optimizer_update(h, params[i].cpu, grads[i].cpu, ns >= 1 ? &s0[i].cpu : nullptr,
                                 ns >= 2 ? &s1[i].cpu : nullptr);
      slots.push_back({&params[i].gpu, &grads[i].gpu, ns >= 1 ? &s0[i].gpu : nullptr,
                       ns >= 2 ? &s1[i].gpu : nullptr});
    }
    gpu_ops().optimizer_update_many(h, slots);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::string tag =
          gputest::cat(ns, "-state optimizer, tensor ", i, " (", sizes[i], " elements)");
      expect_close(params[i], Tol{0, 0, 0}, tag + " param");
      if (ns >= 1) expect_close(s0[i], Tol{0, 0, 0}, tag + " state0");
      if (ns >= 2) expect_close(s1[i], Tol{0, 0, 0}, tag + " state1");
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
  expect_close(param, Tol{0, 0, 0}, "param");
  expect_close(m, Tol{0, 0, 0}, "exp_avg");
  expect_close(v, Tol{0, 0, 0}, "exp_avg_sq");
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
