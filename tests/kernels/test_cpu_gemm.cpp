// The CPU GEMM paths (kernels/cpu/cpu_gemm.h): every path this machine has against a
// double-precision reference, on shapes that cross every blocking loop (k past a packed block,
// n past a B block, m past an A block, ragged register blocks) in all four transpose cases; the
// beta = 0 rule; and the own paths' rounding contract, that the bits of an element of C depend
// neither on which rows or columns of C a call computes (so splitting among threads cannot
// change results) nor on the vector width (AVX2 and AVX-512 agree bit for bit).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"
#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

using cpu::GemmPath;

struct Shape {
  std::int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

// A GEMM on its own operands, with padded leading dimensions (lda etc. > the row length).
struct Problem {
  Shape s;
  std::int64_t lda, ldb, ldc;
  std::vector<float> a, b, c0;
  explicit Problem(const Shape& sh, std::uint32_t seed) : s(sh) {
    lda = (s.ta ? s.m : s.k) + 3;
    ldb = (s.tb ? s.k : s.n) + 5;
    ldc = s.n + 7;
    a = rand_vec(static_cast<std::size_t>((s.ta ? s.k : s.m) * lda), seed, 1.0f);
    b = rand_vec(static_cast<std::size_t>((s.tb ? s.n : s.k) * ldb), seed + 1, 1.0f);
    c0 = rand_vec(static_cast<std::size_t>(s.m * ldc), seed + 2, 1.0f);
  }
  float at(std::int64_t i, std::int64_t p) const { return s.ta ? a[p * lda + i] : a[i * lda + p]; }
  float bt(std::int64_t p, std::int64_t j) const { return s.tb ? b[j * ldb + p] : b[p * ldb + j]; }
  // C on `path`, from c0 (NaN everywhere when beta = 0, which must not be read).
  std::vector<float> run(GemmPath path) const {
    std::vector<float> c = c0;
    if (s.beta == 0.0f)
      for (std::int64_t i = 0; i < s.m; ++i)
        for (std::int64_t j = 0; j < s.n; ++j) c[i * ldc + j] = std::nanf("");
    cpu::set_gemm_path(path);
    cpu::sgemm(s.ta, s.tb, s.m, s.n, s.k, s.alpha, a.data(), lda, b.data(), ldb, s.beta, c.data(),
               ldc);
    return c;
  }
};

// Restores the path in use when a test ends.
class CpuGemm : public ::testing::Test {
 protected:
  void SetUp() override { initial_ = cpu::gemm_path(); }
  void TearDown() override { cpu::set_gemm_path(initial_); }
  GemmPath initial_ = GemmPath::blas;
  static std::vector<GemmPath> paths() {
    std::vector<GemmPath> p;
    for (GemmPath path : {GemmPath::blas, GemmPath::avx2, GemmPath::avx512})
      if (cpu::gemm_available(path)) p.push_back(path);
    return p;
  }
  static std::vector<GemmPath> own_paths() {
    std::vector<GemmPath> p = paths();
    p.erase(p.begin());  // blas
    return p;
  }
};

// m, n, k around the blocks (8 x 32 registers, k 256, A 128 rows, B 1024 columns).
const Shape kShapes[] = {
    {1, 1, 1, false, false, 1.0f, 0.0f},
    {7, 33, 5, false, true, 1.0f, 1.0f},
    {8, 32, 256, true, false, 0.5f, 0.0f},
    {9, 31, 257, true, true, 1.0f, -0.75f},
    {129, 65, 600, false, false, 1.0f, 1.0f},
    {17, 1100, 40, false, false, 2.0f, 0.0f},
    {3, 1030, 300, true, true, 1.0f, 1.0f},
    {150, 40, 513, false, true, -1.0f, 0.25f},
    {32, 288, 100, false, true, 1.0f, 0.0f},
    {288, 100, 32, true, false, 1.0f, 0.0f},
    // x·Wᵀ with few rows and a long k (the own paths' small-m route: kNr ≤ m ≤ 128, k ≥ 8·m):
    // across its 256-column chunks and k blocks, beta read and not, m on and off a panel's width.
    {64, 1030, 600, false, true, 1.0f, 0.5f},
    {128, 300, 1100, false, true, -1.0f, 1.0f},
    {40, 520, 330, false, true, 1.0f, 0.0f},
};

TEST_F(CpuGemm, EveryPathMatchesDoublePrecisionOnEveryBlockingLoop) {
  const float eps = std::numeric_limits<float>::epsilon();
  std::uint32_t seed = 11;
  for (const Shape& s : kShapes) {
    const Problem pr(s, seed += 3);
    for (GemmPath path : paths()) {
      const std::vector<float> c = pr.run(path);
      for (std::int64_t i = 0; i < s.m; ++i) {
        for (std::int64_t j = 0; j < pr.ldc; ++j) {
          const float got = c[i * pr.ldc + j];
          if (j >= s.n) {  // the padding between rows is never written
            ASSERT_EQ(got, pr.c0[i * pr.ldc + j]) << "padding written at " << i << "," << j;
            continue;
          }
          double ref = 0.0, mag = 0.0;
          for (std::int64_t p = 0; p < s.k; ++p) {
            ref += static_cast<double>(pr.at(i, p)) * pr.bt(p, j);
            mag += std::fabs(static_cast<double>(pr.at(i, p)) * pr.bt(p, j));
          }
          const double old = s.beta == 0.0f ? 0.0 : pr.c0[i * pr.ldc + j];
          ref = s.alpha * ref + s.beta * old;
          // A k-term float sum is within k·eps·Σ|terms| of the exact one; plus the two scalings.
          const double tol = (static_cast<double>(s.k) + 3) * eps *
                             (std::fabs(s.alpha) * mag + std::fabs(s.beta * old));
          ASSERT_NEAR(got, ref, tol + 1e-30)
              << cpu::gemm_path_name(path) << " m" << s.m << " n" << s.n << " k" << s.k << " ta"
              << s.ta << " tb" << s.tb << " at " << i << "," << j;
        }
      }
    }
  }
}

TEST_F(CpuGemm, OwnBitsDoNotDependOnTheRowsColumnsOrVectorWidthOfACall) {
  if (own_paths().empty()) GTEST_SKIP() << "this CPU has neither AVX2 with FMA nor AVX-512F";
  // The first: 129 rows take the general route, its row blocks of 40 the small-m route of x·Wᵀ,
  // which must give the same bits; the third is small-m whole and in row blocks of 40, general
  // in row blocks of 13 (narrower than a panel).
  for (const Shape& s : {Shape{129, 1100, 600, false, true, 1.0f, 0.0f},
                         Shape{150, 70, 513, true, false, 0.5f, 1.0f},
                         Shape{100, 700, 900, false, true, 0.5f, 1.0f}}) {
    const Problem pr(s, 101);
    const std::vector<float> whole = pr.run(own_paths().front());
    for (GemmPath path : own_paths()) {
      SCOPED_TRACE(cpu::gemm_path_name(path));
      // The same bits on every own path: one order of the k sums, whatever the vector width.
      const std::vector<float> other = pr.run(path);
      for (std::size_t i = 0; i < whole.size(); ++i) ASSERT_EQ(other[i], whole[i]) << "at " << i;
      // Row blocks and column blocks of odd sizes, each its own call on offset operands.
      for (std::int64_t block : {std::int64_t{13}, std::int64_t{40}}) {
        std::vector<float> rows = pr.c0, cols = pr.c0;
        for (std::int64_t i0 = 0; i0 < s.m; i0 += block) {
          const std::int64_t len = std::min(block, s.m - i0);
          cpu::own_sgemm(s.ta, s.tb, len, s.n, s.k, s.alpha,
                         s.ta ? pr.a.data() + i0 : pr.a.data() + i0 * pr.lda, pr.lda, pr.b.data(),
                         pr.ldb, s.beta, rows.data() + i0 * pr.ldc, pr.ldc);
        }
        for (std::int64_t j0 = 0; j0 < s.n; j0 += block) {
          const std::int64_t len = std::min(block, s.n - j0);
          cpu::own_sgemm(s.ta, s.tb, s.m, len, s.k, s.alpha, pr.a.data(), pr.lda,
                         s.tb ? pr.b.data() + j0 * pr.ldb : pr.b.data() + j0, pr.ldb, s.beta,
                         cols.data() + j0, pr.ldc);
        }
        for (std::int64_t i = 0; i < s.m; ++i)
          for (std::int64_t j = 0; j < s.n; ++j) {
            const std::int64_t at = i * pr.ldc + j;
            ASSERT_EQ(rows[at], whole[at]) << "row blocks of " << block << " at " << i << "," << j;
            ASSERT_EQ(cols[at], whole[at])
                << "column blocks of " << block << " at " << i << "," << j;
          }
      }
    }
  }
}

TEST_F(CpuGemm, PackedAItsRowRangesAndBAlreadyInPanelFormGiveTheSameBits) {
  if (own_paths().empty()) GTEST_SKIP() << "this CPU has neither AVX2 with FMA nor AVX-512F";
  for (GemmPath path : own_paths()) {
    cpu::set_gemm_path(path);
    const std::int64_t width = cpu::gemm_panel_width(), panel = cpu::gemm_panel_rows();
    SCOPED_TRACE(cpu::gemm_path_name(path));
    // m = 300: more rows than one packed block (kMc), so the whole A is packed in one pack_a.
    for (const auto& [ta, m] :
         {std::pair{false, 70}, std::pair{true, 70}, std::pair{false, 300}, std::pair{true, 300}}) {
      const std::int64_t k = 600, n = width;
      const std::int64_t lda = (ta ? m : k) + 1;
      const std::vector<float> a = rand_vec(static_cast<std::size_t>((ta ? k : m) * lda), 5, 1.0f);
      // B (k, width) twice: rows `width` floats apart and 64-byte aligned (read in place as its
      // own packed panel), and rows width + 1 apart (packed as usual).
      std::vector<float> storage(static_cast<std::size_t>(k * n + 16));
      float* in_place = storage.data();
      while (reinterpret_cast<std::uintptr_t>(in_place) % 64 != 0) ++in_place;
      std::vector<float> strided(static_cast<std::size_t>(k * (n + 1)));
      const std::vector<float> bv = rand_vec(static_cast<std::size_t>(k * n), 6, 1.0f);
      for (std::int64_t p = 0; p < k; ++p)
        for (std::int64_t j = 0; j < n; ++j)
          in_place[p * n + j] = strided[p * (n + 1) + j] = bv[p * n + j];
      const std::vector<float> c0 = rand_vec(static_cast<std::size_t>(m * n), 7, 1.0f);
      for (float beta : {0.0f, 1.0f}) {
        std::vector<float> want = c0, packed = c0, in_panel = c0;
        cpu::own_sgemm(ta, false, m, n, k, 1.0f, a.data(), lda, strided.data(), n + 1, beta,
                       want.data(), n);
        const cpu::PackedA pa(ta, m, k, a.data(), lda);
        cpu::own_sgemm(pa, 0, m, false, n, 1.0f, strided.data(), n + 1, beta, packed.data(), n);
        cpu::own_sgemm(pa, 0, m, false, n, 1.0f, in_place, n, beta, in_panel.data(), n);
        // Rows [2·panel, 2·panel + 40) of the packed A alone: those rows of the whole product.
        const std::int64_t r0 = 2 * panel, r1 = r0 + 40;
        std::vector<float> part = c0;
        cpu::own_sgemm(pa, r0, r1 - r0, false, n, 1.0f, strided.data(), n + 1, beta,
                       part.data() + r0 * n, n);
        for (std::size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(packed[i], want[i]) << "packed A, ta " << ta << " beta " << beta << " at " << i;
          ASSERT_EQ(in_panel[i], want[i])
              << "B in place, ta " << ta << " beta " << beta << " at " << i;
          const auto row = static_cast<std::int64_t>(i) / n;
          ASSERT_EQ(part[i], row >= r0 && row < r1 ? want[i] : c0[i]) << "row range, at " << i;
        }
        EXPECT_THROW(
            cpu::own_sgemm(pa, panel / 2 + 1, 4, false, n, 1.0f, in_place, n, beta, part.data(), n),
            std::invalid_argument);
      }
    }
  }
}

// fill_panel_lanes on every own path: lanes stepping by 1 and by 2 within a group of 8, and in
// no pattern (a gather), under random masks: set lanes are their source float, clear ones 0
// whatever the source holds there (NaN here).
TEST_F(CpuGemm, FillPanelLanesReadsTheSetLanesAndZeroesTheRest) {
  if (own_paths().empty()) GTEST_SKIP() << "this CPU has neither AVX2 with FMA nor AVX-512F";
  const std::vector<float> values = rand_vec(4096, 9, 1.0f);
  for (GemmPath path : own_paths()) {
    cpu::set_gemm_path(path);
    const std::int64_t width = cpu::gemm_panel_width();
    SCOPED_TRACE(cpu::gemm_path_name(path));
    // Groups of 8 lanes (AVX2 has the first two): by 2 from 300, scattered (500 + 7·i² mod 400,
    // all distinct), by 1 from 100, by 2 from 40. Taps 1000 floats apart: no two lanes of the
    // panel read one float.
    std::vector<std::int32_t> lanes(static_cast<std::size_t>(width));
    for (int i = 0; i < width; ++i) {
      const int g = i / 8, j = i % 8;
      lanes[i] = g % 4 == 0   ? 300 + 2 * j
                 : g % 4 == 1 ? 500 + (7 * i * i) % 400
                 : g % 4 == 2 ? 100 + j
                              : 40 + 2 * j;
    }
    const std::int64_t channels = 3, stride = 4000, taps = 4;
    const std::int64_t offsets[taps] = {0, 1000, 2000, 3000};
    std::uint32_t masks[taps];
    const std::vector<float> bits = rand_vec(taps, 10, 1.0f);
    for (int t = 0; t < taps; ++t)
      masks[t] = t == 0   ? 0xFFFFFFFFu
                 : t == 1 ? 0u
                          : static_cast<std::uint32_t>(std::abs(bits[t]) * 4294967295.0);
    // The source: NaN at every float a clear lane would read.
    std::vector<float> src(static_cast<std::size_t>(channels * stride));
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = values[i % values.size()];
    for (std::int64_t c = 0; c < channels; ++c)
      for (int t = 0; t < taps; ++t)
        for (int i = 0; i < width; ++i)
          if (!(masks[t] >> i & 1u)) src[c * stride + offsets[t] + lanes[i]] = std::nanf("");
    std::vector<float> storage(static_cast<std::size_t>(channels * taps * width + 16));
    float* panel = storage.data();
    while (reinterpret_cast<std::uintptr_t>(panel) % 64 != 0) ++panel;
    cpu::fill_panel_lanes(src.data(), channels, stride, offsets, masks, taps, lanes.data(), panel);
    for (std::int64_t c = 0; c < channels; ++c)
      for (int t = 0; t < taps; ++t)
        for (int i = 0; i < width; ++i) {
          const bool set = masks[t] >> i & 1u;
          const float want = set ? src[c * stride + offsets[t] + lanes[i]] : 0.0f;
          ASSERT_EQ(panel[(c * taps + t) * width + i], want)
              << "channel " << c << " tap " << t << " lane " << i;
        }
  }
}

TEST_F(CpuGemm, ZeroKScalesByBetaAndBetaZeroNeverReadsC) {
  for (GemmPath path : paths()) {
    const Problem pr(Shape{5, 9, 0, false, false, 1.0f, 0.0f}, 7);
    std::vector<float> c = pr.run(path);  // beta = 0 over NaN: zeros
    for (std::int64_t i = 0; i < 5; ++i)
      for (std::int64_t j = 0; j < 9; ++j) EXPECT_EQ(c[i * pr.ldc + j], 0.0f);
    Problem half(Shape{5, 9, 0, false, false, 1.0f, 0.5f}, 7);
    c = half.run(path);
    for (std::int64_t i = 0; i < 5; ++i)
      for (std::int64_t j = 0; j < 9; ++j)
        EXPECT_EQ(c[i * half.ldc + j], 0.5f * half.c0[i * half.ldc + j]);
  }
}

TEST_F(CpuGemm, TheWidestOwnPathIsTheDefaultAndAPathTheCpuLacksIsRefused) {
  const GemmPath widest = paths().back();
  if (std::getenv("MEMTRADE_GEMM") == nullptr && std::getenv("MEMTRADE_ISA") == nullptr) {
    EXPECT_EQ(cpu::gemm_path(), widest);
  }
  for (GemmPath path : {GemmPath::blas, GemmPath::avx2, GemmPath::avx512}) {
    if (cpu::gemm_available(path)) {
      cpu::set_gemm_path(path);
      EXPECT_EQ(cpu::gemm_path(), path);
    } else {
      EXPECT_THROW(cpu::set_gemm_path(path), std::invalid_argument) << cpu::gemm_path_name(path);
    }
  }
  cpu::set_gemm_path(GemmPath::blas);
  EXPECT_EQ(cpu::gemm_panel_width(), 0);
  EXPECT_THROW(
      cpu::own_sgemm(false, false, 1, 1, 1, 1.0f, nullptr, 1, nullptr, 1, 0.0f, nullptr, 1),
      std::logic_error);
}

// What this run's CPU kernels are, printed for the log, and held to MEMTRADE_ISA: the ISA reruns
// of make test (ctest's isa_avx2_*, isa_sse2_*) are only worth running if the cap took effect.
TEST(CpuKernels, ThePathsInUseFollowMemtradeIsa) {
  const char* env = std::getenv("MEMTRADE_ISA");
  const std::string cap = env ? env : "";
  std::printf("CPU kernels in use: vector loops %s (best %s), GEMM %s; MEMTRADE_ISA=%s\n",
              cpu::vec::isa_name(cpu::vec::isa()), cpu::vec::isa_name(cpu::vec::best_isa()),
              cpu::gemm_path_name(cpu::gemm_path()), cap.empty() ? "(unset)" : cap.c_str());
  const bool gemm_env = std::getenv("MEMTRADE_GEMM") != nullptr;
  if (cap == "sse2") {
    EXPECT_EQ(cpu::vec::isa(), cpu::vec::Isa::sse2);
    EXPECT_EQ(cpu::gemm_path(), GemmPath::blas);
  } else if (cap == "avx2" && cpu::vec::best_isa() != cpu::vec::Isa::sse2) {
    EXPECT_EQ(cpu::vec::isa(), cpu::vec::Isa::avx2);
    if (!gemm_env && cpu::gemm_available(GemmPath::avx2)) {
      EXPECT_EQ(cpu::gemm_path(), GemmPath::avx2);
    }
  } else if (cap.empty()) {
    EXPECT_EQ(cpu::vec::isa(), cpu::vec::best_isa());
  }
}

}  // namespace
}  // namespace memtrade::test
