// Gemma 2's ops (GeGLU, soft-capping, the (1 + w) RMSNorm, capped and scaled math attention) on
// CUDA against the CPU (tests/kernels/test_cpu_ops_gemma.cpp holds the CPU to double
// references), and their allocations against the CPU's and the dry run's.
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

class CudaGemma : public CudaVsCpuDtype {};

TEST_P(CudaGemma, GegluAndSoftcap) {
  const DType t = GetParam();
  for (Shape s : {Shape{3, 5}, Shape{7, 129}, Shape{1000003}}) {
    const std::string tag = gputest::cat(" ", shape_str(s));
    Pair gate = rand(s, t, 1, -6.0f, 6.0f), up = rand(s, t, 2), out = full(s, t, 0.0f);
    cpu_ops().geglu_forward(out.cpu, gate.cpu, up.cpu);
    gpu_ops().geglu_forward(out.gpu, gate.gpu, up.gpu);
    expect_close(out, Tol{1e-6f, 0, 4}, gputest::cat("geglu", tag));  // tanhf's ulps
    Pair dout = rand(s, t, 3), dgate = full(s, t, 0.0f), dup = full(s, t, 0.0f);
    cpu_ops().geglu_backward(dgate.cpu, dup.cpu, dout.cpu, gate.cpu, up.cpu);
    gpu_ops().geglu_backward(dgate.gpu, dup.gpu, dout.gpu, gate.gpu, up.gpu);
    expect_close(dgate, Tol{4e-6f, 0, 4}, gputest::cat("geglu dgate", tag));
    expect_close(dup, Tol{1e-6f, 0, 4}, gputest::cat("geglu dup", tag));

    Pair x = rand(s, t, 4, -20.0f, 20.0f), y = full(s, t, 0.0f), dx = full(s, t, 0.0f);
    cpu_ops().softcap_forward(y.cpu, x.cpu, 5.0f);
    gpu_ops().softcap_forward(y.gpu, x.gpu, 5.0f);
    expect_close(y, Tol{2e-6f, 0, 4}, gputest::cat("softcap", tag));
    cpu_ops().softcap_backward(dx.cpu, dout.cpu, y.cpu, 5.0f);
    gpu_ops().softcap_backward(dx.gpu, dout.gpu, y.gpu, 5.0f);
    expect_close(dx, Tol{2e-6f, 0, 4}, gputest::cat("softcap dinp", tag));
  }
}

TEST_P(CudaGemma, UnitOffsetRmsnorm) {
  const DType t = GetParam();
  for (Shape s : {Shape{4, 7, 2048}, Shape{33, 50}}) {
    const std::int64_t c = s.back(), n = shape_numel(s) / c;
    Pair inp = rand(s, t, 5, -2.0f, 3.0f);
    Pair w = rand({c}, DType::F32, 6, -0.5f, 0.5f, Category::params);
    Pair out = full(s, t, 0.0f), rstd = full({n}, DType::F32, 0.0f);
    cpu_ops().rmsnorm_forward(out.cpu, rstd.cpu, inp.cpu, w.cpu, 1e-6f, true);
    gpu_ops().rmsnorm_forward(out.gpu, rstd.gpu, inp.gpu, w.gpu, 1e-6f, true);
    expect_close(out, Tol{1e-6f, 0, 2}, "unit-offset rmsnorm out");
    Pair dout = rand(s, t, 7), dinp = full(s, t, 0.0f);
    Pair dw = full({c}, DType::F32, 0.0f, Category::grads);
    cpu_ops().rmsnorm_backward(dinp.cpu, &dw.cpu, dout.cpu, inp.cpu, w.cpu, rstd.cpu, false, true);
    gpu_ops().rmsnorm_backward(dinp.gpu, &dw.gpu, dout.gpu, inp.gpu, w.gpu, rstd.gpu, false, true);
    expect_close(dinp, Tol{2e-5f, 0, 3}, "unit-offset rmsnorm dinp");
    expect_close(dw, Tol{2e-6f * n, 0, 3}, "unit-offset rmsnorm dweight");
  }
}

TEST_P(CudaGemma, CappedScaledAttention) {
  const DType t = GetParam();
  const std::int64_t b = 2, tt = 33, nh = 4, nkv = 2, hd = 16, c = nh * hd;
  const AttentionScores sc{0.2f, 3.0f};
  Pair qkv = rand({b, tt, (nh + 2 * nkv) * hd}, t, 8, -2.0f, 2.0f);
  Pair out = full({b, tt, c}, t, 0.0f), att = full({b, nh, tt, tt}, t, 0.0f);
  Pair th = full({b, nh, tt, tt}, t, 0.0f);
  cpu_ops().attention_forward(out.cpu, att.cpu, qkv.cpu, nh, nkv, sc, &th.cpu);
  gpu_ops().attention_forward(out.gpu, att.gpu, qkv.gpu, nh, nkv, sc, &th.gpu);
  const float lp = t == DType::F32 ? 0.0f : 1.0f;
  expect_close(th, Tol{1e-6f + lp * 2 * dtype_eps(t), 0, 4}, "tanh of the scores");
  expect_close(att, Tol{1e-6f + lp * 4 * dtype_eps(t), 0, 4}, "capped probs");
  expect_close(out, Tol{1e-5f, lp * 4 * dtype_eps(t), 4}, "capped attention out");
  Pair att_ref = make({b, nh, tt, tt}, t, cpu_->to_host_f32(att.cpu));
  Pair th_ref = make({b, nh, tt, tt}, t, cpu_->to_host_f32(th.cpu));
  Pair dout = rand({b, tt, c}, t, 9), dqkv = full({b, tt, (nh + 2 * nkv) * hd}, t, 0.0f);
  cpu_ops().attention_backward(dqkv.cpu, dout.cpu, qkv.cpu, att_ref.cpu, nh, nkv, sc, &th_ref.cpu);
  gpu_ops().attention_backward(dqkv.gpu, dout.gpu, qkv.gpu, att_ref.gpu, nh, nkv, sc, &th_ref.gpu);
  expect_close(dqkv, Tol{1e-5f, 1e-5f + lp * 8 * dtype_eps(t), 4}, "capped attention dqkv");
}

// Soft-capping adds no allocation: the CPU, CUDA and the dry run (CUDA target, outside its
// workspace) make the same sequence.
TEST_P(CudaGemma, AllocateAsTheCpuAndTheDryRun) {
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
  const std::int64_t n = 16, cc = 256;
  Pair x = rand({n, cc}, t, 13), w = rand({cc}, t, 14, -0.5f, 0.5f, Category::params);
  Pair y = full({n, cc}, t, 0.0f), rstd = full({n}, DType::F32, 0.0f), dx = full({n, cc}, t, 0.0f);
  Pair dw = full({cc}, t, 0.0f), dg = full({n, cc}, t, 0.0f), du = full({n, cc}, t, 0.0f);
  Pair qkv = rand({2, 8, 8 * 32}, t, 15);  // NH 4, NKV 2, hd 32
  Pair o = full({2, 8, 4 * 32}, t, 0.0f), att = full({2, 4, 8, 8}, t, 0.0f);
  Pair th = full({2, 4, 8, 8}, t, 0.0f), dq = full({2, 8, 8 * 32}, t, 0.0f);
  const AttentionScores sc{0.2f, 3.0f};
  auto dry = make_dry_run_ops(Backend::cuda);
  auto at = [](Pair& p, bool gpu) -> Tensor& { return gpu ? p.gpu : p.cpu; };
  const std::vector<std::function<void(Ops&, bool)>> calls{
      [&](Ops& op, bool g) {
        op.rmsnorm_forward(at(y, g), at(rstd, g), at(x, g), at(w, g), 1e-6f, true);
      },
      [&](Ops& op, bool g) {
        op.rmsnorm_backward(at(dx, g), &at(dw, g), at(y, g), at(x, g), at(w, g), at(rstd, g), true,
                            true);
      },
      [&](Ops& op, bool g) { op.geglu_forward(at(y, g), at(x, g), at(dx, g)); },
      [&](Ops& op, bool g) {
        op.geglu_backward(at(dg, g), at(du, g), at(y, g), at(x, g), at(dx, g));
      },
      [&](Ops& op, bool g) { op.softcap_forward(at(y, g), at(x, g), 3.0f); },
      [&](Ops& op, bool g) { op.softcap_backward(at(dx, g), at(y, g), at(x, g), 3.0f); },
      [&](Ops& op, bool g) {
        op.attention_forward(at(o, g), at(att, g), at(qkv, g), 4, 2, sc, &at(th, g));
      },
      [&](Ops& op, bool g) {
        op.attention_backward(at(dq, g), at(o, g), at(qkv, g), at(att, g), 4, 2, sc, &at(th, g));
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
    // The CPU's own workspace (fp32 copies of 16-bit attention operands) is the CPU's: compare
    // the GPU with its dry run, and the CPU with the GPU where the CPU has none (fp32). The dry
    // run's workspace is PyTorch's (kernels/torch_workspace.h), not memtrade's CUDA block: the
    // dry run is compared outside Category::workspace.
    if (t == DType::F32) {
      EXPECT_EQ(on_gpu, on_cpu) << "call " << i;
    }
    auto outside_workspace = [](std::vector<Ev> ev) {
      std::erase_if(
          ev, [](const Ev& e) { return std::get<3>(e) == static_cast<int>(Category::workspace); });
      return ev;
    };
    EXPECT_EQ(outside_workspace(events(gpu_->memory())), outside_workspace(on_gpu))
        << "dry run of call " << i;
  }
}

MEMTRADE_INSTANTIATE_DTYPES(CudaGemma);

}  // namespace
}  // namespace memtrade
