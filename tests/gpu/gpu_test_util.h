// Shared helpers of the CUDA-vs-CPU tests: a fixture that skips without a usable CUDA device and
// otherwise holds one device of each backend, "pairs" of tensors with identical contents on both,
// and a comparison with the tolerance tol + |ref|·k·eps(dtype).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda_probe.h"
#include "kernels/device.h"

namespace memtrade {
// Readable parameter values in test names and messages ("f32" rather than a byte dump).
inline void PrintTo(DType t, std::ostream* os) {
  *os << dtype_name(t);
}
}  // namespace memtrade

namespace memtrade::gputest {

// Skips the calling test unless a CUDA device can be used; put first in every GPU test.
#define MEMTRADE_REQUIRE_CUDA()                                             \
  do {                                                                      \
    const ::memtrade::CudaProbe memtrade_probe_ = ::memtrade::probe_cuda(); \
    if (!memtrade_probe_.usable)                                            \
      GTEST_SKIP() << "no usable CUDA device: " << memtrade_probe_.detail;  \
  } while (0)

// The same tensor on the CPU and on the CUDA device.
struct Pair {
  Tensor cpu;
  Tensor gpu;
};

inline std::vector<float> random_values(std::int64_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<float> random_ints(std::int64_t n, std::uint32_t seed, int lo, int hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<float>(dist(gen));
  return v;
}

// Concatenates anything streamable: test labels without std::string operator+ chains (which
// trip GCC 12's -Wrestrict false positive, GCC bug 105329).
template <typename... A>
std::string cat(const A&... a) {
  std::ostringstream o;
  (o << ... << a);
  return o.str();
}

// Tolerance of one comparison: |got − ref| <= abs + rel_of_max·max|ref| + ulps·eps(dtype)·|ref|.
// eps is an ulp at 1.0 (dtype_eps, twice the unit roundoff), so ulps = 2 allows the output's
// rounding (eps/2) plus 1.5 ulps of accumulation-order difference.
struct Tol {
  float abs = 0.0f;
  float rel_of_max = 0.0f;
  float ulps = 2.0f;
};

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    MEMTRADE_REQUIRE_CUDA();
    cpu_ = make_device("cpu");
    gpu_ = make_device("cuda");
  }
  void TearDown() override {
    if (gpu_) gpu_->synchronize();
  }

  Ops& cpu_ops() { return cpu_->ops(); }
  Ops& gpu_ops() { return gpu_->ops(); }

  Pair make(const Shape& shape, DType dtype, const std::vector<float>& values,
            Category cat = Category::activations) {
    Pair p{cpu_->empty(shape, dtype, cat), gpu_->empty(shape, dtype, cat)};
    cpu_->from_host_f32(p.cpu, values);
    gpu_->from_host_f32(p.gpu, values);
    return p;
  }
  Pair rand(const Shape& shape, DType dtype, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f,
            Category cat = Category::activations) {
    return make(shape, dtype, random_values(shape_numel(shape), seed, lo, hi), cat);
  }
  Pair full(const Shape& shape, DType dtype, float value, Category cat = Category::activations) {
    return make(shape, dtype,
                std::vector<float>(static_cast<std::size_t>(shape_numel(shape)), value), cat);
  }
  Pair ints(const Shape& shape, std::uint32_t seed, int lo, int hi) {
    return make(shape, DType::I32, random_ints(shape_numel(shape), seed, lo, hi));
  }

  // Compares the two halves of p after both devices have finished.
  void expect_close(Pair& p, Tol tol, const std::string& what) {
    const std::vector<float> ref = cpu_->to_host_f32(p.cpu);
    const std::vector<float> got = gpu_->to_host_f32(p.gpu);
    expect_close_values(ref, got, p.gpu.dtype(), tol, what);
  }

  static void expect_close_values(const std::vector<float>& ref, const std::vector<float>& got,
                                  DType dtype, Tol tol, const std::string& what) {
    ASSERT_EQ(ref.size(), got.size()) << what;
    float max_ref = 0.0f;
    for (float r : ref) max_ref = std::max(max_ref, std::fabs(r));
    const float eps = dtype_eps(dtype);
    std::size_t bad = 0;
    float worst = 0.0f;
    std::ostringstream first;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const float r = ref[i], g = got[i];
      if (std::isnan(r) && std::isnan(g)) continue;
      if (std::isinf(r) && r == g) continue;
      const float limit = tol.abs + tol.rel_of_max * max_ref + tol.ulps * eps * std::fabs(r);
      const float err = std::fabs(g - r);
      if (!(err <= limit)) {
        if (bad < 5)
          first << "\n  [" << i << "] cpu " << r << " cuda " << g << " (limit " << limit << ")";
        ++bad;
        worst = std::max(worst, std::isnan(err) ? INFINITY : err);
      }
    }
    EXPECT_EQ(bad, 0u) << what << " (" << dtype_name(dtype) << "): " << bad << " of " << ref.size()
                       << " elements differ, worst |err| " << worst << ", max|ref| " << max_ref
                       << first.str();
  }

  std::unique_ptr<Device> cpu_;
  std::unique_ptr<Device> gpu_;
};

// Parameterised over the float dtypes.
class CudaVsCpuDtype : public CudaVsCpu, public ::testing::WithParamInterface<DType> {};

inline std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) {
  return std::string(dtype_name(info.param));
}

#define MEMTRADE_INSTANTIATE_DTYPES(suite)                                                        \
  INSTANTIATE_TEST_SUITE_P(                                                                       \
      Dtypes, suite,                                                                              \
      ::testing::Values(::memtrade::DType::F32, ::memtrade::DType::F16, ::memtrade::DType::BF16), \
      ::memtrade::gputest::dtype_param_name)

}  // namespace memtrade::gputest
