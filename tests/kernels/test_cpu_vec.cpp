// The CPU's vectorised loops (kernels/cpu/cpu_vec.h): every instruction-set path this machine has
// gives the SSE2 path's bits, exp is within 1 ulp of the true value, the activations match their
// double-precision formulas, and sums follow the documented lane order exactly.
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/cpu_vec.h"
#include "kernels/optimizer_math.h"
#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

namespace vec = cpu::vec;

// Restores the path in use when a test ends.
class VecTest : public ::testing::Test {
 protected:
  void TearDown() override { vec::set_isa(vec::best_isa()); }
  static std::vector<vec::Isa> paths() {
    std::vector<vec::Isa> p{vec::Isa::sse2};
    if (vec::best_isa() >= vec::Isa::avx2) p.push_back(vec::Isa::avx2);
    if (vec::best_isa() >= vec::Isa::avx512) p.push_back(vec::Isa::avx512);
    return p;
  }
};

// Random values over several magnitudes plus the special ones, at odd lengths (vector tails).
std::vector<float> inputs(std::size_t n, std::uint32_t seed, float spread) {
  std::vector<float> v = rand_vec(n, seed, spread);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,  -0.0f,   inf,      -inf,    std::nanf(""), 1e-40f, -1e-40f,
                            88.7f, -87.4f,  -103.9f,  89.5f,   -120.0f,       20.0f,  -20.0f,
                            5e-8f, 1.0e30f, -1.0e30f, 0.6931f, 3.4e38f};
  for (std::size_t i = 0; i < std::size(specials) && i < n; ++i) v[i * 7 % n] = specials[i];
  return v;
}

// Every NaN as one pattern: which NaN operand's payload survives an operation depends on the
// operand order the compiler picked (kernels/ops.h: NaN payloads may differ).
std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    b[i] = std::isnan(v[i]) ? 0x7fc00000u : std::bit_cast<std::uint32_t>(v[i]);
  return b;
}

// Runs `f` (which writes its outputs into the vector it returns) on every path and checks that
// each gives the SSE2 path's bits.
void expect_same_bits_on_every_path(const std::vector<vec::Isa>& paths,
                                    const std::function<std::vector<float>()>& f,
                                    const std::string& what) {
  vec::set_isa(vec::Isa::sse2);
  const auto want = bits(f());
  for (vec::Isa p : paths) {
    vec::set_isa(p);
    EXPECT_EQ(bits(f()), want) << what << " on " << vec::isa_name(p);
  }
}

TEST_F(VecTest, EveryPathGivesTheSameBits) {
  const float sentinel_of_accumulate3 = std::bit_cast<float>(0x7fc00123u);
  for (std::size_t n : {1u, 7u, 16u, 33u, 257u, 1000u}) {
    const auto x = inputs(n, 11, 30.0f), g = inputs(n, 12, 2.0f), u = inputs(n, 13, 3.0f);
    const auto w = rand_vec(n, 14);
    const std::string at = " n=" + std::to_string(n);
    auto unary = [&](auto fn) {
      return [&, fn] {
        std::vector<float> y(n);
        fn(y);
        return y;
      };
    };
    expect_same_bits_on_every_path(paths(), unary([&](std::vector<float>& y) {
                                     vec::exp_shifted(x.data(), 1.5f, y.data(), n);
                                   }),
                                   "exp" + at);
    expect_same_bits_on_every_path(
        paths(), unary([&](std::vector<float>& y) { vec::gelu_forward(x.data(), y.data(), n); }),
        "gelu" + at);
    expect_same_bits_on_every_path(paths(), unary([&](std::vector<float>& y) {
                                     vec::gelu_backward(g.data(), x.data(), y.data(), n);
                                   }),
                                   "gelu backward" + at);
    expect_same_bits_on_every_path(paths(), unary([&](std::vector<float>& y) {
                                     vec::swiglu_forward(x.data(), u.data(), y.data(), n);
                                   }),
                                   "swiglu" + at);
    expect_same_bits_on_every_path(
        paths(),
        [&] {
          std::vector<float> dg(n), du(n);
          vec::swiglu_backward(g.data(), x.data(), u.data(), dg.data(), du.data(), n);
          dg.insert(dg.end(), du.begin(), du.end());
          return dg;
        },
        "swiglu backward" + at);
    for (std::int64_t stride : {1, 2, 3}) {  // im2col's strided rows: a copy, so x's own bits
      const auto wide = inputs(n * 3, 15, 5.0f);
      std::vector<float> y(n), want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = wide[i * static_cast<std::size_t>(stride)];
      for (vec::Isa p : paths()) {
        vec::set_isa(p);
        vec::gather_strided(wide.data(), stride, y.data(), static_cast<std::int64_t>(n));
        EXPECT_EQ(bits(y), bits(want))
            << "gather stride " << stride << at << " on " << vec::isa_name(p);
      }
    }
    expect_same_bits_on_every_path(paths(), unary([&](std::vector<float>& y) {
                                     y = w;
                                     vec::accumulate(x.data(), y.data(), n);
                                   }),
                                   "accumulate" + at);
    for (vec::Isa p : paths()) {  // three taps' fold: ((y + a) + b) + c, nothing past n
      vec::set_isa(p);
      auto y = w;
      y.push_back(sentinel_of_accumulate3);
      auto want = y;
      for (std::size_t i = 0; i < n; ++i) want[i] = ((want[i] + x[i]) + g[i]) + u[i];
      vec::accumulate3(x.data(), g.data(), u.data(), y.data(), static_cast<std::int64_t>(n));
      EXPECT_EQ(bits(y), bits(want)) << "accumulate3" << at << " on " << vec::isa_name(p);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(y[n]), 0x7fc00123u) << "accumulate3 past n" << at;
    }
    for (vec::Isa p : paths()) {  // the stride-2 fold: y[2i] += x[i], nothing else changes
      vec::set_isa(p);
      auto y = w;
      y.resize(2 * n + 1, 7.0f);
      auto want = y;
      for (std::size_t i = 0; i < n; ++i) want[2 * i] += x[i];
      const float sentinel = std::bit_cast<float>(0x7fc00123u);  // must stay untouched
      y[2 * n - 1] = want[2 * n - 1] = sentinel;
      vec::accumulate_stride2(x.data(), y.data(), static_cast<std::int64_t>(n));
      EXPECT_EQ(bits(y), bits(want)) << "accumulate_stride2" << at << " on " << vec::isa_name(p);
    }
    // The element-wise ops' loops: their scalar formulas' bits on every path (NaN, ±0 included).
    auto special = w;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t i = 0; i < n; i += 5)
      special[i] = i % 15 == 0 ? nan : i % 10 == 0 ? -0.0f : 0.0f;
    for (vec::Isa p : paths()) {
      vec::set_isa(p);
      std::vector<float> sum(n), fwd(n), bwd(n);
      vec::add(x.data(), special.data(), sum.data(), static_cast<std::int64_t>(n));
      vec::relu_forward(special.data(), fwd.data(), static_cast<std::int64_t>(n));
      vec::relu_backward(special.data(), x.data(), bwd.data(), static_cast<std::int64_t>(n));
      std::vector<float> bn(n), dx(n);
      vec::batchnorm_apply(w.data(), 0.1f, 1.7f, 0.9f, -0.2f, bn.data(),
                           static_cast<std::int64_t>(n));
      vec::batchnorm_dx(w.data(), g.data(), 0.1f, 1.7f, 0.03f, 64.0f, 1.5f, -2.5f, dx.data(),
                        static_cast<std::int64_t>(n));
      for (std::size_t i = 0; i < n; ++i) {
        SCOPED_TRACE(std::string(vec::isa_name(p)) + at + " i=" + std::to_string(i));
        const float v = special[i];
        EXPECT_EQ(std::bit_cast<std::uint32_t>(sum[i]), std::bit_cast<std::uint32_t>(x[i] + v));
        EXPECT_EQ(std::bit_cast<std::uint32_t>(fwd[i]),
                  std::bit_cast<std::uint32_t>(v <= 0.0f ? 0.0f : v));
        EXPECT_EQ(std::bit_cast<std::uint32_t>(bwd[i]),
                  std::bit_cast<std::uint32_t>(x[i] > 0.0f ? v : 0.0f));
        EXPECT_EQ(std::bit_cast<std::uint32_t>(bn[i]),
                  std::bit_cast<std::uint32_t>((w[i] - 0.1f) * 1.7f * 0.9f + -0.2f));
        EXPECT_EQ(std::bit_cast<std::uint32_t>(dx[i]),
                  std::bit_cast<std::uint32_t>(
                      0.03f * (64.0f * g[i] - 1.5f - (w[i] - 0.1f) * 1.7f * -2.5f)));
      }
    }
    // Scalar results as floats: each double's bits in four 16-bit pieces, exact as floats.
    auto scalars = [](std::initializer_list<double> d) {
      std::vector<float> out;
      for (double v : d)
        for (int shift = 0; shift < 64; shift += 16)
          out.push_back(static_cast<float>((std::bit_cast<std::uint64_t>(v) >> shift) & 0xffff));
      return out;
    };
    expect_same_bits_on_every_path(
        paths(),
        [&] {
          std::vector<float> e(n);
          const double s = vec::exp_sum(g.data(), 0.5f, e.data(), n);
          auto out = scalars({s, vec::exp_sum(g.data(), 0.5f, nullptr, n), vec::sum(w.data(), n),
                              vec::dot(w.data(), u.data(), n), vec::sum_sq_dev(w.data(), 0.25, n)});
          double a = 0, b = 0;
          vec::layernorm_backward_sums(w.data(), u.data(), g.data(), 0.1f, 1.7f, n, a, b);
          for (float v : scalars({a, b})) out.push_back(v);
          double sg = 1.0, sgx = -1.0;
          vec::batchnorm_backward_sums(w.data(), u.data(), 0.1f, 1.7f, n, sg, sgx);
          for (float v : scalars({sg, sgx})) out.push_back(v);
          out.push_back(vec::max(x.data(), n));
          out.insert(out.end(), e.begin(), e.end());
          return out;
        },
        "sums" + at);
  }
}

// Raw bits, NaN included (a float that must be left alone keeps its payload).
std::uint32_t raw(float v) {
  return std::bit_cast<std::uint32_t>(v);
}

// im2col's and col2im's strided rows (kernels/cpu/cpu_ops_conv.cpp) on every path: the scalar
// formulas' bits, at ragged row lengths, offsets and row pitches, with nothing outside the rows
// written. The sources sit at the very ends of their buffers, where a load past the last read (or
// before the first) would show under a sanitizer.
TEST_F(VecTest, StridedConvolutionRowsOnEveryPath) {
  const float sentinel = std::bit_cast<float>(0x7fc00123u);
  for (vec::Isa p : paths()) {
    vec::set_isa(p);
    for (std::int64_t rows : {1, 2, 3, 7})
      for (std::int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 33})
        for (std::int64_t pad : {0, 1, 5}) {  // ldy = 2n + pad, ldx = n + pad
          const std::int64_t ldx = n + pad, ldy = 2 * n + pad;
          const std::string at = std::string(" on ") + vec::isa_name(p) +
                                 " rows=" + std::to_string(rows) + " n=" + std::to_string(n) +
                                 " pad=" + std::to_string(pad);
          // accumulate_stride2_rows: y[r·ldy + 2i] += x[r·ldx + i], the rest of y untouched.
          const auto xs = inputs(static_cast<std::size_t>((rows - 1) * ldx + n), 21, 4.0f);
          const std::int64_t span = (rows - 1) * ldy + 2 * n - 1, guard = 24;
          auto y = inputs(static_cast<std::size_t>(span + 2 * guard), 22, 3.0f);
          for (std::int64_t i = 0; i < guard; ++i) y[i] = y[guard + span + i] = sentinel;
          auto want = y;
          std::vector<bool> changed(y.size());
          for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t i = 0; i < n; ++i) {
              const auto k = static_cast<std::size_t>(guard + r * ldy + 2 * i);
              want[k] += xs[r * ldx + i];
              changed[k] = true;
            }
          vec::accumulate_stride2_rows(xs.data(), ldx, y.data() + guard, ldy, rows, n);
          for (std::size_t k = 0; k < y.size(); ++k)
            if (changed[k] && std::isnan(want[k]))
              EXPECT_TRUE(std::isnan(y[k])) << "accumulate_stride2_rows" << at << " k=" << k;
            else
              EXPECT_EQ(raw(y[k]), raw(want[k])) << "accumulate_stride2_rows" << at << " k=" << k;
          // gather_strided_rows: y[r·ldy + lo + j] = x[r·ldx + j·stride], 0 elsewhere in the
          // row's width, nothing between the rows written.
          for (std::int64_t stride : {1, 2, 3})
            for (std::int64_t lo : {0, 1, 3}) {
              const std::int64_t width = lo + n + pad % 3, gx = stride * n + pad;
              const auto src = inputs(
                  static_cast<std::size_t>((rows - 1) * gx + stride * (n - 1) + 1), 23, 5.0f);
              const std::int64_t gy = width + pad;
              std::vector<float> out(static_cast<std::size_t>(rows * gy), sentinel);
              auto expect = out;
              for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t i = 0; i < width; ++i)
                  expect[r * gy + i] =
                      i >= lo && i < lo + n ? src[r * gx + (i - lo) * stride] : 0.0f;
              vec::gather_strided_rows(src.data(), gx, stride, out.data(), gy, rows, lo, n, width);
              for (std::size_t k = 0; k < out.size(); ++k)
                EXPECT_EQ(raw(out[k]), raw(expect[k]))
                    << "gather_strided_rows stride " << stride << " lo " << lo << at << " k=" << k;
            }
        }
  }
}

// transpose_to_panels (the weight gradient's B panels): rows become panel columns, rows past the
// last as 0, every float of the panels' rows written and nothing else, at ragged rows and widths.
TEST_F(VecTest, TransposeToPanelsOnEveryPath) {
  const float sentinel = std::bit_cast<float>(0x7fc00123u);
  for (vec::Isa p : paths()) {
    vec::set_isa(p);
    for (std::int64_t lanes : {8, 16, 32})
      for (std::int64_t rows : {1, 7, 8, 9, 16, 23, 40})
        for (std::int64_t width : {1, 7, 8, 13, 16, 33}) {
          const std::int64_t lds = width + 3, panels = (rows + lanes - 1) / lanes;
          const std::int64_t ldp = width * lanes + 5;  // a gap between panels, left alone
          const auto src = inputs(static_cast<std::size_t>(rows * lds), 31, 6.0f);
          std::vector<float> dst(static_cast<std::size_t>(panels * ldp), sentinel);
          auto want = dst;
          for (std::int64_t r = 0; r < panels * lanes; ++r)
            for (std::int64_t q = 0; q < width; ++q)
              want[(r / lanes) * ldp + q * lanes + r % lanes] = r < rows ? src[r * lds + q] : 0.0f;
          vec::transpose_to_panels(src.data(), lds, rows, width, lanes, dst.data(), ldp);
          for (std::size_t k = 0; k < dst.size(); ++k)
            EXPECT_EQ(raw(dst[k]), raw(want[k]))
                << "transpose_to_panels on " << vec::isa_name(p) << " lanes=" << lanes
                << " rows=" << rows << " width=" << width << " k=" << k;
        }
  }
}

// The optimizer's element arithmetic (kernels/optimizer_math.h) vectorised: every kind, every
// path, the same bits as SSE2, and as the scalar template itself.
TEST_F(VecTest, OptimizerStepIsTheScalarArithmeticOnEveryPath) {
  const std::size_t n = 1003;
  const auto p = rand_vec(n, 41), g = rand_vec(n, 42), s0 = rand_vec(n, 43, 0.1f);
  auto s1 = rand_vec(n, 44, 0.01f);
  for (auto& v : s1) v = std::fabs(v);
  for (OptimizerKind kind :
       {OptimizerKind::sgd, OptimizerKind::sgd_momentum, OptimizerKind::adam, OptimizerKind::adamw,
        OptimizerKind::adagrad, OptimizerKind::rmsprop}) {
    OptimizerHyper h;
    h.kind = kind;
    h.lr = 0.01f;
    h.weight_decay = 0.1f;
    h.step = 3;
    h.grad_scale = 0.5f;
    const OptimizerScalars a = optimizer_scalars(h);
    auto run = [&] {
      std::vector<float> out(3 * n);
      vec::optimizer_step(a, p.data(), g.data(), s0.data(), s1.data(), out.data(), out.data() + n,
                          out.data() + 2 * n, static_cast<std::int64_t>(n));
      return out;
    };
    expect_same_bits_on_every_path(paths(), run,
                                   "optimizer kind " + std::to_string(static_cast<int>(kind)));
    const auto got = run();
    dispatch_optimizer(kind, [&](auto k) {
      for (std::size_t i = 0; i < n; ++i) {
        float m0 = s0[i], m1 = s1[i];
        const float w = optimizer_element<decltype(k)::value>(a, p[i], g[i], m0, m1);
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(w)) << i;
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got[n + i]), std::bit_cast<std::uint32_t>(m0));
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got[2 * n + i]), std::bit_cast<std::uint32_t>(m1));
      }
    });
  }
}

// bfloat16 conversions: dtype.h's bits for every path, over a sweep of all float bit patterns
// (NaNs with payloads, infinities, subnormals, ties) and every bfloat16.
TEST_F(VecTest, Bf16ConversionsAreDtypeHsOnEveryPath) {
  std::vector<float> f;
  for (std::uint64_t b = 0; b <= 0xffffffffull; b += 65521) {
    f.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(b)));
    f.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(b) | 0x8000u));  // a tie
  }
  std::vector<std::uint16_t> h(65536);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint16_t>(i);
  for (vec::Isa p : paths()) {
    vec::set_isa(p);
    std::vector<std::uint16_t> got(f.size());
    vec::f32_to_bf16(f.data(), got.data(), static_cast<std::int64_t>(f.size()));
    std::vector<float> back(h.size());
    vec::bf16_to_f32(h.data(), back.data(), static_cast<std::int64_t>(h.size()));
    int bad = 0;
    for (std::size_t i = 0; i < f.size(); ++i) bad += got[i] != float_to_bf16(f[i]);
    for (std::size_t i = 0; i < h.size(); ++i)
      bad += std::bit_cast<std::uint32_t>(back[i]) !=
             std::bit_cast<std::uint32_t>(bf16_to_float(h[i]));
    EXPECT_EQ(bad, 0) << vec::isa_name(p);
  }
}

// ulps between a float and the double it approximates.
double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const double ulp =
      std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity()) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

TEST_F(VecTest, ExpWithinOneUlpOverEveryMagnitude) {
  std::vector<float> x;
  for (std::uint64_t b = 0; b <= 0xffffffffull; b += 4093) {
    const float v = std::bit_cast<float>(static_cast<std::uint32_t>(b));
    if (!std::isnan(v)) x.push_back(v);
  }
  std::vector<float> y(x.size());
  vec::exp_shifted(x.data(), 0.0f, y.data(), static_cast<std::int64_t>(x.size()));
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    if (want > std::numeric_limits<float>::max()) {
      EXPECT_EQ(y[i], std::numeric_limits<float>::infinity()) << "exp(" << x[i] << ")";
    } else if (want < std::numeric_limits<float>::min()) {  // subnormal or 0: absolute
      EXPECT_LE(std::fabs(y[i] - want), std::numeric_limits<float>::denorm_min())
          << "exp(" << x[i] << ")";
    } else {
      worst = std::max(worst, ulps(y[i], want));
    }
  }
  EXPECT_LE(worst, 1.0);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> sp{-inf, inf, std::nanf(""), 0.0f, -0.0f}, out(sp.size());
  vec::exp_shifted(sp.data(), 0.0f, out.data(), 5);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], inf);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 1.0f);
  EXPECT_EQ(out[4], 1.0f);
}

TEST_F(VecTest, ActivationsMatchTheirFormulas) {
  const std::size_t n = 4001;
  auto x = rand_vec(n, 21, 8.0f), g = rand_vec(n, 22), u = rand_vec(n, 23, 2.0f);
  std::vector<float> y(n), dy(n), s(n), dg(n), du(n);
  vec::gelu_forward(x.data(), y.data(), n);
  vec::gelu_backward(g.data(), x.data(), dy.data(), n);
  vec::swiglu_forward(x.data(), u.data(), s.data(), n);
  vec::swiglu_backward(g.data(), x.data(), u.data(), dg.data(), du.data(), n);
  const double k = std::sqrt(2.0 / M_PI);
  for (std::size_t i = 0; i < n; ++i) {
    const double v = x[i], th = std::tanh(k * (v + 0.044715 * v * v * v));
    const double gelu = 0.5 * v * (1.0 + th);
    const double dgelu =
        0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * v * v);
    const double sig = 1.0 / (1.0 + std::exp(-v));
    EXPECT_NEAR(y[i], gelu, 1e-6 + 4e-7 * std::fabs(gelu)) << "gelu(" << v << ")";
    EXPECT_NEAR(dy[i], g[i] * dgelu, 1e-6 + 4e-7 * std::fabs(g[i] * dgelu)) << v;
    EXPECT_NEAR(s[i], v * sig * u[i], 1e-6 + 4e-7 * std::fabs(v * sig * u[i])) << v;
    const double want_dg = g[i] * u[i] * sig * (1.0 + v * (1.0 - sig)), want_du = g[i] * v * sig;
    EXPECT_NEAR(dg[i], want_dg, 1e-6 + 4e-7 * std::fabs(want_dg)) << v;
    EXPECT_NEAR(du[i], want_du, 1e-6 + 4e-7 * std::fabs(want_du)) << v;
  }
}

// The sums add element i into lane i mod kLanes, then the lanes in a fixed tree: the exact
// double result of that order, not just something close.
TEST_F(VecTest, SumsFollowTheLaneOrder) {
  for (std::size_t n : {0u, 5u, 8u, 255u, 256u, 257u, 3001u}) {
    const auto x = rand_vec(n, 31, 4.0f), w = rand_vec(n, 32), g = rand_vec(n, 33);
    auto lane_sum = [n](const std::function<double(std::size_t)>& term) {
      double a[vec::kLanes] = {};
      for (std::size_t i = 0; i < n; ++i) a[i % vec::kLanes] += term(i);
      return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    };
    const auto m = static_cast<std::int64_t>(n);
    EXPECT_EQ(vec::sum(x.data(), m), lane_sum([&](std::size_t i) { return x[i]; })) << n;
    EXPECT_EQ(vec::dot(x.data(), w.data(), m), lane_sum([&](std::size_t i) { return x[i] * w[i]; }))
        << n;
    EXPECT_EQ(vec::sum_sq_dev(x.data(), 0.3, m),
              lane_sum([&](std::size_t i) { return (x[i] - 0.3) * (x[i] - 0.3); }))
        << n;
    std::vector<float> e(n);
    vec::exp_shifted(x.data(), 2.0f, e.data(), m);
    EXPECT_EQ(vec::exp_sum(x.data(), 2.0f, nullptr, m),
              lane_sum([&](std::size_t i) { return e[i]; }))
        << n;
    double a = 0, b = 0;
    vec::layernorm_backward_sums(x.data(), g.data(), w.data(), 0.2f, 1.3f, m, a, b);
    EXPECT_EQ(a, lane_sum([&](std::size_t i) { return w[i] * g[i]; })) << n;
    EXPECT_EQ(b, lane_sum([&](std::size_t i) {
                const float dn = w[i] * g[i];
                return dn * (x[i] - 0.2f) * 1.3f;
              }))
        << n;
    double sg = 0.0, sgx = 0.0;
    vec::batchnorm_backward_sums(x.data(), g.data(), 0.2f, 1.3f, m, sg, sgx);
    EXPECT_EQ(sg, lane_sum([&](std::size_t i) { return g[i]; })) << n;
    EXPECT_EQ(sgx, lane_sum([&](std::size_t i) { return g[i] * (x[i] - 0.2f) * 1.3f; })) << n;
    float mx = -std::numeric_limits<float>::infinity();
    for (float v : x) mx = std::max(mx, v);
    EXPECT_EQ(vec::max(x.data(), m), mx) << n;
  }
}

TEST_F(VecTest, RefusesAPathTheCpuLacks) {
  if (vec::best_isa() == vec::Isa::avx512) GTEST_SKIP() << "this CPU has every path";
  EXPECT_THROW(vec::set_isa(vec::Isa::avx512), std::invalid_argument);
}

}  // namespace
}  // namespace memtrade::test
