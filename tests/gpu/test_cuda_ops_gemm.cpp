// cuBLASLt GEMMs (matmul, linear) against the CPU's fp32 GEMMs: every transpose combination,
// batched, alpha/beta, bias fused and not, accumulation, mixed dtypes, TF32.
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

// Error of a K-term fp32 dot product of unit-range values, plus the output's rounding.
Tol gemm_tol(DType out, std::int64_t k) {
  const float sk = std::sqrt(static_cast<float>(k));
  return Tol{out == DType::F32 ? 2e-6f * k : 0.0f,
             out == DType::F32 ? 0.0f : 2 * dtype_eps(out) / sk, 2.5f};
}

class CudaGemm : public CudaVsCpuDtype {};

TEST_P(CudaGemm, MatmulEveryTransposeAndBatch) {
  const DType t = GetParam();
  const std::int64_t m = 37, n = 53, k = 70;
  std::uint32_t seed = 100;
  for (bool batched : {false, true}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Shape sa = ta ? Shape{k, m} : Shape{m, k};
        Shape sb = tb ? Shape{n, k} : Shape{k, n};
        Shape sc{m, n};
        if (batched) {
          sa.insert(sa.begin(), 3);
          sb.insert(sb.begin(), 3);
          sc.insert(sc.begin(), 3);
        }
        Pair a = rand(sa, t, ++seed);
        Pair b = rand(sb, t, ++seed);
        Pair c = rand(sc, t, ++seed);
        for (auto [alpha, beta] :
             {std::pair{1.0f, 0.0f}, std::pair{0.5f, 1.0f}, std::pair{-2.0f, 0.25f}}) {
          cpu_ops().matmul(c.cpu, a.cpu, b.cpu, ta, tb, alpha, beta);
          gpu_ops().matmul(c.gpu, a.gpu, b.gpu, ta, tb, alpha, beta);
          // With beta != 0 the next round starts from slightly different C: compare each time.
          expect_close(c, gemm_tol(t, k * 4),
                       gputest::cat("matmul ta=", ta, " tb=", tb, " batched=", batched,
                                    " alpha=", alpha, " beta=", beta));
          c = make(sc, t, cpu_->to_host_f32(c.cpu));  // resync both sides
        }
      }
    }
  }
}

TEST_P(CudaGemm, MatmulBetaZeroIgnoresNaNInC) {
  const DType t = GetParam();
  Pair a = rand({8, 16}, t, 1);
  Pair b = rand({16, 8}, t, 2);
  Pair c = full({8, 8}, t, NAN);
  cpu_ops().matmul(c.cpu, a.cpu, b.cpu, false, false, 1.0f, 0.0f);
  gpu_ops().matmul(c.gpu, a.gpu, b.gpu, false, false, 1.0f, 0.0f);
  expect_close(c, gemm_tol(t, 16), "beta = 0 over NaN");
}

TEST_P(CudaGemm, MatmulMixedDtypes) {
  const DType t = GetParam();
  for (DType ct : {DType::F32, DType::F16, DType::BF16}) {
    for (DType bt : {DType::F32, DType::F16, DType::BF16}) {
      Pair a = rand({33, 65}, t, 3);
      Pair b = rand({65, 17}, bt, 4);
      Pair c = full({33, 17}, ct, 0.0f);
      cpu_ops().matmul(c.cpu, a.cpu, b.cpu, false, false, 1.0f, 0.0f);
      gpu_ops().matmul(c.gpu, a.gpu, b.gpu, false, false, 1.0f, 0.0f);
      // The GPU rounds fp32 operands to a 16-bit output's dtype before multiplying.
      const bool rounds_inputs = ct != DType::F32 && !(t == ct && bt == ct);
      Tol tol = gemm_tol(ct, 65);
      if (rounds_inputs) tol.rel_of_max = 4 * dtype_eps(ct);
      expect_close(
          c, tol,
          gputest::cat("matmul a ", dtype_name(t), " b ", dtype_name(bt), " c ", dtype_name(ct)));
    }
  }
}

TEST_P(CudaGemm, LinearForwardWithAndWithoutBias) {
  const DType t = GetParam();
  const std::int64_t b = 4, tt = 9, c = 96, oc = 136;
  Pair inp = rand({b, tt, c}, t, 5);
  Pair w = rand({oc, c}, t, 6, -0.2f, 0.2f, Category::params);
  for (DType bias_t : {t, DType::F32}) {  // same dtype: fused epilogue; else a separate add
    Pair bias = rand({oc}, bias_t, 7, -1.0f, 1.0f, Category::params);
    Pair out = full({b, tt, oc}, t, 0.0f);
    cpu_ops().linear_forward(out.cpu, inp.cpu, w.cpu, &bias.cpu);
    gpu_ops().linear_forward(out.gpu, inp.gpu, w.gpu, &bias.gpu);
    // Either way the bias is in before the output's one rounding.
    expect_close(out, gemm_tol(t, c),
                 gputest::cat("linear_forward with bias ", dtype_name(bias_t)));
  }
  Pair out = full({b, tt, oc}, t, 0.0f);
  cpu_ops().linear_forward(out.cpu, inp.cpu, w.cpu, nullptr);
  gpu_ops().linear_forward(out.gpu, inp.gpu, w.gpu, nullptr);
  expect_close(out, gemm_tol(t, c), "linear_forward without bias");
}

// The bias goes in before a 16-bit output's one rounding (ops.h), fused or not: with operands
// whose products and sums are exact in fp32 (multiples of 2^-5, K = 16) the GEMM's summation
// order cannot matter, so the GPU must equal the CPU bit for bit, while rounding the GEMM's
// result to 16 bits before adding the bias would differ in many elements.
TEST_P(CudaGemm, LinearBiasIsAddedBeforeTheOneRounding) {
  const DType t = GetParam();
  if (t == DType::F32) GTEST_SKIP() << "16-bit outputs only";
  const std::int64_t n = 64, c = 16, oc = 40;
  auto grid = [](std::int64_t count, std::uint32_t seed, float step) {
    std::vector<float> v = gputest::random_values(count, seed, -32.0f, 32.0f);
    for (float& x : v) x = std::round(x) * step;  // within 16-bit range, exactly representable
    return v;
  };
  Pair inp = make({n, c}, t, grid(n * c, 50, 1.0f / 32));
  Pair w = make({oc, c}, t, grid(oc * c, 51, 1.0f / 32), Category::params);
  for (DType bias_t : {t, DType::F32}) {
    Pair bias = make({oc}, bias_t, grid(oc, 52, 1.0f / 4096), Category::params);
    Pair out = full({n, oc}, t, 0.0f);
    cpu_ops().linear_forward(out.cpu, inp.cpu, w.cpu, &bias.cpu);
    gpu_ops().linear_forward(out.gpu, inp.gpu, w.gpu, &bias.gpu);
    expect_close(out, Tol{0, 0, 0}, gputest::cat("exact GEMM plus bias ", dtype_name(bias_t)));
  }
}

TEST_P(CudaGemm, LinearBackwardAccumulates) {
  const DType t = GetParam();
  const std::int64_t n = 150, c = 64, oc = 48;
  Pair inp = rand({n, c}, t, 8);
  Pair w = rand({oc, c}, t, 9, -0.3f, 0.3f, Category::params);
  Pair dout = rand({n, oc}, t, 10);
  for (DType gt : {t, DType::F32}) {  // 16-bit activations with fp32 master grads too
    Pair dinp = full({n, c}, t, 0.0f);
    Pair dw = rand({oc, c}, gt, 11, -1.0f, 1.0f, Category::grads);
    Pair db = rand({oc}, gt, 12, -1.0f, 1.0f, Category::grads);
    for (bool acc : {false, true}) {
      cpu_ops().linear_backward(&dinp.cpu, &dw.cpu, &db.cpu, dout.cpu, inp.cpu, w.cpu, acc);
      gpu_ops().linear_backward(&dinp.gpu, &dw.gpu, &db.gpu, dout.gpu, inp.gpu, w.gpu, acc);
      const std::string tag =
          gputest::cat(" grads ", dtype_name(gt), acc ? " accumulate" : " overwrite");
      expect_close(dinp, gemm_tol(t, oc), gputest::cat("dinp", tag));
      expect_close(dw, gemm_tol(gt, n), gputest::cat("dweight", tag));
      expect_close(db, gemm_tol(gt, n), gputest::cat("dbias", tag));
    }
    // Each output is optional.
    gpu_ops().linear_backward(nullptr, nullptr, &db.gpu, dout.gpu, inp.gpu, w.gpu, false);
    cpu_ops().linear_backward(nullptr, nullptr, &db.cpu, dout.cpu, inp.cpu, w.cpu, false);
    expect_close(db, gemm_tol(gt, n), "dbias alone");
  }
}

TEST_P(CudaGemm, LinearBackwardLongReductionRoundsOnce) {
  // dweight's k is B·T: long enough for cuBLASLt's heuristic to pick split-K. A 16-bit dweight
  // must still be rounded once (fp32 partial sums), so it may differ from the CPU's single
  // rounding of a slightly different fp32 sum by one ulp, not the several ulps of partial sums
  // added in 16 bits. The bias gradient runs the chunked column sum over the same rows.
  const DType t = GetParam();
  if (t == DType::F32) GTEST_SKIP() << "16-bit outputs only";
  const std::int64_t n = 16384, c = 768, oc = 768;
  Pair inp = rand({n, c}, t, 50);
  Pair w = rand({oc, c}, t, 51, -0.1f, 0.1f, Category::params);
  Pair dout = rand({n, oc}, t, 52);
  Pair dw = rand({oc, c}, t, 53, -1.0f, 1.0f, Category::grads);
  Pair db = rand({oc}, t, 54, -1.0f, 1.0f, Category::grads);
  for (bool acc : {false, true}) {
    cpu_ops().linear_backward(nullptr, &dw.cpu, &db.cpu, dout.cpu, inp.cpu, w.cpu, acc);
    gpu_ops().linear_backward(nullptr, &dw.gpu, &db.gpu, dout.gpu, inp.gpu, w.gpu, acc);
    Tol tol = gemm_tol(t, n);
    tol.ulps = 1.0f;  // one rounding step apart at most
    expect_close(dw, tol, gputest::cat("dweight, k = ", n, acc ? " accumulate" : ""));
    expect_close(db, tol, gputest::cat("dbias over ", n, " rows", acc ? " accumulate" : ""));
    dw = make({oc, c}, t, cpu_->to_host_f32(dw.cpu), Category::grads);  // resync both sides
    db = make({oc}, t, cpu_->to_host_f32(db.cpu), Category::grads);
  }
}

TEST_P(CudaGemm, LinearWithZeroInputWidth) {
  // inp (N, 0): every output row is the bias (or 0), and dbias sums dout over all N rows.
  const DType t = GetParam();
  Pair inp = full({3, 5, 0}, t, 0.0f);
  Pair w = full({6, 0}, t, 0.0f, Category::params);
  for (DType bias_t : {t, DType::F32}) {  // fused into the GEMM's k = 0 path, or added after
    Pair bias = rand({6}, bias_t, 40, -1.0f, 1.0f, Category::params);
    Pair out = full({3, 5, 6}, t, NAN);
    cpu_ops().linear_forward(out.cpu, inp.cpu, w.cpu, &bias.cpu);
    gpu_ops().linear_forward(out.gpu, inp.gpu, w.gpu, &bias.gpu);
    expect_close(out, Tol{0, 0, 0},
                 gputest::cat("linear_forward C = 0, bias ", dtype_name(bias_t)));
  }
  Pair out = full({3, 5, 6}, t, NAN);
  cpu_ops().linear_forward(out.cpu, inp.cpu, w.cpu, nullptr);
  gpu_ops().linear_forward(out.gpu, inp.gpu, w.gpu, nullptr);
  expect_close(out, Tol{0, 0, 0}, "linear_forward C = 0 without bias");
  Pair dout = rand({3, 5, 6}, t, 41);
  Pair dinp = full({3, 5, 0}, t, 0.0f);
  Pair dw = full({6, 0}, t, 0.0f, Category::grads);
  Pair db = rand({6}, t, 42, -1.0f, 1.0f, Category::grads);
  for (bool acc : {false, true}) {
    cpu_ops().linear_backward(&dinp.cpu, &dw.cpu, &db.cpu, dout.cpu, inp.cpu, w.cpu, acc);
    gpu_ops().linear_backward(&dinp.gpu, &dw.gpu, &db.gpu, dout.gpu, inp.gpu, w.gpu, acc);
    expect_close(db, gemm_tol(t, 15), gputest::cat("dbias C = 0", acc ? " accumulate" : ""));
  }
}

TEST_P(CudaGemm, RejectsMismatchedShapes) {
  const DType t = GetParam();
  Pair a = rand({4, 5}, t, 1);
  Pair b = rand({6, 7}, t, 2);
  Pair c = full({4, 7}, t, 0.0f);
  EXPECT_THROW(gpu_ops().matmul(c.gpu, a.gpu, b.gpu, false, false, 1.0f, 0.0f),
               std::invalid_argument);
  Pair w = rand({3, 6}, t, 3);
  EXPECT_THROW(gpu_ops().linear_forward(c.gpu, a.gpu, w.gpu, nullptr), std::invalid_argument);
}

MEMTRADE_INSTANTIATE_DTYPES(CudaGemm);

class CudaGemmF32 : public CudaVsCpu {};

TEST_F(CudaGemmF32, LargeProblemWithWorkspace) {
  Pair a = rand({512, 768}, DType::F32, 20);
  Pair b = rand({2304, 768}, DType::F32, 21);
  Pair c = full({512, 2304}, DType::F32, 0.0f);
  cpu_ops().matmul(c.cpu, a.cpu, b.cpu, false, true, 1.0f, 0.0f);
  gpu_ops().matmul(c.gpu, a.gpu, b.gpu, false, true, 1.0f, 0.0f);
  expect_close(c, Tol{1e-4f, 0, 4}, "512x768 · 768x2304");
  // The cuBLASLt workspace is one block of category workspace, kept across calls.
  EXPECT_GT(gpu_->memory().stats().by_category[static_cast<int>(Category::workspace)], 0);
}

#ifdef MEMTRADE_HAVE_CUDA
TEST_F(CudaGemmF32, Tf32IsCloseButNotExact) {
  Pair a = rand({256, 512}, DType::F32, 30);
  Pair b = rand({512, 256}, DType::F32, 31);
  Pair c = full({256, 256}, DType::F32, 0.0f);
  cpu_ops().matmul(c.cpu, a.cpu, b.cpu, false, false, 1.0f, 0.0f);
  cuda::set_tf32(*gpu_, true);
  gpu_ops().matmul(c.gpu, a.gpu, b.gpu, false, false, 1.0f, 0.0f);
  cuda::set_tf32(*gpu_, false);
  // TF32 keeps 10 mantissa bits: about 2^-11 relative per product, sqrt(K) growth.
  expect_close(c, Tol{0, 2e-3f, 0}, "tf32 matmul");
  // Back to exact fp32 afterwards.
  gpu_ops().matmul(c.gpu, a.gpu, b.gpu, false, false, 1.0f, 0.0f);
  expect_close(c, Tol{1e-4f, 0, 4}, "fp32 matmul after tf32");
}
#endif

}  // namespace
}  // namespace memtrade
