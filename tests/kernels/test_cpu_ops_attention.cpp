// Causal self-attention on packed qkv against a naive double implementation.
#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

// nanoGPT packing: q = qkv[..., 0:C], k = [C:2C], v = [2C:3C]; head h uses columns h·hd.
Vec ref_attention(const Vec& qkv, int b_n, int t_n, int c, int nh, Vec* att = nullptr) {
  const int hd = c / nh;
  Vec out(b_n * t_n * c, 0.0);
  if (att) att->assign(static_cast<std::size_t>(b_n) * nh * t_n * t_n, 0.0);
  for (int b = 0; b < b_n; ++b)
    for (int h = 0; h < nh; ++h)
      for (int t = 0; t < t_n; ++t) {
        auto at = [&](int tt, int part, int i) {
          return qkv[(b * t_n + tt) * 3 * c + part * c + h * hd + i];
        };
        Vec s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += at(t, 0, i) * at(j, 1, i);
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= t; ++j) {
          const double p = s[j] / sum;
          if (att) (*att)[((b * nh + h) * t_n + t) * t_n + j] = p;
          for (int i = 0; i < hd; ++i) out[(b * t_n + t) * c + h * hd + i] += p * at(j, 2, i);
        }
      }
  return out;
}

TEST_F(OpsTest, AttentionForwardBackward) {
  const int b = 2, t = 5, c = 8, nh = 2;
  auto qkv = rand_vec(b * t * 3 * c, 1, 1.5f), r = rand_vec(b * t * c, 2);
  Tensor tq = make({b, t, 3 * c}, qkv), out = garbage({b, t, c}), att = garbage({b, nh, t, t});
  ops().attention_forward(out, att, tq, nh);
  Vec want_att;
  const Vec want = ref_attention(to_d(qkv), b, t, c, nh, &want_att);
  expect_close(get(out), want, 1e-6, 1e-5, "attention out");
  expect_close(get(att), want_att, 1e-7, 1e-5, "attention probs (zeros above the diagonal)");

  Tensor att2 = garbage({b, nh, t, t});
  ops().attention_probs(att2, tq, nh);
  expect_close(get(att2), want_att, 1e-7, 1e-5, "attention_probs");

  Tensor dout = make({b, t, c}, r), dqkv = garbage({b, t, 3 * c});
  ops().attention_backward(dqkv, dout, tq, att, nh);
  expect_close(
      get(dqkv),
      fd_grad([&](const Vec& v) { return ref_attention(v, b, t, c, nh); }, to_d(qkv), to_d(r)),
      1e-5, 1e-4, "attention dqkv");
}

TEST_F(OpsTest, AttentionLongerSequence) {
  // T large enough for the parallel softmax rows and a non-trivial GEMM.
  const int b = 1, t = 40, c = 12, nh = 3;
  auto qkv = rand_vec(b * t * 3 * c, 3, 2.0f);
  Tensor tq = make({b, t, 3 * c}, qkv), out = garbage({b, t, c}), att = garbage({b, nh, t, t});
  ops().attention_forward(out, att, tq, nh);
  expect_close(get(out), ref_attention(to_d(qkv), b, t, c, nh), 1e-6, 1e-5, "attention T=40");
}

// T·T·hd = 2^18: the slices run one per thread. Forward against the double reference;
// backward bit for bit against each head run on its own (NH = 1), so that a race between
// heads (dP slices, interleaved dqkv columns) cannot hide in a tolerance.
TEST_F(OpsTest, AttentionSlicesInParallelMatchOneHeadAtATime) {
  const int b = 2, t = 64, c = 128, nh = 2, hd = c / nh;
  auto qkv = rand_vec(b * t * 3 * c, 5, 1.0f), r = rand_vec(b * t * c, 6);
  Tensor tq = make({b, t, 3 * c}, qkv), out = garbage({b, t, c}), att = garbage({b, nh, t, t});
  ops().attention_forward(out, att, tq, nh);
  expect_close(get(out), ref_attention(to_d(qkv), b, t, c, nh), 1e-6, 1e-5, "attention out");
  Tensor dout = make({b, t, c}, r), dqkv = garbage({b, t, 3 * c});
  ops().attention_backward(dqkv, dout, tq, att, nh);
  const std::vector<float> got = get(dqkv);
  for (int h = 0; h < nh; ++h) {
    std::vector<float> q1(b * t * 3 * hd), r1(b * t * hd);
    for (int bt = 0; bt < b * t; ++bt) {
      for (int part = 0; part < 3; ++part)
        for (int i = 0; i < hd; ++i)
          q1[(bt * 3 + part) * hd + i] = qkv[(bt * 3 + part) * c + h * hd + i];
      for (int i = 0; i < hd; ++i) r1[bt * hd + i] = r[bt * c + h * hd + i];
    }
    Tensor tq1 = make({b, t, 3 * hd}, q1), out1 = garbage({b, t, hd}), att1 = garbage({b, 1, t, t}),
           dqkv1 = garbage({b, t, 3 * hd});
    ops().attention_forward(out1, att1, tq1, 1);
    ops().attention_backward(dqkv1, make({b, t, hd}, r1), tq1, att1, 1);
    const std::vector<float> want = get(dqkv1);
    int bad = 0;
    for (int bt = 0; bt < b * t; ++bt)
      for (int part = 0; part < 3; ++part)
        for (int i = 0; i < hd; ++i)
          bad += got[(bt * 3 + part) * c + h * hd + i] != want[(bt * 3 + part) * hd + i];
    EXPECT_EQ(bad, 0) << "head " << h << ": elements that differ from the head run alone";
  }
}

// With 16-bit qkv the GEMMs run in qkv's dtype (ops.h), as CUDA's do: an fp32 dout or att is
// read rounded to it, and out or dqkv of another dtype are computed in it first. So the run
// with every tensor in qkv's dtype gives the same bits as the mixed one.
TEST_F(OpsTest, AttentionOf16BitQkvReadsAndWritesThroughItsDtype) {
  const int b = 2, t = 12, c = 16, nh = 2;
  for (DType lp : {DType::BF16, DType::F16}) {
    const DType other = lp == DType::BF16 ? DType::F16 : DType::BF16;
    SCOPED_TRACE(dtype_name(lp));
    Tensor tq = make({b, t, 3 * c}, rand_vec(b * t * 3 * c, 7, 1.5f), lp);
    Tensor out = garbage({b, t, c}, lp), att = garbage({b, nh, t, t}, lp);
    ops().attention_forward(out, att, tq, nh);
    for (DType ot : {DType::F32, other}) {
      Tensor out2 = garbage({b, t, c}, ot), att2 = garbage({b, nh, t, t}, ot);
      ops().attention_forward(out2, att2, tq, nh);
      EXPECT_EQ(get(out2), quantize(get(out), ot)) << "out " << dtype_name(ot);
      EXPECT_EQ(get(att2), quantize(get(att), ot)) << "att " << dtype_name(ot);
    }
    // Backward from arbitrary fp32 dout and att (not representable in lp).
    const std::vector<float> r = rand_vec(b * t * c, 8), p = rand_vec(b * nh * t * t, 9);
    Tensor dqkv = garbage({b, t, 3 * c}, lp);
    ops().attention_backward(dqkv, make({b, t, c}, quantize(r, lp), lp), tq,
                             make({b, nh, t, t}, quantize(p, lp), lp), nh);
    for (DType dt : {DType::F32, other}) {
      Tensor dqkv2 = garbage({b, t, 3 * c}, dt);
      ops().attention_backward(dqkv2, make({b, t, c}, r), tq, make({b, nh, t, t}, p), nh);
      EXPECT_EQ(get(dqkv2), quantize(get(dqkv), dt)) << "dqkv " << dtype_name(dt);
    }
  }
}

TEST_F(OpsTest, AttentionRejectsBadShapes) {
  Tensor tq = zeros({2, 5, 24}), out = zeros({2, 5, 8}), att = zeros({2, 2, 5, 5});
  EXPECT_THROW(ops().attention_forward(out, att, tq, 3), std::invalid_argument);  // 8 % 3
  Tensor att_bad = zeros({2, 2, 5, 4});
  EXPECT_THROW(ops().attention_forward(out, att_bad, tq, 2), std::invalid_argument);
  Tensor tq_bad = zeros({2, 5, 25});
  EXPECT_THROW(ops().attention_probs(att, tq_bad, 1), std::invalid_argument);
}

}  // namespace
}  // namespace memtrade::test
