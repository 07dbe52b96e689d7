// Convolution (cuDNN), batch-norm and pooling on CUDA against the CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/gpu/gpu_test_util.h"

#ifdef MEMTRADE_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace memtrade {
namespace {

using gputest::CudaVsCpu;
using gputest::CudaVsCpuDtype;
using gputest::Pair;
using gputest::Tol;

class CudaCnn : public CudaVsCpuDtype {
 protected:
  // One batch-norm problem, the same on both backends.
  struct Bn {
    Pair inp, gamma, beta, rm, rv, out, mean, invstd, dout, dinp;
  };
  Bn bn(const Shape& s, std::uint32_t seed) {
    const DType t = GetParam();
    const std::int64_t c = s[1];
    return {rand(s, t, seed, -1.0f, 3.0f),
            rand({c}, t, seed + 1, 0.5f, 1.5f, Category::params),
            rand({c}, DType::F32, seed + 2, -0.5f, 0.5f, Category::params),
            rand({c}, DType::F32, seed + 3, -0.1f, 0.1f, Category::params),
            rand({c}, DType::F32, seed + 4, 0.9f, 1.1f, Category::params),
            full(s, t, 0.0f),
            full({c}, DType::F32, 0.0f),
            full({c}, DType::F32, 0.0f),
            rand(s, t, seed + 5),
            full(s, t, 0.0f)};
  }
  // Training forward with running statistics on both, compared.
  void bn_forward(Bn& b, const std::string& what) {
    cpu_ops().batchnorm_forward(b.out.cpu, b.mean.cpu, b.invstd.cpu, b.inp.cpu, b.gamma.cpu,
                                b.beta.cpu, &b.rm.cpu, &b.rv.cpu, 1e-5f, 0.1f);
    gpu_ops().batchnorm_forward(b.out.gpu, b.mean.gpu, b.invstd.gpu, b.inp.gpu, b.gamma.gpu,
                                b.beta.gpu, &b.rm.gpu, &b.rv.gpu, 1e-5f, 0.1f);
    expect_close(b.out, Tol{1e-5f, 0, 2.5f}, what + " out");
    expect_close(b.mean, Tol{1e-7f, 0, 2}, what + " mean");
    expect_close(b.invstd, Tol{0, 0, 2}, what + " invstd");
    expect_close(b.rm, Tol{1e-7f, 0, 2}, what + " running_mean");
    expect_close(b.rv, Tol{1e-7f, 0, 2}, what + " running_var (unbiased)");
  }
  // Backward with parameter grads of the input's dtype and of F32, assigned and accumulated.
  void bn_backward(Bn& b, std::uint32_t seed, const std::string& what) {
    const std::int64_t c = b.gamma.cpu.numel();
    for (DType gt : {GetParam(), DType::F32}) {
      Pair dg = rand({c}, gt, seed, -1.0f, 1.0f, Category::grads);
      Pair dbt = rand({c}, gt, seed + 1, -1.0f, 1.0f, Category::grads);
      for (bool acc : {false, true}) {
        cpu_ops().batchnorm_backward(b.dinp.cpu, &dg.cpu, &dbt.cpu, b.dout.cpu, b.inp.cpu,
                                     b.gamma.cpu, b.mean.cpu, b.invstd.cpu, acc);
        gpu_ops().batchnorm_backward(b.dinp.gpu, &dg.gpu, &dbt.gpu, b.dout.gpu, b.inp.gpu,
                                     b.gamma.gpu, b.mean.gpu, b.invstd.gpu, acc);
        const std::string tag = gputest::cat(" grads ", dtype_name(gt), acc ? " acc" : "");
        expect_close(b.dinp, Tol{2e-5f, 0, 3}, gputest::cat(what, " dinp", tag));
        expect_close(dg, Tol{1e-5f, 0, 2.5f}, gputest::cat(what, " dgamma", tag));
        expect_close(dbt, Tol{1e-5f, 0, 2.5f}, gputest::cat(what, " dbeta", tag));
      }
    }
  }
};

struct ConvCase {
  std::int64_t n, ci, h, w, co, k;
  int stride, pad;
};

const ConvCase kConvCases[] = {
    {2, 3, 16, 16, 8, 3, 1, 1},  // stem-like
    {3, 8, 9, 11, 16, 3, 2, 1},  // strided, odd sizes
    {2, 16, 8, 8, 32, 1, 1, 0},  // 1x1
    {1, 4, 7, 7, 6, 5, 1, 2},    // 5x5
    {2, 5, 6, 6, 3, 3, 3, 0},    // stride > 1 without padding
};

std::string conv_tag(const ConvCase& c) {
  return gputest::cat(" x(", c.n, ",", c.ci, ",", c.h, ",", c.w, ") co ", c.co, " k", c.k, " s",
                      c.stride, " p", c.pad);
}

Tol conv_tol(DType t, std::int64_t terms) {
  if (t == DType::F32) return Tol{2e-6f * static_cast<float>(terms), 0, 4};
  return Tol{1e-6f, 2 * dtype_eps(t) / std::sqrt(static_cast<float>(terms)), 2.5f};
}

TEST_P(CudaCnn, Conv2dForwardBackward) {
  const DType t = GetParam();
  std::uint32_t seed = 1;
  for (const ConvCase& c : kConvCases) {
    const std::int64_t oh = (c.h + 2 * c.pad - c.k) / c.stride + 1;
    const std::int64_t ow = (c.w + 2 * c.pad - c.k) / c.stride + 1;
    Pair inp = rand({c.n, c.ci, c.h, c.w}, t, ++seed);
    Pair w = rand({c.co, c.ci, c.k, c.k}, t, ++seed, -0.5f, 0.5f, Category::params);
    Pair bias = rand({c.co}, t, ++seed, -1.0f, 1.0f, Category::params);
    Pair out = full({c.n, c.co, oh, ow}, t, 0.0f);
    const std::string tag = conv_tag(c);
    for (bool with_bias : {false, true}) {
      cpu_ops().conv2d_forward(out.cpu, inp.cpu, w.cpu, with_bias ? &bias.cpu : nullptr, c.stride,
                               c.pad);
      gpu_ops().conv2d_forward(out.gpu, inp.gpu, w.gpu, with_bias ? &bias.gpu : nullptr, c.stride,
                               c.pad);
      Tol tol = conv_tol(t, c.ci * c.k * c.k);
      if (with_bias && t != DType::F32) tol.ulps = 4.5f;  // bias added after the conv's rounding
      expect_close(out, tol, gputest::cat("conv2d_forward", tag) + (with_bias ? " bias" : ""));
    }
    Pair dout = rand({c.n, c.co, oh, ow}, t, ++seed);
    Pair dinp = full({c.n, c.ci, c.h, c.w}, t, 3.0f);
    for (DType gt : {t, DType::F32}) {
      Pair dw = rand({c.co, c.ci, c.k, c.k}, gt, ++seed, -1.0f, 1.0f, Category::grads);
      Pair db = rand({c.co}, gt, ++seed, -1.0f, 1.0f, Category::grads);
      for (bool acc : {false, true}) {
        cpu_ops().conv2d_backward(&dinp.cpu, &dw.cpu, &db.cpu, dout.cpu, inp.cpu, w.cpu, c.stride,
                                  c.pad, acc);
        gpu_ops().conv2d_backward(&dinp.gpu, &dw.gpu, &db.gpu, dout.gpu, inp.gpu, w.gpu, c.stride,
                                  c.pad, acc);
        const std::string t2 = gputest::cat(tag, " grads ", dtype_name(gt), acc ? " acc" : "");
        expect_close(dinp, conv_tol(t, c.co * c.k * c.k), gputest::cat("conv dinp", t2));
        Tol wt = conv_tol(gt, c.n * oh * ow);
        if (gt != t) wt.rel_of_max += 2 * dtype_eps(t);  // computed in t, then added in fp32
        expect_close(dw, wt, gputest::cat("conv dweight", t2));
        expect_close(db, conv_tol(gt, c.n * oh * ow), gputest::cat("conv dbias", t2));
      }
    }
  }
}

TEST_P(CudaCnn, BatchnormForwardBackward) {
  const DType t = GetParam();
  const std::int64_t c = 6;
  Bn b = bn({4, c, 7, 9}, 20);
  bn_forward(b, "batchnorm");
  bn_forward(b, "batchnorm, second step");  // running statistics move again
  bn_backward(b, 26, "batchnorm");
  Pair& out = b.out;
  Pair& mean = b.mean;
  Pair& invstd = b.invstd;
  Pair& inp = b.inp;
  Pair& gamma = b.gamma;
  Pair& beta = b.beta;
  // Without running statistics, and rejecting a single value per channel.
  cpu_ops().batchnorm_forward(out.cpu, mean.cpu, invstd.cpu, inp.cpu, gamma.cpu, beta.cpu, nullptr,
                              nullptr, 1e-5f, 0.1f);
  gpu_ops().batchnorm_forward(out.gpu, mean.gpu, invstd.gpu, inp.gpu, gamma.gpu, beta.gpu, nullptr,
                              nullptr, 1e-5f, 0.1f);
  expect_close(out, Tol{1e-5f, 0, 2.5f}, "batchnorm without running stats");
  Pair one = rand({1, c, 1, 1}, t, 28);
  Pair one_out = full({1, c, 1, 1}, t, 0.0f);
  EXPECT_THROW(gpu_ops().batchnorm_forward(one_out.gpu, mean.gpu, invstd.gpu, one.gpu, gamma.gpu,
                                           beta.gpu, nullptr, nullptr, 1e-5f, 0.1f),
               std::invalid_argument);
}

TEST_P(CudaCnn, Conv2dEmptyBatchChannelsAndFilters) {
  // cuDNN rejects 0-sized dimensions; the results are the CPU's: zeros, the bias, empty tensors.
  const DType t = GetParam();
  {  // an empty batch: nothing to compute, dbias = 0 (dweight accumulates nothing)
    Pair inp = full({0, 3, 8, 8}, t, 0.0f);
    Pair w = rand({4, 3, 3, 3}, t, 70, -0.5f, 0.5f, Category::params);
    Pair out = full({0, 4, 8, 8}, t, 0.0f);
    gpu_ops().conv2d_forward(out.gpu, inp.gpu, w.gpu, nullptr, 1, 1);
    Pair dout = full({0, 4, 8, 8}, t, 0.0f);
    Pair dinp = full({0, 3, 8, 8}, t, 0.0f);
    Pair dw = rand({4, 3, 3, 3}, t, 71, -1.0f, 1.0f, Category::grads);
    Pair db = rand({4}, t, 72, -1.0f, 1.0f, Category::grads);
    cpu_ops().conv2d_backward(&dinp.cpu, &dw.cpu, &db.cpu, dout.cpu, inp.cpu, w.cpu, 1, 1, true);
    gpu_ops().conv2d_backward(&dinp.gpu, &dw.gpu, &db.gpu, dout.gpu, inp.gpu, w.gpu, 1, 1, true);
    expect_close(dw, Tol{0, 0, 0}, "conv dweight, N = 0, accumulate");
    cpu_ops().conv2d_backward(nullptr, nullptr, &db.cpu, dout.cpu, inp.cpu, w.cpu, 1, 1, false);
    gpu_ops().conv2d_backward(nullptr, nullptr, &db.gpu, dout.gpu, inp.gpu, w.gpu, 1, 1, false);
    expect_close(db, Tol{0, 0, 0}, "conv dbias, N = 0");
  }
  {  // no input channel: out is the bias, dinp and dweight are empty
    Pair inp = full({2, 0, 5, 5}, t, 0.0f);
    Pair w = full({4, 0, 3, 3}, t, 0.0f, Category::params);
    Pair bias = rand({4}, t, 73, -1.0f, 1.0f, Category::params);
    Pair out = full({2, 4, 5, 5}, t, NAN);
    cpu_ops().conv2d_forward(out.cpu, inp.cpu, w.cpu, &bias.cpu, 1, 1);
    gpu_ops().conv2d_forward(out.gpu, inp.gpu, w.gpu, &bias.gpu, 1, 1);
    expect_close(out, Tol{0, 0, 0}, "conv2d_forward, Ci = 0");
    Pair dout = rand({2, 4, 5, 5}, t, 74);
    Pair dinp = full({2, 0, 5, 5}, t, 0.0f);
    Pair dw = full({4, 0, 3, 3}, t, 0.0f, Category::grads);
    Pair db = full({4}, t, NAN, Category::grads);
    cpu_ops().conv2d_backward(&dinp.cpu, &dw.cpu, &db.cpu, dout.cpu, inp.cpu, w.cpu, 1, 1, false);
    gpu_ops().conv2d_backward(&dinp.gpu, &dw.gpu, &db.gpu, dout.gpu, inp.gpu, w.gpu, 1, 1, false);
    expect_close(db, conv_tol(t, 50), "conv dbias, Ci = 0");
  }
  {  // no output channel: out is empty, dinp is zeros
    Pair inp = rand({2, 3, 5, 5}, t, 75);
    Pair w = full({0, 3, 3, 3}, t, 0.0f, Category::params);
    Pair out = full({2, 0, 5, 5}, t, 0.0f);
    gpu_ops().conv2d_forward(out.gpu, inp.gpu, w.gpu, nullptr, 1, 1);
    Pair dout = full({2, 0, 5, 5}, t, 0.0f);
    Pair dinp = full({2, 3, 5, 5}, t, NAN);
    Pair dw = full({0, 3, 3, 3}, t, 0.0f, Category::grads);
    cpu_ops().conv2d_backward(&dinp.cpu, &dw.cpu, nullptr, dout.cpu, inp.cpu, w.cpu, 1, 1, false);
    gpu_ops().conv2d_backward(&dinp.gpu, &dw.gpu, nullptr, dout.gpu, inp.gpu, w.gpu, 1, 1, false);
    expect_close(dinp, Tol{0, 0, 0}, "conv dinp, Co = 0");
  }
}

TEST_P(CudaCnn, BatchnormSplitChannelsMatchAndRepeat) {
  // Few channels with many values each: every channel is split over several blocks (partials in
  // the small scratch, summed in a fixed order). Same results as the CPU, and bit-identical from
  // run to run. hw = 1600 is no multiple of the block size: the per-thread cursor wraps rows.
  Bn b = bn({16, 4, 40, 40}, 80);
  bn_forward(b, "split batchnorm");
  const std::vector<float> first = gpu_->to_host_f32(b.out.gpu);
  gpu_ops().batchnorm_forward(b.out.gpu, b.mean.gpu, b.invstd.gpu, b.inp.gpu, b.gamma.gpu,
                              b.beta.gpu, nullptr, nullptr, 1e-5f, 0.1f);
  EXPECT_EQ(gpu_->to_host_f32(b.out.gpu), first) << "split batchnorm forward is not repeatable";
  bn_backward(b, 86, "split batchnorm");
  const std::vector<float> dx = gpu_->to_host_f32(b.dinp.gpu);
  gpu_ops().batchnorm_backward(b.dinp.gpu, nullptr, nullptr, b.dout.gpu, b.inp.gpu, b.gamma.gpu,
                               b.mean.gpu, b.invstd.gpu, false);
  EXPECT_EQ(gpu_->to_host_f32(b.dinp.gpu), dx) << "split batchnorm backward is not repeatable";
}

TEST_P(CudaCnn, ReluPropagatesNaN) {
  // torch.relu(NaN) is NaN; backward masks with out > 0, so a NaN output passes no gradient.
  const DType t = GetParam();
  Pair x = make({7}, t, {NAN, -1.0f, 0.0f, -0.0f, 2.5f, INFINITY, -INFINITY});
  Pair out = full({7}, t, 7.0f);
  cpu_ops().relu_forward(out.cpu, x.cpu);
  gpu_ops().relu_forward(out.gpu, x.gpu);
  expect_close(out, Tol{0, 0, 0}, "relu_forward with NaN and inf");
  EXPECT_TRUE(std::isnan(gpu_->to_host_f32(out.gpu)[0])) << "relu(NaN) must stay NaN";
  Pair dout = full({7}, t, 1.0f);
  Pair dinp = full({7}, t, 7.0f);
  cpu_ops().relu_backward(dinp.cpu, dout.cpu, out.cpu);
  gpu_ops().relu_backward(dinp.gpu, dout.gpu, out.gpu);
  expect_close(dinp, Tol{0, 0, 0}, "relu_backward with NaN and inf");
}

TEST_P(CudaCnn, GlobalAvgPool) {
  const DType t = GetParam();
  Pair inp = rand({3, 5, 7, 9}, t, 30);
  Pair out = full({3, 5}, t, 0.0f);
  cpu_ops().global_avgpool_forward(out.cpu, inp.cpu);
  gpu_ops().global_avgpool_forward(out.gpu, inp.gpu);
  expect_close(out, Tol{1e-7f, 0, 2}, "global_avgpool_forward");
  Pair dout = rand({3, 5}, t, 31);
  Pair dinp = full({3, 5, 7, 9}, t, 0.0f);
  cpu_ops().global_avgpool_backward(dinp.cpu, dout.cpu);
  gpu_ops().global_avgpool_backward(dinp.gpu, dout.gpu);
  expect_close(dinp, Tol{0, 0, 0}, "global_avgpool_backward");
}

TEST_P(CudaCnn, MaxPoolOverlappingAndNot) {
  const DType t = GetParam();
  for (auto [k, s] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{3, 1}}) {
    const std::int64_t h = 11, w = 12, oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    // Integers in a small range: ties, which the first maximum must win on both backends.
    Pair inp = make({2, 3, h, w}, t, gputest::random_ints(2 * 3 * h * w, 40 + k, -4, 4));
    Pair out = full({2, 3, oh, ow}, t, 0.0f);
    Pair argmax = full({2, 3, oh, ow}, DType::I32, 0.0f);
    cpu_ops().maxpool2d_forward(out.cpu, argmax.cpu, inp.cpu, k, s);
    gpu_ops().maxpool2d_forward(out.gpu, argmax.gpu, inp.gpu, k, s);
    const std::string tag = gputest::cat(" k", k, " s", s);
    expect_close(out, Tol{0, 0, 0}, gputest::cat("maxpool out", tag));
    expect_close(argmax, Tol{0, 0, 0}, gputest::cat("maxpool argmax", tag));
    Pair dout = rand({2, 3, oh, ow}, t, 50 + k);
    Pair dinp = full({2, 3, h, w}, t, 5.0f);
    cpu_ops().maxpool2d_backward(dinp.cpu, dout.cpu, argmax.cpu);
    gpu_ops().maxpool2d_backward(dinp.gpu, dout.gpu, argmax.gpu);
    // Overlapping windows add in another order on the GPU (atomics).
    expect_close(dinp, Tol{1e-6f, 0, 2.5f}, gputest::cat("maxpool dinp", tag));
  }
}

TEST_P(CudaCnn, MaxPoolPropagatesNaN) {
  const DType t = GetParam();
  std::vector<float> v(16, 1.0f);
  v[5] = NAN;
  Pair inp = make({1, 1, 4, 4}, t, v);
  Pair out = full({1, 1, 2, 2}, t, 0.0f);
  Pair argmax = full({1, 1, 2, 2}, DType::I32, 0.0f);
  cpu_ops().maxpool2d_forward(out.cpu, argmax.cpu, inp.cpu, 2, 2);
  gpu_ops().maxpool2d_forward(out.gpu, argmax.gpu, inp.gpu, 2, 2);
  expect_close(out, Tol{0, 0, 0}, "maxpool with NaN");
  expect_close(argmax, Tol{0, 0, 0}, "maxpool argmax with NaN");
}

MEMTRADE_INSTANTIATE_DTYPES(CudaCnn);

#ifdef MEMTRADE_HAVE_CUDA
class CudaCnnF32 : public CudaVsCpu {};

TEST_F(CudaCnnF32, Tf32ConvolutionIsClose) {
  Pair inp = rand({4, 32, 16, 16}, DType::F32, 60);
  Pair w = rand({64, 32, 3, 3}, DType::F32, 61, -0.2f, 0.2f, Category::params);
  Pair out = full({4, 64, 16, 16}, DType::F32, 0.0f);
  cpu_ops().conv2d_forward(out.cpu, inp.cpu, w.cpu, nullptr, 1, 1);
  cuda::set_tf32(*gpu_, true);
  gpu_ops().conv2d_forward(out.gpu, inp.gpu, w.gpu, nullptr, 1, 1);
  cuda::set_tf32(*gpu_, false);
  expect_close(out, Tol{0, 3e-3f, 0}, "tf32 conv");
}
#endif

}  // namespace
}  // namespace memtrade
