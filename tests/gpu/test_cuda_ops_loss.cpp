// Embeddings, cross-entropy and sum_to_host on CUDA against the CPU.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

namespace memtrade {
namespace {

using gputest::CudaVsCpuDtype;
using gputest::Pair;
using gputest::Tol;

class CudaLoss : public CudaVsCpuDtype {};

TEST_P(CudaLoss, EmbeddingForward) {
  const DType t = GetParam();
  const std::int64_t b = 3, tt = 17, c = 40, v = 101, max_t = 32;
  Pair tokens = ints({b, tt}, 1, 0, static_cast<int>(v - 1));
  Pair wte = rand({v, c}, t, 2, -1.0f, 1.0f, Category::params);
  Pair wpe = rand({max_t, c}, DType::F32, 3, -1.0f, 1.0f, Category::params);
  Pair out = full({b, tt, c}, t, 0.0f);
  cpu_ops().embedding_forward(out.cpu, tokens.cpu, wte.cpu, &wpe.cpu);
  gpu_ops().embedding_forward(out.gpu, tokens.gpu, wte.gpu, &wpe.gpu);
  expect_close(out, Tol{0, 0, 0}, "embedding_forward");
  // Without positions (Llama): wte[tokens] alone, bit for bit too.
  cpu_ops().embedding_forward(out.cpu, tokens.cpu, wte.cpu, nullptr);
  gpu_ops().embedding_forward(out.gpu, tokens.gpu, wte.gpu, nullptr);
  expect_close(out, Tol{0, 0, 0}, "embedding_forward without wpe");
}

TEST_P(CudaLoss, EmbeddingBackwardRepeatedTokensAndAccumulate) {
  const DType t = GetParam();
  const std::int64_t b = 4, tt = 33, c = 48, v = 20, max_t = 40;
  // Few distinct tokens: many positions per row of dwte.
  Pair tokens = ints({b, tt}, 4, 0, static_cast<int>(v - 1));
  Pair dout = rand({b, tt, c}, t, 5);
  for (DType gt : {t, DType::F32}) {
    Pair dwte = rand({v, c}, gt, 6, -1.0f, 1.0f, Category::grads);
    Pair dwpe = rand({max_t, c}, gt, 7, -1.0f, 1.0f, Category::grads);
    for (bool acc : {false, true}) {
      cpu_ops().embedding_backward(&dwte.cpu, &dwpe.cpu, dout.cpu, tokens.cpu, acc);
      gpu_ops().embedding_backward(&dwte.gpu, &dwpe.gpu, dout.gpu, tokens.gpu, acc);
      const std::string tag = gputest::cat(" grads ", dtype_name(gt), acc ? " accumulate" : "");
      // Same grouping and summation order as the CPU: equal up to fp32 contraction.
      expect_close(dwte, Tol{1e-6f, 0, 2.5f}, gputest::cat("dwte", tag));
      expect_close(dwpe, Tol{1e-6f, 0, 2.5f}, gputest::cat("dwpe", tag));
    }
    // Either output may be absent.
    cpu_ops().embedding_backward(nullptr, &dwpe.cpu, dout.cpu, tokens.cpu, true);
    gpu_ops().embedding_backward(nullptr, &dwpe.gpu, dout.gpu, tokens.gpu, true);
    expect_close(dwpe, Tol{1e-6f, 0, 2.5f}, "dwpe alone");
    cpu_ops().embedding_backward(&dwte.cpu, nullptr, dout.cpu, tokens.cpu, false);
    gpu_ops().embedding_backward(&dwte.gpu, nullptr, dout.gpu, tokens.gpu, false);
    expect_close(dwte, Tol{1e-6f, 0, 2.5f}, "dwte alone");
  }
}

TEST_P(CudaLoss, EmbeddingBackwardLargeVocabulary) {
  const DType t = GetParam();
  const std::int64_t b = 8, tt = 256, c = 64, v = 50257;
  Pair tokens = ints({b, tt}, 8, 0, static_cast<int>(v - 1));
  Pair dout = rand({b, tt, c}, t, 9);
  Pair dwte = full({v, c}, t, 0.0f, Category::grads);
  cpu_ops().embedding_backward(&dwte.cpu, nullptr, dout.cpu, tokens.cpu, false);
  gpu_ops().embedding_backward(&dwte.gpu, nullptr, dout.gpu, tokens.gpu, false);
  expect_close(dwte, Tol{1e-6f, 0, 2.5f}, "dwte, V = 50257");
}

TEST_P(CudaLoss, CrossEntropyForwardBackwardWithIgnoredTargets) {
  const DType t = GetParam();
  for (std::int64_t v : {std::int64_t{10}, std::int64_t{1000}, std::int64_t{50257}}) {
    const std::int64_t n = 37;
    Pair logits = rand({n, v}, t, 10, -6.0f, 6.0f);
    std::vector<float> tg = gputest::random_ints(n, 11, 0, static_cast<int>(v - 1));
    tg[3] = -1.0f;  // ignored: loss 0, gradient 0
    tg[20] = -100.0f;
    Pair targets = make({n}, DType::I32, tg);
    Pair losses = full({n}, DType::F32, 9.0f);
    cpu_ops().crossentropy_forward(losses.cpu, logits.cpu, targets.cpu);
    gpu_ops().crossentropy_forward(losses.gpu, logits.gpu, targets.gpu);
    expect_close(losses, Tol{1e-5f, 0, 8}, gputest::cat("crossentropy losses V=", v));
    Pair dlogits = full({n, v}, t, 9.0f);
    cpu_ops().crossentropy_backward(dlogits.cpu, logits.cpu, targets.cpu, 1.0f / 35.0f);
    gpu_ops().crossentropy_backward(dlogits.gpu, logits.gpu, targets.gpu, 1.0f / 35.0f);
    expect_close(dlogits, Tol{1e-8f, 2e-6f, 4}, gputest::cat("crossentropy dlogits V=", v));
    // In place, as the loss layer may do: dlogits aliasing logits.
    cpu_ops().crossentropy_backward(logits.cpu, logits.cpu, targets.cpu, 0.5f);
    gpu_ops().crossentropy_backward(logits.gpu, logits.gpu, targets.gpu, 0.5f);
    expect_close(logits, Tol{1e-8f, 2e-6f, 4}, gputest::cat("crossentropy in place V=", v));
  }
}

TEST_P(CudaLoss, SumToHost) {
  const DType t = GetParam();
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{3'000'001}}) {
    Pair x = rand({n}, t, 12, -1.0f, 2.0f);
    const double ref = cpu_ops().sum_to_host(x.cpu);
    const double got = gpu_ops().sum_to_host(x.gpu);
    EXPECT_NEAR(got, ref, 1e-9 * static_cast<double>(n) + 1e-12) << "n = " << n;
  }
  Pair i = ints({12345}, 13, -50, 50);
  EXPECT_EQ(gpu_ops().sum_to_host(i.gpu), cpu_ops().sum_to_host(i.cpu));
}

MEMTRADE_INSTANTIATE_DTYPES(CudaLoss);

}  // namespace
}  // namespace memtrade
