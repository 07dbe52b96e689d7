// Layer-norm, softmax, batch-norm and pooling: forward against double references, backward
// against finite differences of those references.
#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

Vec ref_layernorm(const Vec& x, const Vec& w, const Vec& b, int n, int c, double eps,
                  Vec* mean = nullptr, Vec* rstd = nullptr) {
  Vec y(x.size());
  for (int r = 0; r < n; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < c; ++j) m += x[r * c + j] / c;
    for (int j = 0; j < c; ++j) v += (x[r * c + j] - m) * (x[r * c + j] - m) / c;
    const double s = 1.0 / std::sqrt(v + eps);
    for (int j = 0; j < c; ++j) y[r * c + j] = (x[r * c + j] - m) * s * w[j] + b[j];
    if (mean) mean->push_back(m);
    if (rstd) rstd->push_back(s);
  }
  return y;
}

Vec ref_softmax(const Vec& x, int n, int c) {
  Vec y(x.size());
  for (int r = 0; r < n; ++r) {
    double mx = -1e300, s = 0;
    for (int j = 0; j < c; ++j) mx = std::max(mx, x[r * c + j]);
    for (int j = 0; j < c; ++j) s += std::exp(x[r * c + j] - mx);
    for (int j = 0; j < c; ++j) y[r * c + j] = std::exp(x[r * c + j] - mx) / s;
  }
  return y;
}

// NCHW batch-norm with batch statistics.
Vec ref_batchnorm(const Vec& x, const Vec& g, const Vec& b, int n, int c, int hw, double eps,
                  Vec* mean = nullptr, Vec* var = nullptr) {
  Vec y(x.size());
  for (int ch = 0; ch < c; ++ch) {
    double m = 0, v = 0;
    for (int i = 0; i < n; ++i)
      for (int p = 0; p < hw; ++p) m += x[(i * c + ch) * hw + p] / (n * hw);
    for (int i = 0; i < n; ++i)
      for (int p = 0; p < hw; ++p) {
        const double d = x[(i * c + ch) * hw + p] - m;
        v += d * d / (n * hw);
      }
    for (int i = 0; i < n; ++i)
      for (int p = 0; p < hw; ++p) {
        const int k = (i * c + ch) * hw + p;
        y[k] = (x[k] - m) / std::sqrt(v + eps) * g[ch] + b[ch];
      }
    if (mean) mean->push_back(m);
    if (var) var->push_back(v);
  }
  return y;
}

Vec ref_maxpool(const Vec& x, int planes, int h, int w, int k, int s) {
  const int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
  Vec y;
  for (int p = 0; p < planes; ++p)
    for (int oy = 0; oy < oh; ++oy)
      for (int ox = 0; ox < ow; ++ox) {
        double m = -1e300;
        for (int ky = 0; ky < k; ++ky)
          for (int kx = 0; kx < k; ++kx)
            m = std::max(m, x[(p * h + oy * s + ky) * w + ox * s + kx]);
        y.push_back(m);
      }
  return y;
}

TEST_F(OpsTest, LayerNormForwardBackward) {
  const int n = 6, c = 10;
  const float eps = 1e-5f;
  auto x = rand_vec(n * c, 1, 2.0f), w = rand_vec(c, 2), b = rand_vec(c, 3), r = rand_vec(n * c, 4);
  Tensor tx = make({2, 3, c}, x), tw = make({c}, w), tb = make({c}, b), out = garbage({2, 3, c});
  Tensor mean = garbage({2, 3}), rstd = garbage({2, 3});
  ops().layernorm_forward(out, mean, rstd, tx, tw, tb, eps);
  Vec m, s;
  const Vec y = ref_layernorm(to_d(x), to_d(w), to_d(b), n, c, eps, &m, &s);
  expect_close(get(out), y, 1e-5, 1e-5, "layernorm");
  expect_close(get(mean), m, 1e-6, 1e-6, "mean");
  expect_close(get(rstd), s, 1e-6, 1e-5, "rstd");

  Tensor dout = make({2, 3, c}, r), dx = garbage({2, 3, c}), dw = garbage({c}), db = garbage({c});
  ops().layernorm_backward(dx, &dw, &db, dout, tx, tw, mean, rstd, false);
  const Vec rd = to_d(r);
  auto gx = fd_grad([&](const Vec& v) { return ref_layernorm(v, to_d(w), to_d(b), n, c, eps); },
                    to_d(x), rd);
  auto gw = fd_grad([&](const Vec& v) { return ref_layernorm(to_d(x), v, to_d(b), n, c, eps); },
                    to_d(w), rd);
  auto gb = fd_grad([&](const Vec& v) { return ref_layernorm(to_d(x), to_d(w), v, n, c, eps); },
                    to_d(b), rd);
  expect_close(get(dx), gx, 1e-5, 1e-4, "layernorm dinp");
  expect_close(get(dw), gw, 1e-5, 1e-4, "layernorm dweight");
  expect_close(get(db), gb, 1e-5, 1e-4, "layernorm dbias");
  ops().layernorm_backward(dout, &dw, &db, dout, tx, tw, mean, rstd, true);  // dinp aliases dout
  for (auto& v : gw) v *= 2;
  for (auto& v : gb) v *= 2;
  expect_close(get(dout), gx, 1e-5, 1e-4, "layernorm dinp in place");
  expect_close(get(dw), gw, 1e-5, 1e-4, "layernorm dweight accumulated");
  expect_close(get(db), gb, 1e-5, 1e-4, "layernorm dbias accumulated");
}

TEST_F(OpsTest, LayerNormLongRowsSpanChunks) {
  const int n = 3, c = 2500;
  auto x = rand_vec(n * c, 5), w = rand_vec(c, 6), b = rand_vec(c, 7);
  Tensor tx = make({n, c}, x), tw = make({c}, w), tb = make({c}, b), out = garbage({n, c});
  Tensor mean = garbage({n}), rstd = garbage({n});
  ops().layernorm_forward(out, mean, rstd, tx, tw, tb, 1e-5f);
  expect_close(get(out), ref_layernorm(to_d(x), to_d(w), to_d(b), n, c, 1e-5), 1e-5, 1e-5,
               "long rows");
  Tensor bad = garbage({n}, DType::BF16);
  EXPECT_THROW(ops().layernorm_forward(out, bad, rstd, tx, tw, tb, 1e-5f), std::invalid_argument);
}

TEST_F(OpsTest, SoftmaxForwardBackward) {
  for (int c : {7, 2100}) {
    const int n = 4;
    auto x = rand_vec(n * c, 8, 5.0f), r = rand_vec(n * c, 9);
    Tensor tx = make({n, c}, x), out = garbage({n, c});
    ops().softmax_forward(out, tx);
    expect_close(get(out), ref_softmax(to_d(x), n, c), 1e-7, 1e-5, "softmax");
    if (c > 100) continue;  // finite differences on the small case only
    Tensor dout = make({n, c}, r), dx = garbage({n, c});
    ops().softmax_backward(dx, dout, out);
    expect_close(get(dx),
                 fd_grad([&](const Vec& v) { return ref_softmax(v, n, c); }, to_d(x), to_d(r)),
                 1e-6, 1e-4, "softmax backward");
  }
}

TEST_F(OpsTest, BatchNormForwardBackwardAndRunningStats) {
  const int n = 3, c = 4, h = 3, w = 5, hw = h * w;
  const float eps = 1e-5f, momentum = 0.1f;
  auto x = rand_vec(n * c * hw, 10, 2.0f), g = rand_vec(c, 11), b = rand_vec(c, 12),
       r = rand_vec(n * c * hw, 13);
  Tensor tx = make({n, c, h, w}, x), tg = make({c}, g), tb = make({c}, b),
         out = garbage({n, c, h, w}), mean = garbage({c}), invstd = garbage({c});
  Tensor rm = make({c}, std::vector<float>(c, 0.5f)), rv = make({c}, std::vector<float>(c, 2.0f));
  ops().batchnorm_forward(out, mean, invstd, tx, tg, tb, &rm, &rv, eps, momentum);
  Vec m, v;
  expect_close(get(out), ref_batchnorm(to_d(x), to_d(g), to_d(b), n, c, hw, eps, &m, &v), 1e-5,
               1e-5, "batchnorm");
  Vec is(c), want_rm(c), want_rv(c);
  for (int i = 0; i < c; ++i) {
    is[i] = 1.0 / std::sqrt(v[i] + eps);
    want_rm[i] = 0.9 * 0.5 + 0.1 * m[i];
    want_rv[i] = 0.9 * 2.0 + 0.1 * v[i] * (n * hw) / (n * hw - 1.0);  // unbiased
  }
  expect_close(get(mean), m, 1e-6, 1e-6, "mean");
  expect_close(get(invstd), is, 1e-6, 1e-5, "invstd");
  expect_close(get(rm), want_rm, 1e-6, 1e-6, "running_mean");
  expect_close(get(rv), want_rv, 1e-6, 1e-6, "running_var");

  Tensor dout = make({n, c, h, w}, r), dx = garbage({n, c, h, w}), dg = garbage({c}),
         db = garbage({c});
  ops().batchnorm_backward(dx, &dg, &db, dout, tx, tg, mean, invstd, false);
  const Vec rd = to_d(r);
  auto gx = fd_grad([&](const Vec& q) { return ref_batchnorm(q, to_d(g), to_d(b), n, c, hw, eps); },
                    to_d(x), rd);
  auto gg = fd_grad([&](const Vec& q) { return ref_batchnorm(to_d(x), q, to_d(b), n, c, hw, eps); },
                    to_d(g), rd);
  auto gb = fd_grad([&](const Vec& q) { return ref_batchnorm(to_d(x), to_d(g), q, n, c, hw, eps); },
                    to_d(b), rd);
  expect_close(get(dx), gx, 1e-5, 1e-4, "batchnorm dinp");
  expect_close(get(dg), gg, 1e-5, 1e-4, "batchnorm dgamma");
  expect_close(get(db), gb, 1e-5, 1e-4, "batchnorm dbeta");
  ops().batchnorm_backward(dx, &dg, &db, dout, tx, tg, mean, invstd, true);
  for (auto& q : gg) q *= 2;
  expect_close(get(dg), gg, 1e-5, 1e-4, "batchnorm dgamma accumulated");
}

TEST_F(OpsTest, GlobalAvgPool) {
  const int n = 2, c = 3, h = 4, w = 5;
  auto x = rand_vec(n * c * h * w, 14), r = rand_vec(n * c, 15);
  auto f = [&](const Vec& q) {
    Vec y(n * c, 0.0);
    for (int p = 0; p < n * c; ++p)
      for (int i = 0; i < h * w; ++i) y[p] += q[p * h * w + i] / (h * w);
    return y;
  };
  Tensor tx = make({n, c, h, w}, x), out = garbage({n, c});
  ops().global_avgpool_forward(out, tx);
  expect_close(get(out), f(to_d(x)), 1e-6, 1e-6, "avgpool");
  Tensor dout = make({n, c}, r), dx = garbage({n, c, h, w});
  ops().global_avgpool_backward(dx, dout);
  expect_close(get(dx), fd_grad(f, to_d(x), to_d(r)), 1e-6, 1e-5, "avgpool backward");
}

TEST_F(OpsTest, MaxPoolForwardBackward) {
  const int n = 2, c = 2, h = 7, w = 6;
  for (auto [k, s] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{3, 1}}) {
    const int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    auto x = rand_vec(n * c * h * w, 16 + k + s), r = rand_vec(n * c * oh * ow, 17);
    auto f = [&](const Vec& q) { return ref_maxpool(q, n * c, h, w, k, s); };
    Tensor tx = make({n, c, h, w}, x), out = garbage({n, c, oh, ow});
    Tensor am = dev->empty({n, c, oh, ow}, DType::I32, Category::activations);
    ops().maxpool2d_forward(out, am, tx, k, s);
    expect_close(get(out), f(to_d(x)), 0, 0, "maxpool");
    // argmax is the flat index within the (H, W) plane
    const auto idx = get(am);
    const auto got = get(out);
    for (std::size_t i = 0; i < idx.size(); ++i) {
      const int plane = static_cast<int>(i) / (oh * ow);
      ASSERT_GE(idx[i], 0);
      ASSERT_LT(idx[i], h * w);
      EXPECT_EQ(x[plane * h * w + static_cast<int>(idx[i])], got[i]);
    }
    Tensor dout = make({n, c, oh, ow}, r), dx = garbage({n, c, h, w});
    ops().maxpool2d_backward(dx, dout, am);
    expect_close(get(dx), fd_grad(f, to_d(x), to_d(r)), 1e-6, 1e-5, "maxpool backward");
  }
  Tensor tx = zeros({1, 1, 2, 2}), out = zeros({1, 1, 1, 1});
  Tensor am = dev->empty({1, 1, 1, 1}, DType::I32, Category::activations);
  EXPECT_THROW(ops().maxpool2d_forward(out, am, tx, 3, 1), std::invalid_argument);
}

// Zero-width rows are rows all the same: no division by the last dimension (it used to be
// numel / dim(-1), a SIGFPE), empty outputs, one statistic per row; softmax likewise.
TEST_F(OpsTest, NormsOfZeroWidthRows) {
  Tensor x = zeros({3, 0}), w = zeros({0}), b = zeros({0}), out = zeros({3, 0});
  Tensor mean = zeros({3}), rstd = zeros({3});
  ops().layernorm_forward(out, mean, rstd, x, w, b, 1e-5f);
  Tensor dx = zeros({3, 0}), dw = zeros({0}), db = zeros({0});
  ops().layernorm_backward(dx, &dw, &db, out, x, w, mean, rstd, false);
  Tensor sm = zeros({3, 0});
  ops().softmax_forward(sm, x);
  ops().softmax_backward(dx, sm, sm);
  // Cross-entropy over no classes is bad input, not a crash.
  Tensor logits = zeros({3, 0}), losses = zeros({3});
  Tensor targets = ints({3}, {0, 0, 0});
  EXPECT_THROW(ops().crossentropy_forward(losses, logits, targets), std::invalid_argument);
}

}  // namespace
}  // namespace memtrade::test
