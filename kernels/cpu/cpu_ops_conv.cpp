// 2-D convolution (NCHW) by im2col + GEMM, one image at a time: the im2col matrix
// (Ci·KH·KW, OH·OW) is the op's library scratch (category workspace), the same buffer holds
// the column gradient in backward before col2im folds it into dinp.
//
// The threads share that one buffer by owning disjoint parts of it, in one parallel region per
// op and without a barrier between images (each GEMM single-threaded: OpenMP OpenBLAS nests):
//   - forward: pixel tiles (columns of col): a thread gathers its tile's columns and multiplies
//     weight (Co, K) by them into its tile of out (on memtrade's own GEMM, tiles of its panel
//     width stored as their own (K, width) panel in the tile's part of the buffer);
//   - backward: channel tiles (rows of col, a channel's KH·KW rows together): a thread gathers
//     its rows, adds dout · rowsᵀ into its columns of dweight, computes those rows of the
//     column gradient and folds them into its channels of dinp.
// A thread owns the same tiles in every image, so nothing another thread touches is ever
// overwritten. A GEMM sums each element over K in its own fixed order whatever range of rows or
// columns it is given (kernels/cpu/cpu_gemm.h), so the tiling does not change results. (The
// pthreads OpenBLAS, whose pool fights OpenMP's, runs the tiles in turn: sgemm_nests().)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"

namespace memtrade::cpu {
namespace {

// This thread's index and the team size (0 and 1 outside a parallel region).
int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
int team_size() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}
int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// a / b rounded down and up, for b > 0 and any sign of a.
std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -(-a / b);
}

// The output columns [lo, hi) whose input column ox·s − pad + kx lies inside [0, W).
struct OxRange {
  std::int64_t lo, hi;
};
inline OxRange valid_ox(const ConvDims& d, std::int64_t kx) {
  if (d.stride == 1) {  // no division: most rows of most convolutions
    const std::int64_t lo = std::clamp<std::int64_t>(d.pad - kx, 0, d.ow);
    return {lo, std::clamp<std::int64_t>(d.w + d.pad - kx, lo, d.ow)};
  }
  const std::int64_t lo = std::clamp<std::int64_t>(ceil_div(d.pad - kx, d.stride), 0, d.ow);
  const std::int64_t hi =
      std::clamp<std::int64_t>(floor_div(d.w - 1 + d.pad - kx, d.stride) + 1, lo, d.ow);
  return {lo, hi};
}

// Stride 1 with OW = W (the rows of a "same" convolution): row (ci, ky, kx) of col is channel ci
// of the image read at one flat offset, col[p] = x[p + (ky − pad)·W + (kx − pad)], except in
// output rows whose input row lies outside the image (all 0) and in the first or last
// |pad − kx| columns of each row, where the flat offset wraps into the neighbouring input row
// (0 too). So a row is one copy (im2col) or one add (col2im) plus those fix-ups, not a loop
// over output rows.
struct FlatRow {
  std::int64_t shift;       // (ky − pad)·W + (kx − pad)
  std::int64_t lo, hi;      // [lo, hi): the positions p whose input row is inside the image
  std::int64_t src0, src1;  // [src0, src1) ⊂ [lo, hi): those whose flat source is in the plane
  OxRange ox;               // the columns that do not wrap
};
bool flat_rows(const ConvDims& d) {
  return d.stride == 1 && d.ow == d.w;
}
FlatRow flat_row(const ConvDims& d, std::int64_t ky, std::int64_t kx) {
  FlatRow r;
  r.shift = (ky - d.pad) * d.w + (kx - d.pad);
  const std::int64_t oy_lo = std::clamp<std::int64_t>(d.pad - ky, 0, d.oh);
  const std::int64_t oy_hi = std::clamp<std::int64_t>(d.h + d.pad - ky, oy_lo, d.oh);
  r.lo = oy_lo * d.ow;
  r.hi = oy_hi * d.ow;
  r.src0 = std::clamp(-r.shift, r.lo, r.hi);
  r.src1 = std::clamp(d.h * d.w - r.shift, r.src0, r.hi);
  r.ox = valid_ox(d, kx);
  return r;
}

// The flat rows of every kernel tap (t = ky·KW + kx), worked out once per op or call where there
// are few taps (3x3: 9); none (count 0) where the rows are not flat or the taps more than
// kMaxFlatTaps. On the stack: im2col and col2im take them per call.
constexpr std::int64_t kMaxFlatTaps = 25;
struct FlatTaps {
  FlatRow row[kMaxFlatTaps];
  std::int64_t count = 0;
  const FlatRow* data() const { return count > 0 ? row : nullptr; }
};
FlatTaps flat_taps(const ConvDims& d) {
  FlatTaps taps;
  if (flat_rows(d) && d.kh * d.kw <= kMaxFlatTaps)
    for (; taps.count < d.kh * d.kw; ++taps.count)
      taps.row[taps.count] = flat_row(d, taps.count / d.kw, taps.count % d.kw);
  return taps;
}

// Sets the wrapped columns (outside r.ox) of positions [a, b) of a flat row to 0.
void zero_wrapped(const ConvDims& d, const FlatRow& r, std::int64_t a, std::int64_t b, float* row) {
  // Column by column (|pad − kx| of them, usually one), strided by a row. One division per call
  // (a's column), not three per column: im2col calls this for every row of every tile.
  if (r.ox.lo == 0 && r.ox.hi == d.ow) return;
  const std::int64_t col_a = a % d.ow;  // a >= 0
  auto column = [&](std::int64_t c) {
    const std::int64_t step = c - col_a;
    const std::int64_t first = a + (step < 0 ? step + d.ow : step);  // >= a, column c
    for (std::int64_t p = first; p < b; p += d.ow) row[p] = 0.0f;
  };
  for (std::int64_t c = 0; c < r.ox.lo; ++c) column(c);
  for (std::int64_t c = r.ox.hi; c < d.ow; ++c) column(c);
}

// Rows [k0, k1) and columns [p0, p1) of col (K, P) for image `img`, row k at col + k·ld:
// col[(ci, ky, kx), (oy, ox)] = inp[img, ci, oy·s − pad + ky, ox·s − pad + kx], 0 outside.
void im2col(const Tensor& inp, std::int64_t img, const ConvDims& d, std::int64_t k0,
            std::int64_t k1, std::int64_t p0, std::int64_t p1, float* col, std::int64_t ld) {
  const bool f32 = inp.dtype() == DType::F32;
  const bool flat = f32 && flat_rows(d);
  const std::int64_t base = img * d.ci * d.h * d.w;
  const FlatTaps taps = f32 ? flat_taps(d) : FlatTaps{};
  const bool taps_cached = taps.count > 0;
  // Row k is (ci, ky, kx), kx fastest: stepped along instead of divided out per row.
  std::int64_t ci = k0 / (d.kh * d.kw), ky = (k0 / d.kw) % d.kh, kx = k0 % d.kw;
  for (std::int64_t k = k0; k < k1; ++k) {
    float* row = col + k * ld;
    if (flat) {
      const FlatRow r = taps_cached ? taps.row[ky * d.kw + kx] : flat_row(d, ky, kx);
      const float* src = inp.as<float>() + base + ci * d.h * d.w + r.shift;
      const std::int64_t a = std::clamp(r.src0, p0, p1), b = std::clamp(r.src1, a, p1);
      std::fill(row + p0, row + a, 0.0f);
      std::copy(src + a, src + b, row + a);
      std::fill(row + b, row + p1, 0.0f);
      zero_wrapped(d, r, a, b, row);
    }
    const OxRange ox = flat ? OxRange{} : valid_ox(d, kx);
    // Strided fp32 rows: the output rows wholly inside [p0, p1) whose input row is in the image,
    // [v_lo, v_hi), in one call (rows are 8-16 floats at cnn-small's strides: a call each cost
    // more than the gather); the rest row by row below.
    std::int64_t v_lo = 0, v_hi = 0;
    if (!flat && f32 && ox.lo < ox.hi) {
      v_lo = std::max((p0 + d.ow - 1) / d.ow, ceil_div(d.pad - ky, d.stride));
      v_hi = std::min(p1 / d.ow, floor_div(d.h - 1 + d.pad - ky, d.stride) + 1);
      if (v_lo < v_hi) {
        const std::int64_t src =
            base + (ci * d.h + v_lo * d.stride - d.pad + ky) * d.w - d.pad + kx + ox.lo * d.stride;
        vec::gather_strided_rows(inp.as<float>() + src, d.stride * d.w, d.stride, row + v_lo * d.ow,
                                 d.ow, v_hi - v_lo, ox.lo, ox.hi - ox.lo, d.ow);
      }
    }
    for (std::int64_t oy = p0 / d.ow; !flat && oy * d.ow < p1; ++oy) {
      if (oy >= v_lo && oy < v_hi) continue;
      const std::int64_t a = std::max(p0 - oy * d.ow, std::int64_t{0});  // this row's [a, b)
      const std::int64_t b = std::min(p1 - oy * d.ow, d.ow);
      float* out = row + oy * d.ow;
      const std::int64_t iy = oy * d.stride - d.pad + ky;
      if (iy < 0 || iy >= d.h) {
        std::fill(out + a, out + b, 0.0f);
        continue;
      }
      const std::int64_t lo = std::clamp(ox.lo, a, b), hi = std::clamp(ox.hi, lo, b);
      std::fill(out + a, out + lo, 0.0f);
      std::fill(out + hi, out + b, 0.0f);
      const std::int64_t src = base + (ci * d.h + iy) * d.w - d.pad + kx;  // + ox·s: in bounds
      if (f32 && d.stride == 1) {
        std::copy_n(inp.as<float>() + (src + lo), hi - lo, out + lo);
      } else if (f32) {
        vec::gather_strided(inp.as<float>() + src + lo * d.stride, d.stride, out + lo, hi - lo);
      } else {
        for (std::int64_t i = lo; i < hi; ++i)
          out[i] = load_as_float(inp.data(), inp.dtype(), src + i * d.stride);
      }
    }
    if (++kx == d.kw) {
      kx = 0;
      if (++ky == d.kh) {
        ky = 0;
        ++ci;
      }
    }
  }
}

// im2col of one full tile [p0, p0 + w) of flat rows (fp32, stride 1, OW = W; w the own GEMM's
// panel width, ≤ 32) straight into its (K, w) panel by fill_panel_rows: each row one or two
// masked vector copies, lanes outside the image or in a wrapped column reading as 0, instead of
// a copy, two fills and a strided zeroing. The same values as im2col.
void im2col_tile(const float* image, const ConvDims& d, const FlatRow* taps, std::int64_t p0,
                 std::int64_t w, float* out) {
  const std::int64_t nt = d.kh * d.kw;
  // Lane i holds position p0 + i: kept where its input row is in the image ([src0, src1)) and its
  // column is not wrapped (the columns [ox.lo, ox.hi) of kx, the same for every ky).
  std::uint32_t columns[25] = {}, mask[25];
  std::int64_t offsets[25];
  for (std::int64_t kx = 0; kx < d.kw; ++kx) {
    std::int64_t c = p0 % d.ow;  // the column of lane i, stepped along
    for (int i = 0; i < w; ++i, c = c + 1 == d.ow ? 0 : c + 1)
      if (c >= taps[kx].ox.lo && c < taps[kx].ox.hi) columns[kx] |= 1u << i;
  }
  auto below = [](std::int64_t n) {  // lanes [0, n), n clamped to [0, 32]
    return n >= 32 ? ~0u : n <= 0 ? 0u : (1u << n) - 1;
  };
  for (std::int64_t t = 0; t < nt; ++t) {
    mask[t] = columns[t % d.kw] & below(taps[t].src1 - p0) & ~below(taps[t].src0 - p0);
    offsets[t] = taps[t].shift + p0;
  }
  fill_panel_rows(image, d.ci, d.h * d.w, offsets, mask, nt, out);
}

// im2col of one full tile [p0, p0 + w) of any other fp32 convolution (stride 2, a kernel that
// does not keep OW = W) into its (K, w) panel by fill_panel_lanes: pixel p0 + i at (oy, ox) reads
// tap (ky, kx) of a channel at lane offset (oy·s − pad)·W + ox·s − pad plus tap offset ky·W + kx,
// masked to the taps inside the image. The per-row calls of im2col cost a strided 3x3
// convolution's forward as much as its GEMM (cnn-small's stride-2 convs ran at 0.47 and 0.60 of
// the AVX2 peak). The same values as im2col. Taps at most kMaxLaneTaps.
constexpr std::int64_t kMaxLaneTaps = 49;
void im2col_tile_lanes(const float* image, const ConvDims& d, std::int64_t p0, std::int64_t w,
                       float* out) {
  std::int32_t lanes[32];
  std::uint32_t rows[7] = {}, columns[7] = {}, mask[kMaxLaneTaps];
  std::int64_t offsets[kMaxLaneTaps];
  for (int i = 0; i < w; ++i) {
    const std::int64_t oy = (p0 + i) / d.ow, ox = (p0 + i) % d.ow;
    const std::int64_t iy = oy * d.stride - d.pad, ix = ox * d.stride - d.pad;  // tap (0, 0)
    lanes[i] = static_cast<std::int32_t>(iy * d.w + ix);
    for (std::int64_t ky = 0; ky < d.kh; ++ky)
      if (iy + ky >= 0 && iy + ky < d.h) rows[ky] |= 1u << i;
    for (std::int64_t kx = 0; kx < d.kw; ++kx)
      if (ix + kx >= 0 && ix + kx < d.w) columns[kx] |= 1u << i;
  }
  for (std::int64_t t = 0; t < d.kh * d.kw; ++t) {
    mask[t] = rows[t / d.kw] & columns[t % d.kw];
    offsets[t] = (t / d.kw) * d.w + t % d.kw;
  }
  fill_panel_lanes(image, d.ci, d.h * d.w, offsets, mask, d.kh * d.kw, lanes, out);
}

// One full tile [p0, p0 + w) of an fp32 image into its (K, w) panel by masked vector copies:
// im2col_tile where the rows are flat and their taps worked out (`taps`, else null), else
// im2col_tile_lanes where it can take the kernel and the plane. False where neither can (im2col
// then).
bool im2col_whole_tile(const float* image, const ConvDims& d, const FlatRow* taps, std::int64_t p0,
                       std::int64_t w, float* out) {
  if (taps) {
    im2col_tile(image, d, taps, p0, w, out);
    return true;
  }
  if (d.kh > 7 || d.kw > 7 || d.h * d.w > (std::int64_t{1} << 30)) return false;  // int32 lanes
  im2col_tile_lanes(image, d, p0, w, out);
  return true;
}

// The weight gradient's B operand on the own GEMM, colᵀ (P, nk) for channels [c0, c1) of an fp32
// image (col rows k0 = c0·KH·KW on, nk of them), as ready panels: panel g (col rows k0 + g·lanes
// on, lanes = gemm_panel_width()) at panels + g·P·lanes, its row p those rows' values at pixel p;
// a last panel of fewer than `lanes` rows (rows past nk 0) at `last` instead (P·lanes floats), not
// past the nk·P floats at panels. Tile by tile of `lanes` pixels, the forward's im2col tiles (nk,
// lanes) into `tile`, each transposed into its rows of every panel: the GEMM then packs no B, and
// col is never written and read back row by row (the weight gradient's im2col and packing of colᵀ
// were a third of cnn-small's stride-2 weight gradients).
void im2col_panels(const Tensor& inp, std::int64_t img, const ConvDims& d, std::int64_t c0,
                   std::int64_t c1, const FlatRow* taps, float* tile, float* panels, float* last) {
  const std::int64_t lanes = gemm_panel_width(), kk = d.kh * d.kw, nk = (c1 - c0) * kk;
  const std::int64_t whole = nk / lanes * lanes;  // rows in whole panels
  ConvDims sub = d;  // the tile functions read channels [0, ci) of the image they are given
  sub.ci = c1 - c0;
  const float* image = inp.as<float>() + (img * d.ci + c0) * d.h * d.w;
  for (std::int64_t p0 = 0; p0 < d.p(); p0 += lanes) {
    const std::int64_t np = std::min(lanes, d.p() - p0);
    if (np != lanes || !im2col_whole_tile(image, sub, taps, p0, np, tile))
      // row k of col at tile + (k − k0)·lanes, pixels [p0, p0 + np)
      im2col(inp, img, d, c0 * kk, c0 * kk + nk, p0, p0 + np, tile - c0 * kk * lanes - p0, lanes);
    vec::transpose_to_panels(tile, lanes, whole, np, lanes, panels + p0 * lanes, d.p() * lanes);
    if (whole < nk)
      vec::transpose_to_panels(tile + whole * lanes, lanes, nk - whole, np, lanes,
                               last + p0 * lanes, d.p() * lanes);
  }
}

// col2im of the three taps (ky, 0..2) of a flat 3-wide kernel (rows at `rows`, P floats apart,
// their FlatRows r[0..2]) into one plane: tap kx adds its row at plane position q + shift for q in
// [src0, src1), after its wrapped columns are set to 0, in kx order; where all three reach, in one
// pass (vec::accumulate3: the plane read and written once, not three times), the ends element by
// element. The same additions in the same order as one vec::accumulate per tap.
void fold_flat_taps3(float* rows, const ConvDims& d, const FlatRow* r, float* plane) {
  std::int64_t lo = d.h * d.w, hi = 0, both_lo = 0, both_hi = d.h * d.w;  // plane positions
  for (std::int64_t kx = 0; kx < 3; ++kx) {
    zero_wrapped(d, r[kx], r[kx].src0, r[kx].src1, rows + kx * d.p());
    if (r[kx].src0 == r[kx].src1) continue;  // adds nothing; the others' span stands
    lo = std::min(lo, r[kx].src0 + r[kx].shift);
    hi = std::max(hi, r[kx].src1 + r[kx].shift);
    both_lo = std::max(both_lo, r[kx].src0 + r[kx].shift);
    both_hi = std::min(both_hi, r[kx].src1 + r[kx].shift);
  }
  bool all = true;
  for (std::int64_t kx = 0; kx < 3; ++kx) all = all && r[kx].src0 < r[kx].src1;
  if (!all || both_lo >= both_hi) both_lo = both_hi = std::max(lo, hi);  // no common span
  auto one_by_one = [&](std::int64_t q0, std::int64_t q1) {
    for (std::int64_t q = q0; q < q1; ++q)
      for (std::int64_t kx = 0; kx < 3; ++kx)
        if (q - r[kx].shift >= r[kx].src0 && q - r[kx].shift < r[kx].src1)
          plane[q] += rows[kx * d.p() + q - r[kx].shift];
  };
  one_by_one(lo, both_lo);
  if (both_lo < both_hi)
    vec::accumulate3(rows + both_lo - r[0].shift, rows + d.p() + both_lo - r[1].shift,
                     rows + 2 * d.p() + both_lo - r[2].shift, plane + both_lo, both_hi - both_lo);
  one_by_one(std::max(both_hi, lo), hi);
}

// dx (Ci, H, W) planes [ci0, ci1) = Σ over windows of col's rows of those channels: the adjoint
// of im2col. Overwrites the wrapped columns of flat rows (see FlatRow) with 0.
void col2im(float* col, const ConvDims& d, std::int64_t ci0, std::int64_t ci1, float* dx) {
  // The flat rows of the kernel taps once, as in im2col (per channel and tap they were 2% of
  // cnn-small's 8x8 input gradient).
  const FlatTaps taps = flat_taps(d);
  const bool taps_cached = taps.count > 0;
  for (std::int64_t ci = ci0; ci < ci1; ++ci) {
    float* plane = dx + ci * d.h * d.w;
    std::fill(plane, plane + d.h * d.w, 0.0f);
    for (std::int64_t ky = 0; ky < d.kh; ++ky) {
      // (On planes of 16x16 and more: on 8x8 ones the ends, element by element, are a quarter of
      // the plane, and cnn-small's 8x8 input gradient measured 2% slower.)
      if (flat_rows(d) && d.kw == 3 && d.h * d.w >= 256) {
        FlatRow own[3];
        for (std::int64_t kx = 0; kx < 3 && !taps_cached; ++kx) own[kx] = flat_row(d, ky, kx);
        fold_flat_taps3(col + (ci * d.kh + ky) * 3 * d.p(), d,
                        taps_cached ? taps.row + 3 * ky : own, plane);
        continue;
      }
      for (std::int64_t kx = 0; kx < d.kw; ++kx) {
        float* row = col + ((ci * d.kh + ky) * d.kw + kx) * d.p();
        if (flat_rows(d)) {  // the wrapped columns (this op's own scratch) become 0 first
          const FlatRow r = taps_cached ? taps.row[ky * d.kw + kx] : flat_row(d, ky, kx);
          zero_wrapped(d, r, r.src0, r.src1, row);
          vec::accumulate(row + r.src0, plane + r.src0 + r.shift, r.src1 - r.src0);
          continue;
        }
        const OxRange ox = valid_ox(d, kx);
        if (d.stride == 2) {  // all the output rows whose input row is in the image, one call
          const std::int64_t oy0 = std::clamp<std::int64_t>(ceil_div(d.pad - ky, 2), 0, d.oh);
          const std::int64_t oy1 =
              std::clamp<std::int64_t>(floor_div(d.h - 1 + d.pad - ky, 2) + 1, oy0, d.oh);
          if (oy0 < oy1 && ox.lo < ox.hi)
            vec::accumulate_stride2_rows(
                row + oy0 * d.ow + ox.lo, d.ow,
                plane + (oy0 * 2 - d.pad + ky) * d.w - d.pad + kx + 2 * ox.lo, 2 * d.w, oy1 - oy0,
                ox.hi - ox.lo);
          continue;
        }
        for (std::int64_t oy = 0; oy < d.oh; ++oy) {
          const std::int64_t iy = oy * d.stride - d.pad + ky;
          if (iy < 0 || iy >= d.h) continue;
          const std::int64_t dst = iy * d.w - d.pad + kx;  // + ox·s: in bounds
          const float* src = row + oy * d.ow;
          if (d.stride == 1) {
            vec::accumulate(src + ox.lo, plane + dst + ox.lo, ox.hi - ox.lo);
          } else {
            for (std::int64_t i = ox.lo; i < ox.hi; ++i) plane[dst + i * d.stride] += src[i];
          }
        }
      }
    }
  }
}

std::optional<Tensor> scratch_if(bool need, CachingAllocator& alloc, Shape shape) {
  if (!need) return std::nullopt;
  return Tensor(alloc, std::move(shape), DType::F32, Category::workspace);  // 16-bit copies
}

// Items per tile when n items are shared by `threads` threads: about two tiles per thread (for
// balance), at least `min` items each (at least 1).
std::int64_t tile_size(std::int64_t n, int threads, std::int64_t min) {
  const std::int64_t want = (n + 2 * threads - 1) / (2 * threads);
  return std::max<std::int64_t>(1, std::min(n, std::max(want, min)));
}

}  // namespace

void CpuOps::conv2d_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                            const Tensor* bias, int stride, int pad) {
  const ConvDims d = check_conv_forward(out, inp, weight, bias, stride, pad);
  CachingAllocator& alloc = *out.allocator();
  F32In w(weight, alloc);
  auto out_buf = scratch_if(out.dtype() != DType::F32, alloc, {d.co, d.p()});
  Tensor col(alloc, {d.k(), d.p()}, DType::F32, Category::workspace);
  if (d.n == 0 || d.p() == 0) return;
  // memtrade's own GEMM (kernels/cpu/cpu_gemm.h) takes the weight packed once for every image
  // and tile, and tiles of exactly its panel width (32 columns on AVX-512, 16 on AVX2): each
  // tile's columns of col are then stored as their own (K, width) matrix (in the tile's K·width
  // floats of the buffer), which is the packed form the GEMM reads in place, so im2col's output
  // is never copied again. (cblas_sgemm packs both operands per call: 3.5% of cnn-small's step
  // was packing the weight, 1.4% col.)
  // With OpenBLAS, pixel tiles of at least 32 columns (narrower ones would starve the GEMM).
  std::optional<PackedA> packed;
  if (gemm_path() != GemmPath::blas) packed.emplace(false, d.co, d.k(), w.data(), d.k());
  const std::int64_t tile = packed ? gemm_panel_width() : tile_size(d.p(), max_threads(), 32);
  // Full tiles of fp32 images by im2col_whole_tile, flat rows with the kernel taps' rows worked
  // out once.
  const bool whole_tiles =
      packed && inp.dtype() == DType::F32 && reinterpret_cast<std::uintptr_t>(col.data()) % 64 == 0;
  const FlatTaps taps = whole_tiles ? flat_taps(d) : FlatTaps{};
  const std::int64_t tiles = (d.p() + tile - 1) / tile;
  const bool parallel = sgemm_nests() && d.n * d.co * d.p() * d.k() >= kParallelGrain;
#pragma omp parallel if (parallel)
  {
    const int id = thread_id(), team = team_size();
    for (std::int64_t img = 0; img < d.n; ++img) {
      const std::int64_t off = img * d.co * d.p();
      float* y = out_buf ? out_buf->as<float>() : out.as<float>() + off;
      for (std::int64_t j = id; j < tiles; j += team) {
        const std::int64_t p0 = j * tile, np = std::min(tile, d.p() - p0);
        if (bias)
          for (std::int64_t o = 0; o < d.co; ++o)
            std::fill_n(y + o * d.p() + p0, np, load_as_float(bias->data(), bias->dtype(), o));
        if (packed) {
          // This thread's (K, np) matrix: the same floats for each of its tiles, so that a tile's
          // panel is written and read in L1 (a fresh part of the buffer each tile came from L2).
          float* own = col.as<float>() + id * tile * d.k();
          const float* image = inp.as<float>() + img * d.ci * d.h * d.w;
          if (!whole_tiles || np != tile || !im2col_whole_tile(image, d, taps.data(), p0, np, own))
            im2col(inp, img, d, 0, d.k(), p0, p0 + np, own - p0, np);
          own_sgemm(*packed, 0, d.co, false, np, 1.0f, own, np, bias ? 1.0f : 0.0f, y + p0, d.p());
        } else {
          im2col(inp, img, d, 0, d.k(), p0, p0 + np, col.as<float>(), d.p());
          sgemm(false, false, d.co, np, d.k(), 1.0f, w.data(), d.k(), col.as<float>() + p0, d.p(),
                bias ? 1.0f : 0.0f, y + p0, d.p());
        }
        if (out_buf)
          for (std::int64_t o = 0; o < d.co; ++o)
            write_f32(out, off + o * d.p() + p0, np, y + o * d.p() + p0);
      }
    }
  }
}

void CpuOps::conv2d_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, int stride, int pad,
                             bool accumulate) {
  const ConvDims d = check_conv_backward(dinp, dweight, dbias, dout, inp, weight, stride, pad);
  if (dbias) {  // Σ over images and pixels, one channel per thread
#pragma omp parallel for schedule(static) if (d.n * d.co * d.p() >= kParallelGrain)
    for (std::int64_t o = 0; o < d.co; ++o) {
      float buf[kChunk];
      double sum = 0.0;
      for (std::int64_t img = 0; img < d.n; ++img)
        for (std::int64_t q = 0; q < d.p(); q += kChunk) {
          const std::int64_t len = std::min(kChunk, d.p() - q);
          sum += vec::sum(read_f32(dout, (img * d.co + o) * d.p() + q, len, buf), len);
        }
      const float old = accumulate ? load_as_float(dbias->data(), dbias->dtype(), o) : 0.0f;
      store_from_float(dbias->data(), dbias->dtype(), o, old + static_cast<float>(sum));
    }
  }
  if (!dinp && !dweight) return;
  CachingAllocator& alloc = *(dinp ? dinp : dweight)->allocator();
  std::optional<F32In> w;
  if (dinp) w.emplace(weight, alloc);
  std::optional<F32Out> dw;
  if (dweight) dw.emplace(*dweight, accumulate);
  auto dout_buf = scratch_if(dout.dtype() != DType::F32, alloc, {d.co, d.p()});
  auto dinp_buf = scratch_if(dinp && dinp->dtype() != DType::F32, alloc, {d.ci, d.h, d.w});
  Tensor col(alloc, {d.k(), d.p()}, DType::F32, Category::workspace);
  // An empty batch still assigns a gradient of zeros (the per-image GEMMs below never run).
  if (dw && d.n == 0 && !accumulate) std::fill_n(dw->data(), weight.numel(), 0.0f);
  const std::int64_t kk = d.kh * d.kw;  // col rows per input channel
  // weightᵀ (K, Co) packed once on the own GEMM: gathering a tile's columns of the weight
  // again for every image was 2% of cnn-small's step (a cache miss per 8 floats).
  std::optional<PackedA> packed_t;
  if (w && gemm_path() != GemmPath::blas) packed_t.emplace(true, d.k(), d.co, w->data(), d.k());
  // Channels per tile: one tile per thread, since each tile's GEMMs pack this image's dout again
  // (two tiles per thread cost cnn-small 3% more time than one; channel counts divide evenly).
  const std::int64_t tile = std::max<std::int64_t>(1, (d.ci + max_threads() - 1) / max_threads());
  // Without an input gradient (a network's first layer) col's rows may be split anywhere, not
  // only at channels: a 3-channel image's 27 rows as 14 + 13 rather than 18 + 9 (cnn-small's stem
  // left one thread idle for a third of its backward).
  const bool row_tiles = !dinp && d.ci % max_threads() != 0;
  const std::int64_t tile_rows =
      row_tiles ? std::max<std::int64_t>(1, (d.k() + max_threads() - 1) / max_threads()) : 0;
  const std::int64_t tiles =
      row_tiles ? (d.k() + tile_rows - 1) / tile_rows : (d.ci + tile - 1) / tile;
  // fp32 weight gradients on the own GEMM take their B operand as panels (im2col_panels), in the
  // thread's rows of col (the same floats, laid out as panels; 64-byte aligned) and dout packed
  // once per image and thread. The same sums (kernels/cpu/cpu_gemm.h), so the same bits.
  const std::int64_t lanes = gemm_panel_width();
  // (Not with row tiles: im2col_panels takes whole channels.)
  const bool dw_panels = dw && !row_tiles && gemm_path() != GemmPath::blas &&
                         inp.dtype() == DType::F32 &&
                         reinterpret_cast<std::uintptr_t>(col.data()) % 64 == 0;
  const FlatTaps taps = dw_panels ? flat_taps(d) : FlatTaps{};
  const bool parallel = sgemm_nests() && d.n * d.co * d.p() * d.k() >= kParallelGrain;
#pragma omp parallel if (parallel)
  {
    const int id = thread_id(), team = team_size();
    // This thread's (nk, lanes) im2col tile and a last panel of fewer than `lanes` rows of colᵀ
    // (its own rows of col hold the whole panels).
    AlignedFloats dw_tile, dw_last;
    if (dw_panels) {
      dw_tile = aligned_floats(tile * kk * lanes);
      if ((tile * kk) % lanes != 0 || (d.ci % tile) * kk % lanes != 0)
        dw_last = aligned_floats(d.p() * lanes);
    }
    for (std::int64_t img = 0; img < d.n; ++img) {
      std::optional<PackedA> dout_packed;  // this image's dout, packed on this thread's first tile
      const std::int64_t out_off = img * d.co * d.p();
      const float* g = dout_buf ? dout_buf->as<float>() : dout.as<float>() + out_off;
      if (dout_buf) {  // one shared fp32 copy of this image's dout, once everyone is done
#pragma omp barrier
#pragma omp single
        read_f32(dout, out_off, d.co * d.p(), dout_buf->as<float>());
      }
      const std::int64_t in_off = img * d.ci * d.h * d.w;
      float* dx = dinp_buf ? dinp_buf->as<float>() : dinp ? dinp->as<float>() + in_off : nullptr;
      for (std::int64_t j = id; j < tiles; j += team) {
        const std::int64_t c0 = j * tile, c1 = std::min(d.ci, c0 + tile);  // channel tiles
        const std::int64_t k0 = row_tiles ? j * tile_rows : c0 * kk;
        const std::int64_t nk = row_tiles ? std::min(tile_rows, d.k() - k0) : (c1 - c0) * kk;
        float* rows = col.as<float>() + k0 * d.p();
        const float beta = (img == 0 && !accumulate) ? 0.0f : 1.0f;
        // (The panels 64-byte aligned too; not where the GEMM reads col's rows in place; and not
        // for fewer than two panels of rows: cnn-small's stem, 9 and 18 rows a thread, measured
        // 0.85 -> 1.10 ms on panels, the 1x1 downsample's 16 rows slower too.)
        if (dw_panels && nk >= 2 * lanes && (k0 * d.p()) % 16 == 0 &&
            !own_sgemm_reads_b_rows(d.co, nk, d.p())) {
          im2col_panels(inp, img, d, c0, c1, taps.data(), dw_tile.get(), rows, dw_last.get());
          if (!dout_packed) dout_packed.emplace(false, d.co, d.p(), g, d.p());
          for (std::int64_t c = 0; c < nk; c += lanes)  // one panel of colᵀ, in place, a call
            own_sgemm(*dout_packed, 0, d.co, false, std::min(lanes, nk - c), 1.0f,
                      c + lanes <= nk ? rows + c * d.p() : dw_last.get(), lanes, beta,
                      dw->data() + k0 + c, d.k());
        } else if (dw) {  // dweight[:, k0:k1] (+)= dout_n (Co, P) · col[k0:k1]ᵀ (P, nk)
          im2col(inp, img, d, k0, k0 + nk, 0, d.p(), col.as<float>(), d.p());
          sgemm(false, true, d.co, nk, d.p(), 1.0f, g, d.p(), rows, d.p(), beta, dw->data() + k0,
                d.k());
        }
        if (dinp) {  // dcol[k0:k1] (nk, P) = weight[:, k0:k1]ᵀ · dout_n, folded back by col2im
          if (packed_t && k0 % gemm_panel_rows() == 0)
            own_sgemm(*packed_t, k0, nk, false, d.p(), 1.0f, g, d.p(), 0.0f, rows, d.p());
          else
            sgemm(true, false, nk, d.p(), d.co, 1.0f, w->data() + k0, d.k(), g, d.p(), 0.0f, rows,
                  d.p());
          col2im(col.as<float>(), d, c0, c1, dx);
          if (dinp_buf)
            write_f32(*dinp, in_off + c0 * d.h * d.w, (c1 - c0) * d.h * d.w, dx + c0 * d.h * d.w);
        }
      }
    }
  }
  if (dw) dw->commit();
}

}  // namespace memtrade::cpu
