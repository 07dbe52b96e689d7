// kernels/cpu/cpu_vec.h: cpu_vec_kernels.inc compiled for SSE2, AVX2 and AVX-512F, and the
// run-time choice between them. Compiled with -ffp-contract=off (AVX-512F brings FMA, which
// would otherwise fuse a·b + c on that path only; the optimizer's arithmetic must not fuse on
// any), -fno-trapping-math (lets GCC turn the clamps' selects into vector blends) and
// -fno-math-errno (lets sqrt vectorise); neither of the last two changes a value
// (kernels/CMakeLists.txt).
#include "kernels/cpu/cpu_vec.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "kernels/optimizer_math.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace memtrade::cpu::vec {

namespace sse2 {
#include "kernels/cpu/cpu_vec_kernels.inc"
}  // namespace sse2

// The few loops GCC does not vectorise well (short strided rows) are written with AVX2
// intrinsics where MEMTRADE_VEC_AVX2 is defined: on the AVX2 path and the AVX-512F one (which
// includes AVX2). `#pragma GCC target` does not define __AVX2__, hence a macro of our own.
#if defined(__x86_64__) && defined(__GNUC__)
#define MEMTRADE_VEC_X86 1
#pragma GCC push_options
#pragma GCC target("avx2")
#define MEMTRADE_VEC_AVX2 1
namespace avx2 {
#include "kernels/cpu/cpu_vec_kernels.inc"
}  // namespace avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f", "prefer-vector-width=512")
namespace avx512 {
#include "kernels/cpu/cpu_vec_kernels.inc"
}  // namespace avx512
#undef MEMTRADE_VEC_AVX2
#pragma GCC pop_options
#endif

namespace {

Isa detect() {
#ifdef MEMTRADE_VEC_X86
  if (__builtin_cpu_supports("avx512f")) return Isa::avx512;  // libgcc checks the OS state too
  if (__builtin_cpu_supports("avx2")) return Isa::avx2;
#endif
  return Isa::sse2;
}

// best_isa(), or a narrower path named by MEMTRADE_ISA (sse2, avx2, avx512): a machine with
// only AVX2 (or SSE2) emulated on a wider one, for `make peer --isa` and CPU comparisons.
Isa initial_isa() {
  const char* env = std::getenv("MEMTRADE_ISA");
  if (env == nullptr || *env == '\0') return best_isa();
  for (Isa path : {Isa::sse2, Isa::avx2, Isa::avx512})
    if (std::string_view(env) == isa_name(path)) {
      if (static_cast<int>(path) <= static_cast<int>(best_isa())) return path;
      std::fprintf(stderr, "memtrade: MEMTRADE_ISA=%s: this CPU has no %s; using %s\n", env, env,
                   isa_name(best_isa()));
      return best_isa();
    }
  std::fprintf(stderr, "memtrade: MEMTRADE_ISA=%s ignored (sse2, avx2 or avx512)\n", env);
  return best_isa();
}

std::atomic<Isa>& current() {
  static std::atomic<Isa> path{initial_isa()};
  return path;
}

}  // namespace

Isa best_isa() {
  static const Isa best = detect();
  return best;
}

Isa isa() {
  return current().load(std::memory_order_relaxed);
}

void set_isa(Isa path) {
  if (static_cast<int>(path) > static_cast<int>(best_isa()))
    throw std::invalid_argument(std::string("cpu vec: this CPU has no ") + isa_name(path));
  current().store(path, std::memory_order_relaxed);
}

const char* isa_name(Isa path) {
  switch (path) {
    case Isa::sse2:
      return "sse2";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "?";
}

// Each entry point forwards to the path in use.
#ifdef MEMTRADE_VEC_X86
#define MEMTRADE_VEC_DISPATCH(call) \
  switch (isa()) {                  \
    case Isa::avx512:               \
      return avx512::call;          \
    case Isa::avx2:                 \
      return avx2::call;            \
    case Isa::sse2:                 \
      break;                        \
  }                                 \
  return sse2::call
#else
#define MEMTRADE_VEC_DISPATCH(call) return sse2::call
#endif

void exp_shifted(const float* x, float shift, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(exp_shifted(x, shift, y, n));
}
double exp_sum(const float* x, float shift, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(exp_sum(x, shift, y, n));
}
float max(const float* x, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(max(x, n));
}
void scale(const float* x, float s, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(scale(x, s, y, n));
}
void gather_strided(const float* x, std::int64_t stride, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(gather_strided(x, stride, y, n));
}
void gather_strided_rows(const float* x, std::int64_t ldx, std::int64_t stride, float* y,
                         std::int64_t ldy, std::int64_t rows, std::int64_t lo, std::int64_t n,
                         std::int64_t width) {
  MEMTRADE_VEC_DISPATCH(gather_strided_rows(x, ldx, stride, y, ldy, rows, lo, n, width));
}
void transpose_to_panels(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t width,
                         std::int64_t lanes, float* dst, std::int64_t ldp) {
  MEMTRADE_VEC_DISPATCH(transpose_to_panels(src, lds, rows, width, lanes, dst, ldp));
}
void accumulate(const float* x, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(accumulate(x, y, n));
}
void accumulate3(const float* a, const float* b, const float* c, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(accumulate3(a, b, c, y, n));
}
void accumulate_stride2(const float* x, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(accumulate_stride2(x, y, n));
}
void accumulate_stride2_rows(const float* x, std::int64_t ldx, float* y, std::int64_t ldy,
                             std::int64_t rows, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(accumulate_stride2_rows(x, ldx, y, ldy, rows, n));
}
void add(const float* a, const float* b, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(add(a, b, y, n));
}
void relu_forward(const float* x, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(relu_forward(x, y, n));
}
void relu_backward(const float* g, const float* o, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(relu_backward(g, o, y, n));
}
void gelu_forward(const float* x, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(gelu_forward(x, y, n));
}
void gelu_backward(const float* g, const float* x, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(gelu_backward(g, x, y, n));
}
void swiglu_forward(const float* g, const float* u, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(swiglu_forward(g, u, y, n));
}
void swiglu_backward(const float* d, const float* g, const float* u, float* dg, float* du,
                     std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(swiglu_backward(d, g, u, dg, du, n));
}
double sum(const float* x, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(sum(x, n));
}
double dot(const float* a, const float* b, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(dot(a, b, n));
}
double sum_sq_dev(const float* x, double mu, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(sum_sq_dev(x, mu, n));
}
void layernorm_backward_sums(const float* x, const float* g, const float* w, float mu, float rs,
                             std::int64_t n, double& dnorm, double& dnorm_norm) {
  MEMTRADE_VEC_DISPATCH(layernorm_backward_sums(x, g, w, mu, rs, n, dnorm, dnorm_norm));
}
void batchnorm_backward_sums(const float* x, const float* g, float mu, float rs, std::int64_t n,
                             double& sum_g, double& sum_gx) {
  MEMTRADE_VEC_DISPATCH(batchnorm_backward_sums(x, g, mu, rs, n, sum_g, sum_gx));
}
void batchnorm_apply(const float* x, float mu, float rs, float gamma, float beta, float* y,
                     std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(batchnorm_apply(x, mu, rs, gamma, beta, y, n));
}
void batchnorm_dx(const float* x, const float* g, float mu, float rs, float k, float count,
                  float sum_g, float sum_gx, float* y, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(batchnorm_dx(x, g, mu, rs, k, count, sum_g, sum_gx, y, n));
}
void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(bf16_to_f32(src, dst, n));
}
void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(f32_to_bf16(src, dst, n));
}
void optimizer_step(const OptimizerScalars& a, const float* p_in, const float* g,
                    const float* s0_in, const float* s1_in, float* p, float* s0, float* s1,
                    std::int64_t n) {
  MEMTRADE_VEC_DISPATCH(optimizer_step(a, p_in, g, s0_in, s1_in, p, s0, s1, n));
}

}  // namespace memtrade::cpu::vec
