// CUDA microbenchmarks: GEMM per precision (fp32, tf32, fp16, bf16), attention forward and
// backward, layer-norm, and an Adam step, timed with CUDA events on the compute stream through
// UseManualTime; FLOP and byte rates as counters. Every benchmark is a row that says why when it
// cannot run (no CUDA build, no device): SkipWithError, never a crash.
//
//   build/bench/bench_cuda --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda_probe.h"
#include "kernels/device.h"

#ifdef MEMTRADE_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace memtrade {
namespace {

// The CUDA device, or nullptr after SkipWithError.
std::unique_ptr<Device> cuda_or_skip(benchmark::State& state) {
  const CudaProbe p = probe_cuda();
  if (!p.usable) {
    state.SkipWithError(("CUDA unusable: " + p.detail).c_str());
    return nullptr;
  }
  return make_device("cuda");
}

// Times `body` per iteration with events on the compute stream (warmed up once).
template <typename F>
void time_with_events(benchmark::State& state, Device& dev, F&& body) {
  body();
  dev.synchronize();
  auto start = dev.make_event();
  auto stop = dev.make_event();
  for (auto _ : state) {
    start->record(StreamKind::compute);
    body();
    stop->record(StreamKind::compute);
    stop->synchronize();
    state.SetIterationTime(stop->seconds_since(*start));
  }
}

// Arg 0: precision (0 fp32, 1 tf32, 2 fp16, 3 bf16); arg 1: M = N = K.
void BM_Gemm(benchmark::State& state) {
  auto dev = cuda_or_skip(state);
  if (!dev) return;
  const int prec = static_cast<int>(state.range(0));
  const std::int64_t n = state.range(1);
  const DType t = prec == 2 ? DType::F16 : prec == 3 ? DType::BF16 : DType::F32;
#ifdef MEMTRADE_HAVE_CUDA
  cuda::set_tf32(*dev, prec == 1);
#endif
  Tensor a = dev->empty({n, n}, t, Category::activations);
  Tensor b = dev->empty({n, n}, t, Category::activations);
  Tensor c = dev->empty({n, n}, t, Category::activations);
  dev->ops().fill(a, 0.5f);
  dev->ops().fill(b, 0.25f);
  time_with_events(state, *dev, [&] { dev->ops().matmul(c, a, b, false, true, 1.0f, 0.0f); });
  state.counters["TFLOPS"] = benchmark::Counter(
      2.0 * static_cast<double>(n * n * n) * static_cast<double>(state.iterations()) / 1e12,
      benchmark::Counter::kIsRate);
  static const char* names[] = {"fp32", "tf32", "fp16", "bf16"};
  state.SetLabel(names[prec]);
}
BENCHMARK(BM_Gemm)
    ->ArgsProduct({{0, 1, 2, 3}, {1024, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// GPT-2 small attention: B = arg 0, T = 1024, C = 768, 12 heads; arg 1: 0 fp32, 1 bf16;
// arg 2: 0 math, 1 flash.
void BM_Attention(benchmark::State& state) {
  auto dev = cuda_or_skip(state);
  if (!dev) return;
  const std::int64_t b = state.range(0), t = 1024, c = 768;
  const int nh = 12;
  const DType dt = state.range(1) ? DType::BF16 : DType::F32;
  const bool flash = state.range(2) != 0;
  Tensor qkv = dev->empty({b, t, 3 * c}, dt, Category::activations);
  Tensor out = dev->empty({b, t, c}, dt, Category::activations);
  Tensor att = flash ? Tensor() : dev->empty({b, nh, t, t}, dt, Category::activations);
  Tensor lse = flash ? dev->empty({b, nh, t}, DType::F32, Category::activations) : Tensor();
  Tensor dout = dev->empty({b, t, c}, dt, Category::activations);
  Tensor dqkv = dev->empty({b, t, 3 * c}, dt, Category::activations);
  dev->ops().fill(qkv, 0.01f);
  dev->ops().fill(dout, 0.01f);
  time_with_events(state, *dev, [&] {
    if (flash) {
      dev->ops().flash_attention_forward(out, lse, qkv, nh, nh);
      dev->ops().flash_attention_backward(dqkv, dout, qkv, out, lse, nh, nh);
    } else {
      dev->ops().attention_forward(out, att, qkv, nh, nh);
      dev->ops().attention_backward(dqkv, dout, qkv, att, nh, nh);
    }
  });
  // Forward 2 GEMMs (4·B·T²·C FLOPs), backward 4: the straightforward form computes the
  // masked half too. Flash is counted the same way, so that the rates compare times.
  state.counters["TFLOPS"] = benchmark::Counter(
      12.0 * static_cast<double>(b * t * t * c) * static_cast<double>(state.iterations()) / 1e12,
      benchmark::Counter::kIsRate);
  state.SetLabel(std::string(dtype_name(dt)) + (flash ? " flash" : " math"));
}
BENCHMARK(BM_Attention)
    ->ArgsProduct({{4, 8}, {0, 1}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Layer-norm forward + backward on (B·T, 768), B·T = arg 0.
void BM_Layernorm(benchmark::State& state) {
  auto dev = cuda_or_skip(state);
  if (!dev) return;
  const std::int64_t n = state.range(0), c = 768;
  Tensor x = dev->empty({n, c}, DType::BF16, Category::activations);
  Tensor y = dev->empty({n, c}, DType::BF16, Category::activations);
  Tensor w = dev->empty({c}, DType::F32, Category::params);
  Tensor bias = dev->empty({c}, DType::F32, Category::params);
  Tensor dw = dev->empty({c}, DType::F32, Category::grads);
  Tensor db = dev->empty({c}, DType::F32, Category::grads);
  Tensor mean = dev->empty({n}, DType::F32, Category::activations);
  Tensor rstd = dev->empty({n}, DType::F32, Category::activations);
  for (Tensor* p : {&x, &y, &w, &bias}) dev->ops().fill(*p, 1.0f);
  time_with_events(state, *dev, [&] {
    dev->ops().layernorm_forward(y, mean, rstd, x, w, bias, 1e-5f);
    dev->ops().layernorm_backward(x, &dw, &db, y, y, w, mean, rstd, true);
  });
  state.SetBytesProcessed(state.iterations() * n * c * 2 * 6);  // ~6 passes over 16-bit rows
}
BENCHMARK(BM_Layernorm)->Arg(8192)->Arg(65536)->UseManualTime()->Unit(benchmark::kMicrosecond);

// One Adam step over arg 0 fp32 parameters.
void BM_AdamStep(benchmark::State& state) {
  auto dev = cuda_or_skip(state);
  if (!dev) return;
  const std::int64_t n = state.range(0);
  Tensor p = dev->empty({n}, DType::F32, Category::params);
  Tensor g = dev->empty({n}, DType::F32, Category::grads);
  Tensor m = dev->empty({n}, DType::F32, Category::optimizer);
  Tensor v = dev->empty({n}, DType::F32, Category::optimizer);
  for (Tensor* x : {&p, &g, &m, &v}) dev->ops().fill(*x, 0.1f);
  OptimizerHyper h;
  h.kind = OptimizerKind::adamw;
  time_with_events(state, *dev, [&] { dev->ops().optimizer_update(h, p, g, &m, &v); });
  state.SetBytesProcessed(state.iterations() * n * 4 * 7);  // read p, g, m, v; write p, m, v
}
BENCHMARK(BM_AdamStep)
    ->Arg(1 << 20)
    ->Arg(124 << 20)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace memtrade

BENCHMARK_MAIN();
