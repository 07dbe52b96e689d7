// Allocator microbenchmarks: what a cached alloc/free pair through CachingAllocator costs next to
// raw malloc/free of the same size. The cache is warmed first, so the CachingAllocator path is
// pure bookkeeping (best-fit lookup, split, coalesce, stats); malloc of large sizes is an
// mmap/munmap pair per call, which is exactly the cost a caching allocator exists to avoid
// (cudaMalloc/cudaFree are far slower still, and cudaFree synchronizes the device).
//
//   build/bench/bench_allocator --benchmark_min_time=0.05
#include <benchmark/benchmark.h>

#include <array>
#include <cstdlib>
#include <memory>
#include <vector>

#include "kernels/allocator.h"

namespace memtrade {
namespace {

void set_counters(benchmark::State& state, std::size_t bytes_per_iteration,
                  std::int64_t allocs_per_iteration) {
  state.SetItemsProcessed(state.iterations() * allocs_per_iteration);
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes_per_iteration));
}

void BM_CachedAllocFree(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  CachingAllocator alloc(std::make_unique<HostProvider>());
  alloc.free(alloc.allocate(bytes, Category::temporaries));  // warm: the segment stays cached
  for (auto _ : state) {
    void* p = alloc.allocate(bytes, Category::temporaries);
    benchmark::DoNotOptimize(p);
    alloc.free(p);
  }
  set_counters(state, bytes, 1);
  // 1 means every pair after warm-up was served from the cache.
  state.counters["segments"] = static_cast<double>(alloc.stats().num_segment_allocs);
}

void BM_MallocFree(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(bytes);
    benchmark::DoNotOptimize(p);
    std::free(p);
    benchmark::ClobberMemory();
  }
  set_counters(state, bytes, 1);
}

// A training-step-like burst: 32 live tensors of mixed sizes (256 B .. 8 MiB), freed in reverse.
constexpr std::array<std::size_t, 8> kMix = {256,     4 * KiB,       48 * KiB, 300 * KiB,
                                             1 * MiB, 2 * MiB + 512, 5 * MiB,  8 * MiB};

std::size_t mix_bytes() {
  std::size_t total = 0;
  for (int i = 0; i < 32; ++i) total += kMix[static_cast<std::size_t>(i) % kMix.size()];
  return total;
}

void BM_CachedStepBurst(benchmark::State& state) {
  CachingAllocator alloc(std::make_unique<HostProvider>());
  std::vector<void*> live(32);
  auto burst = [&] {
    for (std::size_t i = 0; i < live.size(); ++i)
      live[i] = alloc.allocate(kMix[i % kMix.size()], Category::activations);
    for (std::size_t i = live.size(); i-- > 0;) alloc.free(live[i]);
  };
  burst();  // warm
  for (auto _ : state) {
    burst();
    benchmark::DoNotOptimize(live.data());
  }
  set_counters(state, mix_bytes(), 32);
}

void BM_MallocStepBurst(benchmark::State& state) {
  std::vector<void*> live(32);
  for (auto _ : state) {
    for (std::size_t i = 0; i < live.size(); ++i) live[i] = std::malloc(kMix[i % kMix.size()]);
    benchmark::DoNotOptimize(live.data());
    for (std::size_t i = live.size(); i-- > 0;) std::free(live[i]);
    benchmark::ClobberMemory();
  }
  set_counters(state, mix_bytes(), 32);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t s :
       {std::int64_t{512}, std::int64_t{4} << 10, std::int64_t{64} << 10, std::int64_t{1} << 20,
        std::int64_t{8} << 20, std::int64_t{64} << 20, std::int64_t{1} << 30})
    b->Arg(s);
}

BENCHMARK(BM_CachedAllocFree)->Apply(sizes);
BENCHMARK(BM_MallocFree)->Apply(sizes);
BENCHMARK(BM_CachedStepBurst);
BENCHMARK(BM_MallocStepBurst);

}  // namespace
}  // namespace memtrade

BENCHMARK_MAIN();
