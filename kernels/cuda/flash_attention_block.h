// The tile algorithm of the CUDA flash-attention kernels (kernels/cuda/cuda_ops_flash.cu),
// written once for two executors: the GPU, where a phase runs on every thread of a block and
// ends in __syncthreads(), and a host emulation (tests/kernels/test_flash_emulation.cpp) that
// runs a phase thread by thread. CPU-only CI thereby checks the kernels' indexing, tiling,
// masking and grouped-query mapping against the CPU ops; what it cannot check is CUDA itself
// (launch geometry, shared-memory limits, the compiler).
//
// Rules that keep the emulation faithful:
//   - state that outlives a phase lives in shared memory (`smem`) or global memory; a phase's
//     registers die with it;
//   - code outside a phase is block-uniform (every thread computes the same values);
//   - within a phase no thread reads what another writes in it, so any thread order gives the
//     same result: the emulation runs the threads forwards and backwards and compares bit for
//     bit, which catches a missing barrier.
//
// The algorithm is FlashAttention-2's with fp32 arithmetic on CUDA cores (no tensor cores:
// fp32 inputs must match the CPU to fp32 rounding, and one code path serves every dtype).
// A block owns tiles of R rows (R query rows, R keys), R from the head-dim bucket HD (a power of
// two >= hd, zero-padded) so that every kernel's shared memory fits an A100 (163 KiB):
//   forward    grid (query tiles, NH, B): Q, O in smem, K/V tiles streamed, online softmax;
//   backward   D = rowsum(dO ∘ O) per row (B, NH, T), then two kernels without atomics:
//     kv       grid (key tiles, NKV, B): K, V, dK, dV in smem; streams the query tiles at or
//              after the diagonal of each query head of the group (dk, dv summed over it);
//     q        grid (query tiles, NH, B): Q, dO, dQ in smem; streams the key tiles up to the
//              diagonal, recomputing P and dS (the price of no atomics: S and dP twice).
// Every output element is written once, by one thread, from fp32 sums in a fixed order:
// deterministic, rounded once to its dtype.
//
// The includer defines MEMTRADE_FLASH_FN (`__device__ __forceinline__` for CUDA, `inline` on
// the host) and supplies Mem (load/store of a runtime-typed element) and Exec (runs a phase).
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/dtype.h"

#ifndef MEMTRADE_FLASH_FN
#error "define MEMTRADE_FLASH_FN before including flash_attention_block.h"
#endif

namespace memtrade::flash {

inline constexpr int kGrid = 16;                // micro-tile grid of mm(): kGrid × kGrid threads
inline constexpr int kThreads = kGrid * kGrid;  // threads per block

// Head-dim bucket of hd in [1, 256] (kFlashMaxHeadDim): the tile width HD.
constexpr int head_dim_bucket(std::int64_t hd) {
  return hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 256;
}

// Shared-memory layout of the kernels for head-dim bucket HD. (R, HD) tiles have row stride
// HD + 1 and (R, R) tiles R + 1: odd strides, so that a warp walking a column hits 32 banks.
template <int HD>
struct Layout {
  static constexpr int R = HD <= 64 ? 64 : HD <= 128 ? 32 : 16;  // tile rows
  static constexpr int LD = HD + 1;
  static constexpr int LS = R + 1;
  static constexpr int kMat = R * LD;  // floats of an (R, HD) tile
  static constexpr int kSq = R * LS;   // floats of an (R, R) tile
  // Q, K, V, O, S/P; row max m, row sum l, rescale alpha.
  static constexpr int kForward = 4 * kMat + kSq + 3 * R;
  // K, V, Q, dO, dK, dV, P, dP/dS; lse, D (BackwardTiles).
  static constexpr int kBackwardKv = 6 * kMat + 2 * kSq + 2 * R;
  // K, V, Q, dO, dQ, P, dP/dS; lse, D.
  static constexpr int kBackwardQ = 5 * kMat + 2 * kSq + 2 * R;
  static_assert(4 * (kForward > kBackwardKv ? kForward : kBackwardKv) <= 163 * 1024 &&
                    kBackwardQ <= kBackwardKv,
                "an A100 block has at most 163 KiB of shared memory");
};

// Dimensions shared by the kernels (kernels/op_checks.h's AttentionDims, in device form).
struct Dims {
  std::int64_t b, t, nh, nkv, hd;
  float scale;                                                              // 1/√hd
  MEMTRADE_FLASH_FN std::int64_t c() const { return nh * hd; }              // out's row
  MEMTRADE_FLASH_FN std::int64_t w() const { return (nh + 2 * nkv) * hd; }  // qkv's row
  MEMTRADE_FLASH_FN std::int64_t group() const { return nh / nkv; }
  MEMTRADE_FLASH_FN std::int64_t tiles(int r) const { return (t + r - 1) / r; }
  // Columns of kv head g's keys and values in a qkv row.
  MEMTRADE_FLASH_FN std::int64_t k_col(std::int64_t g) const { return (nh + g) * hd; }
  MEMTRADE_FLASH_FN std::int64_t v_col(std::int64_t g) const { return (nh + nkv + g) * hd; }
};

struct ForwardArgs {
  Dims d;
  const void* qkv;  // (B, T, (NH + 2·NKV)·hd)
  DType qkv_t;
  void* out;  // (B, T, NH·hd)
  DType out_t;
  float* lse;  // (B, NH, T)
};

struct BackwardArgs {
  Dims d;
  const void* qkv;
  DType qkv_t;
  const void* out;
  DType out_t;
  const void* dout;  // (B, T, NH·hd)
  DType dout_t;
  const float* lse;
  float* dsum;  // D (B, NH, T): written by dsum_row, read by the two kernels
  void* dqkv;   // like qkv
  DType dqkv_t;
};

// An (r, c)-indexed view of a shared-memory tile.
struct View {
  float* p;
  int rs, cs;  // strides of r and c
  MEMTRADE_FLASH_FN float& operator()(int r, int c) const { return p[r * rs + c * cs]; }
};
MEMTRADE_FLASH_FN View rows(float* p, int ld) {
  return {p, ld, 1};
}
MEMTRADE_FLASH_FN View transposed(float* p, int ld) {  // (r, c) is element (c, r) of the tile
  return {p, 1, ld};
}

enum class Acc { overwrite, add, rescale };

// out(r, c) = alpha·Σ_{k < kdim} a(r, k)·b(k, c) + β_r·out(r, c) for an R × C output, with
// β_r = 0 (overwrite), 1 (add) or row_scale[r] (rescale). Thread tid owns rows tid / kGrid +
// i·kGrid and columns tid % kGrid + j·kGrid: strided, so a warp reads b's consecutive columns
// and two rows of a (broadcasts), and every output element has exactly one owner.
template <int R, int C>
MEMTRADE_FLASH_FN void mm(int tid, int kdim, View a, View b, View out, float alpha, Acc acc,
                          const float* row_scale = nullptr) {
  static_assert(R % kGrid == 0 && C % kGrid == 0, "tiles are multiples of the thread grid");
  constexpr int MR = R / kGrid, MC = C / kGrid;
  const int r0 = tid / kGrid, c0 = tid % kGrid;
  float sum[MR][MC];
#pragma unroll
  for (int i = 0; i < MR; ++i)
#pragma unroll
    for (int j = 0; j < MC; ++j) sum[i][j] = 0.0f;
  for (int k = 0; k < kdim; ++k) {
    float av[MR], bv[MC];
#pragma unroll
    for (int i = 0; i < MR; ++i) av[i] = a(r0 + i * kGrid, k);
#pragma unroll
    for (int j = 0; j < MC; ++j) bv[j] = b(k, c0 + j * kGrid);
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
      for (int j = 0; j < MC; ++j) sum[i][j] = fmaf(av[i], bv[j], sum[i][j]);
  }
#pragma unroll
  for (int i = 0; i < MR; ++i)
#pragma unroll
    for (int j = 0; j < MC; ++j) {
      const int r = r0 + i * kGrid;
      float& o = out(r, c0 + j * kGrid);
      const float base = acc == Acc::overwrite ? 0.0f : acc == Acc::add ? o : o * row_scale[r];
      o = fmaf(alpha, sum[i][j], base);
    }
}

// An (R, HD) tile at row stride ld: element (r, c) = src[base + r·stride + c] for r < n and
// c < hd, else 0 (padding rows and columns add nothing to any sum).
template <class Mem, int R, int HD>
MEMTRADE_FLASH_FN void load_tile(int tid, float* dst, int ld, const void* src, DType t,
                                 std::int64_t base, std::int64_t stride, int n, int hd) {
  for (int e = tid; e < R * HD; e += kThreads) {
    const int r = e / HD, c = e % HD;
    dst[r * ld + c] = r < n && c < hd ? Mem::load(src, t, base + r * stride + c) : 0.0f;
  }
}

// Keys of the tile starting at key j0 (nc of them) that query row q may see: key <= q.
MEMTRADE_FLASH_FN int visible(std::int64_t q, std::int64_t j0, int nc) {
  const std::int64_t n = q - j0 + 1;
  return n < 0 ? 0 : n > nc ? nc : static_cast<int>(n);
}

// ---- forward ----------------------------------------------------------------------------------
// Query tile qt of head h of sequence b: out rows and their lse.
template <int HD, class Mem, class Exec>
MEMTRADE_FLASH_FN void forward_block(Exec& ex, float* smem, const ForwardArgs& a, std::int64_t qt,
                                     std::int64_t h, std::int64_t b) {
  using L = Layout<HD>;
  constexpr int R = L::R, LD = L::LD, LS = L::LS;
  float* sq = smem;
  float* sk = sq + L::kMat;
  float* sv = sk + L::kMat;
  float* so = sv + L::kMat;
  float* ss = so + L::kMat;
  float* sm = ss + L::kSq;
  float* sl = sm + R;
  float* sa = sl + R;
  const Dims& d = a.d;
  const int hd = static_cast<int>(d.hd);
  const std::int64_t w = d.w(), seq = b * d.t * w, g = h / d.group();
  const std::int64_t r0 = qt * R, kend = d.t < r0 + R ? d.t : r0 + R;
  const int nr = static_cast<int>(kend - r0);
  ex([&](int tid) {
    load_tile<Mem, R, HD>(tid, sq, LD, a.qkv, a.qkv_t, seq + r0 * w + h * d.hd, w, nr, hd);
    for (int e = tid; e < R * HD; e += kThreads) so[(e / HD) * LD + e % HD] = 0.0f;
    for (int r = tid; r < R; r += kThreads) {
      sm[r] = -INFINITY;
      sl[r] = 0.0f;
    }
  });
  for (std::int64_t j0 = 0; j0 < kend; j0 += R) {
    const int nc = static_cast<int>(kend - j0 < R ? kend - j0 : R);
    ex([&](int tid) {
      load_tile<Mem, R, HD>(tid, sk, LD, a.qkv, a.qkv_t, seq + j0 * w + d.k_col(g), w, nc, hd);
      load_tile<Mem, R, HD>(tid, sv, LD, a.qkv, a.qkv_t, seq + j0 * w + d.v_col(g), w, nc, hd);
    });
    ex([&](int tid) {  // S = scale·Q·Kᵀ
      mm<R, R>(tid, hd, rows(sq, LD), transposed(sk, LD), rows(ss, LS), d.scale, Acc::overwrite);
    });
    ex([&](int tid) {  // online softmax, one thread per row: P in place of S
      for (int r = tid; r < R; r += kThreads) {
        float* row = ss + r * LS;
        const int n = r < nr ? visible(r0 + r, j0, nc) : 0;
        float mx = sm[r];
        for (int c = 0; c < n; ++c) mx = fmaxf(mx, row[c]);
        // exp(−inf) = 0 on the first tile; a row that sees none of this tile keeps its state.
        const float alpha = n > 0 ? expf(sm[r] - mx) : 1.0f;
        float sum = 0.0f;
        for (int c = 0; c < n; ++c) sum += (row[c] = expf(row[c] - mx));
        for (int c = n; c < R; ++c) row[c] = 0.0f;
        sl[r] = sl[r] * alpha + sum;
        sm[r] = mx;
        sa[r] = alpha;
      }
    });
    ex([&](int tid) {  // O = alpha·O + P·V
      mm<R, HD>(tid, nc, rows(ss, LS), rows(sv, LD), rows(so, LD), 1.0f, Acc::rescale, sa);
    });
  }
  ex([&](int tid) {
    for (int e = tid; e < nr * hd; e += kThreads) {
      const int r = e / hd, c = e % hd;
      Mem::store(a.out, a.out_t, (b * d.t + r0 + r) * d.c() + h * d.hd + c, so[r * LD + c] / sl[r]);
    }
    for (int r = tid; r < nr; r += kThreads)
      a.lse[(b * d.nh + h) * d.t + r0 + r] = sm[r] + logf(sl[r]);
  });
}

// ---- backward ---------------------------------------------------------------------------------
// D of one row, row = (b·NH + h)·T + t: Σ_c dO·O over head h's hd columns, in column order.
template <class Mem>
MEMTRADE_FLASH_FN void dsum_row(const BackwardArgs& a, std::int64_t row) {
  const Dims& d = a.d;
  const std::int64_t t = row % d.t, h = (row / d.t) % d.nh, b = row / (d.t * d.nh);
  const std::int64_t base = (b * d.t + t) * d.c() + h * d.hd;
  float sum = 0.0f;
  for (std::int64_t c = 0; c < d.hd; ++c)
    sum = fmaf(Mem::load(a.dout, a.dout_t, base + c), Mem::load(a.out, a.out_t, base + c), sum);
  a.dsum[row] = sum;
}

// P = exp(S − lse) for query r0 + r (r < nr) and key j0 + c (c < nc) when key <= query, else 0.
MEMTRADE_FLASH_FN float probability(float s, float lse, std::int64_t r0, int r, int nr,
                                    std::int64_t j0, int c, int nc) {
  return r < nr && c < nc && j0 + c <= r0 + r ? expf(s - lse) : 0.0f;
}

// Loads query tile (r0, nr) of head h: Q and dO rows, and its lse and D.
template <class Mem, int HD, int R>
MEMTRADE_FLASH_FN void load_query_side(int tid, const BackwardArgs& a, float* sq, float* sdo,
                                       float* slse, float* sd, std::int64_t b, std::int64_t h,
                                       std::int64_t r0, int nr) {
  const Dims& d = a.d;
  const std::int64_t w = d.w(), c = d.c();
  const int hd = static_cast<int>(d.hd), ld = HD + 1;
  load_tile<Mem, R, HD>(tid, sq, ld, a.qkv, a.qkv_t, (b * d.t + r0) * w + h * d.hd, w, nr, hd);
  load_tile<Mem, R, HD>(tid, sdo, ld, a.dout, a.dout_t, (b * d.t + r0) * c + h * d.hd, c, nr, hd);
  const std::int64_t row0 = (b * d.nh + h) * d.t + r0;
  for (int r = tid; r < R; r += kThreads) {
    slse[r] = r < nr ? a.lse[row0 + r] : 0.0f;
    sd[r] = r < nr ? a.dsum[row0 + r] : 0.0f;
  }
}

// Stores rows < n, columns < hd of an (R, HD) tile into dqkv at element base + r·w + c.
template <class Mem, int HD>
MEMTRADE_FLASH_FN void store_tile(int tid, const BackwardArgs& a, const float* src,
                                  std::int64_t base, int n) {
  const int hd = static_cast<int>(a.d.hd);
  for (int e = tid; e < n * hd; e += kThreads) {
    const int r = e / hd, c = e % hd;
    Mem::store(a.dqkv, a.dqkv_t, base + r * a.d.w() + c, src[r * (HD + 1) + c]);
  }
}

// Shared memory of the backward kernels (Layout's kBackwardKv and kBackwardQ): the key side
// (K, V), the query side (Q, dO), `n` fp32 accumulators (dK and dV, or dQ), the score tiles
// (P, dP/dS), and the query rows' lse and D.
template <int HD>
struct BackwardTiles {
  float *k, *v, *q, *dout, *acc[2], *p, *ds, *lse, *dsum;
  MEMTRADE_FLASH_FN BackwardTiles(float* smem, int n) {
    using L = Layout<HD>;
    k = smem;
    v = k + L::kMat;
    q = v + L::kMat;
    dout = q + L::kMat;
    acc[0] = dout + L::kMat;
    acc[1] = n > 1 ? acc[0] + L::kMat : nullptr;
    p = acc[0] + n * L::kMat;
    ds = p + L::kSq;
    lse = ds + L::kSq;
    dsum = lse + L::R;
  }
};

// dk, dv of key tile kt of kv head g of sequence b, summed over the group's query heads.
template <int HD, class Mem, class Exec>
MEMTRADE_FLASH_FN void backward_kv_block(Exec& ex, float* smem, const BackwardArgs& a,
                                         std::int64_t kt, std::int64_t g, std::int64_t b) {
  using L = Layout<HD>;
  constexpr int R = L::R, LD = L::LD, LS = L::LS;
  const BackwardTiles<HD> st(smem, 2);
  float *sk = st.k, *sv = st.v, *sq = st.q, *sdo = st.dout, *sp = st.p, *sds = st.ds;
  float *slse = st.lse, *sd = st.dsum, *sdk = st.acc[0], *sdv = st.acc[1];
  const Dims& d = a.d;
  const int hd = static_cast<int>(d.hd);
  const std::int64_t w = d.w(), seq = b * d.t * w, j0 = kt * R, tiles = d.tiles(R);
  const int nc = static_cast<int>(d.t - j0 < R ? d.t - j0 : R);
  ex([&](int tid) {
    load_tile<Mem, R, HD>(tid, sk, LD, a.qkv, a.qkv_t, seq + j0 * w + d.k_col(g), w, nc, hd);
    load_tile<Mem, R, HD>(tid, sv, LD, a.qkv, a.qkv_t, seq + j0 * w + d.v_col(g), w, nc, hd);
    for (int e = tid; e < R * HD; e += kThreads) {
      sdk[(e / HD) * LD + e % HD] = 0.0f;
      sdv[(e / HD) * LD + e % HD] = 0.0f;
    }
  });
  for (std::int64_t h = g * d.group(); h < (g + 1) * d.group(); ++h) {
    for (std::int64_t qt = kt; qt < tiles; ++qt) {  // query tiles at or after the diagonal
      const std::int64_t r0 = qt * R;
      const int nr = static_cast<int>(d.t - r0 < R ? d.t - r0 : R);
      ex([&](int tid) { load_query_side<Mem, HD, R>(tid, a, sq, sdo, slse, sd, b, h, r0, nr); });
      ex([&](int tid) {  // S = scale·Q·Kᵀ
        mm<R, R>(tid, hd, rows(sq, LD), transposed(sk, LD), rows(sp, LS), d.scale, Acc::overwrite);
      });
      ex([&](int tid) {
        for (int e = tid; e < R * R; e += kThreads) {
          const int r = e / R, c = e % R;
          float& p = sp[r * LS + c];
          p = probability(p, slse[r], r0, r, nr, j0, c, nc);
        }
      });
      ex([&](int tid) {  // dV += Pᵀ·dO; dP = dO·Vᵀ (into dS)
        mm<R, HD>(tid, nr, transposed(sp, LS), rows(sdo, LD), rows(sdv, LD), 1.0f, Acc::add);
        mm<R, R>(tid, hd, rows(sdo, LD), transposed(sv, LD), rows(sds, LS), 1.0f, Acc::overwrite);
      });
      ex([&](int tid) {  // dS = P ∘ (dP − D)
        for (int e = tid; e < R * R; e += kThreads) {
          const int r = e / R, c = e % R;
          sds[r * LS + c] = sp[r * LS + c] * (sds[r * LS + c] - sd[r]);
        }
      });
      ex([&](int tid) {  // dK += scale·dSᵀ·Q
        mm<R, HD>(tid, nr, transposed(sds, LS), rows(sq, LD), rows(sdk, LD), d.scale, Acc::add);
      });
    }
  }
  ex([&](int tid) {
    store_tile<Mem, HD>(tid, a, sdk, seq + j0 * w + d.k_col(g), nc);
    store_tile<Mem, HD>(tid, a, sdv, seq + j0 * w + d.v_col(g), nc);
  });
}

// dq of query tile qt of head h of sequence b.
template <int HD, class Mem, class Exec>
MEMTRADE_FLASH_FN void backward_q_block(Exec& ex, float* smem, const BackwardArgs& a,
                                        std::int64_t qt, std::int64_t h, std::int64_t b) {
  using L = Layout<HD>;
  constexpr int R = L::R, LD = L::LD, LS = L::LS;
  const BackwardTiles<HD> st(smem, 1);
  float *sk = st.k, *sv = st.v, *sq = st.q, *sdo = st.dout, *sp = st.p, *sds = st.ds;
  float *slse = st.lse, *sd = st.dsum, *sdq = st.acc[0];
  const Dims& d = a.d;
  const int hd = static_cast<int>(d.hd);
  const std::int64_t w = d.w(), seq = b * d.t * w, g = h / d.group();
  const std::int64_t r0 = qt * R, kend = d.t < r0 + R ? d.t : r0 + R;
  const int nr = static_cast<int>(kend - r0);
  ex([&](int tid) {
    load_query_side<Mem, HD, R>(tid, a, sq, sdo, slse, sd, b, h, r0, nr);
    for (int e = tid; e < R * HD; e += kThreads) sdq[(e / HD) * LD + e % HD] = 0.0f;
  });
  for (std::int64_t j0 = 0; j0 < kend; j0 += R) {
    const int nc = static_cast<int>(kend - j0 < R ? kend - j0 : R);
    ex([&](int tid) {
      load_tile<Mem, R, HD>(tid, sk, LD, a.qkv, a.qkv_t, seq + j0 * w + d.k_col(g), w, nc, hd);
      load_tile<Mem, R, HD>(tid, sv, LD, a.qkv, a.qkv_t, seq + j0 * w + d.v_col(g), w, nc, hd);
    });
    ex([&](int tid) {  // S = scale·Q·Kᵀ; dP = dO·Vᵀ
      mm<R, R>(tid, hd, rows(sq, LD), transposed(sk, LD), rows(sp, LS), d.scale, Acc::overwrite);
      mm<R, R>(tid, hd, rows(sdo, LD), transposed(sv, LD), rows(sds, LS), 1.0f, Acc::overwrite);
    });
    ex([&](int tid) {  // dS = P ∘ (dP − D), P = exp(S − lse) where visible
      for (int e = tid; e < R * R; e += kThreads) {
        const int r = e / R, c = e % R;
        const float p = probability(sp[r * LS + c], slse[r], r0, r, nr, j0, c, nc);
        sds[r * LS + c] = p * (sds[r * LS + c] - sd[r]);
      }
    });
    ex([&](int tid) {  // dQ += scale·dS·K
      mm<R, HD>(tid, nc, rows(sds, LS), rows(sk, LD), rows(sdq, LD), d.scale, Acc::add);
    });
  }
  ex([&](int tid) { store_tile<Mem, HD>(tid, a, sdq, seq + r0 * w + h * d.hd, nr); });
}

}  // namespace memtrade::flash
