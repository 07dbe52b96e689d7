// fill, cast, add, add_inplace, scale, GELU, ReLU and unscale_and_check.
#include <array>
#include <limits>

#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

Vec ref_gelu(const Vec& x) {
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    y[i] = 0.5 * x[i] *
           (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

Vec ref_relu(const Vec& x) {
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] > 0 ? x[i] : 0.0;
  return y;
}

TEST_F(OpsTest, FillScaleAddCast) {
  const int n = 3000;  // several chunks
  auto a = rand_vec(n, 1), b = rand_vec(n, 2);
  Tensor ta = make({n}, a), tb = make({n}, b), t = garbage({n});
  ops().fill(t, 1.25f);
  expect_close(get(t), Vec(n, 1.25), 0, 0, "fill");
  ops().add(t, ta, tb);
  Vec sum(n);
  for (int i = 0; i < n; ++i) sum[i] = double{a[i]} + b[i];
  expect_close(get(t), sum, 1e-7, 1e-7, "add");
  ops().add_inplace(ta, tb);
  expect_close(get(ta), sum, 1e-7, 1e-7, "add_inplace");
  ops().scale(ta, -0.5f);
  for (auto& v : sum) v *= -0.5;
  expect_close(get(ta), sum, 1e-7, 1e-7, "scale");
  // cast rounds to the destination and reads back any source dtype
  for (DType dt : {DType::F16, DType::BF16, DType::F32}) {
    Tensor lo = garbage({30, 100}, dt);
    ops().cast(lo, tb);
    expect_close(get(lo), to_d(quantize(b, dt)), 0, 0, "cast to 16-bit");
    Tensor back = garbage({n});
    ops().cast(back, lo);
    expect_close(get(back), to_d(quantize(b, dt)), 0, 0, "cast back");
  }
}

TEST_F(OpsTest, ElementwiseRejectsMismatch) {
  Tensor a = zeros({4}), b = zeros({5}), c = zeros({4});
  EXPECT_THROW(ops().add(c, a, b), std::invalid_argument);
  EXPECT_THROW(ops().add_inplace(c, b), std::invalid_argument);
  EXPECT_THROW(ops().gelu_forward(c, b), std::invalid_argument);
  EXPECT_THROW(ops().cast(c, b), std::invalid_argument);
}

TEST_F(OpsTest, GeluForwardBackward) {
  const int n = 257;
  auto x = rand_vec(n, 3, 4.0f), r = rand_vec(n, 4);
  Tensor tx = make({n}, x), out = garbage({n}), dout = make({n}, r), dx = garbage({n});
  ops().gelu_forward(out, tx);
  expect_close(get(out), ref_gelu(to_d(x)), 1e-6, 1e-6, "gelu");
  ops().gelu_backward(dx, dout, tx);
  expect_close(get(dx), fd_grad(ref_gelu, to_d(x), to_d(r)), 1e-6, 1e-5, "gelu backward");
}

TEST_F(OpsTest, ReluForwardBackwardInPlace) {
  const int n = 1500;
  auto x = rand_vec(n, 5), r = rand_vec(n, 6);
  Tensor t = make({n}, x);
  ops().relu_forward(t, t);  // in place
  expect_close(get(t), ref_relu(to_d(x)), 0, 0, "relu");
  Tensor g = make({n}, r);
  ops().relu_backward(g, g, t);  // dinp aliases dout
  expect_close(get(g), fd_grad(ref_relu, to_d(x), to_d(r)), 1e-7, 1e-6, "relu backward");
}

TEST_F(OpsTest, ReluPropagatesNaNLikeTorch) {
  // torch.relu(NaN) is NaN: a NaN activation must reach the loss scaler's check, not become 0.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x{NAN, -1.0f, 0.0f, -0.0f, 2.5f, inf, -inf};
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    Tensor in = make({7}, x, t), out = garbage({7}, t);
    ops().relu_forward(out, in);
    const std::vector<float> y = get(out);
    EXPECT_TRUE(std::isnan(y[0])) << dtype_name(t);
    EXPECT_EQ(y[1], 0.0f) << dtype_name(t);
    EXPECT_EQ(y[2], 0.0f) << dtype_name(t);
    EXPECT_EQ(y[3], 0.0f) << dtype_name(t);
    EXPECT_EQ(y[4], 2.5f) << dtype_name(t);
    EXPECT_EQ(y[5], inf) << dtype_name(t);
    EXPECT_EQ(y[6], 0.0f) << dtype_name(t);
    // Backward masks with out > 0, as torch's threshold_backward: a NaN output passes nothing.
    Tensor g = make({7}, std::vector<float>(7, 1.0f), t), dx = garbage({7}, t);
    ops().relu_backward(dx, g, out);
    EXPECT_EQ(get(dx), (std::vector<float>{0, 0, 0, 0, 1, 1, 0})) << dtype_name(t);
  }
}

TEST_F(OpsTest, UnscaleAndCheckFindsInfAndNan) {
  auto v = rand_vec(2500, 7);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor a = make({2500}, v, dt), b = make({10}, std::vector<float>(10, 2.0f), dt);
    std::array<Tensor*, 3> list{&a, nullptr, &b};
    EXPECT_FALSE(ops().unscale_and_check(list, 0.5f));
    Vec half = to_d(quantize(v, dt));
    for (auto& x : half) x *= 0.5;
    expect_close(get(a), half, 0, dtype_eps(dt), "unscaled");
    expect_close(get(b), Vec(10, 1.0), 0, 0, "unscaled b");
    for (float bad :
         {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      auto w = v;
      w[2042] = bad;
      Tensor c = make({2500}, w, dt);
      std::array<Tensor*, 2> l2{&b, &c};
      EXPECT_TRUE(ops().unscale_and_check(l2, 0.5f)) << bad << " " << dtype_name(dt);
    }
  }
  // A finite value that overflows when multiplied counts too.
  Tensor big = make({3}, {1.0f, 3e38f, 2.0f});
  std::array<Tensor*, 1> l3{&big};
  EXPECT_TRUE(ops().unscale_and_check(l3, 4.0f));
}

}  // namespace
}  // namespace memtrade::test
