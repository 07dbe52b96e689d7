// Layer-norm, softmax and attention on CUDA against the CPU.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

namespace memtrade {
namespace {

using gputest::CudaVsCpuDtype;
using gputest::Pair;
using gputest::Tol;

class CudaNorm : public CudaVsCpuDtype {};

TEST_P(CudaNorm, LayernormForwardBackward) {
  const DType t = GetParam();
  for (Shape s : {Shape{4, 7, 768}, Shape{33, 50}, Shape{3, 2049}}) {
    const std::int64_t c = s.back(), n = shape_numel(s) / c;
    Pair inp = rand(s, t, 1, -2.0f, 3.0f);
    Pair w = rand({c}, t, 2, 0.5f, 1.5f, Category::params);
    Pair b = rand({c}, DType::F32, 3, -0.5f, 0.5f, Category::params);  // mixed on purpose
    Pair out = full(s, t, 0.0f);
    Pair mean = full({n}, DType::F32, 0.0f);
    Pair rstd = full({n}, DType::F32, 0.0f);
    cpu_ops().layernorm_forward(out.cpu, mean.cpu, rstd.cpu, inp.cpu, w.cpu, b.cpu, 1e-5f);
    gpu_ops().layernorm_forward(out.gpu, mean.gpu, rstd.gpu, inp.gpu, w.gpu, b.gpu, 1e-5f);
    expect_close(mean, Tol{1e-6f, 0, 8}, gputest::cat("layernorm mean ", shape_str(s)));
    expect_close(rstd, Tol{0, 0, 16}, gputest::cat("layernorm rstd ", shape_str(s)));
    expect_close(out, Tol{1e-5f, 0, 2.5f}, gputest::cat("layernorm out ", shape_str(s)));

    Pair dout = rand(s, t, 4);
    Pair dinp = full(s, t, 0.0f);
    for (DType gt : {t, DType::F32}) {
      Pair dw = rand({c}, gt, 5, -1.0f, 1.0f, Category::grads);
      Pair db = rand({c}, gt, 6, -1.0f, 1.0f, Category::grads);
      for (bool acc : {false, true}) {
        cpu_ops().layernorm_backward(dinp.cpu, &dw.cpu, &db.cpu, dout.cpu, inp.cpu, w.cpu, mean.cpu,
                                     rstd.cpu, acc);
        gpu_ops().layernorm_backward(dinp.gpu, &dw.gpu, &db.gpu, dout.gpu, inp.gpu, w.gpu, mean.gpu,
                                     rstd.gpu, acc);
        const std::string tag = gputest::cat(" ", shape_str(s), acc ? " accumulate" : "");
        expect_close(dinp, Tol{2e-5f, 0, 3}, gputest::cat("layernorm dinp", tag));
        expect_close(dw, Tol{2e-6f * n, 0, 3}, gputest::cat("layernorm dweight", tag));
        expect_close(db, Tol{2e-6f * n, 0, 3}, gputest::cat("layernorm dbias", tag));
      }
    }
    // dinp may alias dout.
    cpu_ops().layernorm_backward(dout.cpu, nullptr, nullptr, dout.cpu, inp.cpu, w.cpu, mean.cpu,
                                 rstd.cpu, false);
    gpu_ops().layernorm_backward(dout.gpu, nullptr, nullptr, dout.gpu, inp.gpu, w.gpu, mean.gpu,
                                 rstd.gpu, false);
    expect_close(dout, Tol{2e-5f, 0, 3},
                 gputest::cat("layernorm dinp aliasing dout ", shape_str(s)));
  }
}

// Rows far from zero: the statistics are summed in double on both backends, so mean and rstd
// agree to a rounding and the output stays within the usual tolerance (an fp32 mean did not:
// ~19x the tolerance at an offset of 1000 in a host emulation of the old kernel).
TEST_P(CudaNorm, LayernormOfOffsetRows) {
  const DType t = GetParam();
  for (float offset : {100.0f, 1000.0f}) {
    const Shape s{16, 768};
    Pair inp = rand(s, t, 7, offset - 1.0f, offset + 1.0f);
    Pair w = rand({768}, t, 8, 0.5f, 1.5f, Category::params);
    Pair b = rand({768}, t, 9, -0.5f, 0.5f, Category::params);
    Pair out = full(s, t, 0.0f), mean = full({16}, DType::F32, 0.0f),
         rstd = full({16}, DType::F32, 0.0f);
    cpu_ops().layernorm_forward(out.cpu, mean.cpu, rstd.cpu, inp.cpu, w.cpu, b.cpu, 1e-5f);
    gpu_ops().layernorm_forward(out.gpu, mean.gpu, rstd.gpu, inp.gpu, w.gpu, b.gpu, 1e-5f);
    const std::string tag = gputest::cat(" offset ", offset);
    expect_close(mean, Tol{0, 0, 1}, gputest::cat("layernorm mean", tag));
    expect_close(rstd, Tol{0, 0, 1}, gputest::cat("layernorm rstd", tag));
    expect_close(out, Tol{1e-5f, 0, 2.5f}, gputest::cat("layernorm out", tag));
  }
}

// Zero-width rows: no division by the last dimension (a SIGFPE before), like the CPU.
TEST_P(CudaNorm, ZeroWidthRows) {
  const DType t = GetParam();
  Pair x = full({3, 0}, t, 0.0f), w = full({0}, t, 0.0f), b = full({0}, t, 0.0f);
  Pair out = full({3, 0}, t, 0.0f), mean = full({3}, DType::F32, 0.0f),
       rstd = full({3}, DType::F32, 0.0f);
  gpu_ops().layernorm_forward(out.gpu, mean.gpu, rstd.gpu, x.gpu, w.gpu, b.gpu, 1e-5f);
  Pair dx = full({3, 0}, t, 0.0f), dw = full({0}, t, 0.0f), db = full({0}, t, 0.0f);
  gpu_ops().layernorm_backward(dx.gpu, &dw.gpu, &db.gpu, out.gpu, x.gpu, w.gpu, mean.gpu, rstd.gpu,
                               false);
  gpu_ops().softmax_forward(out.gpu, x.gpu);
  gpu_ops().softmax_backward(dx.gpu, out.gpu, out.gpu);
  gpu_->synchronize();
}

TEST_P(CudaNorm, SoftmaxForwardBackward) {
  const DType t = GetParam();
  for (Shape s : {Shape{64, 10}, Shape{5, 3, 1000}, Shape{2, 50257}}) {
    Pair inp = rand(s, t, 7, -8.0f, 8.0f);
    Pair out = full(s, t, 0.0f);
    cpu_ops().softmax_forward(out.cpu, inp.cpu);
    gpu_ops().softmax_forward(out.gpu, inp.gpu);
    expect_close(out, Tol{1e-7f, 0, 4}, gputest::cat("softmax_forward ", shape_str(s)));
    Pair dout = rand(s, t, 8);
    Pair dinp = full(s, t, 0.0f);
    cpu_ops().softmax_backward(dinp.cpu, dout.cpu, out.cpu);
    gpu_ops().softmax_backward(dinp.gpu, dout.gpu, out.gpu);
    expect_close(dinp, Tol{1e-6f, 0, 4}, gputest::cat("softmax_backward ", shape_str(s)));
  }
}

TEST_P(CudaNorm, AttentionForwardProbsBackward) {
  const DType t = GetParam();
  struct Case {
    std::int64_t b, tt, c;
    int nh, nkv;  // grouped-query when nkv < nh
  };
  for (Case k : {Case{2, 16, 32, 4, 4}, Case{3, 64, 96, 2, 2}, Case{1, 129, 64, 1, 1},
                 Case{2, 33, 64, 4, 2}, Case{1, 65, 96, 6, 1}}) {
    const std::int64_t hd = k.c / k.nh;
    const Shape qkv_s{k.b, k.tt, (k.nh + 2 * k.nkv) * hd};
    Pair qkv = rand(qkv_s, t, 9, -2.0f, 2.0f);
    Pair out = full({k.b, k.tt, k.c}, t, 0.0f);
    Pair att = full({k.b, k.nh, k.tt, k.tt}, t, 0.0f);
    cpu_ops().attention_forward(out.cpu, att.cpu, qkv.cpu, k.nh, k.nkv);
    gpu_ops().attention_forward(out.gpu, att.gpu, qkv.gpu, k.nh, k.nkv);
    const std::string tag =
        gputest::cat(" B", k.b, " T", k.tt, " C", k.c, " NH", k.nh, " NKV", k.nkv);
    // 16-bit: the GPU rounds the scores and the probabilities before their next use.
    const float lp = t == DType::F32 ? 0.0f : 1.0f;
    expect_close(att, Tol{1e-6f + lp * 2 * dtype_eps(t), 0, 4},
                 gputest::cat("attention probs", tag));
    expect_close(out, Tol{1e-5f, lp * 4 * dtype_eps(t), 4}, gputest::cat("attention out", tag));

    Pair probs = full({k.b, k.nh, k.tt, k.tt}, t, 0.5f);
    cpu_ops().attention_probs(probs.cpu, qkv.cpu, k.nh, k.nkv);
    gpu_ops().attention_probs(probs.gpu, qkv.gpu, k.nh, k.nkv);
    expect_close(probs, Tol{1e-6f + lp * 2 * dtype_eps(t), 0, 4},
                 gputest::cat("attention_probs", tag));

    Pair dout = rand({k.b, k.tt, k.c}, t, 10);
    Pair dqkv = full(qkv_s, t, 7.0f);  // overwritten entirely
    // Both backends start from the same probabilities (the CPU's).
    Pair att_ref = make({k.b, k.nh, k.tt, k.tt}, t, cpu_->to_host_f32(att.cpu));
    cpu_ops().attention_backward(dqkv.cpu, dout.cpu, qkv.cpu, att_ref.cpu, k.nh, k.nkv);
    gpu_ops().attention_backward(dqkv.gpu, dout.gpu, qkv.gpu, att_ref.gpu, k.nh, k.nkv);
    expect_close(dqkv, Tol{1e-5f, 1e-5f + lp * 8 * dtype_eps(t), 4},
                 gputest::cat("attention dqkv", tag));
  }
}

TEST_P(CudaNorm, AttentionWithF32ProbabilitiesOf16BitQkv) {
  const DType t = GetParam();
  Pair qkv = rand({2, 32, 3 * 64}, t, 11, -2.0f, 2.0f);
  Pair att = full({2, 4, 32, 32}, DType::F32, 0.0f);
  Pair out = full({2, 32, 64}, t, 0.0f);
  cpu_ops().attention_forward(out.cpu, att.cpu, qkv.cpu, 4, 4);
  gpu_ops().attention_forward(out.gpu, att.gpu, qkv.gpu, 4, 4);
  const float lp = t == DType::F32 ? 0.0f : 1.0f;
  expect_close(att, Tol{1e-6f + lp * 2 * dtype_eps(t), 0, 4}, "f32 probabilities");
  expect_close(out, Tol{1e-5f, lp * 4 * dtype_eps(t), 4}, "out");
  // fp32 dout and dqkv next to 16-bit qkv: both backends read dout as qkv's dtype and write
  // dqkv through it (ops.h), so the tolerance is the all-16-bit one.
  Pair dout = rand({2, 32, 64}, DType::F32, 12);
  Pair dqkv = full({2, 32, 3 * 64}, DType::F32, 7.0f);
  Pair att_ref = make({2, 4, 32, 32}, DType::F32, cpu_->to_host_f32(att.cpu));
  cpu_ops().attention_backward(dqkv.cpu, dout.cpu, qkv.cpu, att_ref.cpu, 4, 4);
  gpu_ops().attention_backward(dqkv.gpu, dout.gpu, qkv.gpu, att_ref.gpu, 4, 4);
  expect_close(dqkv, Tol{1e-5f, 1e-5f + lp * 8 * dtype_eps(t), 4}, "f32 dqkv from f32 dout");
}

MEMTRADE_INSTANTIATE_DTYPES(CudaNorm);

}  // namespace
}  // namespace memtrade
