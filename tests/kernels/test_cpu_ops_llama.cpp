// The Llama-family ops (RMSNorm, RoPE, SwiGLU): forward against double references, backward
// against finite differences of those references, RoPE's frequencies against the published
// llama3 formula and against PyTorch's own values (fixtures/rope_torch_reference.txt, kept
// honest by tests/python/test_rope_reference.py), and the dry run against the real ops'
// allocations.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <numbers>
#include <sstream>
#include <tuple>
#include <utility>

#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

Vec ref_rmsnorm(const Vec& x, const Vec& w, int n, int c, double eps, Vec* rstd = nullptr) {
  Vec y(x.size());
  for (int r = 0; r < n; ++r) {
    double ms = 0;
    for (int j = 0; j < c; ++j) ms += x[r * c + j] * x[r * c + j] / c;
    const double s = 1.0 / std::sqrt(ms + eps);
    for (int j = 0; j < c; ++j) y[r * c + j] = w[j] * (x[r * c + j] * s);
    if (rstd) rstd->push_back(s);
  }
  return y;
}

// The packed qkv layout of rope_forward: (B, T, (NH + 2·NKV)·hd).
struct Layout {
  int b, t, nh, nkv, hd;
  int row() const { return (nh + 2 * nkv) * hd; }
  int numel() const { return b * t * row(); }
};

// HF's apply_rotary_pos_emb in double on the q and k heads, with the fp32 angle t·inv_freq the
// op uses; sign -1 rotates backwards.
Vec ref_rope(const Vec& x, const Layout& l, const std::vector<float>& inv, double sign = 1.0) {
  Vec y = x;
  const int half = l.hd / 2;
  for (int b = 0; b < l.b; ++b)
    for (int t = 0; t < l.t; ++t)
      for (int h = 0; h < l.nh + l.nkv; ++h)
        for (int i = 0; i < half; ++i) {
          const double angle = static_cast<float>(t) * inv[i];
          const double c = std::cos(angle), s = sign * std::sin(angle);
          const int k = (b * l.t + t) * l.row() + h * l.hd + i;
          y[k] = x[k] * c - x[k + half] * s;
          y[k + half] = x[k + half] * c + x[k] * s;
        }
  return y;
}

Vec ref_swiglu(const Vec& g, const Vec& u) {
  Vec y(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) y[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return y;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

RopeConfig llama3_scaled(double factor) {  // Llama 3.1 (8) / 3.2 (32) rope_scaling
  RopeConfig r;
  r.theta = 500000.0;
  r.factor = factor;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position = 8192;
  return r;
}

TEST_F(OpsTest, RmsNormForwardBackward) {
  for (int c : {10, 2500}) {  // 2500: rows span several chunks
    const int n = 6;
    const float eps = 1e-5f;
    auto x = rand_vec(n * c, 1, 2.0f), w = rand_vec(c, 2), r = rand_vec(n * c, 3);
    Tensor tx = make({2, 3, c}, x), tw = make({c}, w), out = garbage({2, 3, c}),
           rstd = garbage({2, 3});
    ops().rmsnorm_forward(out, rstd, tx, tw, eps);
    Vec s;
    expect_close(get(out), ref_rmsnorm(to_d(x), to_d(w), n, c, eps, &s), 1e-6, 1e-5, "rmsnorm");
    expect_close(get(rstd), s, 0, 1e-6, "rmsnorm rstd");
    if (c > 100) continue;  // finite differences on the small case only

    Tensor dout = make({2, 3, c}, r), dx = garbage({2, 3, c}), dw = garbage({c});
    ops().rmsnorm_backward(dx, &dw, dout, tx, tw, rstd, false);
    const Vec rd = to_d(r);
    auto gx =
        fd_grad([&](const Vec& v) { return ref_rmsnorm(v, to_d(w), n, c, eps); }, to_d(x), rd);
    auto gw =
        fd_grad([&](const Vec& v) { return ref_rmsnorm(to_d(x), v, n, c, eps); }, to_d(w), rd);
    expect_close(get(dx), gx, 1e-5, 1e-4, "rmsnorm dinp");
    expect_close(get(dw), gw, 1e-5, 1e-4, "rmsnorm dweight");
    ops().rmsnorm_backward(dout, &dw, dout, tx, tw, rstd, true);  // dinp aliases dout
    for (auto& v : gw) v *= 2;
    expect_close(get(dout), gx, 1e-5, 1e-4, "rmsnorm dinp in place");
    expect_close(get(dw), gw, 1e-5, 1e-4, "rmsnorm dweight accumulated");
    ops().rmsnorm_backward(dx, nullptr, make({2, 3, c}, r), tx, tw, rstd, false);
    expect_close(get(dx), gx, 1e-5, 1e-4, "rmsnorm dinp without dweight");
  }
}

// HF's LlamaRMSNorm rounds x·rstd to the input's dtype before the weight multiplies it: a bf16
// input with an fp32 weight and output gives exactly w · bf16(x·rstd), and the weight's gradient
// is taken against that same rounded factor.
TEST_F(OpsTest, RmsNormRoundsTheNormalisedRowToTheInputDtype) {
  const int n = 3, c = 64;
  auto x = quantize(rand_vec(n * c, 4, 3.0f), DType::BF16), w = rand_vec(c, 5),
       g = rand_vec(n * c, 6);
  Tensor tx = make({n, c}, x, DType::BF16), tw = make({c}, w), out = garbage({n, c}),
         rstd = garbage({n});
  ops().rmsnorm_forward(out, rstd, tx, tw, 1e-6f);
  const auto s = get(rstd);
  Vec s_ref;
  (void)ref_rmsnorm(to_d(x), to_d(w), n, c, 1e-6, &s_ref);
  expect_close(s, s_ref, 0, 1e-6, "rstd of bf16 rows");
  std::vector<float> norm(n * c);
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < c; ++j) norm[r * c + j] = x[r * c + j] * s[r];
  norm = quantize(norm, DType::BF16);
  Vec want(n * c), want_dw(c, 0.0);
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < c; ++j) {
      want[r * c + j] = w[j] * norm[r * c + j];
      want_dw[j] += static_cast<double>(g[r * c + j]) * norm[r * c + j];
    }
  expect_close(get(out), want, 0, 0, "w · bf16(x·rstd)");
  Tensor dout = make({n, c}, g), dx = garbage({n, c}, DType::BF16), dw = garbage({c});
  ops().rmsnorm_backward(dx, &dw, dout, tx, tw, rstd, false);
  expect_close(get(dw), want_dw, 1e-6, 1e-6, "dweight against the rounded factor");
}

TEST_F(OpsTest, RopeForwardMatchesHfRotation) {
  // GQA (4 query heads, 2 key/value heads) and GPT's equal-heads layout; a scaled config too.
  for (auto [l, rope] : {std::pair{Layout{2, 9, 4, 2, 16}, RopeConfig{100.0}},
                         std::pair{Layout{1, 7, 3, 3, 8}, RopeConfig{}},
                         std::pair{Layout{2, 5, 2, 1, 64}, llama3_scaled(32.0)}}) {
    const auto x = rand_vec(l.numel(), 7);
    Tensor qkv = make({l.b, l.t, l.row()}, x);
    ops().rope_forward(qkv, l.nh, l.nkv, rope);
    const auto inv = rope_inv_freq(l.hd, rope);
    const auto got = get(qkv);
    expect_close(got, ref_rope(to_d(x), l, inv), 1e-6, 1e-6, "rope_forward");
    // v is untouched, bit for bit.
    for (int bt = 0; bt < l.b * l.t; ++bt)
      for (int k = (l.nh + l.nkv) * l.hd; k < l.row(); ++k)
        ASSERT_EQ(got[bt * l.row() + k], x[bt * l.row() + k]) << "v changed at " << bt;
  }
}

TEST_F(OpsTest, RopeBackwardIsTheTransposeOfForward) {
  const Layout l{2, 11, 4, 2, 12};
  const RopeConfig rope = llama3_scaled(8.0);
  const auto x = rand_vec(l.numel(), 8), y = rand_vec(l.numel(), 9);
  const Shape s{l.b, l.t, l.row()};
  // Finite differences of L = Σ rope(x)·y: the gradient rope_backward must produce (dv = y).
  Tensor dqkv = make(s, y);
  ops().rope_backward(dqkv, l.nh, l.nkv, rope);
  const auto inv = rope_inv_freq(l.hd, rope);
  const auto rty = get(dqkv);
  expect_close(rty, fd_grad([&](const Vec& v) { return ref_rope(v, l, inv); }, to_d(x), to_d(y)),
               1e-6, 1e-5, "rope_backward vs finite differences");
  // ⟨R x, y⟩ = ⟨x, Rᵀ y⟩.
  Tensor qkv = make(s, x);
  ops().rope_forward(qkv, l.nh, l.nkv, rope);
  const auto rx = get(qkv);
  EXPECT_NEAR(dot(rx, y), dot(x, rty), 1e-5 * std::sqrt(dot(x, x) * dot(y, y)));
  // A rotation keeps every head's norm, and backward undoes forward.
  for (int h = 0; h < l.b * l.t * (l.nh + 2 * l.nkv); ++h) {
    double n0 = 0, n1 = 0;
    for (int i = 0; i < l.hd; ++i) {
      n0 += static_cast<double>(x[h * l.hd + i]) * x[h * l.hd + i];
      n1 += static_cast<double>(rx[h * l.hd + i]) * rx[h * l.hd + i];
    }
    ASSERT_NEAR(n1, n0, 1e-6 * n0) << "head " << h;
  }
  ops().rope_backward(qkv, l.nh, l.nkv, rope);
  expect_close(get(qkv), to_d(x), 1e-6, 1e-6, "rope_backward(rope_forward(x))");
}

TEST_F(OpsTest, RopeInvFreqFollowsThePublishedFormulas) {
  // Default: θ^(−2i/hd); at hd = 64, θ = 1e4, i = 16 that is 1 / 100 in fp32 arithmetic.
  const auto plain = rope_inv_freq(64, RopeConfig{});
  ASSERT_EQ(plain.size(), 32u);
  EXPECT_EQ(plain[0], 1.0f);
  EXPECT_EQ(plain[16], 1.0f / 100.0f);
  // llama3 (Meta's apply_scaling, evaluated here in double): wavelengths 2π/f under
  // original/high_freq_factor are kept, over original/low_freq_factor divided by the factor,
  // and the band between interpolated; Llama 3.2's config has frequencies in all three.
  for (int hd : {64, 128}) {
    const RopeConfig r = llama3_scaled(32.0);
    const auto got = rope_inv_freq(hd, r);
    int kept = 0, scaled = 0, smoothed = 0;
    for (int i = 0; i < hd / 2; ++i) {
      const double f = std::pow(r.theta, -2.0 * i / hd);
      const double wavelen = 2 * std::numbers::pi / f;
      const double old = static_cast<double>(r.original_max_position);
      double want = f;
      if (wavelen < old / r.high_freq_factor) {
        ++kept;
      } else if (wavelen > old / r.low_freq_factor) {
        want = f / r.factor;
        ++scaled;
      } else {
        const double sm =
            (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        want = (1 - sm) * f / r.factor + sm * f;
        ++smoothed;
      }
      // The fp32 chain's error is absolute in the smooth factor, so it scales with f, not
      // with the result (f / factor near the low-frequency edge): measured up to 1.33·2⁻²⁴·f.
      EXPECT_NEAR(got[i], want, 2 * 0x1p-24 * f) << "hd " << hd << " i " << i;
    }
    EXPECT_GT(kept, 0);
    EXPECT_GT(scaled, 0);
    EXPECT_GT(smoothed, 0);
  }
  RopeConfig bad = llama3_scaled(8.0);
  bad.high_freq_factor = bad.low_freq_factor;  // HF would divide by zero
  EXPECT_THROW(rope_inv_freq(64, bad), std::invalid_argument);
  EXPECT_THROW(rope_inv_freq(63, RopeConfig{}), std::invalid_argument);
  EXPECT_THROW(rope_inv_freq(64, RopeConfig{0.0}), std::invalid_argument);
}

// (kind, label) -> values, from the file tests/python/test_rope_reference.py writes.
std::map<std::pair<std::string, std::string>, std::vector<float>> read_torch_reference() {
  std::ifstream in(MEMTRADE_SOURCE_DIR "/tests/kernels/fixtures/rope_torch_reference.txt");
  EXPECT_TRUE(in.good()) << "fixture missing";
  std::map<std::pair<std::string, std::string>, std::vector<float>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string kind, label, v;
    std::size_t count = 0;
    s >> kind >> label >> count;
    auto& vals = out[{kind, label}];
    while (s >> v) vals.push_back(std::strtof(v.c_str(), nullptr));
    EXPECT_EQ(vals.size(), count) << kind << " " << label;
  }
  return out;
}

std::int64_t ulp_distance(float a, float b) {
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<std::int64_t>(ia) - ib);
}

// PyTorch's inv_freq (HF's formulas, torch fp32 ops) are the same floats, for the real configs
// and for a synthetic one whose factors make every rounding step visible; cos and sin of the
// rotation at positions 1, 100 and 4095 (read off rope_forward applied to unit vectors) are
// within an ulp of torch's (SLEEF's 1-ulp cos/sin there, correctly rounded ones here).
TEST_F(OpsTest, RopeMatchesPyTorch) {
  const auto ref = read_torch_reference();
  const std::vector<int> positions{1, 100, 4095};
  const std::vector<std::tuple<std::string, int, RopeConfig>> cases{
      {"theta1e4_hd64", 64, RopeConfig{}},
      {"llama3_8b", 128, RopeConfig{500000.0}},
      {"llama3.1_8b", 128, llama3_scaled(8.0)},
      {"llama3.2_1b", 64, llama3_scaled(32.0)},
      {"llama3.2_3b", 128, llama3_scaled(32.0)},
      {"synthetic", 128, RopeConfig{10000.0, 3.0, 1.0, 7.0, 3000}}};
  for (const auto& [label, hd, rope] : cases) {
    const auto inv = rope_inv_freq(hd, rope);
    const auto& want_inv = ref.at({"inv_freq", label});
    ASSERT_EQ(inv.size(), want_inv.size()) << label;
    for (std::size_t i = 0; i < inv.size(); ++i)
      EXPECT_EQ(inv[i], want_inv[i]) << label << " inv_freq[" << i << "]";

    // One query head of [1 … 1, 0 … 0] becomes [cos, sin] at every position.
    const int t = positions.back() + 1, half = hd / 2;
    std::vector<float> x(static_cast<std::size_t>(t) * 3 * hd, 0.0f);
    for (int p = 0; p < t; ++p)
      for (int i = 0; i < half; ++i) x[static_cast<std::size_t>(p) * 3 * hd + i] = 1.0f;
    Tensor qkv = make({1, t, 3 * hd}, x);
    ops().rope_forward(qkv, 1, 1, rope);
    const auto y = get(qkv);
    const auto& cos = ref.at({"cos", label});
    const auto& sin = ref.at({"sin", label});
    std::int64_t worst = 0;
    for (std::size_t k = 0; k < positions.size(); ++k)
      for (int i = 0; i < hd; ++i) {
        const std::size_t at = static_cast<std::size_t>(positions[k]) * 3 * hd;
        const float c = y[at + i % half], s = y[at + half + i % half];
        worst =
            std::max({worst, ulp_distance(c, cos[k * hd + i]), ulp_distance(s, sin[k * hd + i])});
      }
    EXPECT_LE(worst, 1) << label << ": cos/sin off torch's by " << worst << " ulps";
  }
}

TEST_F(OpsTest, SwigluForwardBackward) {
  const int n = 3, c = 7;
  auto g = rand_vec(n * c, 10, 4.0f), u = rand_vec(n * c, 11), r = rand_vec(n * c, 12);
  Tensor tg = make({n, c}, g), tu = make({n, c}, u), out = garbage({n, c});
  ops().swiglu_forward(out, tg, tu);
  expect_close(get(out), ref_swiglu(to_d(g), to_d(u)), 1e-7, 1e-6, "swiglu");

  Tensor dout = make({n, c}, r), dg = garbage({n, c}), du = garbage({n, c});
  ops().swiglu_backward(dg, du, dout, tg, tu);
  const Vec rd = to_d(r);
  auto want_g = fd_grad([&](const Vec& v) { return ref_swiglu(v, to_d(u)); }, to_d(g), rd);
  auto want_u = fd_grad([&](const Vec& v) { return ref_swiglu(to_d(g), v); }, to_d(u), rd);
  expect_close(get(dg), want_g, 1e-6, 1e-5, "swiglu dgate");
  expect_close(get(du), want_u, 1e-6, 1e-5, "swiglu dup");
  // In place: dgate over gate and dup over up; then dgate over dout.
  ops().swiglu_backward(tg, tu, dout, tg, tu);
  expect_close(get(tg), want_g, 1e-6, 1e-5, "swiglu dgate over gate");
  expect_close(get(tu), want_u, 1e-6, 1e-5, "swiglu dup over up");
  Tensor g2 = make({n, c}, g), u2 = make({n, c}, u);
  ops().swiglu_backward(dout, du, dout, g2, u2);
  expect_close(get(dout), want_g, 1e-6, 1e-5, "swiglu dgate over dout");
  // The saturated ends: no NaN from exp overflow.
  Tensor big = make({4}, {-200.0f, -90.0f, 90.0f, 200.0f}), one = make({4}, {1, 1, 1, 1}),
         o = garbage({4});
  ops().swiglu_forward(o, big, one);
  expect_close(get(o), {-0.0, -0.0, 90.0, 200.0}, 1e-30, 0, "swiglu saturation");
}

TEST_F(OpsTest, LlamaOpsRejectBadArguments) {
  Tensor qkv = zeros({2, 3, 8 * 8});  // (4 + 2·2) heads of 8
  EXPECT_NO_THROW(ops().rope_forward(qkv, 4, 2, RopeConfig{}));
  EXPECT_THROW(ops().rope_backward(qkv, 5, 1, RopeConfig{}), std::invalid_argument);  // 64 % 7
  // Head counts GQA cannot share, in layouts that would divide evenly.
  Tensor ten = zeros({1, 2, 10 * 8}), seven = zeros({1, 2, 7 * 8});
  EXPECT_THROW(ops().rope_forward(ten, 2, 4, RopeConfig{}), std::invalid_argument);    // nkv > nh
  EXPECT_THROW(ops().rope_forward(seven, 3, 2, RopeConfig{}), std::invalid_argument);  // 3 % 2
  EXPECT_THROW(ops().rope_forward(seven, 7, 0, RopeConfig{}), std::invalid_argument);  // nkv 0
  Tensor odd = zeros({1, 2, 9});  // three heads of 3
  EXPECT_THROW(ops().rope_forward(odd, 1, 1, RopeConfig{}), std::invalid_argument);
  Tensor flat = zeros({6, 64});
  EXPECT_THROW(ops().rope_forward(flat, 4, 2, RopeConfig{}), std::invalid_argument);

  Tensor x = zeros({4, 6}), w = zeros({6}), out = zeros({4, 6}), rstd = zeros({4});
  Tensor rstd16 = zeros({4}, DType::BF16), w5 = zeros({5});
  EXPECT_THROW(ops().rmsnorm_forward(out, rstd16, x, w, 1e-5f), std::invalid_argument);
  EXPECT_THROW(ops().rmsnorm_forward(out, rstd, x, w5, 1e-5f), std::invalid_argument);
  EXPECT_THROW(ops().rmsnorm_backward(out, &w5, x, x, w, rstd, false), std::invalid_argument);

  Tensor a = zeros({4, 6}), b = zeros({4, 5});
  EXPECT_THROW(ops().swiglu_forward(out, a, b), std::invalid_argument);
  EXPECT_THROW(ops().swiglu_backward(out, b, a, a, a), std::invalid_argument);
}

// The memory model runs these through make_dry_run_ops: it must allocate what the real ops do
// (nothing, today), in every dtype.
TEST_F(OpsTest, LlamaOpsDryRunAllocatesAsTheRealOps) {
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
    const int n = 8, c = 64, nh = 4, nkv = 2;
    Tensor x = make({n, c}, rand_vec(n * c, 13), dt), w = make({c}, rand_vec(c, 14), dt);
    Tensor y = zeros({n, c}, dt), rstd = zeros({n}), dx = zeros({n, c}, dt), dw = zeros({c}, dt);
    Tensor qkv = make({2, 4, (nh + 2 * nkv) * 16}, rand_vec(2 * 4 * 128, 15), dt);
    Tensor dg = zeros({n, c}, dt), du = zeros({n, c}, dt);
    const std::vector<std::function<void(Ops&)>> calls{
        [&](Ops& o) { o.rmsnorm_forward(y, rstd, x, w, 1e-5f); },
        [&](Ops& o) { o.rmsnorm_backward(dx, &dw, y, x, w, rstd, true); },
        [&](Ops& o) { o.rope_forward(qkv, nh, nkv, llama3_scaled(32.0)); },
        [&](Ops& o) { o.rope_backward(qkv, nh, nkv, RopeConfig{}); },
        [&](Ops& o) { o.swiglu_forward(y, x, dx); },
        [&](Ops& o) { o.swiglu_backward(dg, du, y, x, dx); }};
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
