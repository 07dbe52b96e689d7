// The memory model's cost: one `memtrade estimate` (estimate_memory: model, Trainer and two
// steps on the meta device) per model, and one `memtrade fit` search, in wall time and peak
// resident memory. The meta device holds no data, so neither should grow with the parameter
// count. The targets on a 2-core machine: gpt2-1558m <= 0.5 s, Llama-3-8B (seq 4096,
// bf16, Adam) <= 1 s, RSS <= 300 MB; fit of gpt2-124m on an H100 <= 5 s.
//
// Counters: max_rss_MiB is the process's resident high-water mark over the benchmark (reset
// before it through /proc/self/clear_refs where the kernel allows, else the process's so far);
// rss_per_case says 1 when that reset worked; peak_GiB the predicted peak (or, for fit, the batch
// found), to see that the work was done.
#include <benchmark/benchmark.h>

#include <fstream>
#include <string>

#include <sys/resource.h>

#include "harness/run/estimate.h"
#include "kernels/allocator.h"

namespace memtrade {
namespace {

// One row per benchmark. A model is its name in make_model(), trained at seq_len (0: its own
// positions); the point is batch 8, accumulation 1, the CUDA target's memory model.
struct Case {
  const char* name;  // benchmark name suffix
  const char* model;
  Precision precision = Precision::bf16;
  OptimizerKind optimizer = OptimizerKind::adam;
  const char* fit_capacity = nullptr;  // fit: the card to search the batch size for
  std::int64_t seq_len = 0;
};

constexpr Case kCases[] = {
    {"gpt_mini", "gpt-mini"},
    {"gpt2_124m", "gpt2-124m"},
    {"gpt2_350m", "gpt2-350m"},
    {"gpt2_1558m", "gpt2-1558m"},
    {"llama3_8b", "llama3-8b", Precision::bf16, OptimizerKind::adam, nullptr, 4096},
    {"fit_gpt2_124m_h100", "gpt2-124m", Precision::bf16, OptimizerKind::adam, "h100"},
};

// Resets the kernel's resident high-water mark (VmHWM); false where that is not allowed.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  return static_cast<bool>(f << "5") && static_cast<bool>(f.flush());
}

// VmHWM in MiB, or getrusage's ru_maxrss (never reset) where /proc is unavailable.
double peak_rss_mib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // "... kB"
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

void BM_Estimate(benchmark::State& state, const Case& c) {
  TrainConfig cfg;
  cfg.model = c.model;
  cfg.batch_size = 8;
  cfg.precision = c.precision;
  cfg.optimizer = c.optimizer;
  cfg.seq_len = c.seq_len;
  const std::size_t capacity = c.fit_capacity ? parse_capacity(c.fit_capacity).value() : 0;
  state.counters["rss_per_case"] = reset_peak_rss() ? 1 : 0;
  double result = 0;
  for (auto _ : state) {
    if (c.fit_capacity != nullptr) {
      result = static_cast<double>(largest_fitting_batch(cfg, Backend::cuda, capacity, 65536));
    } else {
      const MemoryEstimate e = estimate_memory(cfg, Backend::cuda, 0);
      if (!e.fits) state.SkipWithError(e.oom_message.c_str());
      result = static_cast<double>(e.peak_allocated) / static_cast<double>(GiB);
    }
    benchmark::DoNotOptimize(result);
  }
  state.counters[c.fit_capacity ? "max_batch" : "peak_GiB"] = result;
  state.counters["max_rss_MiB"] = peak_rss_mib();
}

[[maybe_unused]] const bool kRegistered = [] {
  for (const Case& c : kCases)
    benchmark::RegisterBenchmark((std::string("BM_Estimate/") + c.name).c_str(), BM_Estimate, c)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  return true;
}();

}  // namespace
}  // namespace memtrade

BENCHMARK_MAIN();
