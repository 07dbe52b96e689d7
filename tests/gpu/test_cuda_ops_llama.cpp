// The Llama-family ops (RMSNorm, RoPE, SwiGLU) on CUDA against the CPU, and their allocations
// (none) against the CPU's and the dry run's.
#include <gtest/gtest.h>

#include <functional>
#include <tuple>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

#include "tests/gpu/gpu_test_util.h"

namespace memtrade {
namespace {

using gputest::CudaVsCpuDtype;
using gputest::Pair;
using gputest::Tol;

class CudaLlama : public CudaVsCpuDtype {};

RopeConfig llama3_scaled(double factor) {  // Llama 3.1 (8) / 3.2 (32) rope_scaling
  RopeConfig r;
  r.theta = 500000.0;
  r.factor = factor;
  r.original_max_position = 8192;
  return r;
}

TEST_P(CudaLlama, RmsnormForwardBackward) {
  const DType t = GetParam();
  for (Shape s : {Shape{4, 7, 2048}, Shape{33, 50}, Shape{3, 4097}}) {
    const std::int64_t c = s.back(), n = shape_numel(s) / c;
    Pair inp = rand(s, t, 1, -2.0f, 3.0f);
    for (DType wt : {t, DType::F32}) {  // an fp32 weight with a 16-bit input: HF's mixed case
      Pair w = rand({c}, wt, 2, 0.5f, 1.5f, Category::params);
      Pair out = full(s, t, 0.0f);
      Pair rstd = full({n}, DType::F32, 0.0f);
      cpu_ops().rmsnorm_forward(out.cpu, rstd.cpu, inp.cpu, w.cpu, 1e-5f);
      gpu_ops().rmsnorm_forward(out.gpu, rstd.gpu, inp.gpu, w.gpu, 1e-5f);
      const std::string tag = gputest::cat(" ", shape_str(s), " weight ", dtype_name(wt));
      // Both sum the squares in double: rstd agrees to its rounding.
      expect_close(rstd, Tol{0, 0, 1}, gputest::cat("rmsnorm rstd", tag));
      expect_close(out, Tol{1e-6f, 0, 2}, gputest::cat("rmsnorm out", tag));

      Pair dout = rand(s, t, 3);
      Pair dinp = full(s, t, 0.0f);
      Pair dw = rand({c}, wt, 4, -1.0f, 1.0f, Category::grads);
      for (bool acc : {false, true}) {
        cpu_ops().rmsnorm_backward(dinp.cpu, &dw.cpu, dout.cpu, inp.cpu, w.cpu, rstd.cpu, acc);
        gpu_ops().rmsnorm_backward(dinp.gpu, &dw.gpu, dout.gpu, inp.gpu, w.gpu, rstd.gpu, acc);
        const std::string at = gputest::cat(tag, acc ? " accumulate" : "");
        expect_close(dinp, Tol{2e-5f, 0, 3}, gputest::cat("rmsnorm dinp", at));
        expect_close(dw, Tol{2e-6f * n, 0, 3}, gputest::cat("rmsnorm dweight", at));
      }
      // dinp may alias dout.
      cpu_ops().rmsnorm_backward(dout.cpu, nullptr, dout.cpu, inp.cpu, w.cpu, rstd.cpu, false);
      gpu_ops().rmsnorm_backward(dout.gpu, nullptr, dout.gpu, inp.gpu, w.gpu, rstd.gpu, false);
      expect_close(dout, Tol{2e-5f, 0, 3}, gputest::cat("rmsnorm dinp aliasing dout", tag));
    }
  }
}

// Both backends rotate with the same fp32 cos/sin (computed in double) and the same unfused
// arithmetic, so the results agree to the last bit but for a cos/sin on a rounding boundary.
TEST_P(CudaLlama, RopeForwardBackward) {
  const DType t = GetParam();
  struct Case {
    std::int64_t b, tt;
    int nh, nkv;
    std::int64_t hd;
    RopeConfig rope;
  };
  for (const Case& k :
       {Case{2, 64, 8, 2, 64, llama3_scaled(32.0)}, Case{3, 17, 4, 4, 128, RopeConfig{}},
        Case{1, 5000, 2, 1, 128, llama3_scaled(8.0)},
        Case{70000, 2, 1, 1, 8, RopeConfig{}},  // more sequences than gridDim.y
        Case{2, 3, 1, 1, kRopeMaxHeadDim, RopeConfig{500000.0}}}) {
    const Shape s{k.b, k.tt, (k.nh + 2 * k.nkv) * k.hd};
    const std::string tag = gputest::cat(" ", shape_str(s), " NH", k.nh, " NKV", k.nkv);
    Pair qkv = rand(s, t, 5, -2.0f, 2.0f);
    cpu_ops().rope_forward(qkv.cpu, k.nh, k.nkv, k.rope);
    gpu_ops().rope_forward(qkv.gpu, k.nh, k.nkv, k.rope);
    expect_close(qkv, Tol{1e-7f, 0, 1}, gputest::cat("rope_forward", tag));
    Pair dqkv = rand(s, t, 6, -1.0f, 1.0f);
    cpu_ops().rope_backward(dqkv.cpu, k.nh, k.nkv, k.rope);
    gpu_ops().rope_backward(dqkv.gpu, k.nh, k.nkv, k.rope);
    expect_close(dqkv, Tol{1e-7f, 0, 1}, gputest::cat("rope_backward", tag));
  }
}

TEST_P(CudaLlama, SwigluForwardBackward) {
  const DType t = GetParam();
  // Sizes with a scalar tail, and one past a single grid's reach.
  for (Shape s : {Shape{3, 5}, Shape{7, 129}, Shape{1000003}}) {
    // The same dtype throughout (the templated kernels), then mixed (the generic ones).
    for (DType other : {t, t == DType::F32 ? DType::BF16 : DType::F32}) {
      const std::string tag = gputest::cat(" ", shape_str(s), " with ", dtype_name(other));
      Pair gate = rand(s, t, 7, -6.0f, 6.0f);
      Pair up = rand(s, other, 8);
      Pair out = full(s, t, 0.0f);
      cpu_ops().swiglu_forward(out.cpu, gate.cpu, up.cpu);
      gpu_ops().swiglu_forward(out.gpu, gate.gpu, up.gpu);
      // expf differs from the CPU's exp by an ulp or two.
      expect_close(out, Tol{1e-6f, 0, 4}, gputest::cat("swiglu", tag));
      Pair dout = rand(s, t, 9);
      Pair dgate = full(s, other, 0.0f);
      Pair dup = full(s, t, 0.0f);
      cpu_ops().swiglu_backward(dgate.cpu, dup.cpu, dout.cpu, gate.cpu, up.cpu);
      gpu_ops().swiglu_backward(dgate.gpu, dup.gpu, dout.gpu, gate.gpu, up.gpu);
      // dgate's 1 + g·(1 − σ) cancels near g = −1.28 (nvcc fuses it): absolute tolerance.
      expect_close(dgate, Tol{4e-6f, 0, 4}, gputest::cat("swiglu dgate", tag));
      expect_close(dup, Tol{1e-6f, 0, 4}, gputest::cat("swiglu dup", tag));
    }
  }
  // In place: dgate over gate, dup over up.
  Pair gate = rand({513}, t, 10, -6.0f, 6.0f), up = rand({513}, t, 11), dout = rand({513}, t, 12);
  cpu_ops().swiglu_backward(gate.cpu, up.cpu, dout.cpu, gate.cpu, up.cpu);
  gpu_ops().swiglu_backward(gate.gpu, up.gpu, dout.gpu, gate.gpu, up.gpu);
  expect_close(gate, Tol{4e-6f, 0, 4}, "swiglu dgate over gate");
  expect_close(up, Tol{1e-6f, 0, 4}, "swiglu dup over up");
}

// No op here allocates: the CPU, CUDA and the memory model's dry run (CUDA target) all make the
// same (empty) sequence, workspace included.
TEST_P(CudaLlama, AllocateNothingOnEitherBackendOrInTheDryRun) {
  const DType t = GetParam();
  using Ev = std::tuple<int, std::size_t, std::size_t, int>;
  auto events = [](CachingAllocator& a) {
    std::vector<Ev> out;
    for (const TraceEvent& e : a.trace())
      out.emplace_back(static_cast<int>(e.kind), e.bytes, e.requested,
                       static_cast<int>(e.category));
    a.clear_trace();
    return out;
  };
  const std::int64_t n = 16, c = 256;
  Pair x = rand({n, c}, t, 13), w = rand({c}, t, 14, 0.5f, 1.5f, Category::params);
  Pair y = full({n, c}, t, 0.0f), rstd = full({n}, DType::F32, 0.0f), dx = full({n, c}, t, 0.0f);
  Pair dw = full({c}, t, 0.0f), dg = full({n, c}, t, 0.0f), du = full({n, c}, t, 0.0f);
  Pair qkv = rand({2, 8, 8 * 32}, t, 15);  // NH 4, NKV 2, hd 32
  auto dry = make_dry_run_ops(Backend::cuda);
  auto at = [](Pair& p, bool gpu) -> Tensor& { return gpu ? p.gpu : p.cpu; };
  const std::vector<std::function<void(Ops&, bool)>> calls{
      [&](Ops& o, bool g) { o.rmsnorm_forward(at(y, g), at(rstd, g), at(x, g), at(w, g), 1e-5f); },
      [&](Ops& o, bool g) {
        o.rmsnorm_backward(at(dx, g), &at(dw, g), at(y, g), at(x, g), at(w, g), at(rstd, g), true);
      },
      [&](Ops& o, bool g) { o.rope_forward(at(qkv, g), 4, 2, llama3_scaled(32.0)); },
      [&](Ops& o, bool g) { o.rope_backward(at(qkv, g), 4, 2, RopeConfig{}); },
      [&](Ops& o, bool g) { o.swiglu_forward(at(y, g), at(x, g), at(dx, g)); },
      [&](Ops& o, bool g) {
        o.swiglu_backward(at(dg, g), at(du, g), at(y, g), at(x, g), at(dx, g));
      }};
  for (Device* d : {cpu_.get(), gpu_.get()}) d->memory().enable_trace(true);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    for (Device* d : {cpu_.get(), gpu_.get()}) d->memory().clear_trace();
    calls[i](cpu_ops(), false);
    calls[i](gpu_ops(), true);
    gpu_->synchronize();
    const auto on_cpu = events(cpu_->memory());
    const auto on_gpu = events(gpu_->memory());
    calls[i](*dry, true);
    EXPECT_EQ(on_gpu, on_cpu) << "call " << i;
    EXPECT_EQ(events(gpu_->memory()), on_gpu) << "dry run of call " << i;
  }
}

MEMTRADE_INSTANTIATE_DTYPES(CudaLlama);

}  // namespace
}  // namespace memtrade
