// Shared helpers for the CPU ops tests: a CPU device fixture, deterministic random data,
// finite-difference gradients of double-precision reference forwards, and tolerant compares.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/device.h"

namespace memtrade::test {

using Vec = std::vector<double>;

// Uniform values in [-scale, scale) from mt19937's raw (standardised) output.
inline std::vector<float> rand_vec(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * (2.0f * static_cast<float>(g() >> 8) / 16777216.0f - 1.0f);
  return v;
}

// Values rounded through `t` (what a tensor of that dtype holds).
inline std::vector<float> quantize(std::vector<float> v, DType t) {
  for (auto& x : v) {
    unsigned char raw[4];
    store_from_float(raw, t, 0, x);
    x = load_as_float(raw, t, 0);
  }
  return v;
}

inline Vec to_d(const std::vector<float>& v) {
  return Vec(v.begin(), v.end());
}

class OpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> dev = make_device("cpu");
  Ops& ops() { return dev->ops(); }
  CachingAllocator& mem() { return dev->memory(); }

  Tensor make(Shape s, const std::vector<float>& v, DType t = DType::F32) {
    Tensor x = dev->empty(std::move(s), t, Category::activations);
    dev->from_host_f32(x, v);
    return x;
  }
  Tensor zeros(Shape s, DType t = DType::F32) {
    Tensor x = dev->empty(s, t, Category::activations);
    dev->from_host_f32(x, std::vector<float>(static_cast<std::size_t>(shape_numel(s)), 0.0f));
    return x;
  }
  // Filled with a NaN sentinel so that a missed write shows.
  Tensor garbage(Shape s, DType t = DType::F32) {
    Tensor x = dev->empty(s, t, Category::activations);
    dev->from_host_f32(x, std::vector<float>(static_cast<std::size_t>(shape_numel(s)), NAN));
    return x;
  }
  Tensor ints(Shape s, const std::vector<std::int32_t>& v) {
    Tensor x = dev->empty(std::move(s), DType::I32, Category::io);
    dev->upload(x, v.data(), v.size() * 4);
    return x;
  }
  std::vector<float> get(const Tensor& t) { return dev->to_host_f32(t); }
};

// Central-difference gradient of L(x) = Σ_i f(x)_i · r_i, all in double.
inline Vec fd_grad(const std::function<Vec(const Vec&)>& f, Vec x, const Vec& r,
                   double eps = 1e-6) {
  Vec g(x.size());
  auto loss = [&](const Vec& xx) {
    Vec y = f(xx);
    double s = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
    return s;
  };
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double lp = loss(x);
    x[i] = keep - eps;
    const double lm = loss(x);
    x[i] = keep;
    g[i] = (lp - lm) / (2.0 * eps);
  }
  return g;
}

// Every |got − want| <= atol + rtol·|want|; reports the first few offenders.
inline void expect_close(const std::vector<float>& got, const Vec& want, double atol, double rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::abs(want[i]))) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (err "
                      << err << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements off";
}

}  // namespace memtrade::test
