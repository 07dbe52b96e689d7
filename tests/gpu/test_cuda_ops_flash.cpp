// Flash attention on CUDA (kernels/cuda/cuda_ops_flash.cu) against the CPU's flash ops, in every
// storage dtype and head-dim bucket, grouped-query included; its determinism and scratch; and a
// whole GPT on the GPU with flash against math. (The kernels' tiling is also emulated on the host
// by tests/kernels/test_flash_emulation.cpp, which needs no GPU.)
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"
#include "tests/models/attention_run.h"

namespace memtrade {
namespace {

using gputest::Pair;
using gputest::Tol;

struct Shape5 {
  std::int64_t b, t;
  int nh, nkv;
  std::int64_t hd;
  Shape qkv() const { return {b, t, (nh + 2 * nkv) * hd}; }
  Shape out() const { return {b, t, nh * hd}; }
  Shape lse() const { return {b, nh, t}; }
};

// T of 1, inside one tile, one past a tile, several tiles; hd in every bucket (32, 64, 128,
// 256), powers of two or not; multi-head, grouped-query and multi-query.
const Shape5 kShapes[] = {{2, 5, 2, 2, 8},    {1, 1, 4, 2, 32},   {2, 67, 4, 1, 48},
                          {1, 130, 6, 3, 64}, {2, 257, 4, 4, 64}, {1, 70, 2, 1, 100},
                          {1, 33, 2, 2, 128}, {1, 40, 2, 1, 256}};

class CudaFlash : public gputest::CudaVsCpuDtype {};

TEST_P(CudaFlash, ForwardAndBackwardMatchTheCpu) {
  const DType t = GetParam();
  std::uint32_t seed = 1;
  for (const Shape5& s : kShapes) {
    const std::string tag =
        gputest::cat(" B", s.b, " T", s.t, " NH", s.nh, " NKV", s.nkv, " hd", s.hd);
    Pair qkv = rand(s.qkv(), t, ++seed, -2.0f, 2.0f);
    Pair out = full(s.out(), t, 7.0f);
    Pair lse = full(s.lse(), DType::F32, 7.0f);
    cpu_ops().flash_attention_forward(out.cpu, lse.cpu, qkv.cpu, s.nh, s.nkv);
    gpu_ops().flash_attention_forward(out.gpu, lse.gpu, qkv.gpu, s.nh, s.nkv);
    // fp32 sums in two orders, then (16-bit) one rounding each: a flip of one ulp at most.
    expect_close(out, Tol{1e-6f, 2e-6f, 2}, gputest::cat("flash out", tag));
    expect_close(lse, Tol{1e-5f, 0, 4}, gputest::cat("flash lse", tag));

    // Backward on both from the CPU's out and lse.
    Pair out_ref = make(s.out(), t, cpu_->to_host_f32(out.cpu));
    Pair lse_ref = make(s.lse(), DType::F32, cpu_->to_host_f32(lse.cpu));
    Pair dout = rand(s.out(), t, ++seed);
    Pair dqkv = full(s.qkv(), t, 7.0f);  // overwritten entirely
    cpu_ops().flash_attention_backward(dqkv.cpu, dout.cpu, qkv.cpu, out_ref.cpu, lse_ref.cpu, s.nh,
                                       s.nkv);
    gpu_ops().flash_attention_backward(dqkv.gpu, dout.gpu, qkv.gpu, out_ref.gpu, lse_ref.gpu, s.nh,
                                       s.nkv);
    expect_close(dqkv, Tol{1e-6f, 1e-5f, 2}, gputest::cat("flash dqkv", tag));
  }
}

// No atomics: two runs give the same bits.
TEST_P(CudaFlash, Deterministic) {
  const DType t = GetParam();
  const Shape5 s{2, 300, 4, 2, 64};
  Pair qkv = rand(s.qkv(), t, 3, -2.0f, 2.0f);
  Pair dout = rand(s.out(), t, 4);
  std::vector<float> first[3];
  for (int run = 0; run < 2; ++run) {
    Tensor out = gpu_->empty(s.out(), t, Category::activations);
    Tensor lse = gpu_->empty(s.lse(), DType::F32, Category::activations);
    Tensor dqkv = gpu_->empty(s.qkv(), t, Category::activations);
    gpu_ops().flash_attention_forward(out, lse, qkv.gpu, s.nh, s.nkv);
    gpu_ops().flash_attention_backward(dqkv, dout.gpu, qkv.gpu, out, lse, s.nh, s.nkv);
    const std::vector<float> got[3] = {gpu_->to_host_f32(out), gpu_->to_host_f32(lse),
                                       gpu_->to_host_f32(dqkv)};
    for (int i = 0; i < 3; ++i) {
      if (run == 0)
        first[i] = got[i];
      else
        EXPECT_TRUE(got[i] == first[i]) << "output " << i;
    }
  }
}

// Scratch (kernels/ops.h): forward nothing; backward D (B, NH, T) F32 and nothing else.
TEST_P(CudaFlash, ScratchIsD) {
  const DType t = GetParam();
  const Shape5 s{2, 100, 4, 2, 64};
  Pair qkv = rand(s.qkv(), t, 5, -2.0f, 2.0f);
  Pair dout = rand(s.out(), t, 6);
  Pair out = full(s.out(), t, 0.0f), lse = full(s.lse(), DType::F32, 0.0f);
  Pair dqkv = full(s.qkv(), t, 0.0f);
  CachingAllocator& mem = gpu_->memory();
  const auto before = mem.stats().allocated.current;
  mem.reset_peak();
  gpu_ops().flash_attention_forward(out.gpu, lse.gpu, qkv.gpu, s.nh, s.nkv);
  gpu_->synchronize();
  EXPECT_EQ(mem.stats().allocated.peak, before);
  gpu_ops().flash_attention_backward(dqkv.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, s.nh, s.nkv);
  gpu_->synchronize();
  EXPECT_EQ(mem.stats().allocated.current, before);
  const auto d_bytes = static_cast<std::int64_t>(
      CachingAllocator::round_size(static_cast<std::size_t>(s.b * s.nh * s.t) * 4));
  EXPECT_EQ(mem.stats().allocated.peak - before, d_bytes);
}

// In fp32, CUDA's flash against CUDA's math attention: the same function to 1e-5.
TEST_P(CudaFlash, AgreesWithCudaMath) {
  const DType t = GetParam();
  if (t != DType::F32) GTEST_SKIP() << "math rounds its 16-bit intermediates; flash does not";
  const Shape5 s{2, 150, 6, 2, 64};
  Pair qkv = rand(s.qkv(), t, 7, -2.0f, 2.0f);
  Pair dout = rand(s.out(), t, 8);
  Tensor out = gpu_->empty(s.out(), t, Category::activations);
  Tensor lse = gpu_->empty(s.lse(), DType::F32, Category::activations);
  Tensor mout = gpu_->empty(s.out(), t, Category::activations);
  Tensor att = gpu_->empty({s.b, s.nh, s.t, s.t}, t, Category::activations);
  Tensor dq = gpu_->empty(s.qkv(), t, Category::activations);
  Tensor mdq = gpu_->empty(s.qkv(), t, Category::activations);
  gpu_ops().flash_attention_forward(out, lse, qkv.gpu, s.nh, s.nkv);
  gpu_ops().attention_forward(mout, att, qkv.gpu, s.nh, s.nkv);
  gpu_ops().flash_attention_backward(dq, dout.gpu, qkv.gpu, out, lse, s.nh, s.nkv);
  gpu_ops().attention_backward(mdq, dout.gpu, qkv.gpu, att, s.nh, s.nkv);
  EXPECT_LE(testing::error_of_max(gpu_->to_host_f32(out), gpu_->to_host_f32(mout)), 1e-5);
  EXPECT_LE(testing::error_of_max(gpu_->to_host_f32(dq), gpu_->to_host_f32(mdq)), 1e-5);
}

MEMTRADE_INSTANTIATE_DTYPES(CudaFlash);

// A whole GPT or Llama (grouped-query heads, RoPE) on the GPU: flash's gradients are math's to 1e-5
// (fp32) and it saves the formula's bytes (tests/models/test_models_attention.cpp is the CPU twin).
class CudaFlashModel : public gputest::CudaVsCpu {};

TEST_F(CudaFlashModel, GptAndLlamaGradientsAndSavedBytes) {
  for (const char* name : {"gpt-tiny", "gpt-mini", "gpt-small", "llama-tiny", "llama-mini"}) {
    SCOPED_TRACE(name);
    const std::int64_t batch = 8;
    const auto math = testing::run_attention(*gpu_, name, batch, AttentionKind::math);
    const auto flash = testing::run_attention(*gpu_, name, batch, AttentionKind::flash);
    EXPECT_NEAR(flash.loss, math.loss, 1e-5 * std::abs(math.loss));
    testing::expect_grads_close(flash, math, 1e-5);
    const nlohmann::json h = make_model(name)->hyper();
    const auto L = h["n_layer"].get<std::int64_t>(), NH = h["n_head"].get<std::int64_t>(),
               T = h["seq_len"].get<std::int64_t>();
    EXPECT_EQ(flash.saved_bytes,
              math.saved_bytes - L * batch * NH * T * T * 4 + L * batch * NH * T * 4);
    EXPECT_EQ(flash.blocks_with_att, 0);
  }
}

}  // namespace
}  // namespace memtrade
