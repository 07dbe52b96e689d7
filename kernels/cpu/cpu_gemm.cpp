// kernels/cpu/cpu_gemm.h: a BLIS-style GEMM, the packing and the 8x32 register block in AVX-512F.
//
// Loops (outermost first), with the blocks where they live on one core:
//   jc: kNc columns of C and B
//     pc: kKc of k        B (kc, nc) packed into 32-column panels   (L2, ≤ 1 MiB)
//       ic: kMc rows      A (mc, kc) packed into 8-row panels       (L2, ≤ 128 KiB)
//         ir: 8 rows      one A panel (8, kc)                       (L1, ≤ 8 KiB)
//           jr: 32 columns  one B panel (kc, 32), streamed from L2
//             the register block: 16 zmm accumulators, C (8, 32) += A panel · B panel
// ir outside jr keeps a register block's 8 rows of C on the same pages from one block to the
// next; with jr outside, a wide C (n = 8192: rows 32 KiB apart) touched 128 pages per column
// strip and ran at 170 against 237 GFLOP/s (one Zen 5 core, 1024x8192x384; the other orders
// and block sizes tried were within noise of this one on the conv and linear shapes).
// Panels are padded with zeros to full width, so the register block always runs full; only its
// store is masked to the rows and columns that exist.
#include "kernels/cpu/cpu_gemm.h"

#include "kernels/cpu/cpu_vec.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MEMTRADE_GEMM_X86 1
#endif

namespace memtrade::cpu {
namespace {

constexpr std::int64_t kMr = 8;     // rows of the register block
constexpr std::int64_t kNr = 32;    // columns of the register block: two zmm
constexpr std::int64_t kKc = 256;   // k per packed block: a B panel is kKc·kNr·4 B = 32 KiB
constexpr std::int64_t kMc = 128;   // rows per packed A block
constexpr std::int64_t kNc = 1024;  // columns per packed B block

// This thread's packing buffers, 64-byte aligned, made on first use (about 1.1 MiB; host memory
// of the engine's own, like OpenBLAS's buffers, outside the modelled device memory).
// n floats (at least 16, a whole number of 64-byte lines: aligned_alloc's size rule).
AlignedFloats aligned_floats(std::int64_t n) {
  const auto lines = static_cast<std::size_t>(std::max<std::int64_t>(1, (n + 15) / 16));
  AlignedFloats p(static_cast<float*>(std::aligned_alloc(64, lines * 64)));
  if (!p) throw std::bad_alloc();
  return p;
}
struct Buffers {
  AlignedFloats a = aligned_floats(kMc * kKc);
  AlignedFloats b = aligned_floats(kKc * kNc);
};
Buffers& buffers() {
  thread_local Buffers bufs;
  return bufs;
}

GemmPath initial_path() {
  if (!gemm_avx512_available() || vec::isa() != vec::Isa::avx512) return GemmPath::blas;
  const char* env = std::getenv("MEMTRADE_GEMM");
  return env != nullptr && std::string(env) == "blas" ? GemmPath::blas : GemmPath::avx512;
}

std::atomic<GemmPath>& current() {
  static std::atomic<GemmPath> path{initial_path()};
  return path;
}

}  // namespace

bool gemm_avx512_available() {
#ifdef MEMTRADE_GEMM_X86
  static const bool ok = __builtin_cpu_supports("avx512f");  // libgcc checks the OS state too
  return ok;
#else
  return false;
#endif
}

GemmPath gemm_path() {
  return current().load(std::memory_order_relaxed);
}

void set_gemm_path(GemmPath path) {
  if (path == GemmPath::avx512 && !gemm_avx512_available())
    throw std::invalid_argument("cpu gemm: this CPU has no AVX-512F");
  current().store(path, std::memory_order_relaxed);
}

const char* gemm_path_name(GemmPath path) {
  return path == GemmPath::avx512 ? "avx512" : "blas";
}

#ifdef MEMTRADE_GEMM_X86
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace {

// (The packing functions are kept out of line so that a profile shows them apart from the
// loops; each call packs a whole block.)

// Rows [0, n) of a 16-lane mask.
inline __mmask16 lanes(std::int64_t n) {
  return n >= 16 ? __mmask16{0xFFFF} : n <= 0 ? __mmask16{0} : __mmask16((1u << n) - 1);
}

// dst[p·ldd + r] = src[r·lds + p] for 8 rows r (those past `rows` read as 0) and p < len: eight
// rows of a matrix become the first 8 floats of len rows of a panel. By 8 x 8 blocks in
// registers (unpack, shuffle, permute), the last len % 8 columns one by one.
[[gnu::noinline]] void transpose_rows(const float* src, std::int64_t lds, std::int64_t rows,
                                      std::int64_t len, float* dst, std::int64_t ldd) {
  rows = std::clamp<std::int64_t>(rows, 0, 8);
  std::int64_t p = 0;
  for (; p + 8 <= len; p += 8) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i)
      r[i] = i < rows ? _mm256_loadu_ps(src + i * lds + p) : _mm256_setzero_ps();
    // Pairs interleaved, then quads: s0 = (r0[0] r1[0] r2[0] r3[0] | r0[4] r1[4] r2[4] r3[4]) ...
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    float* d = dst + p * ldd;
    _mm256_storeu_ps(d + 0 * ldd, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(d + 1 * ldd, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(d + 2 * ldd, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(d + 3 * ldd, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(d + 4 * ldd, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(d + 5 * ldd, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(d + 6 * ldd, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(d + 7 * ldd, _mm256_permute2f128_ps(s3, s7, 0x31));
  }
  for (; p < len; ++p)
    for (std::int64_t i = 0; i < 8; ++i) dst[p * ldd + i] = i < rows ? src[i * lds + p] : 0.0f;
}

// B rows [pc, pc + kc), columns [jc, jc + nc) of op(B) into 32-column panels, panel j at
// dst + j·32·kc, each row of a panel 32 floats (zeros past nc).
[[gnu::noinline]] void pack_b(bool trans_b, const float* b, std::int64_t ldb, std::int64_t pc,
                              std::int64_t kc, std::int64_t jc, std::int64_t nc, float* dst) {
  for (std::int64_t j0 = 0; j0 < nc; j0 += kNr, dst += kNr * kc) {
    const std::int64_t nr = std::min(kNr, nc - j0);
    if (!trans_b) {  // row p of the panel is 32 consecutive floats of B's row pc + p
      const __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
      const float* src = b + pc * ldb + jc + j0;
      for (std::int64_t p = 0; p < kc; ++p, src += ldb) {
        _mm512_store_ps(dst + p * kNr, _mm512_maskz_loadu_ps(m0, src));
        _mm512_store_ps(dst + p * kNr + 16, _mm512_maskz_loadu_ps(m1, src + 16));
      }
      continue;
    }
    // op(B) = Bᵀ: column j of the panel is B's row jc + j0 + j, read along k, 8 x 8 at a time.
    for (std::int64_t j = 0; j < kNr; j += 8)
      transpose_rows(b + (jc + j0 + j) * ldb + pc, ldb, nr - j, kc, dst + j, kNr);
  }
}

// A rows [ic, ic + mc), k [pc, pc + kc) of op(A) into 8-row panels, panel i at dst + i·8·kc,
// each k step of a panel 8 floats (zeros past mc).
[[gnu::noinline]] void pack_a(bool trans_a, const float* a, std::int64_t lda, std::int64_t ic,
                              std::int64_t mc, std::int64_t pc, std::int64_t kc, float* dst) {
  for (std::int64_t i0 = 0; i0 < mc; i0 += kMr, dst += kMr * kc) {
    const std::int64_t mr = std::min(kMr, mc - i0);
    if (trans_a) {  // op(A) = Aᵀ: a k step of the panel is mr consecutive floats of A's row
      const float* src = a + pc * lda + ic + i0;
      if (mr == kMr) {
        for (std::int64_t p = 0; p < kc; ++p, src += lda)
          _mm256_store_ps(dst + p * kMr, _mm256_loadu_ps(src));
        continue;
      }
      for (std::int64_t p = 0; p < kc; ++p, src += lda)
        for (std::int64_t i = 0; i < kMr; ++i) dst[p * kMr + i] = i < mr ? src[i] : 0.0f;
      continue;
    }
    transpose_rows(a + (ic + i0) * lda + pc, lda, mr, kc, dst, kMr);
  }
}

// C (mr ≤ 8, nr ≤ 32) = alpha·(A panel · B panel) + beta·C over kc steps; beta = 0 reads no C.
void register_block(std::int64_t kc, const float* __restrict ap, const float* __restrict bp,
                    float* c, std::int64_t ldc, std::int64_t mr, std::int64_t nr, float alpha,
                    float beta) {
  __m512 acc0[kMr], acc1[kMr];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < kc; ++p, ap += kMr, bp += kNr) {
    const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const __m512 ai = _mm512_set1_ps(ap[i]);
      acc0[i] = _mm512_fmadd_ps(ai, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(ai, b1, acc1[i]);
    }
  }
  const __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {  // unrolled, so acc stays in registers; rows past mr skipped
    if (i >= mr) break;
    float* row = c + i * ldc;
    __m512 r0 = _mm512_mul_ps(va, acc0[i]), r1 = _mm512_mul_ps(va, acc1[i]);
    if (beta != 0.0f) {
      r0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), r0);
      r1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), r1);
    }
    _mm512_mask_storeu_ps(row, m0, r0);
    _mm512_mask_storeu_ps(row + 16, m1, r1);
  }
}

// The loops above, with op(A)'s packed (mc, kc) block at rows [ic, ic + mc), k [pc, pc + kc)
// from a_block(ic, mc, pc, kc).
template <typename ABlock>
void gemm_loops(ABlock&& a_block, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                float alpha, const float* b, std::int64_t ldb, float beta, float* c,
                std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // C = beta·C, and 0 (not 0·NaN) for beta = 0
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  float* const b_buf = buffers().b.get();
  // B already in panel form (one 32-column panel, rows 32 floats apart, aligned): read in place.
  const bool b_packed =
      !trans_b && ldb == kNr && n <= kNr && reinterpret_cast<std::uintptr_t>(b) % 64 == 0;
  for (std::int64_t jc = 0; jc < n; jc += kNc) {
    const std::int64_t nc = std::min(kNc, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += kKc) {
      const std::int64_t kc = std::min(kKc, k - pc);
      const float* bp = b_packed ? b + pc * kNr : b_buf;
      if (!b_packed) pack_b(trans_b, b, ldb, pc, kc, jc, nc, b_buf);
      const float beta_here = pc == 0 ? beta : 1.0f;  // later k blocks add to C
      for (std::int64_t ic = 0; ic < m; ic += kMc) {
        const std::int64_t mc = std::min(kMc, m - ic);
        const float* ap = a_block(ic, mc, pc, kc);
        for (std::int64_t ir = 0; ir < mc; ir += kMr)
          for (std::int64_t jr = 0; jr < nc; jr += kNr)
            register_block(kc, ap + ir * kc, bp + jr * kc, c + (ic + ir) * ldc + jc + jr, ldc,
                           std::min(kMr, mc - ir), std::min(kNr, nc - jr), alpha, beta_here);
      }
    }
  }
}

}  // namespace

void sgemm_avx512(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                  float beta, float* c, std::int64_t ldc) {
  float* const a_buf = buffers().a.get();
  auto pack = [&](std::int64_t ic, std::int64_t mc, std::int64_t pc, std::int64_t kc) {
    pack_a(trans_a, a, lda, ic, mc, pc, kc, a_buf);
    return static_cast<const float*>(a_buf);
  };
  gemm_loops(pack, trans_b, m, n, k, alpha, b, ldb, beta, c, ldc);
}

PackedA::PackedA(bool trans_a, std::int64_t m, std::int64_t k, const float* a, std::int64_t lda)
    : m_(m), k_(k), rows_((m + kMr - 1) / kMr * kMr) {
  data_ = aligned_floats(rows_ * k);
  // k block pc (all rows, panel after panel) at pc · rows_: the blocks before it are full.
  for (std::int64_t pc = 0; pc < k; pc += kKc)
    pack_a(trans_a, a, lda, 0, m, pc, std::min(kKc, k - pc), data_.get() + pc * rows_);
}

void sgemm_avx512(const PackedA& a, std::int64_t i0, std::int64_t m, bool trans_b, std::int64_t n,
                  float alpha, const float* b, std::int64_t ldb, float beta, float* c,
                  std::int64_t ldc) {
  if (i0 % kMr != 0 || i0 < 0 || m < 0 || i0 + m > a.m_)
    throw std::invalid_argument("cpu gemm: packed rows must start on an 8-row panel, in range");
  const float* packed = a.data_.get();
  const std::int64_t rows = a.rows_;
  auto block = [packed, rows, i0](std::int64_t ic, std::int64_t, std::int64_t pc, std::int64_t kc) {
    return packed + pc * rows + (i0 + ic) * kc;  // panel (i0 + ic) / 8 of block pc
  };
  gemm_loops(block, trans_b, m, n, a.k_, alpha, b, ldb, beta, c, ldc);
}
#pragma GCC pop_options
#else
void sgemm_avx512(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                  std::int64_t, const float*, std::int64_t, float, float*, std::int64_t) {
  throw std::logic_error("cpu gemm: the AVX-512F GEMM is not built for this architecture");
}
PackedA::PackedA(bool, std::int64_t, std::int64_t, const float*, std::int64_t) {
  throw std::logic_error("cpu gemm: the AVX-512F GEMM is not built for this architecture");
}
void sgemm_avx512(const PackedA&, std::int64_t, std::int64_t, bool, std::int64_t, float,
                  const float*, std::int64_t, float, float*, std::int64_t) {
  throw std::logic_error("cpu gemm: the AVX-512F GEMM is not built for this architecture");
}
#endif

}  // namespace memtrade::cpu
