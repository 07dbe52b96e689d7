// Embeddings, cross-entropy and sum_to_host.
#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

TEST_F(OpsTest, EmbeddingForwardBackward) {
  const int b = 2, t = 4, c = 6, v = 5, max_t = 7;
  const std::vector<std::int32_t> tok{1, 3, 1, 0, 4, 1, 3, 3};  // repeats exercise the scatter
  auto wte = rand_vec(v * c, 1), wpe = rand_vec(max_t * c, 2), r = rand_vec(b * t * c, 3);
  auto f = [&](const Vec& e, const Vec& p) {
    Vec y(b * t * c);
    for (int i = 0; i < b * t; ++i)
      for (int j = 0; j < c; ++j) y[i * c + j] = e[tok[i] * c + j] + p[(i % t) * c + j];
    return y;
  };
  Tensor tt = ints({b, t}, tok), te = make({v, c}, wte), tp = make({max_t, c}, wpe),
         out = garbage({b, t, c});
  ops().embedding_forward(out, tt, te, &tp);
  expect_close(get(out), f(to_d(wte), to_d(wpe)), 0, 0, "embedding");
  ops().embedding_forward(out, tt, te, nullptr);  // no positions (Llama): wte[tokens] alone
  expect_close(get(out), f(to_d(wte), Vec(max_t * c, 0.0)), 0, 0, "embedding without wpe");
  Tensor dout = make({b, t, c}, r), dwte = garbage({v, c}), dwpe = garbage({max_t, c});
  ops().embedding_backward(&dwte, &dwpe, dout, tt, false);
  Vec ge = fd_grad([&](const Vec& e) { return f(e, to_d(wpe)); }, to_d(wte), to_d(r));
  Vec gp = fd_grad([&](const Vec& p) { return f(to_d(wte), p); }, to_d(wpe), to_d(r));
  expect_close(get(dwte), ge, 1e-6, 1e-5, "dwte (row 2 unused: zero)");
  expect_close(get(dwpe), gp, 1e-6, 1e-5, "dwpe (rows >= T: zero)");
  ops().embedding_backward(&dwte, nullptr, dout, tt, true);
  for (auto& x : ge) x *= 2;
  expect_close(get(dwte), ge, 1e-6, 1e-5, "dwte accumulated");

  Tensor bad = ints({b, t}, {1, 3, 1, 0, 5, 1, 3, 3});
  EXPECT_THROW(ops().embedding_forward(out, bad, te, &tp), std::invalid_argument);
  Tensor short_wpe = zeros({3, c});
  EXPECT_THROW(ops().embedding_forward(out, tt, te, &short_wpe), std::invalid_argument);
}

Vec ref_ce(const Vec& x, const std::vector<std::int32_t>& tg, int n, int v) {
  Vec loss(n, 0.0);
  for (int r = 0; r < n; ++r) {
    if (tg[r] < 0) continue;
    double mx = -1e300, s = 0;
    for (int j = 0; j < v; ++j) mx = std::max(mx, x[r * v + j]);
    for (int j = 0; j < v; ++j) s += std::exp(x[r * v + j] - mx);
    loss[r] = std::log(s) + mx - x[r * v + tg[r]];
  }
  return loss;
}

TEST_F(OpsTest, CrossEntropyForwardBackward) {
  const int n = 5, v = 9;
  const std::vector<std::int32_t> tg{0, 8, 3, -1, 3};  // -1: ignored row
  auto x = rand_vec(n * v, 4, 3.0f);
  x[2 * v + 1] = 80.0f;  // large logit: needs the max subtraction
  Tensor tx = make({n, v}, x), tt = ints({n}, tg), losses = garbage({n});
  ops().crossentropy_forward(losses, tx, tt);
  expect_close(get(losses), ref_ce(to_d(x), tg, n, v), 1e-5, 1e-5, "losses");
  const float dloss = 1.0f / 4;  // mean over the 4 counted rows
  Tensor dx = garbage({n, v});
  ops().crossentropy_backward(dx, tx, tt, dloss);
  Vec want = fd_grad([&](const Vec& q) { return ref_ce(q, tg, n, v); }, to_d(x), Vec(n, dloss));
  expect_close(get(dx), want, 1e-6, 1e-4, "dlogits");
  // In place (dlogits aliases logits) gives the same.
  ops().crossentropy_backward(tx, tx, tt, dloss);
  expect_close(get(tx), want, 1e-6, 1e-4, "dlogits in place");
  EXPECT_NEAR(
      ops().sum_to_host(losses),
      [&] {
        double s = 0;
        for (double l : ref_ce(to_d(x), tg, n, v)) s += l;
        return s;
      }(),
      1e-4);
  Tensor bad = ints({n}, {0, 9, 3, 1, 3});
  EXPECT_THROW(ops().crossentropy_forward(losses, tx, bad), std::invalid_argument);
}

TEST_F(OpsTest, CrossEntropyLargeVocab) {
  const int n = 3, v = 5000;  // rows span several chunks
  const std::vector<std::int32_t> tg{4999, 0, 1234};
  auto x = rand_vec(n * v, 5, 4.0f);
  Tensor tx = make({n, v}, x), tt = ints({n}, tg), losses = garbage({n});
  ops().crossentropy_forward(losses, tx, tt);
  expect_close(get(losses), ref_ce(to_d(x), tg, n, v), 1e-5, 1e-5, "losses V=5000");
}

TEST_F(OpsTest, SumToHost) {
  auto x = rand_vec(3333, 6);
  double want = 0;
  for (float f : x) want += f;
  Tensor t = make({3333}, x);
  EXPECT_NEAR(ops().sum_to_host(t), want, 1e-9);
  Tensor h = make({3333}, x, DType::BF16);
  double want_h = 0;
  for (float f : quantize(x, DType::BF16)) want_h += f;
  EXPECT_NEAR(ops().sum_to_host(h), want_h, 1e-9);
}

}  // namespace
}  // namespace memtrade::test
