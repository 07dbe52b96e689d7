// One whole training step (Trainer::step: forward, backward, optimizer) per model on the CPU
// backend, fp32 Adam unless the name says otherwise. Items are samples; the FLOP/s counter uses
// the model's own FLOP count, so it reads as achieved GFLOP/s of the whole step.
#include <benchmark/benchmark.h>

#include "kernels/device.h"
#include "models/model.h"
#include "models/trainer.h"

namespace memtrade {
namespace {

void BM_TrainStep(benchmark::State& state, const char* model_name, Precision precision,
                  OptimizerKind optimizer) {
  auto dev = make_device("cpu");
  auto model = make_model(model_name);
  TrainConfig cfg;
  cfg.model = model_name;
  cfg.batch_size = state.range(0);
  cfg.precision = precision;
  cfg.optimizer = optimizer;
  Trainer trainer(*dev, *model, cfg);
  trainer.step();  // the first step creates grads and optimizer state
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step().loss);
  RunOptions ro;
  ro.act_dtype = compute_dtype(precision);
  const double flops = model->flops(cfg.batch_size, ro).total();
  state.SetItemsProcessed(state.iterations() * cfg.batch_size);
  state.counters["FLOP/s"] = benchmark::Counter(flops * static_cast<double>(state.iterations()),
                                                benchmark::Counter::kIsRate);
  state.counters["peak_MiB"] =
      static_cast<double>(dev->memory().stats().allocated.peak) / (1024.0 * 1024.0);
}

BENCHMARK_CAPTURE(BM_TrainStep, gpt_mini_fp32_adam, "gpt-mini", Precision::fp32,
                  OptimizerKind::adam)
    ->Arg(8)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, gpt_mini_bf16_adam, "gpt-mini", Precision::bf16,
                  OptimizerKind::adam)
    ->Arg(8)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, gpt_tiny_fp32_adam, "gpt-tiny", Precision::fp32,
                  OptimizerKind::adam)
    ->Arg(8)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, mlp_tiny_fp32_adam, "mlp-tiny", Precision::fp32,
                  OptimizerKind::adam)
    ->Arg(64)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, mlp_small_fp32_adam, "mlp-small", Precision::fp32,
                  OptimizerKind::adam)
    ->Arg(64)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, mlp_large_fp32_adam, "mlp-large", Precision::fp32,
                  OptimizerKind::adam)
    ->Arg(64)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, cnn_tiny_fp32_adam, "cnn-tiny", Precision::fp32,
                  OptimizerKind::adam)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace memtrade

BENCHMARK_MAIN();
