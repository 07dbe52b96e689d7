// CUDA element-wise ops against the CPU ones, for every dtype and for mixed dtypes.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

namespace memtrade {
namespace {

using gputest::CudaVsCpuDtype;
using gputest::Pair;
using gputest::Tol;

class CudaElementwise : public CudaVsCpuDtype {};

// Sizes: empty-ish, not a multiple of 4 (scalar tail), large (grid-stride loops).
const std::vector<Shape> kShapes = {{1}, {3, 5}, {7, 129}, {1 << 20}, {1000003}};

TEST_P(CudaElementwise, Fill) {
  const DType t = GetParam();
  for (const Shape& s : kShapes) {
    Pair x = rand(s, t, 1);
    cpu_ops().fill(x.cpu, -1.375f);
    gpu_ops().fill(x.gpu, -1.375f);
    expect_close(x, Tol{0, 0, 0}, gputest::cat("fill ", shape_str(s)));
  }
}

TEST_P(CudaElementwise, CastBetweenEveryDtype) {
  const DType t = GetParam();
  for (DType src_t : {DType::F32, DType::F16, DType::BF16}) {
    for (const Shape& s : kShapes) {
      Pair src = rand(s, src_t, 2, -70000.0f, 70000.0f);  // f16 overflows to inf here: both must
      Pair dst = full(s, t, 0.0f);
      cpu_ops().cast(dst.cpu, src.cpu);
      gpu_ops().cast(dst.gpu, src.gpu);
      expect_close(dst, Tol{0, 0, 0}, gputest::cat("cast from ", dtype_name(src_t)));
    }
  }
  // Same numel, different shape.
  Pair src = rand({6, 4}, DType::F32, 3);
  Pair dst = full({24}, t, 0.0f);
  cpu_ops().cast(dst.cpu, src.cpu);
  gpu_ops().cast(dst.gpu, src.gpu);
  expect_close(dst, Tol{0, 0, 0}, "cast reshaped");
}

TEST_P(CudaElementwise, AddAndAddInplaceMixedDtypes) {
  const DType t = GetParam();
  for (DType other : {DType::F32, DType::F16, DType::BF16}) {
    for (const Shape& s : kShapes) {
      Pair a = rand(s, t, 4);
      Pair b = rand(s, other, 5);
      Pair out = full(s, t, 0.0f);
      cpu_ops().add(out.cpu, a.cpu, b.cpu);
      gpu_ops().add(out.gpu, a.gpu, b.gpu);
      expect_close(out, Tol{0, 0, 0}, gputest::cat("add ", shape_str(s)));
      cpu_ops().add_inplace(a.cpu, b.cpu);
      gpu_ops().add_inplace(a.gpu, b.gpu);
      expect_close(a, Tol{0, 0, 0}, gputest::cat("add_inplace ", shape_str(s)));
    }
  }
}

TEST_P(CudaElementwise, Scale) {
  const DType t = GetParam();
  for (const Shape& s : kShapes) {
    Pair x = rand(s, t, 6, -3.0f, 3.0f);
    cpu_ops().scale(x.cpu, 0.37f);
    gpu_ops().scale(x.gpu, 0.37f);
    expect_close(x, Tol{0, 0, 0}, gputest::cat("scale ", shape_str(s)));
  }
}

TEST_P(CudaElementwise, GeluForwardBackward) {
  const DType t = GetParam();
  for (const Shape& s : kShapes) {
    Pair inp = rand(s, t, 7, -6.0f, 6.0f);
    Pair dout = rand(s, t, 8);
    Pair out = full(s, t, 0.0f);
    Pair dinp = full(s, t, 0.0f);
    cpu_ops().gelu_forward(out.cpu, inp.cpu);
    gpu_ops().gelu_forward(out.gpu, inp.gpu);
    // tanhf on the device may differ from std::tanh by an ulp or two of fp32.
    expect_close(out, Tol{2e-6f, 0, 2.5f}, gputest::cat("gelu_forward ", shape_str(s)));
    cpu_ops().gelu_backward(dinp.cpu, dout.cpu, inp.cpu);
    gpu_ops().gelu_backward(dinp.gpu, dout.gpu, inp.gpu);
    expect_close(dinp, Tol{4e-6f, 0, 2.5f}, gputest::cat("gelu_backward ", shape_str(s)));
  }
}

TEST_P(CudaElementwise, ReluForwardBackwardInPlace) {
  const DType t = GetParam();
  for (const Shape& s : kShapes) {
    Pair x = rand(s, t, 9);
    Pair dout = rand(s, t, 10);
    cpu_ops().relu_forward(x.cpu, x.cpu);  // in place, as models do
    gpu_ops().relu_forward(x.gpu, x.gpu);
    expect_close(x, Tol{0, 0, 0}, gputest::cat("relu_forward ", shape_str(s)));
    cpu_ops().relu_backward(dout.cpu, dout.cpu, x.cpu);
    gpu_ops().relu_backward(dout.gpu, dout.gpu, x.gpu);
    expect_close(dout, Tol{0, 0, 0}, gputest::cat("relu_backward ", shape_str(s)));
  }
}

TEST_P(CudaElementwise, RejectsBadArguments) {
  const DType t = GetParam();
  Pair a = rand({4, 4}, t, 11);
  Pair b = rand({4, 5}, t, 12);
  Pair i = ints({4, 4}, 13, 0, 3);
  EXPECT_THROW(gpu_ops().add(a.gpu, a.gpu, b.gpu), std::invalid_argument);
  EXPECT_THROW(gpu_ops().cast(a.gpu, b.gpu), std::invalid_argument);
  EXPECT_THROW(gpu_ops().fill(i.gpu, 1.0f), std::invalid_argument);
  EXPECT_THROW(gpu_ops().gelu_forward(a.gpu, b.gpu), std::invalid_argument);
}

MEMTRADE_INSTANTIATE_DTYPES(CudaElementwise);

}  // namespace
}  // namespace memtrade
