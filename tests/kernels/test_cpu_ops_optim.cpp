// optimizer_update against torch.optim's formulas, hand-written here in double for 3 steps.
#include <cmath>

#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

const std::vector<float> kP0{0.5f, -1.0f, 2.0f, 0.0f, -0.25f};
const std::vector<std::vector<float>> kGrads{{0.1f, -0.2f, 0.3f, 1.0f, -0.5f},
                                             {0.2f, 0.1f, -0.4f, 0.5f, 0.0f},
                                             {-0.3f, 0.4f, 0.2f, -1.0f, 0.25f}};

struct Expected {
  Vec p, s0, s1;
};

// Literal transcriptions of torch/optim/{sgd,adam,adamw,adagrad,rmsprop}.py (single tensor).
Expected expected(const OptimizerHyper& h0) {
  Expected e{to_d(kP0), Vec(5, 0.0), Vec(5, 0.0)};
  if (h0.kind == OptimizerKind::adagrad) e.s0 = Vec(5, h0.initial_accumulator_value);
  const double lr = h0.lr, wd = h0.weight_decay, eps = h0.eps;
  for (int step = 1; step <= 3; ++step) {
    for (int i = 0; i < 5; ++i) {
      double p = e.p[i], g = kGrads[step - 1][i];
      switch (h0.kind) {
        case OptimizerKind::sgd:
          g = g + wd * p;
          p = p - lr * g;
          break;
        case OptimizerKind::sgd_momentum: {
          g = g + wd * p;
          double& buf = e.s0[i];
          buf = step == 1 ? g : h0.momentum * buf + (1 - h0.dampening) * g;
          g = h0.nesterov ? g + h0.momentum * buf : buf;
          p = p - lr * g;
          break;
        }
        case OptimizerKind::adam:
        case OptimizerKind::adamw: {
          if (h0.kind == OptimizerKind::adamw)
            p = p * (1 - lr * wd);
          else
            g = g + wd * p;
          double& m = e.s0[i];
          double& v = e.s1[i];
          m = m + (g - m) * (1 - h0.beta1);  // lerp_
          v = v * h0.beta2 + (1 - h0.beta2) * g * g;
          const double bc1 = 1 - std::pow(double{h0.beta1}, step);
          const double bc2 = 1 - std::pow(double{h0.beta2}, step);
          const double denom = std::sqrt(v) / std::sqrt(bc2) + eps;
          p = p - (lr / bc1) * m / denom;
          break;
        }
        case OptimizerKind::adagrad: {
          const double clr = lr / (1 + (step - 1) * h0.lr_decay);
          g = g + wd * p;
          double& sum = e.s0[i];
          sum = sum + g * g;
          p = p - clr * g / (std::sqrt(sum) + eps);
          break;
        }
        case OptimizerKind::rmsprop: {
          g = g + wd * p;
          double& sq = e.s0[i];
          sq = sq * h0.alpha + (1 - h0.alpha) * g * g;
          p = p - lr * g / (std::sqrt(sq) + eps);
          break;
        }
      }
      e.p[i] = p;
    }
  }
  return e;
}

struct OptCase {
  const char* name;
  OptimizerHyper h;
};

void PrintTo(const OptCase& c, std::ostream* os) {
  *os << c.name;
}

class OptimTest : public OpsTest, public ::testing::WithParamInterface<OptCase> {};

TEST_P(OptimTest, ThreeStepsMatchTorchFormulas) {
  for (float wd : {0.0f, 0.1f}) {
    OptimizerHyper h = GetParam().h;
    h.weight_decay = wd;
    const int ns = optimizer_state_count(h.kind);
    Tensor p = make({5}, kP0);
    Tensor s0 = make(
        {5}, std::vector<float>(5, h.kind == OptimizerKind::adagrad
                                       ? h.initial_accumulator_value
                                       : (h.kind == OptimizerKind::sgd_momentum ? NAN : 0.0f)));
    Tensor s1 = zeros({5});
    for (int step = 1; step <= 3; ++step) {
      h.step = step;
      Tensor g = make({5}, kGrads[step - 1]);
      ops().optimizer_update(h, p, g, ns >= 1 ? &s0 : nullptr, ns >= 2 ? &s1 : nullptr);
    }
    const Expected e = expected(h);
    const std::string what = std::string(GetParam().name) + " wd=" + std::to_string(wd);
    expect_close(get(p), e.p, 1e-6, 1e-5, what + " param");
    if (ns >= 1) expect_close(get(s0), e.s0, 1e-6, 1e-5, what + " state0");
    if (ns >= 2) expect_close(get(s1), e.s1, 1e-7, 1e-5, what + " state1");
  }
}

OptimizerHyper hyper(OptimizerKind k, float lr) {
  OptimizerHyper h;
  h.kind = k;
  h.lr = lr;
  return h;
}

OptimizerHyper nesterov() {
  OptimizerHyper h = hyper(OptimizerKind::sgd_momentum, 0.1f);
  h.nesterov = true;
  return h;
}

OptimizerHyper damped() {
  OptimizerHyper h = hyper(OptimizerKind::sgd_momentum, 0.1f);
  h.dampening = 0.3f;
  return h;
}

OptimizerHyper adagrad() {
  OptimizerHyper h = hyper(OptimizerKind::adagrad, 0.1f);
  h.eps = 1e-10f;
  h.lr_decay = 0.05f;
  h.initial_accumulator_value = 0.1f;
  return h;
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, OptimTest,
    ::testing::Values(OptCase{"sgd", hyper(OptimizerKind::sgd, 0.1f)},
                      OptCase{"momentum", hyper(OptimizerKind::sgd_momentum, 0.1f)},
                      OptCase{"nesterov", nesterov()}, OptCase{"dampened", damped()},
                      OptCase{"adam", hyper(OptimizerKind::adam, 0.01f)},
                      OptCase{"adamw", hyper(OptimizerKind::adamw, 0.01f)},
                      OptCase{"adagrad", adagrad()},
                      OptCase{"rmsprop", hyper(OptimizerKind::rmsprop, 0.01f)}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

TEST_F(OpsTest, OptimizerSixteenBitParamAndState) {
  // Pure bf16: param and state in bf16, grad in f16; arithmetic is fp32, results rounded.
  OptimizerHyper h = hyper(OptimizerKind::adam, 0.01f);
  Tensor p = make({5}, kP0, DType::BF16), m = zeros({5}, DType::BF16), v = zeros({5}, DType::BF16);
  Tensor g = make({5}, kGrads[0], DType::F16);
  ops().optimizer_update(h, p, g, &m, &v);
  // Step 1 of Adam moves every coordinate by lr·sign(g) (m/√v = sign at step 1).
  Vec want = to_d(kP0);
  for (int i = 0; i < 5; ++i)
    want[i] -= 0.01 * (kGrads[0][i] > 0 ? 1 : (kGrads[0][i] < 0 ? -1 : 0));
  expect_close(get(p), to_d(quantize(std::vector<float>(want.begin(), want.end()), DType::BF16)),
               1e-6, 0, "bf16 adam step");
}

// grad_scale is the fused unscale: the same bits as updating with grad · scale computed first
// (fp32 products either way), which is what the Trainer did with an fp32 copy before.
TEST_F(OpsTest, OptimizerGradScaleIsTheUnscaleFused) {
  for (OptimizerKind k :
       {OptimizerKind::sgd_momentum, OptimizerKind::adam, OptimizerKind::adagrad}) {
    OptimizerHyper h = hyper(k, 0.01f);
    std::vector<float> g(kGrads[0].begin(), kGrads[0].end());
    for (float& x : g) x *= 1024.0f;  // a loss scaled by 1024, grads stored in fp16
    g = quantize(g, DType::F16);
    std::vector<float> g_half = g;
    for (float& x : g_half) x *= 1.0f / 1024.0f;
    Tensor p1 = make({5}, kP0), a1 = zeros({5}), b1 = zeros({5});
    Tensor p2 = make({5}, kP0), a2 = zeros({5}), b2 = zeros({5});
    Tensor scaled = make({5}, g, DType::F16), unscaled = make({5}, g_half);
    h.grad_scale = 1.0f / 1024.0f;
    ops().optimizer_update(h, p1, scaled, &a1, &b1);
    h.grad_scale = 1.0f;
    ops().optimizer_update(h, p2, unscaled, &a2, &b2);
    EXPECT_EQ(get(p1), get(p2)) << static_cast<int>(k);
    EXPECT_EQ(get(a1), get(a2)) << static_cast<int>(k);
  }
}

// optimizer_update_many is optimizer_update over the slots, bit for bit.
TEST_F(OpsTest, OptimizerUpdateManyEqualsOneByOne) {
  OptimizerHyper h = hyper(OptimizerKind::adamw, 0.01f);
  h.step = 3;
  h.grad_scale = 0.5f;
  std::vector<Tensor> pa, pb, ga, ma, mb, va, vb;
  for (int i = 0; i < 4; ++i) {
    const std::int64_t n = 1 + 3000 * i;
    const DType pt = i % 2 ? DType::BF16 : DType::F32;
    auto v0 = rand_vec(n, 20 + i);
    pa.push_back(make({n}, v0, pt));
    pb.push_back(make({n}, v0, pt));
    ga.push_back(make({n}, rand_vec(n, 40 + i), i == 3 ? DType::F16 : DType::F32));
    ma.push_back(zeros({n}, pt));
    mb.push_back(zeros({n}, pt));
    va.push_back(zeros({n}, pt));
    vb.push_back(zeros({n}, pt));
  }
  std::vector<OptimizerSlot> slots;
  for (int i = 0; i < 4; ++i) {
    slots.push_back({&pa[i], &ga[i], &ma[i], &va[i]});
    ops().optimizer_update(h, pb[i], ga[i], &mb[i], &vb[i]);
  }
  ops().optimizer_update_many(h, slots);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(get(pa[i]), get(pb[i])) << i;
    EXPECT_EQ(get(va[i]), get(vb[i])) << i;
  }
}

TEST_F(OpsTest, OptimizerRejectsMissingState) {
  OptimizerHyper h = hyper(OptimizerKind::adam, 0.01f);
  Tensor p = make({5}, kP0), g = make({5}, kGrads[0]), m = zeros({5}), small = zeros({4});
  EXPECT_THROW(ops().optimizer_update(h, p, g, &m, nullptr), std::invalid_argument);
  EXPECT_THROW(ops().optimizer_update(h, p, g, &m, &small), std::invalid_argument);
  EXPECT_THROW(ops().optimizer_update(h, p, small, &m, &m), std::invalid_argument);
}

}  // namespace
}  // namespace memtrade::test
