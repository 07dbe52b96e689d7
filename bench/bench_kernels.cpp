// CPU op microbenchmarks: GEMM GFLOP/s through our ops (fp32 and bf16 storage) next to raw
// cblas_sgemm on the same shapes, plus layer-norm, GELU, softmax, attention (math and flash),
// convolution and the Adam update.
//
//   build-*/bench/bench_kernels --benchmark_filter=Gemm
// Rates are counters: "FLOP/s" for GEMMs and attention, "bytes/s" for memory-bound ops.
#include <memory>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#ifdef MEMTRADE_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/device.h"

namespace memtrade {
namespace {

Device& cpu() {
  static std::unique_ptr<Device> dev = make_device("cpu");  // immutable after first use
  return *dev;
}

std::vector<float> random_values(std::int64_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

Tensor random_tensor(Shape s, DType t, std::uint32_t seed) {
  Tensor x = cpu().empty(s, t, Category::activations);
  cpu().from_host_f32(x, random_values(shape_numel(s), seed));
  return x;
}

void set_flops(benchmark::State& state, double flops_per_iter) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops_per_iter, benchmark::Counter::kIsIterationInvariantRate);
}

void set_bytes(benchmark::State& state, double bytes_per_iter) {
  state.counters["bytes/s"] =
      benchmark::Counter(bytes_per_iter, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- GEMM: C (M, N) = A (M, K) · Bᵀ, B (N, K), the layout of a linear layer -------------------
void BM_GemmRawSgemm(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  auto a = random_values(m * k, 1), b = random_values(n * k, 2);
  std::vector<float> c(static_cast<std::size_t>(m * n));
  for (auto _ : state) {
#ifdef MEMTRADE_HAVE_OPENBLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a.data(), static_cast<int>(k), b.data(),
                static_cast<int>(k), 0.0f, c.data(), static_cast<int>(n));
#else
    cpu::blocked_sgemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
#endif
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * m * n * k);
}

void BM_GemmMatmul(benchmark::State& state, DType dt) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Tensor a = random_tensor({m, k}, dt, 1), b = random_tensor({n, k}, dt, 2);
  Tensor c = cpu().empty({m, n}, dt, Category::activations);
  for (auto _ : state) cpu().ops().matmul(c, a, b, false, true, 1.0f, 0.0f);
  set_flops(state, 2.0 * m * n * k);
}

void BM_GemmLinear(benchmark::State& state, DType dt) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Tensor x = random_tensor({m, k}, dt, 1), w = random_tensor({n, k}, dt, 2),
         bias = random_tensor({n}, dt, 3);
  Tensor y = cpu().empty({m, n}, dt, Category::activations);
  for (auto _ : state) cpu().ops().linear_forward(y, x, w, &bias);
  set_flops(state, 2.0 * m * n * k);
}

void gemm_shapes(benchmark::internal::Benchmark* b) {
  for (int s : {256, 512, 1024, 2048}) b->Args({s, s, s});
  for (int bt : {1024, 2048, 4096}) b->Args({bt, 3072, 768});  // GPT-2 small MLP fc
  b->ArgNames({"M", "N", "K"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_GemmRawSgemm)->Apply(gemm_shapes);
BENCHMARK_CAPTURE(BM_GemmMatmul, f32, DType::F32)->Apply(gemm_shapes);
BENCHMARK_CAPTURE(BM_GemmLinear, f32, DType::F32)->Apply(gemm_shapes);
BENCHMARK_CAPTURE(BM_GemmLinear, bf16, DType::BF16)->Apply(gemm_shapes);

// ---- memory-bound ops on GPT-2 small activations (B·T, 768) ------------------------------------
void BM_LayerNorm(benchmark::State& state, DType dt) {
  const std::int64_t n = state.range(0), c = 768;
  Tensor x = random_tensor({n, c}, dt, 1), w = random_tensor({c}, dt, 2),
         b = random_tensor({c}, dt, 3);
  Tensor y = cpu().empty({n, c}, dt, Category::activations);
  Tensor mean = cpu().empty({n}, DType::F32, Category::activations);
  Tensor rstd = cpu().empty({n}, DType::F32, Category::activations);
  for (auto _ : state) cpu().ops().layernorm_forward(y, mean, rstd, x, w, b, 1e-5f);
  set_bytes(state, 2.0 * static_cast<double>(n * c * dtype_size(dt)));
}

void BM_Gelu(benchmark::State& state, DType dt) {
  const std::int64_t n = state.range(0) * 3072;
  Tensor x = random_tensor({n}, dt, 1);
  Tensor y = cpu().empty({n}, dt, Category::activations);
  for (auto _ : state) cpu().ops().gelu_forward(y, x);
  set_bytes(state, 2.0 * static_cast<double>(n * dtype_size(dt)));
}

void BM_Softmax(benchmark::State& state) {
  const std::int64_t n = state.range(0), c = state.range(1);
  Tensor x = random_tensor({n, c}, DType::F32, 1);
  Tensor y = cpu().empty({n, c}, DType::F32, Category::activations);
  for (auto _ : state) cpu().ops().softmax_forward(y, x);
  set_bytes(state, 8.0 * static_cast<double>(n * c));
}

BENCHMARK_CAPTURE(BM_LayerNorm, f32, DType::F32)->Arg(4096)->UseRealTime();
BENCHMARK_CAPTURE(BM_LayerNorm, bf16, DType::BF16)->Arg(4096)->UseRealTime();
BENCHMARK_CAPTURE(BM_Gelu, f32, DType::F32)->Arg(1024)->UseRealTime();
BENCHMARK_CAPTURE(BM_Gelu, bf16, DType::BF16)->Arg(1024)->UseRealTime();
BENCHMARK(BM_Softmax)->Args({1024, 1024})->Args({64, 50257})->UseRealTime();

// ---- attention: forward + backward of one layer, math against flash ----------------------------
// Args B, T, NH, hd: gpt-mini's (batch 8), gpt-small's (batch 8) and GPT-2 small's heads at
// T = 256 and 1024. Compare the kinds side by side in one interleaved job (the machine is shared):
//   bench_kernels --benchmark_filter=Attention --benchmark_repetitions=10
//                 --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only
void BM_Attention(benchmark::State& state, AttentionKind kind, DType dt) {
  const std::int64_t b = state.range(0), t = state.range(1), nh = state.range(2),
                     hd = state.range(3), c = nh * hd;
  const int heads = static_cast<int>(nh);
  Tensor qkv = random_tensor({b, t, 3 * c}, dt, 1), dout = random_tensor({b, t, c}, dt, 2);
  Tensor out = cpu().empty({b, t, c}, dt, Category::activations);
  Tensor dqkv = cpu().empty({b, t, 3 * c}, dt, Category::activations);
  const bool flash = kind == AttentionKind::flash;
  Tensor att = flash ? Tensor() : cpu().empty({b, nh, t, t}, dt, Category::activations);
  Tensor lse = flash ? cpu().empty({b, nh, t}, DType::F32, Category::activations) : Tensor();
  for (auto _ : state) {
    if (flash) {
      cpu().ops().flash_attention_forward(out, lse, qkv, heads, heads);
      cpu().ops().flash_attention_backward(dqkv, dout, qkv, out, lse, heads, heads);
    } else {
      cpu().ops().attention_forward(out, att, qkv, heads, heads);
      cpu().ops().attention_backward(dqkv, dout, qkv, att, heads, heads);
    }
  }
  // Dense GEMM work of math (forward 2 GEMMs of T·T·hd, backward 4, per head), for both kinds:
  // the rates compare times.
  set_flops(state, 6.0 * 2.0 * static_cast<double>(b * nh * t * t * hd));
}

void attention_shapes(benchmark::internal::Benchmark* b) {
  b->Args({8, 64, 4, 32})      // gpt-mini
      ->Args({8, 256, 6, 64})  // gpt-small
      ->Args({4, 256, 12, 64})
      ->Args({1, 1024, 12, 64})
      ->ArgNames({"B", "T", "NH", "hd"})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

BENCHMARK_CAPTURE(BM_Attention, math_f32, AttentionKind::math, DType::F32)->Apply(attention_shapes);
BENCHMARK_CAPTURE(BM_Attention, flash_f32, AttentionKind::flash, DType::F32)
    ->Apply(attention_shapes);
BENCHMARK_CAPTURE(BM_Attention, math_bf16, AttentionKind::math, DType::BF16)
    ->Args({8, 256, 6, 64})
    ->ArgNames({"B", "T", "NH", "hd"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Attention, flash_bf16, AttentionKind::flash, DType::BF16)
    ->Args({8, 256, 6, 64})
    ->ArgNames({"B", "T", "NH", "hd"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- convolution: forward + backward (dinp, dweight, dbias) of one 3x3 layer, pad 1 -----------
// Args N, Ci, H (= W), Co, stride: cnn-small's layers at batch 32. Real time and the process's
// CPU time (all threads): the latter shows the work even when the shared machine delays threads.
void BM_Conv2d(benchmark::State& state) {
  const std::int64_t n = state.range(0), ci = state.range(1), h = state.range(2),
                     co = state.range(3);
  const int stride = static_cast<int>(state.range(4));
  const std::int64_t oh = (h + 2 - 3) / stride + 1;
  Tensor x = random_tensor({n, ci, h, h}, DType::F32, 1);
  Tensor w = random_tensor({co, ci, 3, 3}, DType::F32, 2), b = random_tensor({co}, DType::F32, 3);
  Tensor dout = random_tensor({n, co, oh, oh}, DType::F32, 4);
  Tensor y = cpu().empty({n, co, oh, oh}, DType::F32, Category::activations);
  Tensor dx = cpu().empty({n, ci, h, h}, DType::F32, Category::activations);
  Tensor dw = cpu().empty({co, ci, 3, 3}, DType::F32, Category::activations);
  Tensor db = cpu().empty({co}, DType::F32, Category::activations);
  for (auto _ : state) {
    cpu().ops().conv2d_forward(y, x, w, &b, stride, 1);
    cpu().ops().conv2d_backward(&dx, &dw, &db, dout, x, w, stride, 1, false);
  }
  set_flops(state, 3.0 * 2.0 * static_cast<double>(n * co * oh * oh * ci * 9));
}

BENCHMARK(BM_Conv2d)
    ->Args({32, 3, 32, 32, 1})
    ->Args({32, 32, 32, 32, 1})
    ->Args({32, 32, 32, 64, 2})
    ->Args({32, 64, 16, 64, 1})
    ->Args({32, 128, 8, 128, 1})
    ->ArgNames({"N", "Ci", "H", "Co", "s"})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

// One pass of the same convolution alone (phase 0: forward; 1: the weight gradient; 2: the input
// gradient), each 2·N·Co·OH·OW·Ci·9 FLOPs: which pass falls short of the GEMM's peak.
void BM_Conv2dPass(benchmark::State& state) {
  const std::int64_t n = state.range(0), ci = state.range(1), h = state.range(2),
                     co = state.range(3);
  const int stride = static_cast<int>(state.range(4)), phase = static_cast<int>(state.range(5));
  const std::int64_t oh = (h + 2 - 3) / stride + 1;
  Tensor x = random_tensor({n, ci, h, h}, DType::F32, 1);
  Tensor w = random_tensor({co, ci, 3, 3}, DType::F32, 2);
  Tensor dout = random_tensor({n, co, oh, oh}, DType::F32, 4);
  Tensor y = cpu().empty({n, co, oh, oh}, DType::F32, Category::activations);
  Tensor dx = cpu().empty({n, ci, h, h}, DType::F32, Category::activations);
  Tensor dw = cpu().empty({co, ci, 3, 3}, DType::F32, Category::activations);
  for (auto _ : state) {
    if (phase == 0) cpu().ops().conv2d_forward(y, x, w, nullptr, stride, 1);
    if (phase == 1)
      cpu().ops().conv2d_backward(nullptr, &dw, nullptr, dout, x, w, stride, 1, false);
    if (phase == 2)
      cpu().ops().conv2d_backward(&dx, nullptr, nullptr, dout, x, w, stride, 1, false);
  }
  set_flops(state, 2.0 * static_cast<double>(n * co * oh * oh * ci * 9));
}

BENCHMARK(BM_Conv2dPass)
    ->ArgsProduct({{32}, {3}, {32}, {32}, {1}, {0, 1}})
    ->ArgsProduct({{32}, {32}, {32}, {32}, {1}, {0, 1, 2}})
    ->ArgsProduct({{32}, {32}, {32}, {64}, {2}, {0, 1, 2}})
    ->ArgsProduct({{32}, {64}, {16}, {64}, {1}, {0, 1, 2}})
    ->ArgsProduct({{32}, {64}, {16}, {128}, {2}, {0, 1, 2}})
    ->ArgsProduct({{32}, {128}, {8}, {128}, {1}, {0, 1, 2}})
    ->ArgNames({"N", "Ci", "H", "Co", "s", "pass"})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

// ---- optimizer: Adam over n parameters (param, grad, m, v read; param, m, v written) -----------
void BM_AdamUpdate(benchmark::State& state, DType dt) {
  const std::int64_t n = state.range(0);
  Tensor p = random_tensor({n}, dt, 1), g = random_tensor({n}, dt, 2);
  Tensor m = random_tensor({n}, dt, 3), v = random_tensor({n}, dt, 4);
  cpu().ops().fill(v, 0.01f);
  OptimizerHyper h;
  h.kind = OptimizerKind::adam;
  for (auto _ : state) {
    cpu().ops().optimizer_update(h, p, g, &m, &v);
    ++h.step;
  }
  set_bytes(state, 7.0 * static_cast<double>(n * dtype_size(dt)));
}

BENCHMARK_CAPTURE(BM_AdamUpdate, f32, DType::F32)->Arg(1 << 22)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamUpdate, bf16, DType::BF16)->Arg(1 << 22)->UseRealTime();

}  // namespace
}  // namespace memtrade

BENCHMARK_MAIN();
