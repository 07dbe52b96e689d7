// One whole training step (Trainer::step: forward, backward, optimizer) per point on the CPU
// backend. A point is a set of knob settings (axis=value, through the knob table), fp32 Adam
// unless it says otherwise. Items are samples; the FLOP/s counter uses the model's own FLOP
// count (recompute included), so it reads as the achieved GFLOP/s of the whole step; peak_MiB is
// the allocator's peak. Rows in pairs (math vs flash, fp32 vs bf16) are meant to be run
// together with --benchmark_enable_random_interleaving on this shared machine. Times are real
// time; the CPU column is the whole process's (every thread), which shows the work done even
// when the shared machine keeps a thread waiting for a core.
//
// LargestGemm is each of the models' large GEMMs alone, on every GEMM path, one thread and two,
// with its fraction of the FMA peak (see BM_LargestGemm):
//   bench_step --benchmark_filter='gpt_small_fp32/|LargestGemm/gpt_small_b4/lm_head/'
//              --benchmark_enable_random_interleaving=true --benchmark_repetitions=10
#include <benchmark/benchmark.h>

#include <algorithm>
#include <ctime>
#include <random>
#include <sstream>
#include <vector>

#ifdef MEMTRADE_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench/fma_peak.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"
#include "kernels/device.h"
#include "models/config/knobs.h"
#include "models/model.h"
#include "models/train/trainer.h"

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

// One GEMM of a model's step, alone, on one GEMM path and thread count: the yardstick of the
// step's FLOP/s. Through the CPU ops' own sgemm (split among the threads as the ops split it;
// one thread: a single call), on the path the row names: `blas` (OpenBLAS), `avx2` or `avx512`
// (memtrade's own, kernels/cpu/cpu_gemm.h), skipped where the CPU lacks it. `of_peak` is the
// FLOP/s over the FMA peak of as many cores at the path's vector width (bench/fma_peak.h,
// measured in this process: 256-bit for avx2, 512-bit for avx512; for blas, the widest the CPU
// has under MEMTRADE_ISA, since OpenBLAS chooses its own kernels).

// The CPU time of every thread of this process, in seconds.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

void BM_LargestGemm(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool trans_a = (state.range(3) & 1) != 0, trans_b = (state.range(3) & 2) != 0;
  const auto path = static_cast<cpu::GemmPath>(state.range(4));
  const int threads = static_cast<int>(state.range(5));
  const std::int64_t pixels = state.range(6);  // a conv row's pixels per image
  if (!cpu::gemm_available(path)) {
    state.SkipWithError("this CPU lacks the GEMM path");
    return;
  }
  make_device("cpu");  // sets the OpenMP and OpenBLAS thread counts, as a step's device does
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
#ifdef MEMTRADE_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
#endif
  const cpu::GemmPath before = cpu::gemm_path();
  cpu::set_gemm_path(path);
  std::mt19937 g(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k)),
      c(static_cast<std::size_t>(m * n));
  for (auto& x : a) x = d(g);
  for (auto& x : b) x = d(g);
  // trans 4: a convolution's GEMM as conv2d runs it, one image of `pixels` pixels at a time
  // (C: its (m, pixels) output plane). On an own path the weight is packed once per op
  // (PackedA) and each im2col tile of `width` pixels is already a B panel, read in place; on blas
  // each image is one GEMM.
  const bool conv = state.range(3) == 4;
  const bool own = path != cpu::GemmPath::blas;
  const std::int64_t width = conv && own ? cpu::gemm_panel_width() : 0;
  cpu::AlignedFloats panels;  // the im2col tiles: n / width panels of (k, width), 64-byte aligned
  if (width > 0) {
    panels.reset(static_cast<float*>(std::aligned_alloc(64, ((n * k * 4 + 63) / 64) * 64)));
    if (!panels) throw std::bad_alloc();
    std::copy(b.begin(), b.end(), panels.get());
  }
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    if (conv && own) {
      const cpu::PackedA packed(false, m, k, a.data(), k);
      for (std::int64_t img = 0; img < n / pixels; ++img)
        for (std::int64_t j = 0; j < pixels; j += width)
          cpu::own_sgemm(packed, 0, m, false, std::min(width, pixels - j), 1.0f,
                         panels.get() + (img * pixels + j) * k, width, 0.0f,
                         c.data() + img * m * pixels + j, pixels);
    } else if (conv) {
      for (std::int64_t img = 0; img < n / pixels; ++img)
        cpu::sgemm(false, false, m, pixels, k, 1.0f, a.data(), k, b.data() + img * pixels * k,
                   pixels, 0.0f, c.data() + img * m * pixels, pixels);
    } else {
      cpu::sgemm(trans_a, trans_b, m, n, k, 1.0f, a.data(), trans_a ? m : k, b.data(),
                 trans_b ? k : n, 0.0f, c.data(), n);
    }
    benchmark::DoNotOptimize(c.data());
  }
  const double cpu_s = process_cpu_seconds() - cpu0;
  cpu::set_gemm_path(before);
  const double flop = 2.0 * static_cast<double>(m * n * k);
  state.counters["FLOP/s"] =
      benchmark::Counter(flop, benchmark::Counter::kIsIterationInvariantRate);
  const bool wide = path == cpu::GemmPath::avx512 ||
                    (path == cpu::GemmPath::blas && cpu::vec::isa() == cpu::vec::Isa::avx512);
  static const double peak[2] = {bench::fma_peak_flops(bench::FmaIsa::avx2),
                                 bench::fma_peak_flops(bench::FmaIsa::avx512)};
  const double core_peak = peak[wide ? 1 : 0];
  // Per core, by CPU time (every thread's): FLOPs over the CPU seconds spent is the rate of a
  // core while it ran this GEMM, which a shared machine's waits for a core do not dilute (the
  // peak is measured the same way, bench/fma_peak.h).
  const double total = flop * static_cast<double>(state.iterations());
  if (cpu_s > 0.0) state.counters["core_FLOP/s"] = total / cpu_s;
  if (core_peak > 0.0 && cpu_s > 0.0) state.counters["of_peak"] = total / cpu_s / core_peak;
}

// The large GEMMs of the `make peer` models' fp32 steps, as the linear ops call them (forward
// C = X·Wᵀ: trans 2; the input gradient dX = dY·W: 0; the weight gradient dW = dYᵀ·X: 1), and a
// convolution's forward as conv2d calls it (trans 4): cnn-small's widest layer, 128 channels
// from 128·3·3 over 32 images of 8 x 8, and its first block's, 32 channels from 32·3·3 over
// images of 32 x 32 (its weight gradient, per image, is trans 2 with m = 32). Each on every path,
// one thread and two (the conv row on one: conv2d splits its tiles among the threads itself).
struct GemmShape {
  const char* name;
  std::int64_t m, n, k, trans;
  std::int64_t pixels = 0;  // a convolution's (trans 4): pixels per image
};
constexpr GemmShape kLargestGemms[] = {
    {"gpt_small_b4/lm_head", 1024, 8192, 384, 2},     // the largest: B·T × V × C
    {"gpt_small_b4/lm_head_dx", 1024, 384, 8192, 0},  //
    {"gpt_small_b4/lm_head_dw", 8192, 384, 1024, 1},  //
    {"gpt_small_b4/fc", 1024, 1536, 384, 2},          // B·T × 4C × C
    {"gpt_small_b4/proj", 1024, 384, 1536, 2},        // B·T × C × 4C
    {"gpt_mini_b8/fc", 512, 512, 128, 2},             //
    {"mlp_small_b64/hidden", 64, 1024, 1024, 2},      // batch × width × width
    {"mlp_small_b64/hidden_dw", 1024, 1024, 64, 1},   //
    {"cnn_small_b32/conv3", 128, 2048, 1152, 4, 64},  // Cout × (B·H·W) × Cin·9, 8 x 8 images
    {"cnn_small_b32/conv1", 32, 8192, 288, 4, 1024},  // the first block's, 32 x 32 (8 images)
    {"cnn_small_b32/conv1_dw", 32, 288, 1024, 2},     // its weight gradient, one image: dY·colᵀ
};

void register_largest_gemms() {
  for (const GemmShape& s : kLargestGemms)
    for (const cpu::GemmPath path :
         {cpu::GemmPath::blas, cpu::GemmPath::avx2, cpu::GemmPath::avx512})
      for (const int threads : {1, 2}) {
        if (s.trans == 4 && threads > 1) continue;
        benchmark::RegisterBenchmark(
            (std::string("LargestGemm/") + s.name + "/" + cpu::gemm_path_name(path) +
             "/threads:" + std::to_string(threads))
                .c_str(),
            BM_LargestGemm)
            ->Args({s.m, s.n, s.k, s.trans, static_cast<std::int64_t>(path), threads, s.pixels})
            ->Unit(benchmark::kMillisecond)
            ->MeasureProcessCPUTime()
            ->UseRealTime();
      }
}

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

int main(int argc, char** argv) {
  memtrade::register_largest_gemms();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
