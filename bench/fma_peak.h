// The FMA throughput of this CPU's cores, the peak a GEMM is measured against: independent chains
// of fused multiply-adds (acc = acc·a + b, bounded, no denormals), enough of them to cover the
// FMA latency on every port (4-5 cycles × 2 ports: 12 ymm chains on AVX2, 24 zmm chains on
// AVX-512, each within the register file), timed by each thread's CPU time over about 0.1 s, best
// of three; on `threads` threads at once (each its own chains) for a whole machine's peak.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ctime>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace memtrade::bench {

// This thread's CPU time in seconds.
inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

enum class FmaIsa { avx2, avx512 };

inline bool fma_isa_available(FmaIsa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  return isa == FmaIsa::avx2 ? __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                             : __builtin_cpu_supports("avx512f");
#else
  (void)isa;
  return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
// FLOPs done by `iters` rounds of the chains (2 per lane per FMA); the sum keeps them live.
[[gnu::target("avx2,fma"), gnu::noinline]] inline double fma_chains_avx2(std::int64_t iters,
                                                                         float* sink) {
  constexpr int kChains = 12;
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(1.0f + 0.01f * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (std::int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, acc[i]);
  *sink = _mm256_cvtss_f32(s);
  return 2.0 * 8 * kChains * static_cast<double>(iters);
}

[[gnu::target("avx512f"), gnu::noinline]] inline double fma_chains_avx512(std::int64_t iters,
                                                                          float* sink) {
  constexpr int kChains = 24;
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + 0.01f * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (std::int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  *sink = lanes[0] + lanes[15];
  return 2.0 * 16 * kChains * static_cast<double>(iters);
}
#endif

// FLOP/s of FMAs on `threads` threads at once (0 where the CPU lacks the ISA): each thread's FLOPs
// over its own CPU time (CLOCK_THREAD_CPUTIME_ID), summed. CPU time, not the wall clock: on a
// machine shared with other work a thread that waits for its core is not running FMAs, and the
// wall clock would count that wait as slowness of the core (measured here with a loaded machine:
// 50 GFLOP/s by the wall clock, against the core's 125 by its CPU time).
inline double fma_flops(FmaIsa isa, int threads, std::int64_t iters) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (!fma_isa_available(isa)) return 0.0;
  double rate = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : rate)
  {
    float sink = 0.0f;
    const double t0 = thread_cpu_seconds();
    const double flops =
        isa == FmaIsa::avx2 ? fma_chains_avx2(iters, &sink) : fma_chains_avx512(iters, &sink);
    const double s = thread_cpu_seconds() - t0;
    rate += s > 0.0 ? flops / s : 0.0;
    if (sink == 12345.0f) rate += 1.0;  // keeps sink observable
  }
  return rate;
#else
  (void)isa, (void)threads, (void)iters;
  return 0.0;
#endif
}

// The peak: best of three runs of about 0.1 s each (the iteration count is calibrated first).
inline double fma_peak_flops(FmaIsa isa, int threads = 1) {
  const double probe = fma_flops(isa, threads, 1 << 16);
  if (probe <= 0.0) return 0.0;
  const double per_iter = isa == FmaIsa::avx2 ? 2.0 * 8 * 12 : 2.0 * 16 * 24;
  const auto iters = static_cast<std::int64_t>(std::max(1e5, 0.1 * probe / per_iter / threads));
  double best = 0.0;
  for (int r = 0; r < 3; ++r) best = std::max(best, fma_flops(isa, threads, iters));
  return best;
}

}  // namespace memtrade::bench
