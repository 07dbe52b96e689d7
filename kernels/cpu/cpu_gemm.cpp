// kernels/cpu/cpu_gemm.h: which GEMM runs, the packing buffers, and cpu_gemm_kernels.inc (the
// packing, the register block and the loops) compiled for AVX2 (6x16 register block: 12 ymm
// accumulators) and for AVX-512F (8x32: 16 zmm), chosen at run time.
#include "kernels/cpu/cpu_gemm.h"

#include "kernels/cpu/cpu_vec.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MEMTRADE_GEMM_X86 1
#endif

namespace memtrade::cpu {
namespace {

// Shared by both paths: the order of the k sums (kKc blocks) is part of the rounding contract.
constexpr std::int64_t kKc = 256;     // k per packed block: an AVX-512 B panel is 32 KiB
constexpr std::int64_t kNc = 1024;    // columns per packed B block
constexpr std::int64_t kMcMax = 128;  // rows per packed A block, on either path
// The small-m path (sgemm_small_m_nt): at most kSmallM rows of C, kSmallChunk columns at a time.
constexpr std::int64_t kSmallM = 128;
constexpr std::int64_t kSmallChunk = 256;
// Floats an A pack may write past its last panel (a whole 8-float store of a 6-float AVX2 panel
// row: transpose_rows): every A buffer has them at its end.
constexpr std::int64_t kPackSlack = 8;

// This thread's packing buffers, 64-byte aligned, made on first use (about 1.25 MiB; host memory
// of the engine's own, like OpenBLAS's buffers, outside the modelled device memory).
struct Buffers {
  AlignedFloats a = aligned_floats(kMcMax * kKc + kPackSlack);
  AlignedFloats b = aligned_floats(kKc * kNc);
  AlignedFloats ct = aligned_floats(kSmallChunk * kSmallM);
};
Buffers& buffers() {
  thread_local Buffers bufs;
  return bufs;
}

GemmPath initial_path() {
  const char* env = std::getenv("MEMTRADE_GEMM");
  if (env != nullptr && std::string(env) == "blas") return GemmPath::blas;
  if (gemm_available(GemmPath::avx512) && vec::isa() == vec::Isa::avx512) return GemmPath::avx512;
  if (gemm_available(GemmPath::avx2) && vec::isa() >= vec::Isa::avx2) return GemmPath::avx2;
  return GemmPath::blas;
}

std::atomic<GemmPath>& current() {
  static std::atomic<GemmPath> path{initial_path()};
  return path;
}

}  // namespace

AlignedFloats aligned_floats(std::int64_t n) {
  const auto lines = static_cast<std::size_t>(std::max<std::int64_t>(1, (n + 15) / 16));
  AlignedFloats p(static_cast<float*>(std::aligned_alloc(64, lines * 64)));
  if (!p) throw std::bad_alloc();
  return p;
}

bool gemm_available(GemmPath path) {
#ifdef MEMTRADE_GEMM_X86
  // libgcc's checks include the OS's register state.
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return path == GemmPath::blas || (path == GemmPath::avx512 && avx512) ||
         (path == GemmPath::avx2 && avx2);
#else
  return path == GemmPath::blas;
#endif
}

GemmPath gemm_path() {
  return current().load(std::memory_order_relaxed);
}

void set_gemm_path(GemmPath path) {
  if (!gemm_available(path))
    throw std::invalid_argument(std::string("cpu gemm: this CPU has no ") + gemm_path_name(path));
  current().store(path, std::memory_order_relaxed);
}

const char* gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::avx512:
      return "avx512";
    case GemmPath::avx2:
      return "avx2";
    case GemmPath::blas:
      break;
  }
  return "blas";
}

#ifdef MEMTRADE_GEMM_X86
#pragma GCC push_options
#pragma GCC target("avx2", "fma")
namespace avx2 {
constexpr std::int64_t kMr = 6, kNr = 16, kMc = 126, lanes_of_v = 8;  // kMc: 21 panels of 6
using V = __m256;
inline V vzero() {
  return _mm256_setzero_ps();
}
inline V vset1(float x) {
  return _mm256_set1_ps(x);
}
inline V vload(const float* p) {
  return _mm256_load_ps(p);
}
inline void vstore(float* p, V v) {
  _mm256_store_ps(p, v);
}
inline V vfma(V a, V b, V c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline V vmul(V a, V b) {
  return _mm256_mul_ps(a, b);
}
inline __m256i ymm_lanes(std::int64_t n);  // cpu_ymm_masks.inc
inline V vload_n(const float* p, std::int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, ymm_lanes(n));
}
inline void vstore_n(float* p, V v, std::int64_t n) {
  if (n >= 8)
    _mm256_storeu_ps(p, v);
  else if (n > 0)
    _mm256_maskstore_ps(p, ymm_lanes(n), v);
}
inline __m256i lanes_of_bits(std::uint32_t m);  // cpu_ymm_masks.inc
inline V vload_bits(const float* p, std::uint32_t bits) {
  return _mm256_maskload_ps(p, lanes_of_bits(bits));
}
#include "kernels/cpu/cpu_gemm_kernels.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
constexpr std::int64_t kMr = 8, kNr = 32, kMc = 128, lanes_of_v = 16;
using V = __m512;
inline __mmask16 lanes(std::int64_t n) {  // the first n of 16 lanes
  return n >= 16 ? __mmask16{0xFFFF} : n <= 0 ? __mmask16{0} : __mmask16((1u << n) - 1);
}
inline V vzero() {
  return _mm512_setzero_ps();
}
inline V vset1(float x) {
  return _mm512_set1_ps(x);
}
inline V vload(const float* p) {
  return _mm512_load_ps(p);
}
inline void vstore(float* p, V v) {
  _mm512_store_ps(p, v);
}
inline V vfma(V a, V b, V c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline V vmul(V a, V b) {
  return _mm512_mul_ps(a, b);
}
inline V vload_n(const float* p, std::int64_t n) {
  return _mm512_maskz_loadu_ps(lanes(n), p);
}
inline void vstore_n(float* p, V v, std::int64_t n) {
  _mm512_mask_storeu_ps(p, lanes(n), v);
}
inline V vload_bits(const float* p, std::uint32_t bits) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>(bits & 0xFFFF), p);
}
#include "kernels/cpu/cpu_gemm_kernels.inc"
}  // namespace avx512
#pragma GCC pop_options

// Each entry point forwards to the path in use (own paths only).
#define MEMTRADE_GEMM_DISPATCH(call) \
  switch (gemm_path()) {             \
    case GemmPath::avx512:           \
      return avx512::call;           \
    case GemmPath::avx2:             \
      return avx2::call;             \
    case GemmPath::blas:             \
      break;                         \
  }                                  \
  throw std::logic_error("cpu gemm: memtrade's own GEMM called on the BLAS path")
#else
#define MEMTRADE_GEMM_DISPATCH(call) \
  throw std::logic_error("cpu gemm: memtrade's own GEMM is not built for this architecture")
#endif

std::int64_t gemm_panel_rows() {
  switch (gemm_path()) {
#ifdef MEMTRADE_GEMM_X86
    case GemmPath::avx512:
      return avx512::kMr;
    case GemmPath::avx2:
      return avx2::kMr;
#endif
    default:
      return 0;
  }
}

std::int64_t gemm_panel_width() {
  switch (gemm_path()) {
#ifdef MEMTRADE_GEMM_X86
    case GemmPath::avx512:
      return avx512::kNr;
    case GemmPath::avx2:
      return avx2::kNr;
#endif
    default:
      return 0;
  }
}

void own_sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
               float beta, float* c, std::int64_t ldc) {
  MEMTRADE_GEMM_DISPATCH(sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}

bool own_sgemm_reads_b_rows(std::int64_t m, std::int64_t n, std::int64_t k) {
  if (gemm_path() == GemmPath::blas) return false;
  MEMTRADE_GEMM_DISPATCH(small_m_pays(m, n, k));
}

PackedA::PackedA(bool trans_a, std::int64_t m, std::int64_t k, const float* a, std::int64_t lda)
    : m_(m), k_(k), path_(gemm_path()), panel_(gemm_panel_rows()) {
  if (panel_ == 0) throw std::logic_error("cpu gemm: PackedA on the BLAS path");
  rows_ = (m + panel_ - 1) / panel_ * panel_;
  data_ = aligned_floats(rows_ * k + kPackSlack);
  [&] { MEMTRADE_GEMM_DISPATCH(pack_whole_a(trans_a, m, k, a, lda, rows_, data_.get())); }();
}

void own_sgemm(const PackedA& a, std::int64_t i0, std::int64_t m, bool trans_b, std::int64_t n,
               float alpha, const float* b, std::int64_t ldb, float beta, float* c,
               std::int64_t ldc) {
  if (a.path_ != gemm_path()) throw std::logic_error("cpu gemm: a PackedA of another GEMM path");
  if (i0 % a.panel_ != 0 || i0 < 0 || m < 0 || i0 + m > a.m_)
    throw std::invalid_argument("cpu gemm: packed rows must start on a panel, in range");
  MEMTRADE_GEMM_DISPATCH(
      sgemm_packed(a.data_.get(), a.rows_, i0, m, a.k_, trans_b, n, alpha, b, ldb, beta, c, ldc));
}

void fill_panel_rows(const float* base, std::int64_t channels, std::int64_t stride,
                     const std::int64_t* offsets, const std::uint32_t* masks, std::int64_t taps,
                     float* panel) {
  MEMTRADE_GEMM_DISPATCH(fill_panel_rows(base, channels, stride, offsets, masks, taps, panel));
}

void fill_panel_lanes(const float* base, std::int64_t channels, std::int64_t stride,
                      const std::int64_t* offsets, const std::uint32_t* masks, std::int64_t taps,
                      const std::int32_t* lanes, float* panel) {
  MEMTRADE_GEMM_DISPATCH(
      fill_panel_lanes(base, channels, stride, offsets, masks, taps, lanes, panel));
}

}  // namespace memtrade::cpu
