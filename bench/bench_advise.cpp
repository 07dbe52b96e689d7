// The cost of `memtrade advise`'s search (the target: gpt2-124m at its 1024 positions on an H100,
// CUDA memory model, predicted only: <= 5 s): building the space off the knob table, one
// memory-model estimate per configuration (two micro-batches), the cost model's prediction and
// the Pareto frontier. The calibration is not part of it (it is measured once per device and
// cached); a stand-in cost model is used, as the search's work does not depend on its numbers.
//
// Counters: candidates (configurations searched), estimates (memory-model runs), frontier.
#include <benchmark/benchmark.h>

#include "harness/run/advise.h"
#include "kernels/allocator.h"

namespace memtrade {
namespace {

struct Case {
  const char* name;
  const char* model;
  const char* card;
  std::int64_t global_batch;
};

constexpr Case kCases[] = {
    {"gpt2_124m_h100_b8", "gpt2-124m", "h100", 8},
    {"gpt2_124m_h100_b64", "gpt2-124m", "h100", 64},
    {"gpt2_1558m_a10g_b32", "gpt2-1558m", "a10g", 32},
};

void BM_AdviseSearch(benchmark::State& state, const Case& c) {
  TrainConfig start;
  start.model = c.model;
  start.batch_size = c.global_batch;
  resolve_config(start);
  CostModel cost;  // stand-in coefficients: a flat FLOP rate
  cost.rate = {{1.0, 1e14}};
  const std::size_t limit = parse_capacity(c.card).value() - GiB;
  std::size_t candidates = 0, estimates = 0, frontier = 0;
  for (auto _ : state) {
    const AdviseSpace space = advise_space(start, {}, {}, Backend::cuda);
    estimates = 0;
    const auto all = evaluate(space, Backend::cuda, limit, cost, &estimates);
    frontier = pareto_frontier(all, start).size();
    candidates = space.configs.size();
    benchmark::DoNotOptimize(frontier);
  }
  state.counters["candidates"] = static_cast<double>(candidates);
  state.counters["estimates"] = static_cast<double>(estimates);
  state.counters["frontier"] = static_cast<double>(frontier);
}

[[maybe_unused]] const bool kRegistered = [] {
  for (const Case& c : kCases)
    benchmark::RegisterBenchmark((std::string("AdviseSearch/") + c.name).c_str(), BM_AdviseSearch,
                                 c)
        ->Unit(benchmark::kSecond)
        ->Iterations(1)
        ->UseRealTime();
  return true;
}();

}  // namespace
}  // namespace memtrade

BENCHMARK_MAIN();
