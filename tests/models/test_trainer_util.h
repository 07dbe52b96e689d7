// Shared helpers of the Trainer tests: a CPU device, a model, and runs of a config that
// return everything the tests compare.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/device.h"
#include "models/config.h"
#include "models/model.h"
#include "models/trainer.h"

namespace memtrade::testing {

inline std::unique_ptr<Device> cpu_device() {
  DeviceOptions o;
  o.threads = 2;
  return make_device("cpu", o);
}

inline TrainConfig base_config(const std::string& model, std::int64_t batch = 4) {
  TrainConfig c;
  c.model = model;
  c.batch_size = batch;
  c.seed = 1;
  c.optimizer = OptimizerKind::adam;
  return c;
}

// "gpt-tiny" -> "gpt_tiny" for parameterised test names.
inline std::string model_test_name(const ::testing::TestParamInfo<std::string>& p) {
  std::string s = p.param;
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

// Everything one run produced: per step the loss, and after the last step every trainable
// parameter's grads (captured, unscaled) and values.
struct RunResult {
  std::vector<double> losses;
  std::vector<bool> skipped;
  std::vector<std::vector<float>> params_before, grads, params_after;
  std::vector<std::string> names;
};

inline RunResult run_steps(Device& dev, const TrainConfig& cfg, int steps) {
  auto model = make_model(cfg.model);
  Trainer trainer(dev, *model, cfg);
  trainer.set_capture_grads(true);
  RunResult r;
  const auto& specs = model->params();
  for (int i = 0; i < static_cast<int>(specs.size()); ++i)
    if (specs[static_cast<std::size_t>(i)].trainable)
      r.params_before.push_back(trainer.param_f32(i));
  for (int s = 0; s < steps; ++s) {
    StepResult sr = trainer.step();
    r.losses.push_back(sr.loss);
    r.skipped.push_back(sr.skipped);
  }
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    if (!specs[static_cast<std::size_t>(i)].trainable) continue;
    r.names.push_back(specs[static_cast<std::size_t>(i)].name);
    r.grads.push_back(trainer.grad_f32(i));
    r.params_after.push_back(trainer.param_f32(i));
  }
  return r;
}

inline RunResult run_steps(const TrainConfig& cfg, int steps) {
  auto dev = cpu_device();
  return run_steps(*dev, cfg, steps);
}

// Exact equality of every element (fp32 == also equates +0 and -0, which is intended).
inline void expect_identical(const std::vector<std::vector<float>>& a,
                             const std::vector<std::vector<float>>& b,
                             const std::vector<std::string>& names, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t p = 0; p < a.size(); ++p) {
    ASSERT_EQ(a[p].size(), b[p].size()) << what << " " << names[p];
    std::size_t mismatches = 0, first = 0;
    for (std::size_t j = 0; j < a[p].size(); ++j)
      if (!(a[p][j] == b[p][j])) {
        if (mismatches++ == 0) first = j;
      }
    EXPECT_EQ(mismatches, 0u) << what << " " << names[p] << ": first at " << first << " ("
                              << (mismatches ? a[p][first] : 0.f) << " vs "
                              << (mismatches ? b[p][first] : 0.f) << ")";
  }
}

// max_j |a - b| / max(max_j |b|, tiny), per parameter, the worst over parameters.
inline double max_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-30;
  for (std::size_t j = 0; j < a.size(); ++j) {
    diff = std::max(diff, std::abs(static_cast<double>(a[j]) - b[j]));
    scale = std::max(scale, std::abs(static_cast<double>(b[j])));
  }
  return diff / scale;
}

}  // namespace memtrade::testing
