// One whole training step (Trainer::step: forward, backward, optimizer) per point on the CPU
// backend. A point is a set of knob settings (axis=value, through the knob table), fp32 Adam
// unless it says otherwise. Items are samples; the FLOP/s counter uses the model's own FLOP
// count (recompute included), so it reads as the achieved GFLOP/s of the whole step; peak_MiB is
// the allocator's peak. Rows in pairs (math vs flash, fp32 vs bf16) are meant to be run
// together with --benchmark_enable_random_interleaving on this shared machine. Times are real
// time; the CPU column is the whole process's (every thread), which shows the work done even
// when the shared machine keeps a thread waiting for a core.
//
// LargestGemm is a model's largest GEMM alone, the yardstick of the step's FLOP/s: as plain
// OpenBLAS runs it (cblas_sgemm with its own threads), and (/engine) through the CPU ops' own
// sgemm on the path the step itself runs (memtrade's own AVX-512 or AVX2 GEMM where the CPU has
// it, else OpenBLAS; kernels/cpu/cpu_gemm.h), split among the threads as the ops split it:
//   bench_step --benchmark_filter='gpt_small_fp32/|LargestGemm/gpt_small'
//              --benchmark_enable_random_interleaving=true --benchmark_repetitions=10
#include <benchmark/benchmark.h>

#include <random>
#include <sstream>
#include <vector>

#ifdef MEMTRADE_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/device.h"
#include "models/knobs.h"
#include "models/model.h"
#include "models/trainer.h"

namespace memtrade {
namespace {

// "model=gpt-mini batch_size=8 attention=flash" -> the config (bad text throws KnobError).
TrainConfig point(const std::string& settings) {
  TrainConfig cfg;
  std::istringstream in(settings);
  std::string kv;
  while (in >> kv) {
    const auto eq = kv.find('=');
    set_knob(cfg, knob(kv.substr(0, eq)), kv.substr(eq + 1));
  }
  resolve_config(cfg);
  return cfg;
}

void BM_TrainStep(benchmark::State& state, const char* settings) {
  const TrainConfig cfg = point(settings);
  auto dev = make_device("cpu");
  auto model = make_model(cfg);
  Trainer trainer(*dev, *model, cfg);
  trainer.step();  // the first step creates grads and optimizer state
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step().loss);
  const FlopCount f = model->flops(cfg.batch_size, RunOptions::from(cfg));
  state.SetItemsProcessed(state.iterations() * cfg.batch_size);
  state.counters["FLOP/s"] =
      benchmark::Counter(f.total() * static_cast<double>(cfg.accumulation * state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["peak_MiB"] =
      static_cast<double>(dev->memory().stats().allocated.peak) / (1024.0 * 1024.0);
}

#define MEMTRADE_STEP(name, settings)             \
  BENCHMARK_CAPTURE(BM_TrainStep, name, settings) \
      ->Unit(benchmark::kMillisecond)             \
      ->MeasureProcessCPUTime()                   \
      ->UseRealTime()

#ifdef MEMTRADE_HAVE_OPENBLAS
// C (M, N) = A (M, K) · Bᵀ, B (N, K): a linear layer's forward (the LM head's for a GPT).
void BM_LargestGemm(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  make_device("cpu");  // sets the OpenMP and OpenBLAS thread counts, as a step's device does
  std::mt19937 g(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k)),
      c(static_cast<std::size_t>(m * n));
  for (auto& x : a) x = d(g);
  for (auto& x : b) x = d(g);
  const bool engine = state.range(3) != 0;
  for (auto _ : state) {
    if (engine)
      cpu::sgemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), 1.0f, a.data(), static_cast<int>(k), b.data(),
                  static_cast<int>(k), 0.0f, c.data(), static_cast<int>(n));
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// gpt-small batch 4: the LM head, (B·T = 1024) × (V = 8192) × (C = 384), forward and (as
// 8192 × 384 × 1024) the weight gradient: the same multiply-adds.
BENCHMARK(BM_LargestGemm)
    ->Name("LargestGemm/gpt_small_b4")
    ->Args({1024, 8192, 384, 0})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
BENCHMARK(BM_LargestGemm)
    ->Name("LargestGemm/gpt_small_b4/engine")
    ->Args({1024, 8192, 384, 1})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
#endif

MEMTRADE_STEP(gpt_tiny_fp32, "model=gpt-tiny batch_size=8");
MEMTRADE_STEP(gpt_mini_fp32, "model=gpt-mini batch_size=8");
MEMTRADE_STEP(gpt_mini_bf16, "model=gpt-mini batch_size=8 precision=bf16");
MEMTRADE_STEP(gpt_mini_fp32_flash, "model=gpt-mini batch_size=8 attention=flash");
MEMTRADE_STEP(gpt_small_fp32, "model=gpt-small batch_size=4");
MEMTRADE_STEP(gpt_small_fp32_flash, "model=gpt-small batch_size=4 attention=flash");
MEMTRADE_STEP(gpt_small_seq64_fp32, "model=gpt-small batch_size=4 seq_len=64");
MEMTRADE_STEP(gpt_small_seq64_fp32_flash,
              "model=gpt-small batch_size=4 seq_len=64 attention=flash");
MEMTRADE_STEP(mlp_tiny_fp32, "model=mlp-tiny batch_size=64");
MEMTRADE_STEP(mlp_small_fp32, "model=mlp-small batch_size=64");
MEMTRADE_STEP(mlp_large_fp32, "model=mlp-large batch_size=64");
MEMTRADE_STEP(cnn_tiny_fp32, "model=cnn-tiny batch_size=16");
MEMTRADE_STEP(cnn_small_fp32, "model=cnn-small batch_size=32");

}  // namespace
}  // namespace memtrade

BENCHMARK_MAIN();
