// conv2d forward/backward (im2col + GEMM) against a direct double convolution.
#include <bit>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <omp.h>

#include "kernels/cpu/cpu_gemm.h"
#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {
namespace {

struct Conv {
  int n, ci, h, w, co, k, stride, pad;
  int oh() const { return (h + 2 * pad - k) / stride + 1; }
  int ow() const { return (w + 2 * pad - k) / stride + 1; }
};

Vec ref_conv(const Conv& d, const Vec& x, const Vec& wt, const Vec* b) {
  Vec y(static_cast<std::size_t>(d.n) * d.co * d.oh() * d.ow(), 0.0);
  for (int i = 0; i < d.n; ++i)
    for (int o = 0; o < d.co; ++o)
      for (int oy = 0; oy < d.oh(); ++oy)
        for (int ox = 0; ox < d.ow(); ++ox) {
          double s = b ? (*b)[o] : 0.0;
          for (int c = 0; c < d.ci; ++c)
            for (int ky = 0; ky < d.k; ++ky)
              for (int kx = 0; kx < d.k; ++kx) {
                const int iy = oy * d.stride - d.pad + ky, ix = ox * d.stride - d.pad + kx;
                if (iy < 0 || iy >= d.h || ix < 0 || ix >= d.w) continue;
                s += x[((i * d.ci + c) * d.h + iy) * d.w + ix] *
                     wt[((o * d.ci + c) * d.k + ky) * d.k + kx];
              }
          y[((i * d.co + o) * d.oh() + oy) * d.ow() + ox] = s;
        }
  return y;
}

class ConvTest : public OpsTest, public ::testing::WithParamInterface<std::tuple<int, int, int>> {};

TEST_P(ConvTest, ForwardBackward) {
  const auto [k, stride, pad] = GetParam();
  const Conv d{2, 3, 6, 5, 4, k, stride, pad};
  const int oh = d.oh(), ow = d.ow();
  auto x = rand_vec(d.n * d.ci * d.h * d.w, 1), wt = rand_vec(d.co * d.ci * k * k, 2),
       b = rand_vec(d.co, 3), r = rand_vec(d.n * d.co * oh * ow, 4);
  const Vec bd = to_d(b);
  Tensor tx = make({d.n, d.ci, d.h, d.w}, x), tw = make({d.co, d.ci, k, k}, wt),
         tb = make({d.co}, b), out = garbage({d.n, d.co, oh, ow});
  ops().conv2d_forward(out, tx, tw, &tb, stride, pad);
  expect_close(get(out), ref_conv(d, to_d(x), to_d(wt), &bd), 1e-5, 1e-5, "conv forward");

  Tensor dout = make({d.n, d.co, oh, ow}, r), dx = garbage({d.n, d.ci, d.h, d.w}),
         dw = garbage({d.co, d.ci, k, k}), db = garbage({d.co});
  ops().conv2d_backward(&dx, &dw, &db, dout, tx, tw, stride, pad, false);
  const Vec rd = to_d(r);
  auto gx = fd_grad([&](const Vec& q) { return ref_conv(d, q, to_d(wt), &bd); }, to_d(x), rd);
  auto gw = fd_grad([&](const Vec& q) { return ref_conv(d, to_d(x), q, &bd); }, to_d(wt), rd);
  auto gb = fd_grad([&](const Vec& q) { return ref_conv(d, to_d(x), to_d(wt), &q); }, bd, rd);
  expect_close(get(dx), gx, 1e-5, 1e-4, "conv dinp");
  expect_close(get(dw), gw, 1e-5, 1e-4, "conv dweight");
  expect_close(get(db), gb, 1e-5, 1e-4, "conv dbias");
  ops().conv2d_backward(nullptr, &dw, &db, dout, tx, tw, stride, pad, true);
  for (auto& v : gw) v *= 2;
  for (auto& v : gb) v *= 2;
  expect_close(get(dw), gw, 1e-5, 1e-4, "conv dweight accumulated");
  expect_close(get(db), gb, 1e-5, 1e-4, "conv dbias accumulated");
  Tensor out_nb = garbage({d.n, d.co, oh, ow});
  ops().conv2d_forward(out_nb, tx, tw, nullptr, stride, pad);
  expect_close(get(out_nb), ref_conv(d, to_d(x), to_d(wt), nullptr), 1e-5, 1e-5, "no bias");
}

INSTANTIATE_TEST_SUITE_P(KernelStridePad, ConvTest,
                         ::testing::Values(std::tuple{3, 1, 0}, std::tuple{3, 1, 1},
                                           std::tuple{3, 2, 0}, std::tuple{3, 2, 1},
                                           std::tuple{1, 1, 0}, std::tuple{1, 2, 0}));

// The adjoints of ref_conv in double: dx, dw, db for L = Σ y·r.
struct ConvGrads {
  Vec dx, dw, db;
};
ConvGrads ref_conv_grads(const Conv& d, const Vec& x, const Vec& wt, const Vec& r) {
  ConvGrads g{Vec(x.size(), 0.0), Vec(wt.size(), 0.0), Vec(d.co, 0.0)};
  for (int i = 0; i < d.n; ++i)
    for (int o = 0; o < d.co; ++o)
      for (int oy = 0; oy < d.oh(); ++oy)
        for (int ox = 0; ox < d.ow(); ++ox) {
          const double ry = r[((i * d.co + o) * d.oh() + oy) * d.ow() + ox];
          g.db[o] += ry;
          for (int c = 0; c < d.ci; ++c)
            for (int ky = 0; ky < d.k; ++ky)
              for (int kx = 0; kx < d.k; ++kx) {
                const int iy = oy * d.stride - d.pad + ky, ix = ox * d.stride - d.pad + kx;
                if (iy < 0 || iy >= d.h || ix < 0 || ix >= d.w) continue;
                const int xi = ((i * d.ci + c) * d.h + iy) * d.w + ix;
                const int wi = ((o * d.ci + c) * d.k + ky) * d.k + kx;
                g.dx[xi] += ry * wt[wi];
                g.dw[wi] += ry * x[xi];
              }
        }
  return g;
}

// Large enough for the threads to split each image into pixel tiles (forward) and channel tiles
// (backward), in every dtype (16-bit: the shared dout copy and the per-tile conversions), and
// with one thread (other tiles; OpenBLAS rounds a column differently with another tile width,
// as its own threading does, so the runs agree within the tolerance, not bit for bit).
TEST_F(OpsTest, ConvTilesMatchTheReferenceWithTwoThreadsAndOne) {
  for (auto [stride, pad] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 0}}) {
    const Conv d{3, 8, 20, 18, 6, 3, stride, pad};
    SCOPED_TRACE("stride " + std::to_string(stride) + " pad " + std::to_string(pad));
    const int oh = d.oh(), ow = d.ow();
    auto x = rand_vec(d.n * d.ci * d.h * d.w, 21), wt = rand_vec(d.co * d.ci * 9, 22, 0.3f),
         b = rand_vec(d.co, 23), r = rand_vec(d.n * d.co * oh * ow, 24);
    for (DType t : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(dtype_name(t));
      const auto xq = quantize(x, t), wq = quantize(wt, t), bq = quantize(b, t),
                 rq = quantize(r, t);
      const Vec bd = to_d(bq);
      const ConvGrads want = ref_conv_grads(d, to_d(xq), to_d(wq), to_d(rq));
      const double tol = t == DType::F32 ? 1e-5 : 1e-2;
      for (int threads : {2, 1}) {
        SCOPED_TRACE(std::to_string(threads) + " threads");
        const int keep = omp_get_max_threads();
        omp_set_num_threads(threads);
        Tensor tx = make({d.n, d.ci, d.h, d.w}, xq, t), tw = make({d.co, d.ci, 3, 3}, wq, t),
               tb = make({d.co}, bq, t), out = garbage({d.n, d.co, oh, ow}, t);
        ops().conv2d_forward(out, tx, tw, &tb, stride, pad);
        Tensor dout = make({d.n, d.co, oh, ow}, rq, t), dx = garbage({d.n, d.ci, d.h, d.w}, t),
               dw = garbage({d.co, d.ci, 3, 3}, t), db = garbage({d.co}, t);
        ops().conv2d_backward(&dx, &dw, &db, dout, tx, tw, stride, pad, false);
        omp_set_num_threads(keep);
        expect_close(get(out), ref_conv(d, to_d(xq), to_d(wq), &bd), tol, tol, "forward");
        expect_close(get(dx), want.dx, tol, tol, "dinp");
        expect_close(get(dw), want.dw, tol, tol, "dweight");
        expect_close(get(db), want.db, tol, tol, "dbias");
      }
    }
  }
}

// Every GEMM path (kernels/cpu/cpu_gemm.h) through the convolution: the own ones pack the
// weight once, write im2col tiles in their panel form (whole ones by masked copies:
// "same" rows of 1x1, 3x3 and 5x5 kernels, widths that do and do not divide 32; the other
// convolutions' whole tiles by fill_panel_lanes: stride 2 with output rows of 16 and 8 pixels,
// 3x3 and 1x1, lanes stepping by 2 within a row; output rows of 10 and stride 3, gathered) and
// read them in place; OpenBLAS takes the plain tiles.
TEST_F(OpsTest, ConvOnEveryGemmPathMatchesTheReference) {
  std::vector<cpu::GemmPath> paths;
  for (cpu::GemmPath p : {cpu::GemmPath::blas, cpu::GemmPath::avx2, cpu::GemmPath::avx512})
    if (cpu::gemm_available(p)) paths.push_back(p);
  const cpu::GemmPath keep = cpu::gemm_path();
  for (const Conv& d :
       {Conv{2, 3, 20, 18, 5, 3, 1, 1}, Conv{2, 2, 12, 12, 3, 5, 1, 2},
        Conv{2, 4, 8, 8, 6, 1, 1, 0}, Conv{2, 3, 10, 9, 4, 3, 1, 0}, Conv{1, 2, 16, 16, 3, 3, 2, 1},
        Conv{2, 3, 32, 32, 4, 3, 2, 1}, Conv{2, 3, 20, 20, 4, 3, 2, 1},
        Conv{2, 2, 19, 19, 3, 3, 3, 1}, Conv{2, 4, 16, 16, 5, 1, 2, 0}}) {
    SCOPED_TRACE("k" + std::to_string(d.k) + " pad " + std::to_string(d.pad) + " " +
                 std::to_string(d.h) + "x" + std::to_string(d.w));
    const int oh = d.oh(), ow = d.ow();
    auto x = rand_vec(d.n * d.ci * d.h * d.w, 41), wt = rand_vec(d.co * d.ci * d.k * d.k, 42),
         r = rand_vec(d.n * d.co * oh * ow, 43);
    const ConvGrads want = ref_conv_grads(d, to_d(x), to_d(wt), to_d(r));
    for (cpu::GemmPath path : paths) {
      SCOPED_TRACE(cpu::gemm_path_name(path));
      cpu::set_gemm_path(path);
      Tensor tx = make({d.n, d.ci, d.h, d.w}, x), tw = make({d.co, d.ci, d.k, d.k}, wt),
             out = garbage({d.n, d.co, oh, ow});
      ops().conv2d_forward(out, tx, tw, nullptr, d.stride, d.pad);
      Tensor dout = make({d.n, d.co, oh, ow}, r), dx = garbage({d.n, d.ci, d.h, d.w}),
             dw = garbage({d.co, d.ci, d.k, d.k});
      ops().conv2d_backward(&dx, &dw, nullptr, dout, tx, tw, d.stride, d.pad, false);
      cpu::set_gemm_path(keep);
      expect_close(get(out), ref_conv(d, to_d(x), to_d(wt), nullptr), 1e-5, 1e-5, "forward");
      expect_close(get(dx), want.dx, 1e-5, 1e-5, "dinp");
      expect_close(get(dw), want.dw, 1e-5, 1e-5, "dweight");
    }
  }
}

// The weight gradient on the own GEMM, whichever way its B operand reaches the GEMM (colᵀ from
// col's rows, or panels filled tile by tile: cpu_ops_conv.cpp's im2col_panels, whole panels and a
// last narrower one, whole pixel tiles and a ragged last one), is bit for bit own_sgemm's
// dout·colᵀ summed image after image over an explicit im2col (the GEMM's rounding contract:
// kernels/cpu/cpu_gemm.h), with two threads and one.
TEST_F(OpsTest, ConvWeightGradientIsTheOwnGemmsBits) {
  const cpu::GemmPath keep = cpu::gemm_path();
  for (cpu::GemmPath path : {cpu::GemmPath::avx2, cpu::GemmPath::avx512}) {
    if (!cpu::gemm_available(path)) continue;
    cpu::set_gemm_path(path);
    for (const Conv& d : {Conv{2, 6, 32, 32, 8, 3, 2, 1}, Conv{2, 16, 16, 16, 24, 3, 2, 1},
                          Conv{2, 5, 12, 10, 7, 3, 1, 1}, Conv{2, 4, 9, 9, 3, 3, 2, 0},
                          Conv{2, 8, 8, 8, 20, 3, 1, 1}, Conv{2, 3, 32, 32, 8, 3, 1, 1}}) {
      SCOPED_TRACE(std::string(cpu::gemm_path_name(path)) + " ci " + std::to_string(d.ci) + " " +
                   std::to_string(d.h) + "x" + std::to_string(d.w) + " stride " +
                   std::to_string(d.stride));
      const int oh = d.oh(), ow = d.ow(), p = oh * ow, k = d.ci * d.k * d.k;
      const auto x = rand_vec(d.n * d.ci * d.h * d.w, 51), wt = rand_vec(d.co * k, 52),
                 r = rand_vec(d.n * d.co * p, 53);
      std::vector<float> want(static_cast<std::size_t>(d.co * k)),
          col(static_cast<std::size_t>(k * p));
      for (int i = 0; i < d.n; ++i) {
        for (int c = 0; c < d.ci; ++c)
          for (int ky = 0; ky < d.k; ++ky)
            for (int kx = 0; kx < d.k; ++kx)
              for (int oy = 0; oy < oh; ++oy)
                for (int ox = 0; ox < ow; ++ox) {
                  const int iy = oy * d.stride - d.pad + ky, ix = ox * d.stride - d.pad + kx;
                  const bool in = iy >= 0 && iy < d.h && ix >= 0 && ix < d.w;
                  col[((c * d.k + ky) * d.k + kx) * p + oy * ow + ox] =
                      in ? x[((i * d.ci + c) * d.h + iy) * d.w + ix] : 0.0f;
                }
        cpu::own_sgemm(false, true, d.co, k, p, 1.0f, r.data() + i * d.co * p, p, col.data(), p,
                       i == 0 ? 0.0f : 1.0f, want.data(), k);
      }
      for (int threads : {2, 1}) {
        const int keep_threads = omp_get_max_threads();
        omp_set_num_threads(threads);
        Tensor tx = make({d.n, d.ci, d.h, d.w}, x), tw = make({d.co, d.ci, d.k, d.k}, wt);
        Tensor dout = make({d.n, d.co, oh, ow}, r), dw = garbage({d.co, d.ci, d.k, d.k});
        ops().conv2d_backward(nullptr, &dw, nullptr, dout, tx, tw, d.stride, d.pad, false);
        omp_set_num_threads(keep_threads);
        const std::vector<float> got = get(dw);
        std::size_t differ = 0;
        for (std::size_t j = 0; j < got.size(); ++j)
          differ += std::bit_cast<std::uint32_t>(got[j]) != std::bit_cast<std::uint32_t>(want[j]);
        EXPECT_EQ(differ, 0u) << threads << " threads";
      }
    }
  }
  cpu::set_gemm_path(keep);
}

// The input gradient on the own GEMM: bit for bit own_sgemm's weightᵀ·dout (the column gradient)
// folded back into each plane element by element, from +0, tap after tap in (ky, kx) order, as
// col2im's vector folds must (stride 2: all of a tap's output rows in one call; flat 3-wide rows:
// three taps in one pass on planes of 16x16 and more), with two threads and one.
TEST_F(OpsTest, ConvInputGradientIsTheOwnGemmsBitsFoldedInTapOrder) {
  const cpu::GemmPath keep = cpu::gemm_path();
  for (cpu::GemmPath path : {cpu::GemmPath::avx2, cpu::GemmPath::avx512}) {
    if (!cpu::gemm_available(path)) continue;
    cpu::set_gemm_path(path);
    for (const Conv& d : {Conv{2, 6, 32, 32, 8, 3, 2, 1}, Conv{2, 4, 17, 15, 5, 3, 2, 1},
                          Conv{2, 5, 20, 18, 7, 3, 1, 1}, Conv{2, 4, 16, 16, 6, 3, 1, 1},
                          Conv{2, 4, 9, 9, 3, 3, 2, 0}, Conv{2, 3, 16, 16, 5, 1, 2, 0}}) {
      SCOPED_TRACE(std::string(cpu::gemm_path_name(path)) + " ci " + std::to_string(d.ci) + " " +
                   std::to_string(d.h) + "x" + std::to_string(d.w) + " k" + std::to_string(d.k) +
                   " stride " + std::to_string(d.stride));
      const int oh = d.oh(), ow = d.ow(), p = oh * ow, k = d.ci * d.k * d.k;
      const auto x = rand_vec(d.n * d.ci * d.h * d.w, 61), wt = rand_vec(d.co * k, 62),
                 r = rand_vec(d.n * d.co * p, 63);
      std::vector<float> want(x.size()), dcol(static_cast<std::size_t>(k * p));
      for (int i = 0; i < d.n; ++i) {
        cpu::own_sgemm(true, false, k, p, d.co, 1.0f, wt.data(), k, r.data() + i * d.co * p, p,
                       0.0f, dcol.data(), p);
        for (int c = 0; c < d.ci; ++c) {
          float* plane = want.data() + (i * d.ci + c) * d.h * d.w;
          for (int ky = 0; ky < d.k; ++ky)
            for (int kx = 0; kx < d.k; ++kx)
              for (int oy = 0; oy < oh; ++oy)
                for (int ox = 0; ox < ow; ++ox) {
                  const int iy = oy * d.stride - d.pad + ky, ix = ox * d.stride - d.pad + kx;
                  if (iy >= 0 && iy < d.h && ix >= 0 && ix < d.w)
                    plane[iy * d.w + ix] += dcol[((c * d.k + ky) * d.k + kx) * p + oy * ow + ox];
                }
        }
      }
      for (int threads : {2, 1}) {
        const int keep_threads = omp_get_max_threads();
        omp_set_num_threads(threads);
        Tensor tx = make({d.n, d.ci, d.h, d.w}, x), tw = make({d.co, d.ci, d.k, d.k}, wt);
        Tensor dout = make({d.n, d.co, oh, ow}, r), dx = garbage({d.n, d.ci, d.h, d.w});
        ops().conv2d_backward(&dx, nullptr, nullptr, dout, tx, tw, d.stride, d.pad, false);
        omp_set_num_threads(keep_threads);
        const std::vector<float> got = get(dx);
        std::size_t differ = 0;
        for (std::size_t j = 0; j < got.size(); ++j)
          differ += std::bit_cast<std::uint32_t>(got[j]) != std::bit_cast<std::uint32_t>(want[j]);
        EXPECT_EQ(differ, 0u) << threads << " threads";
      }
    }
  }
  cpu::set_gemm_path(keep);
}

// Inputs narrower than the kernel's reach on one side: windows that see no input column at
// all, where the first and last valid output columns must be computed with floor and ceiling.
TEST_F(OpsTest, ConvTinyInputsWithPaddingAndStride) {
  for (auto [h, w, stride] : {std::tuple{1, 1, 2}, std::tuple{2, 1, 2}, std::tuple{2, 3, 2},
                              std::tuple{1, 2, 1}, std::tuple{3, 1, 3}}) {
    const Conv d{2, 2, h, w, 3, 3, stride, 1};
    SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w) + " stride " + std::to_string(stride));
    auto x = rand_vec(d.n * d.ci * h * w, 31), wt = rand_vec(d.co * d.ci * 9, 32),
         r = rand_vec(d.n * d.co * d.oh() * d.ow(), 33);
    Tensor tx = make({d.n, d.ci, h, w}, x), tw = make({d.co, d.ci, 3, 3}, wt),
           out = garbage({d.n, d.co, d.oh(), d.ow()});
    ops().conv2d_forward(out, tx, tw, nullptr, stride, 1);
    expect_close(get(out), ref_conv(d, to_d(x), to_d(wt), nullptr), 1e-6, 1e-6, "forward");
    Tensor dout = make({d.n, d.co, d.oh(), d.ow()}, r), dx = garbage({d.n, d.ci, h, w}),
           dw = garbage({d.co, d.ci, 3, 3});
    ops().conv2d_backward(&dx, &dw, nullptr, dout, tx, tw, stride, 1, false);
    const ConvGrads want = ref_conv_grads(d, to_d(x), to_d(wt), to_d(r));
    expect_close(get(dx), want.dx, 1e-6, 1e-6, "dinp");
    expect_close(get(dw), want.dw, 1e-6, 1e-6, "dweight");
  }
}

TEST_F(OpsTest, ConvUsesWorkspaceScratchAndFreesIt) {
  Tensor tx = make({2, 3, 8, 8}, rand_vec(2 * 3 * 64, 5)),
         tw = make({4, 3, 3, 3}, rand_vec(108, 6));
  Tensor out = zeros({2, 4, 8, 8});
  const auto before = mem().stats().allocated.current;
  mem().reset_peak();
  ops().conv2d_forward(out, tx, tw, nullptr, 1, 1);
  EXPECT_EQ(mem().stats().allocated.current, before);
  EXPECT_GT(mem().stats().allocated.peak, before);
  EXPECT_GT(mem().stats().by_category_at_peak[static_cast<int>(Category::workspace)], 0);
}

TEST_F(OpsTest, ConvWithEmptyChannelsOrBatch) {
  // What the CUDA backend must match where cuDNN cannot be called (0-sized dimensions).
  {  // no input channel: every output is the bias; dbias sums dout
    Tensor tx = zeros({2, 0, 5, 5}), tw = zeros({4, 0, 3, 3}), tb = make({4}, rand_vec(4, 7));
    Tensor out = garbage({2, 4, 5, 5});
    ops().conv2d_forward(out, tx, tw, &tb, 1, 1);
    const std::vector<float> b = get(tb);
    Vec want;
    for (int img = 0; img < 2; ++img)
      for (int o = 0; o < 4; ++o) want.insert(want.end(), 25, b[o]);
    expect_close(get(out), want, 0, 0, "Ci = 0 forward");
    auto r = rand_vec(2 * 4 * 25, 8);
    Tensor dout = make({2, 4, 5, 5}, r), dx = zeros({2, 0, 5, 5}), dw = zeros({4, 0, 3, 3}),
           db = garbage({4});
    ops().conv2d_backward(&dx, &dw, &db, dout, tx, tw, 1, 1, false);
    Vec gb(4, 0.0);
    for (int img = 0; img < 2; ++img)
      for (int o = 0; o < 4; ++o)
        for (int p = 0; p < 25; ++p) gb[o] += r[(img * 4 + o) * 25 + p];
    expect_close(get(db), gb, 1e-6, 1e-6, "Ci = 0 dbias");
  }
  {  // no output channel: dinp is zeros
    Tensor tx = make({2, 3, 5, 5}, rand_vec(150, 9)), tw = zeros({0, 3, 3, 3});
    Tensor dout = zeros({2, 0, 5, 5}), dx = garbage({2, 3, 5, 5}), dw = zeros({0, 3, 3, 3});
    ops().conv2d_backward(&dx, &dw, nullptr, dout, tx, tw, 1, 1, false);
    expect_close(get(dx), Vec(150, 0.0), 0, 0, "Co = 0 dinp");
  }
  {  // an empty batch: dbias is 0, an accumulated dweight is unchanged
    Tensor tx = zeros({0, 3, 8, 8}), tw = make({4, 3, 3, 3}, rand_vec(108, 10));
    auto w0 = rand_vec(108, 11);
    Tensor dout = zeros({0, 4, 8, 8}), dx = zeros({0, 3, 8, 8}), dw = make({4, 3, 3, 3}, w0),
           db = garbage({4});
    ops().conv2d_backward(&dx, &dw, &db, dout, tx, tw, 1, 1, true);
    expect_close(get(dw), to_d(w0), 0, 0, "N = 0 dweight accumulated");
    ops().conv2d_backward(nullptr, nullptr, &db, dout, tx, tw, 1, 1, false);
    expect_close(get(db), Vec(4, 0.0), 0, 0, "N = 0 dbias");
    for (DType t : {DType::F32, DType::BF16}) {  // an assigned dweight is zeros, in any dtype
      Tensor dw2 = make({4, 3, 3, 3}, w0, t);
      ops().conv2d_backward(nullptr, &dw2, nullptr, dout, tx, tw, 1, 1, false);
      expect_close(get(dw2), Vec(108, 0.0), 0, 0, "N = 0 dweight assigned");
    }
  }
}

TEST_F(OpsTest, ConvRejectsBadShapes) {
  Tensor tx = zeros({1, 3, 4, 4}), tw = zeros({2, 2, 3, 3}), out = zeros({1, 2, 2, 2});
  EXPECT_THROW(ops().conv2d_forward(out, tx, tw, nullptr, 1, 0), std::invalid_argument);
  Tensor tw2 = zeros({2, 3, 3, 3}), out_bad = zeros({1, 2, 3, 3});
  EXPECT_THROW(ops().conv2d_forward(out_bad, tx, tw2, nullptr, 1, 0), std::invalid_argument);
  EXPECT_THROW(ops().conv2d_forward(out, tx, tw2, nullptr, 0, 0), std::invalid_argument);
}

}  // namespace
}  // namespace memtrade::test
