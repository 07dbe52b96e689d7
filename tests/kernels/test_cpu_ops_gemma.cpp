// Gemma 2's ops (transformers 4.46.3 modeling_gemma2.py): GeGLU, soft-capping, the (1 + w)
// RMSNorm computed in fp32, and math attention with a scale of query_pre_attn_scalar^-0.5 and
// soft-capped scores. Forward against double references, backward against finite differences
// of those references, and the dry run against the real ops' allocations.
#include <cmath>
#include <functional>
#include <tuple>

#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

double gelu_tanh(double x) {  // gelu_pytorch_tanh
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

Vec ref_geglu(const Vec& g, const Vec& u) {
  Vec y(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) y[i] = gelu_tanh(g[i]) * u[i];
  return y;
}

Vec ref_softcap(const Vec& x, double cap) {
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = cap * std::tanh(x[i] / cap);
  return y;
}

// Gemma2RMSNorm: x·rstd·(1 + w).
Vec ref_rmsnorm1(const Vec& x, const Vec& w, int n, int c, double eps) {
  Vec y(x.size());
  for (int r = 0; r < n; ++r) {
    double ms = 0;
    for (int j = 0; j < c; ++j) ms += x[r * c + j] * x[r * c + j] / c;
    const double s = 1.0 / std::sqrt(ms + eps);
    for (int j = 0; j < c; ++j) y[r * c + j] = x[r * c + j] * s * (1.0 + w[j]);
  }
  return y;
}

// Gemma2Attention's eager scores: softcap·tanh(scale·q·kᵀ / softcap), causal softmax, ·V
// (attention_reference.h); optionally the tanh (B, NH, T, T).
Vec ref_capped_attention(const Vec& qkv, const AttnShape& s, double scale, double cap,
                         Vec* tanh = nullptr) {
  return ref_attention(qkv, s, nullptr, nullptr, scale, cap, tanh);
}

TEST_F(OpsTest, GegluForwardBackward) {
  const int n = 3, c = 7;
  auto g = rand_vec(n * c, 20, 4.0f), u = rand_vec(n * c, 21), r = rand_vec(n * c, 22);
  Tensor tg = make({n, c}, g), tu = make({n, c}, u), out = garbage({n, c});
  ops().geglu_forward(out, tg, tu);
  expect_close(get(out), ref_geglu(to_d(g), to_d(u)), 1e-7, 1e-6, "geglu");

  Tensor dout = make({n, c}, r), dg = garbage({n, c}), du = garbage({n, c});
  ops().geglu_backward(dg, du, dout, tg, tu);
  const Vec rd = to_d(r);
  auto want_g = fd_grad([&](const Vec& v) { return ref_geglu(v, to_d(u)); }, to_d(g), rd);
  auto want_u = fd_grad([&](const Vec& v) { return ref_geglu(to_d(g), v); }, to_d(u), rd);
  expect_close(get(dg), want_g, 1e-6, 1e-5, "geglu dgate");
  expect_close(get(du), want_u, 1e-6, 1e-5, "geglu dup");
  // In place, as the MLP calls it: dgate over dout; and over gate and up.
  Tensor g2 = make({n, c}, g), u2 = make({n, c}, u), d2 = make({n, c}, r);
  ops().geglu_backward(d2, du, d2, g2, u2);
  expect_close(get(d2), want_g, 1e-6, 1e-5, "geglu dgate over dout");
  ops().geglu_backward(g2, u2, dout, g2, u2);
  expect_close(get(g2), want_g, 1e-6, 1e-5, "geglu dgate over gate");
  expect_close(get(u2), want_u, 1e-6, 1e-5, "geglu dup over up");
}

TEST_F(OpsTest, SoftcapForwardBackward) {
  const int n = 4, c = 9;
  const float cap = 3.0f;
  auto x = rand_vec(n * c, 23, 8.0f), r = rand_vec(n * c, 24);
  Tensor tx = make({n, c}, x), out = garbage({n, c});
  ops().softcap_forward(out, tx, cap);
  expect_close(get(out), ref_softcap(to_d(x), cap), 1e-6, 1e-6, "softcap");
  Tensor dout = make({n, c}, r), dx = garbage({n, c});
  ops().softcap_backward(dx, dout, out, cap);
  auto want = fd_grad([&](const Vec& v) { return ref_softcap(v, cap); }, to_d(x), to_d(r));
  expect_close(get(dx), want, 1e-6, 1e-5, "softcap dinp");
  ops().softcap_backward(dout, dout, out, cap);  // in place over dout
  expect_close(get(dout), want, 1e-6, 1e-5, "softcap dinp over dout");
  ops().softcap_forward(tx, tx, cap);  // in place, bf16 out rounded once
  Tensor o16 = garbage({n, c}, DType::BF16);
  ops().softcap_forward(o16, make({n, c}, x), cap);
  expect_close(get(o16), to_d(quantize(get(tx), DType::BF16)), 0, 0, "bf16 softcap: one rounding");
}

// Gemma2RMSNorm: (x·rstd)·(1 + w) in fp32, rounded once; no rounding of the normalised row to a
// 16-bit input's dtype (unlike LlamaRMSNorm), in forward and in the weight's gradient.
TEST_F(OpsTest, RmsNormUnitOffset) {
  const int n = 6, c = 10;
  const float eps = 1e-6f;
  auto x = rand_vec(n * c, 25, 2.0f), w = rand_vec(c, 26, 0.3f), r = rand_vec(n * c, 27);
  Tensor tx = make({n, c}, x), tw = make({c}, w), out = garbage({n, c}), rstd = garbage({n});
  ops().rmsnorm_forward(out, rstd, tx, tw, eps, true);
  expect_close(get(out), ref_rmsnorm1(to_d(x), to_d(w), n, c, eps), 1e-6, 1e-5, "(1 + w) norm");
  Tensor dout = make({n, c}, r), dx = garbage({n, c}), dw = garbage({c});
  ops().rmsnorm_backward(dx, &dw, dout, tx, tw, rstd, false, true);
  const Vec rd = to_d(r);
  auto gx = fd_grad([&](const Vec& v) { return ref_rmsnorm1(v, to_d(w), n, c, eps); }, to_d(x), rd);
  auto gw = fd_grad([&](const Vec& v) { return ref_rmsnorm1(to_d(x), v, n, c, eps); }, to_d(w), rd);
  expect_close(get(dx), gx, 1e-5, 1e-4, "(1 + w) norm dinp");
  expect_close(get(dw), gw, 1e-5, 1e-4, "(1 + w) norm dweight");

  // bf16 input, bf16 output: fp32 arithmetic on the bf16 values, one rounding at the end.
  auto xb = quantize(x, DType::BF16);
  Tensor tb = make({n, c}, xb, DType::BF16), ob = garbage({n, c}, DType::BF16);
  ops().rmsnorm_forward(ob, rstd, tb, tw, eps, true);
  const auto s = get(rstd);
  std::vector<float> want(n * c);
  Vec want_dw(c, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < c; ++j) {
      want[i * c + j] = xb[i * c + j] * s[i] * (1.0f + w[j]);
      want_dw[j] += static_cast<double>(r[i * c + j]) * (xb[i * c + j] * s[i]);
    }
  expect_close(get(ob), to_d(quantize(want, DType::BF16)), 0, 0, "bf16 (1 + w) norm");
  Tensor dxb = garbage({n, c}, DType::BF16);
  ops().rmsnorm_backward(dxb, &dw, dout, tb, tw, rstd, false, true);
  expect_close(get(dw), want_dw, 1e-6, 1e-6, "dweight against the unrounded factor");
}

TEST_F(OpsTest, AttentionWithScaleAndSoftcap) {
  for (const AttnShape s : {AttnShape{2, 5, 4, 2, 8}, AttnShape{1, 70, 2, 1, 4}}) {
    const float scale = 0.3f, cap = 1.5f;
    const AttentionScores sc{scale, cap};
    auto qkv = rand_vec(s.qkv_numel(), 28, 2.0f);
    Tensor tq = make({s.b, s.t, s.w()}, qkv), out = garbage({s.b, s.t, s.c()}),
           att = garbage({s.b, s.nh, s.t, s.t}), th = garbage({s.b, s.nh, s.t, s.t});
    ops().attention_forward(out, att, tq, s.nh, s.nkv, sc, &th);
    Vec want_th;
    const Vec want = ref_capped_attention(to_d(qkv), s, scale, cap, &want_th);
    expect_close(get(out), want, 1e-5, 1e-4, "capped attention");
    expect_close(get(th), want_th, 1e-6, 1e-5, "tanh of the scaled scores");
    Tensor att2 = garbage({s.b, s.nh, s.t, s.t}), th2 = garbage({s.b, s.nh, s.t, s.t});
    ops().attention_probs(att2, tq, s.nh, s.nkv, sc, &th2);
    EXPECT_EQ(get(att2), get(att));
    EXPECT_EQ(get(th2), get(th));
    if (s.t > 10) continue;  // finite differences on the small case only

    auto r = rand_vec(s.out_numel(), 29);
    Tensor dout = make({s.b, s.t, s.c()}, r), dq = garbage({s.b, s.t, s.w()});
    ops().attention_backward(dq, dout, tq, att, s.nh, s.nkv, sc, &th);
    auto gq = fd_grad([&](const Vec& v) { return ref_capped_attention(v, s, scale, cap); },
                      to_d(qkv), to_d(r));
    expect_close(get(dq), gq, 1e-5, 1e-4, "capped attention dqkv");
  }
  // A scale alone (no cap) is plain attention with that scale: hd = 4 and scale 1/2 is 1/√hd.
  const AttnShape s{1, 6, 2, 2, 4};
  auto qkv = rand_vec(s.qkv_numel(), 30);
  Tensor tq = make({s.b, s.t, s.w()}, qkv), o1 = garbage({s.b, s.t, s.c()}),
         o2 = garbage({s.b, s.t, s.c()}), a = garbage({s.b, s.nh, s.t, s.t});
  ops().attention_forward(o1, a, tq, s.nh, s.nkv, AttentionScores{0.5f, 0.0f});
  ops().attention_forward(o2, a, tq, s.nh, s.nkv);
  EXPECT_EQ(get(o1), get(o2));
}

TEST_F(OpsTest, GemmaOpsRejectBadArguments) {
  const AttnShape s{1, 4, 2, 1, 4};
  Tensor q = zeros({s.b, s.t, s.w()}), out = zeros({s.b, s.t, s.c()}),
         att = zeros({s.b, s.nh, s.t, s.t}), th = zeros({s.b, s.nh, s.t, s.t}),
         th16 = zeros({s.b, s.nh, s.t, s.t}, DType::BF16), dq = zeros({s.b, s.t, s.w()});
  EXPECT_THROW(ops().attention_forward(out, att, q, s.nh, s.nkv, {0.0f, 2.0f}),
               std::invalid_argument);  // a cap without its tanh tensor
  EXPECT_THROW(ops().attention_forward(out, att, q, s.nh, s.nkv, {}, &th),
               std::invalid_argument);  // a tanh tensor without a cap
  EXPECT_THROW(ops().attention_forward(out, att, q, s.nh, s.nkv, {0.0f, 2.0f}, &th16),
               std::invalid_argument);  // not qkv's dtype
  EXPECT_THROW(ops().attention_probs(att, q, s.nh, s.nkv, {-1.0f, 0.0f}), std::invalid_argument);
  EXPECT_THROW(ops().attention_backward(dq, out, q, att, s.nh, s.nkv, {0.0f, NAN}, &th),
               std::invalid_argument);
  Tensor a = zeros({4, 6}), b = zeros({4, 5});
  EXPECT_THROW(ops().geglu_forward(a, a, b), std::invalid_argument);
  EXPECT_THROW(ops().geglu_backward(a, b, a, a, a), std::invalid_argument);
  EXPECT_THROW(ops().softcap_forward(a, b, 1.0f), std::invalid_argument);
  EXPECT_THROW(ops().softcap_backward(a, a, b, 1.0f), std::invalid_argument);
}

// The memory model runs these through make_dry_run_ops: it must allocate what the real ops do,
// in every dtype (soft-capping takes no scratch of its own).
TEST_F(OpsTest, GemmaOpsDryRunAllocatesAsTheRealOps) {
  using Ev = std::tuple<int, std::size_t, std::size_t, int>;
  auto events = [&] {
    std::vector<Ev> out;
    for (const TraceEvent& e : mem().trace())
      out.emplace_back(static_cast<int>(e.kind), e.bytes, e.requested,
                       static_cast<int>(e.category));
    mem().clear_trace();
    return out;
  };
  auto dry = make_dry_run_ops(Backend::cpu);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const AttnShape s{2, 6, 4, 2, 8};
    const int n = 8, c = 64;
    Tensor x = make({n, c}, rand_vec(n * c, 31), dt), w = make({c}, rand_vec(c, 32), dt);
    Tensor y = zeros({n, c}, dt), rstd = zeros({n}), dx = zeros({n, c}, dt), dw = zeros({c}, dt);
    Tensor dg = zeros({n, c}, dt), du = zeros({n, c}, dt);
    Tensor q = make({s.b, s.t, s.w()}, rand_vec(s.qkv_numel(), 33), dt);
    Tensor out = zeros({s.b, s.t, s.c()}, dt), att = zeros({s.b, s.nh, s.t, s.t}, dt),
           th = zeros({s.b, s.nh, s.t, s.t}, dt), dq = zeros({s.b, s.t, s.w()}, dt);
    const AttentionScores sc{0.25f, 2.0f};
    const std::vector<std::function<void(Ops&)>> calls{
        [&](Ops& o) { o.rmsnorm_forward(y, rstd, x, w, 1e-6f, true); },
        [&](Ops& o) { o.rmsnorm_backward(dx, &dw, y, x, w, rstd, true, true); },
        [&](Ops& o) { o.geglu_forward(y, x, dx); },
        [&](Ops& o) { o.geglu_backward(dg, du, y, x, dx); },
        [&](Ops& o) { o.softcap_forward(y, x, 3.0f); },
        [&](Ops& o) { o.softcap_backward(dx, y, x, 3.0f); },
        [&](Ops& o) { o.attention_forward(out, att, q, s.nh, s.nkv, sc, &th); },
        [&](Ops& o) { o.attention_probs(att, q, s.nh, s.nkv, sc, &th); },
        [&](Ops& o) { o.attention_backward(dq, out, q, att, s.nh, s.nkv, sc, &th); }};
    mem().enable_trace(true);
    for (std::size_t i = 0; i < calls.size(); ++i) {
      mem().clear_trace();
      calls[i](ops());
      const auto real = events();
      calls[i](*dry);
      EXPECT_EQ(events(), real) << "call " << i << " in " << dtype_name(dt);
    }
    mem().enable_trace(false);
  }
}

}  // namespace
}  // namespace memtrade::test
