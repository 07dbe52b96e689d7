// Causal self-attention (math) on packed qkv against a naive double implementation.
#include <cstdio>

#include "tests/kernels/attention_reference.h"

namespace memtrade::test {
namespace {

TEST_F(OpsTest, AttentionForwardBackward) {
  const int b = 2, t = 5, c = 8, nh = 2;
  auto qkv = rand_vec(b * t * 3 * c, 1, 1.5f), r = rand_vec(b * t * c, 2);
  Tensor tq = make({b, t, 3 * c}, qkv), out = garbage({b, t, c}), att = garbage({b, nh, t, t});
  ops().attention_forward(out, att, tq, nh, nh);
  Vec want_att;
  const Vec want = ref_attention(to_d(qkv), {b, t, nh, nh, c / nh}, &want_att);
  expect_close(get(out), want, 1e-6, 1e-5, "attention out");
  expect_close(get(att), want_att, 1e-7, 1e-5, "attention probs (zeros above the diagonal)");

  Tensor att2 = garbage({b, nh, t, t});
  ops().attention_probs(att2, tq, nh, nh);
  expect_close(get(att2), want_att, 1e-7, 1e-5, "attention_probs");

  Tensor dout = make({b, t, c}, r), dqkv = garbage({b, t, 3 * c});
  ops().attention_backward(dqkv, dout, tq, att, nh, nh);
  expect_close(get(dqkv),
               fd_grad(
                   [&](const Vec& v) {
                     return ref_attention(v, {b, t, nh, nh, c / nh});
                   },
                   to_d(qkv), to_d(r)),
               1e-5, 1e-4, "attention dqkv");
}

TEST_F(OpsTest, AttentionLongerSequence) {
  // T large enough for the parallel softmax rows and a non-trivial GEMM.
  const int b = 1, t = 40, c = 12, nh = 3;
  auto qkv = rand_vec(b * t * 3 * c, 3, 2.0f);
  Tensor tq = make({b, t, 3 * c}, qkv), out = garbage({b, t, c}), att = garbage({b, nh, t, t});
  ops().attention_forward(out, att, tq, nh, nh);
  expect_close(get(out), ref_attention(to_d(qkv), {b, t, nh, nh, c / nh}), 1e-6, 1e-5,
               "attention T=40");
}

// T·T·hd = 2^18: the slices run one per thread. Forward against the double reference;
// backward bit for bit against each head run on its own (NH = 1), so that a race between
// heads (dP slices, interleaved dqkv columns) cannot hide in a tolerance.
TEST_F(OpsTest, AttentionSlicesInParallelMatchOneHeadAtATime) {
  const int b = 2, t = 64, c = 128, nh = 2, hd = c / nh;
  auto qkv = rand_vec(b * t * 3 * c, 5, 1.0f), r = rand_vec(b * t * c, 6);
  Tensor tq = make({b, t, 3 * c}, qkv), out = garbage({b, t, c}), att = garbage({b, nh, t, t});
  ops().attention_forward(out, att, tq, nh, nh);
  expect_close(get(out), ref_attention(to_d(qkv), {b, t, nh, nh, c / nh}), 1e-6, 1e-5,
               "attention out");
  Tensor dout = make({b, t, c}, r), dqkv = garbage({b, t, 3 * c});
  ops().attention_backward(dqkv, dout, tq, att, nh, nh);
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
    ops().attention_forward(out1, att1, tq1, 1, 1);
    ops().attention_backward(dqkv1, make({b, t, hd}, r1), tq1, att1, 1, 1);
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
    ops().attention_forward(out, att, tq, nh, nh);
    for (DType ot : {DType::F32, other}) {
      Tensor out2 = garbage({b, t, c}, ot), att2 = garbage({b, nh, t, t}, ot);
      ops().attention_forward(out2, att2, tq, nh, nh);
      EXPECT_EQ(get(out2), quantize(get(out), ot)) << "out " << dtype_name(ot);
      // An F32 att holds the probabilities unrounded (HF's softmax(..., dtype=float32)).
      EXPECT_EQ(ot == DType::F32 ? quantize(get(att2), lp) : get(att2), quantize(get(att), ot))
          << "att " << dtype_name(ot);
    }
    // Backward from arbitrary fp32 dout and att (not representable in lp).
    const std::vector<float> r = rand_vec(b * t * c, 8), p = rand_vec(b * nh * t * t, 9);
    Tensor dqkv = garbage({b, t, 3 * c}, lp);
    ops().attention_backward(dqkv, make({b, t, c}, quantize(r, lp), lp), tq,
                             make({b, nh, t, t}, quantize(p, lp), lp), nh, nh);
    for (DType dt : {DType::F32, other}) {
      Tensor dqkv2 = garbage({b, t, 3 * c}, dt);
      ops().attention_backward(dqkv2, make({b, t, c}, r), tq, make({b, nh, t, t}, p), nh, nh);
      EXPECT_EQ(get(dqkv2), quantize(get(dqkv), dt)) << "dqkv " << dtype_name(dt);
    }
  }
}

// HF's softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) with bf16 q, k, v: an F32 att
// receives the probabilities unrounded, the ·V product reads them rounded (out as with a bf16
// att, bit for bit), and a backward given them (probs) reads the fp32 P for the softmax's dS and
// the rounded one (att) for dV. Against a double reference of that contract (kernels/ops.h):
// S = bf16(s·q·kᵀ), P = softmax(S) (fp32), dP = bf16(dO·vᵀ), dS = bf16(P ⊙ (dP − Σ P·dP)),
// dq = bf16(s·dS·k), dk = bf16(s·dSᵀ·q), dv = bf16(bf16(P)ᵀ·dO). Measured (AMD EPYC Zen 4, the
// avx512, avx2 and sse2 paths alike): the kernel is 0.0000·eps (relative L2) from the reference,
// while reading the rounded P for dS (the old contract, no probs) lands 0.23·eps from it and
// 0.0000·eps from its own reference: the bounds below (0.05·eps, 4×) tell the two apart.
TEST_F(OpsTest, AttentionFp32ProbsOfBf16Qkv) {
  const int b = 2, t = 24, c = 16, nh = 2, hd = c / nh;
  const DType lp = DType::BF16;
  const std::vector<float> qkv = quantize(rand_vec(b * t * 3 * c, 41, 1.5f), lp);
  const std::vector<float> dov = quantize(rand_vec(b * t * c, 42), lp);
  Tensor tq = make({b, t, 3 * c}, qkv, lp), dout = make({b, t, c}, dov, lp);
  Tensor out16 = garbage({b, t, c}, lp), att16 = garbage({b, nh, t, t}, lp);
  ops().attention_forward(out16, att16, tq, nh, nh);
  Tensor out = garbage({b, t, c}, lp), att32 = garbage({b, nh, t, t});
  ops().attention_forward(out, att32, tq, nh, nh);
  EXPECT_EQ(get(out), get(out16)) << "the ·V product reads the probabilities rounded";
  EXPECT_EQ(quantize(get(att32), lp), get(att16));
  const std::vector<float> p32 = get(att32);
  EXPECT_NE(p32, quantize(p32, lp)) << "F32 att holds the unrounded probabilities";

  // The reference, per (b, h), with the probabilities the dS reads: fp32 or rounded.
  auto r16 = [&](double x) {
    return static_cast<double>(quantize({static_cast<float>(x)}, lp)[0]);
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  auto reference = [&](bool fp32_p) {
    Vec dq(b * t * 3 * c, 0.0);
    for (int bb = 0; bb < b; ++bb)
      for (int h = 0; h < nh; ++h) {
        auto q = [&](int i, int d) {
          return static_cast<double>(qkv[(bb * t + i) * 3 * c + h * hd + d]);
        };
        auto k = [&](int i, int d) {
          return static_cast<double>(qkv[(bb * t + i) * 3 * c + c + h * hd + d]);
        };
        auto v = [&](int i, int d) {
          return static_cast<double>(qkv[(bb * t + i) * 3 * c + 2 * c + h * hd + d]);
        };
        auto go = [&](int i, int d) {
          return static_cast<double>(dov[(bb * t + i) * c + h * hd + d]);
        };
        const std::size_t slab = static_cast<std::size_t>((bb * nh + h) * t * t);
        std::vector<double> ds(t * t, 0.0);
        for (int i = 0; i < t; ++i) {
          std::vector<double> pr(i + 1), dp(i + 1);
          double dot = 0.0;
          for (int j = 0; j <= i; ++j) {
            pr[j] = fp32_p ? p32[slab + i * t + j] : r16(p32[slab + i * t + j]);
            double s = 0.0;
            for (int d = 0; d < hd; ++d) s += go(i, d) * v(j, d);
            dp[j] = r16(s);
            dot += pr[j] * dp[j];
          }
          for (int j = 0; j <= i; ++j) ds[i * t + j] = r16(pr[j] * (dp[j] - dot));
        }
        for (int i = 0; i < t; ++i)
          for (int d = 0; d < hd; ++d) {
            double sq = 0.0, sk = 0.0, sv = 0.0;
            for (int j = 0; j < t; ++j) {
              sq += ds[i * t + j] * k(j, d);
              sk += ds[j * t + i] * q(j, d);
              sv += r16(p32[slab + j * t + i]) * go(j, d);
            }
            const std::size_t row = static_cast<std::size_t>((bb * t + i) * 3 * c + h * hd + d);
            dq[row] = r16(scale * sq);
            dq[row + c] = r16(scale * sk);
            dq[row + 2 * c] = r16(sv);
          }
      }
    return dq;
  };
  auto rel_l2 = [](const std::vector<float>& got, const Vec& want) {
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    return std::sqrt(num / den);
  };
  const double eps = 1.0 / 128;  // bf16's machine epsilon, 2^-7
  Tensor with = garbage({b, t, 3 * c}, lp), without = garbage({b, t, 3 * c}, lp);
  ops().attention_backward(with, dout, tq, att16, nh, nh, {}, nullptr, &att32);
  ops().attention_backward(without, dout, tq, att16, nh, nh);
  const Vec ref = reference(true), ref_rounded = reference(false);
  const double e_with = rel_l2(get(with), ref), e_without = rel_l2(get(without), ref);
  const double e_rounded = rel_l2(get(without), ref_rounded);
  RecordProperty("fp32_probs_err_eps", std::to_string(e_with / eps));
  std::printf(
      "fp32 P: %.4f·eps from the reference; rounded P: %.4f·eps from it (%.4f·eps from "
      "its own reference)\n",
      e_with / eps, e_without / eps, e_rounded / eps);
  EXPECT_LT(e_with, 0.05 * eps);
  EXPECT_LT(e_rounded, 0.05 * eps);  // the reference is right about the old contract too
  EXPECT_GT(e_without, 4 * e_with);  // and the two contracts differ measurably
  // dv reads the rounded probabilities either way: the same bits.
  const std::vector<float> gw = get(with), gwo = get(without);
  for (int row = 0; row < b * t; ++row)
    for (int i = 2 * c; i < 3 * c; ++i)
      ASSERT_EQ(gw[row * 3 * c + i], gwo[row * 3 * c + i]) << "dv, row " << row;
  EXPECT_THROW(ops().attention_backward(with, dout, tq, att16, nh, nh, {}, nullptr, &att16),
               std::invalid_argument);  // probs must be F32
}

// Grouped-query attention: query head h uses kv head h / (NH / NKV). Forward against the
// double reference; backward against its finite differences (a kv head's dk, dv sum over the
// group's query heads).
TEST_F(OpsTest, AttentionGroupedQueryForwardBackward) {
  for (int nkv : {2, 1}) {
    SCOPED_TRACE("n_kv_head " + std::to_string(nkv));
    const AttnShape s{2, 6, 4, nkv, 3};
    auto qkv = rand_vec(s.qkv_numel(), 20 + nkv, 1.5f), r = rand_vec(s.out_numel(), 30 + nkv);
    Tensor tq = make({s.b, s.t, s.w()}, qkv), out = garbage({s.b, s.t, s.c()}),
           att = garbage({s.b, s.nh, s.t, s.t});
    ops().attention_forward(out, att, tq, s.nh, s.nkv);
    Vec want_att;
    expect_close(get(out), ref_attention(to_d(qkv), s, &want_att), 1e-6, 1e-5, "GQA out");
    expect_close(get(att), want_att, 1e-7, 1e-5, "GQA probabilities");
    Tensor att2 = garbage({s.b, s.nh, s.t, s.t});
    ops().attention_probs(att2, tq, s.nh, s.nkv);
    expect_close(get(att2), want_att, 1e-7, 1e-5, "GQA attention_probs");
    Tensor dqkv = garbage({s.b, s.t, s.w()});
    ops().attention_backward(dqkv, make({s.b, s.t, s.c()}, r), tq, att, s.nh, s.nkv);
    expect_close(get(dqkv),
                 fd_grad([&](const Vec& v) { return ref_attention(v, s); }, to_d(qkv), to_d(r)),
                 1e-5, 1e-4, "GQA dqkv");
  }
}

// HF's repeat_kv definition: GQA equals multi-head attention on qkv whose kv heads are repeated
// per query head, and a kv head's gradient is the sum of its copies'. T·T·hd = 2^18: the groups
// run one per thread.
TEST_F(OpsTest, AttentionGroupedQueryIsMultiHeadOnRepeatedKv) {
  const AttnShape s{2, 64, 4, 2, 64}, m{2, 64, 4, 4, 64};
  const int rep = s.nh / s.nkv;
  auto qkv = rand_vec(s.qkv_numel(), 40, 1.0f), r = rand_vec(s.out_numel(), 41);
  std::vector<float> wide(m.qkv_numel());  // q as is, kv head h / rep for head h
  for (int bt = 0; bt < s.b * s.t; ++bt)
    for (int h = 0; h < s.nh; ++h)
      for (int i = 0; i < s.hd; ++i) {
        const float* row = qkv.data() + static_cast<std::size_t>(bt) * s.w();
        float* wrow = wide.data() + static_cast<std::size_t>(bt) * m.w();
        wrow[h * s.hd + i] = row[h * s.hd + i];
        wrow[(m.nh + h) * s.hd + i] = row[(s.nh + h / rep) * s.hd + i];
        wrow[(m.nh + m.nkv + h) * s.hd + i] = row[(s.nh + s.nkv + h / rep) * s.hd + i];
      }
  Tensor tq = make({s.b, s.t, s.w()}, qkv), tw = make({m.b, m.t, m.w()}, wide);
  Tensor out = garbage({s.b, s.t, s.c()}), att = garbage({s.b, s.nh, s.t, s.t});
  Tensor outw = garbage({s.b, s.t, s.c()}), attw = garbage({s.b, s.nh, s.t, s.t});
  ops().attention_forward(out, att, tq, s.nh, s.nkv);
  ops().attention_forward(outw, attw, tw, m.nh, m.nkv);
  EXPECT_TRUE(get(out) == get(outw)) << "the same GEMMs on the same values";
  Tensor dout = make({s.b, s.t, s.c()}, r), dq = garbage({s.b, s.t, s.w()}),
         dw = garbage({m.b, m.t, m.w()});
  ops().attention_backward(dq, dout, tq, att, s.nh, s.nkv);
  ops().attention_backward(dw, dout, tw, attw, m.nh, m.nkv);
  const std::vector<float> got = get(dq), gw = get(dw);
  Vec want(got.size(), 0.0);
  for (int bt = 0; bt < s.b * s.t; ++bt)
    for (int h = 0; h < s.nh; ++h)
      for (int i = 0; i < s.hd; ++i) {
        const std::size_t o = static_cast<std::size_t>(bt) * s.w(),
                          ow = static_cast<std::size_t>(bt) * m.w();
        want[o + h * s.hd + i] = gw[ow + h * s.hd + i];
        want[o + (s.nh + h / rep) * s.hd + i] += gw[ow + (m.nh + h) * s.hd + i];
        want[o + (s.nh + s.nkv + h / rep) * s.hd + i] += gw[ow + (m.nh + m.nkv + h) * s.hd + i];
      }
  expect_close(got, want, 1e-7, 1e-6, "GQA dqkv vs summed repeated heads");
}

TEST_F(OpsTest, AttentionRejectsBadShapes) {
  Tensor tq = zeros({2, 5, 24}), out = zeros({2, 5, 8}), att = zeros({2, 2, 5, 5});
  EXPECT_THROW(ops().attention_forward(out, att, tq, 3, 3), std::invalid_argument);  // 8 % 3
  Tensor att_bad = zeros({2, 2, 5, 4});
  EXPECT_THROW(ops().attention_forward(out, att_bad, tq, 2, 2), std::invalid_argument);
  Tensor tq_bad = zeros({2, 5, 25});
  EXPECT_THROW(ops().attention_probs(att, tq_bad, 1, 1), std::invalid_argument);
  // Grouped-query: n_head a multiple of n_kv_head, qkv (NH + 2·NKV)·hd wide.
  Tensor tq_gqa = zeros({2, 5, 16}), out_gqa = zeros({2, 5, 8}), att_gqa = zeros({2, 4, 5, 5});
  EXPECT_NO_THROW(ops().attention_forward(out_gqa, att_gqa, tq_gqa, 4, 2));  // hd 2
  EXPECT_THROW(ops().attention_forward(out_gqa, att_gqa, tq_gqa, 4, 3), std::invalid_argument);
  EXPECT_THROW(ops().attention_forward(out_gqa, att_gqa, tq_gqa, 4, 0), std::invalid_argument);
  EXPECT_THROW(ops().attention_forward(out_gqa, att_gqa, tq_gqa, 3, 1), std::invalid_argument);
}

}  // namespace
}  // namespace memtrade::test
