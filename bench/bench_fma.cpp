// The FMA peak of this CPU (bench/fma_peak.h): one core and every core, 256-bit (AVX2 with FMA)
// and 512-bit (AVX-512F) FMAs, as FLOP/s. The yardstick of the GEMM rows of bench_step
// (LargestGemm's `of_peak`) and of bench_kernels' GEMM shapes.
#include <benchmark/benchmark.h>

#include <thread>

#include "bench/fma_peak.h"

namespace memtrade::bench {
namespace {

void BM_FmaPeak(benchmark::State& state, FmaIsa isa) {
  if (!fma_isa_available(isa)) {
    state.SkipWithError(isa == FmaIsa::avx2 ? "this CPU has no AVX2 with FMA"
                                            : "this CPU has no AVX-512F");
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  double flops = 0.0;
  for (auto _ : state) flops = std::max(flops, fma_peak_flops(isa, threads));
  state.counters["FLOP/s"] = flops;
  state.counters["per_core"] = flops / threads;
}

void thread_counts(benchmark::internal::Benchmark* b) {
  b->Arg(1);
  const int all = static_cast<int>(std::thread::hardware_concurrency());
  if (all > 1) b->Arg(all);
}

BENCHMARK_CAPTURE(BM_FmaPeak, avx2, FmaIsa::avx2)
    ->Apply(thread_counts)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_FmaPeak, avx512, FmaIsa::avx512)
    ->Apply(thread_counts)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace memtrade::bench

BENCHMARK_MAIN();
