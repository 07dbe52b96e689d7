// matmul, linear forward/backward and the blocked fallback GEMM against double references.
#include <tuple>

#include "kernels/cpu/cpu_ops_impl.h"
#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

// Naive double C (M, N) = alpha·op(A)·op(B) + beta·C, row-major.
Vec ref_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const Vec& a, const Vec& b,
             double beta, Vec c) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0.0;
      for (int p = 0; p < k; ++p)
        s += (ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
      c[i * n + j] = alpha * s + beta * c[i * n + j];
    }
  return c;
}

// out (N, OC) = inp (N, C) · wᵀ + bias
Vec ref_linear(const Vec& x, const Vec& w, const Vec* b, int n, int c, int oc) {
  Vec y(n * oc);
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < oc; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int k = 0; k < c; ++k) s += x[i * c + k] * w[o * c + k];
      y[i * oc + o] = s;
    }
  return y;
}

class GemmTest : public OpsTest, public ::testing::WithParamInterface<std::tuple<bool, bool>> {};

TEST_P(GemmTest, MatmulMatchesReferenceWithAlphaBeta) {
  const auto [ta, tb] = GetParam();
  const int m = 7, n = 5, k = 9;
  auto a = rand_vec(m * k, 1), b = rand_vec(k * n, 2), c0 = rand_vec(m * n, 3);
  Tensor ta_ = make(ta ? Shape{k, m} : Shape{m, k}, a);
  Tensor tb_ = make(tb ? Shape{n, k} : Shape{k, n}, b);
  Tensor tc = make({m, n}, c0);
  ops().matmul(tc, ta_, tb_, ta, tb, 0.5f, 2.0f);
  expect_close(get(tc), ref_gemm(ta, tb, m, n, k, 0.5, to_d(a), to_d(b), 2.0, to_d(c0)), 1e-5, 1e-5,
               "matmul");
  // beta = 0 ignores NaN in c
  Tensor tn = garbage({m, n});
  ops().matmul(tn, ta_, tb_, ta, tb, 1.0f, 0.0f);
  expect_close(get(tn), ref_gemm(ta, tb, m, n, k, 1.0, to_d(a), to_d(b), 0.0, Vec(m * n)), 1e-5,
               1e-5, "matmul beta=0");
}

TEST_P(GemmTest, BlockedFallbackMatchesReference) {
  const auto [ta, tb] = GetParam();
  // Sizes that straddle the fallback's 32/128 blocks.
  const int m = 70, n = 131, k = 150;
  auto a = rand_vec(m * k, 4), b = rand_vec(k * n, 5), c0 = rand_vec(m * n, 6);
  std::vector<float> c = c0;
  cpu::blocked_sgemm(ta, tb, m, n, k, 1.5f, a.data(), ta ? m : k, b.data(), tb ? k : n, -1.0f,
                     c.data(), n);
  expect_close(c, ref_gemm(ta, tb, m, n, k, 1.5, to_d(a), to_d(b), -1.0, to_d(c0)), 1e-4, 1e-5,
               "blocked_sgemm");
}

// Above 2^18 multiply-adds sgemm splits C's rows (m >= n) or columns among the threads: both
// ways, odd sizes (a short last block), alpha and beta, against the double reference.
TEST_P(GemmTest, SplitAcrossThreadsMatchesReference) {
  const auto [ta, tb] = GetParam();
  for (auto [m, n] : {std::pair{203, 71}, std::pair{71, 203}}) {
    const int k = 97;
    auto a = rand_vec(m * k, 11), b = rand_vec(k * n, 12), c0 = rand_vec(m * n, 13);
    std::vector<float> c = c0;
    cpu::sgemm(ta, tb, m, n, k, 0.75f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.5f, c.data(),
               n);
    expect_close(c, ref_gemm(ta, tb, m, n, k, 0.75, to_d(a), to_d(b), 0.5, to_d(c0)), 1e-5, 1e-5,
                 "split sgemm " + std::to_string(m) + "x" + std::to_string(n));
  }
}

INSTANTIATE_TEST_SUITE_P(Trans, GemmTest, ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST_F(OpsTest, MatmulBatched) {
  const int bsz = 3, m = 4, n = 6, k = 5;
  auto a = rand_vec(bsz * m * k, 7), b = rand_vec(bsz * n * k, 8);
  Tensor ta = make({bsz, m, k}, a), tb = make({bsz, n, k}, b), tc = garbage({bsz, m, n});
  ops().matmul(tc, ta, tb, false, true);
  Vec want;
  for (int i = 0; i < bsz; ++i) {
    Vec ai(a.begin() + i * m * k, a.begin() + (i + 1) * m * k);
    Vec bi(b.begin() + i * n * k, b.begin() + (i + 1) * n * k);
    Vec ci = ref_gemm(false, true, m, n, k, 1.0, ai, bi, 0.0, Vec(m * n));
    want.insert(want.end(), ci.begin(), ci.end());
  }
  expect_close(get(tc), want, 1e-5, 1e-5, "batched matmul");
}

TEST_F(OpsTest, MatmulBackwardByFiniteDifferences) {
  // The gradient of Σ (a·b)·R w.r.t. a is R·bᵀ: computed with matmul itself.
  const int m = 4, n = 3, k = 5;
  auto a = rand_vec(m * k, 9), b = rand_vec(k * n, 10), r = rand_vec(m * n, 11);
  Tensor tb = make({k, n}, b), tr = make({m, n}, r), da = garbage({m, k}), ta = make({m, k}, a),
         db = garbage({k, n});
  ops().matmul(da, tr, tb, false, true);  // dA = R · Bᵀ
  ops().matmul(db, ta, tr, true, false);  // dB = Aᵀ · R
  auto fa = [&](const Vec& x) {
    return ref_gemm(false, false, m, n, k, 1, x, to_d(b), 0, Vec(m * n));
  };
  auto fb = [&](const Vec& x) {
    return ref_gemm(false, false, m, n, k, 1, to_d(a), x, 0, Vec(m * n));
  };
  expect_close(get(da), fd_grad(fa, to_d(a), to_d(r)), 1e-5, 1e-4, "dA");
  expect_close(get(db), fd_grad(fb, to_d(b), to_d(r)), 1e-5, 1e-4, "dB");
}

TEST_F(OpsTest, MatmulRejectsMismatchedShapes) {
  Tensor a = zeros({3, 4}), b = zeros({5, 2}), c = zeros({3, 2});
  EXPECT_THROW(ops().matmul(c, a, b, false, false), std::invalid_argument);
  Tensor a3 = zeros({2, 3, 4}), b3 = zeros({3, 4, 2}), c3 = zeros({2, 3, 2});
  EXPECT_THROW(ops().matmul(c3, a3, b3, false, false), std::invalid_argument);
}

TEST_F(OpsTest, LinearForwardAndBackward) {
  const int n = 6, c = 5, oc = 4;
  auto x = rand_vec(n * c, 12), w = rand_vec(oc * c, 13), b = rand_vec(oc, 14);
  auto r = rand_vec(n * oc, 15);
  Tensor tx = make({2, 3, c}, x), tw = make({oc, c}, w), tb = make({oc}, b);
  Tensor out = garbage({2, 3, oc});
  ops().linear_forward(out, tx, tw, &tb);
  const Vec bd = to_d(b);
  expect_close(get(out), ref_linear(to_d(x), to_d(w), &bd, n, c, oc), 1e-5, 1e-5, "forward");
  Tensor out_nb = garbage({2, 3, oc});
  ops().linear_forward(out_nb, tx, tw, nullptr);
  expect_close(get(out_nb), ref_linear(to_d(x), to_d(w), nullptr, n, c, oc), 1e-5, 1e-5,
               "forward without bias");

  Tensor dout = make({2, 3, oc}, r), dx = garbage({2, 3, c}), dw = garbage({oc, c}),
         db = garbage({oc});
  ops().linear_backward(&dx, &dw, &db, dout, tx, tw, false);
  const Vec rd = to_d(r);
  const Vec gx =
      fd_grad([&](const Vec& v) { return ref_linear(v, to_d(w), &bd, n, c, oc); }, to_d(x), rd);
  const Vec gw =
      fd_grad([&](const Vec& v) { return ref_linear(to_d(x), v, &bd, n, c, oc); }, to_d(w), rd);
  const Vec gb =
      fd_grad([&](const Vec& v) { return ref_linear(to_d(x), to_d(w), &v, n, c, oc); }, bd, rd);
  expect_close(get(dx), gx, 1e-5, 1e-4, "dinp");
  expect_close(get(dw), gw, 1e-5, 1e-4, "dweight");
  expect_close(get(db), gb, 1e-5, 1e-4, "dbias");

  // accumulate = true adds onto what is there; dinp is still overwritten
  ops().linear_backward(&dx, &dw, &db, dout, tx, tw, true);
  Vec gw2 = gw, gb2 = gb;
  for (auto& v : gw2) v *= 2;
  for (auto& v : gb2) v *= 2;
  expect_close(get(dx), gx, 1e-5, 1e-4, "dinp after accumulate");
  expect_close(get(dw), gw2, 1e-5, 1e-4, "dweight accumulated");
  expect_close(get(db), gb2, 1e-5, 1e-4, "dbias accumulated");

  // any output may be skipped
  Tensor dw_only = garbage({oc, c});
  ops().linear_backward(nullptr, &dw_only, nullptr, dout, tx, tw, false);
  expect_close(get(dw_only), gw, 1e-5, 1e-4, "dweight alone");
}

// Large enough for sgemm to split among the threads, each block of rows (more rows than
// outputs) or of columns (fewer) starting as the bias on its own thread; in fp32 and bf16
// (the bias read through a chunk buffer). dbias's column blocks over many rows, too.
TEST_F(OpsTest, LinearSplitAcrossThreadsWithBias) {
  for (auto [n, oc] : {std::pair{300, 70}, std::pair{70, 1300}}) {
    const int c = 64;
    SCOPED_TRACE(std::to_string(n) + " rows, " + std::to_string(oc) + " outputs");
    for (DType t : {DType::F32, DType::BF16}) {
      auto x = quantize(rand_vec(n * c, 16), t), w = quantize(rand_vec(oc * c, 17), t),
           b = quantize(rand_vec(oc, 18), t), r = quantize(rand_vec(n * oc, 19), t);
      Tensor tx = make({n, c}, x, t), tw = make({oc, c}, w, t), tb = make({oc}, b, t);
      Tensor out = garbage({n, oc});
      ops().linear_forward(out, tx, tw, &tb);
      const Vec bd = to_d(b);
      expect_close(get(out), ref_linear(to_d(x), to_d(w), &bd, n, c, oc), 1e-5, 1e-5, "forward");
      Tensor db = garbage({oc});
      ops().linear_backward(nullptr, nullptr, &db, make({n, oc}, r, t), tx, tw, false);
      Vec want(oc, 0.0);
      for (int i = 0; i < n; ++i)
        for (int o = 0; o < oc; ++o) want[o] += r[i * oc + o];
      expect_close(get(db), want, 1e-4, 1e-5, "dbias");
    }
  }
}

// A 16-bit output of a linear op is its fp32 result rounded once: each thread rounds the block of
// rows or columns it computed, split or not (every GEMM direction split both ways below), and
// the bits equal those of the same op on fp32 tensors holding the same values, then rounded.
TEST_F(OpsTest, Linear16BitOutputsAreTheRoundedFp32Results) {
  struct Dims {
    int n, c, oc;
  };
  for (auto [n, c, oc] : {Dims{300, 64, 70}, Dims{70, 64, 1300}, Dims{40, 512, 300}}) {
    SCOPED_TRACE(std::to_string(n) + "x" + std::to_string(c) + " -> " + std::to_string(oc));
    for (DType t : {DType::BF16, DType::F16}) {
      auto x = quantize(rand_vec(n * c, 21), t), w = quantize(rand_vec(oc * c, 22), t),
           b = quantize(rand_vec(oc, 23), t), r = quantize(rand_vec(n * oc, 24), t),
           old = quantize(rand_vec(oc * c, 25), t);
      auto run = [&](DType d) {
        Tensor tx = make({n, c}, x, d), tw = make({oc, c}, w, d), tb = make({oc}, b, d);
        Tensor out = garbage({n, oc}, d), dx = garbage({n, c}, d), dw = garbage({oc, c}, d);
        Tensor dw_acc = make({oc, c}, old, d), dout = make({n, oc}, r, d);
        ops().linear_forward(out, tx, tw, &tb);
        ops().linear_backward(&dx, &dw, nullptr, dout, tx, tw, false);
        ops().linear_backward(nullptr, &dw_acc, nullptr, dout, tx, tw, true);
        return std::vector{get(out), get(dx), get(dw), get(dw_acc)};
      };
      const auto low = run(t), full = run(DType::F32);
      const char* what[] = {"out", "dinp", "dweight", "dweight accumulated"};
      for (int i = 0; i < 4; ++i) EXPECT_EQ(low[i], quantize(full[i], t)) << what[i];
    }
  }
}

TEST_F(OpsTest, LinearWithZeroInputWidth) {
  // inp (2, 3, 0): six rows of nothing. out is the bias (or 0) in every row and dbias sums dout
  // over all six rows; dweight (OC, 0) and dinp are empty. (N used to be numel / C = 0 / 0.)
  const int oc = 4;
  auto b = rand_vec(oc, 16), r = rand_vec(6 * oc, 17);
  Tensor tx = zeros({2, 3, 0}), tw = zeros({oc, 0}), tb = make({oc}, b);
  Tensor out = garbage({2, 3, oc});
  ops().linear_forward(out, tx, tw, &tb);
  Vec want;
  for (int i = 0; i < 6; ++i) want.insert(want.end(), b.begin(), b.end());
  expect_close(get(out), want, 0, 0, "forward with bias");
  ops().linear_forward(out, tx, tw, nullptr);
  expect_close(get(out), Vec(6 * oc, 0.0), 0, 0, "forward without bias");

  Tensor dout = make({2, 3, oc}, r), dx = zeros({2, 3, 0}), dw = zeros({oc, 0}), db = garbage({oc});
  ops().linear_backward(&dx, &dw, &db, dout, tx, tw, false);
  Vec gb(oc, 0.0);
  for (int i = 0; i < 6; ++i)
    for (int o = 0; o < oc; ++o) gb[o] += r[i * oc + o];
  expect_close(get(db), gb, 1e-6, 1e-6, "dbias");
  ops().linear_backward(&dx, &dw, &db, dout, tx, tw, true);
  for (auto& v : gb) v *= 2;
  expect_close(get(db), gb, 1e-6, 1e-6, "dbias accumulated");
}

TEST_F(OpsTest, LinearRejectsBadShapes) {
  Tensor x = zeros({4, 5}), w = zeros({3, 6}), out = zeros({4, 3}), b = zeros({4});
  EXPECT_THROW(ops().linear_forward(out, x, w, nullptr), std::invalid_argument);
  Tensor w2 = zeros({3, 5});
  EXPECT_THROW(ops().linear_forward(out, x, w2, &b), std::invalid_argument);
  Tensor idx = dev->empty({4, 5}, DType::I32, Category::io);
  EXPECT_THROW(ops().linear_forward(out, idx, w2, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace memtrade::test
