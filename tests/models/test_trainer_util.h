// Shared helpers of the Trainer tests: a CPU device, a model, and runs of a config that
// return everything the tests compare.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/device.h"
#include "models/config/config.h"
#include "models/model.h"
#include "models/train/trainer.h"

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

// "gpt-tiny" -> "gpt_tiny", "llama-tiny:n_layer=4" -> "llama_tiny_n_layer_4" for parameterised
// test names.
inline std::string model_test_name(const ::testing::TestParamInfo<std::string>& p) {
  std::string s = p.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
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

// Knobs that only trade memory for time, each a change to a config: runs with them must be
// bit-identical to the plain run (tests/models/test_trainer_equivalence.cpp on the CPU,
// tests/gpu/test_cuda_knob_equivalence.cpp on CUDA). A label containing "accumulation=2" is
// compared against the plain run with accumulation 2.
struct KnobVariant {
  std::string label;
  void (*apply)(TrainConfig&);
};

inline const std::vector<KnobVariant>& knob_variants() {
  static const std::vector<KnobVariant> v = {
      {"checkpoint=1", [](TrainConfig& c) { c.checkpoint = *Checkpoint::parse("1"); }},
      {"checkpoint=0.5", [](TrainConfig& c) { c.checkpoint = *Checkpoint::parse("0.5"); }},
      {"checkpoint=sqrt", [](TrainConfig& c) { c.checkpoint = *Checkpoint::parse("sqrt"); }},
      {"checkpoint=selective",
       [](TrainConfig& c) { c.checkpoint = *Checkpoint::parse("selective"); }},
      {"offload=activations", [](TrainConfig& c) { c.offload = Offload::activations; }},
      {"offload=optimizer", [](TrainConfig& c) { c.offload = Offload::optimizer; }},
      {"offload=params", [](TrainConfig& c) { c.offload = Offload::params; }},
      {"offload=params+checkpoint=1",
       [](TrainConfig& c) {
         c.offload = Offload::params;
         c.checkpoint = *Checkpoint::parse("1");
       }},
      {"offload=activations+checkpoint=0.5",
       [](TrainConfig& c) {
         c.offload = Offload::activations;
         c.checkpoint = *Checkpoint::parse("0.5");
       }},
      {"zero_grad=zero", [](TrainConfig& c) { c.zero_grad = ZeroGrad::zero; }},
      {"zero_grad=zero+accumulation=2",  // compared against set_to_none with accumulation 2
       [](TrainConfig& c) { c.zero_grad = ZeroGrad::zero; }},
      {"input=pageable", [](TrainConfig& c) { c.input = InputMemory::pageable; }},
      {"empty_cache=per_step", [](TrainConfig& c) { c.empty_cache = EmptyCache::per_step; }},
  };
  return v;
}

// Runs every knob variant of `model` through `run` (a config -> RunResult, on some device) and
// expects each to equal the plain run bit for bit, at `precision` (and autocast `policy`).
template <typename Run>
void expect_knobs_bit_identical(const std::string& model, Run&& run, int steps = 3,
                                Precision precision = Precision::fp32,
                                autocast::Policy policy = autocast::Policy::torch_cuda) {
  TrainConfig base = base_config(model, 4);
  base.precision = precision;
  base.autocast_policy = policy;
  const RunResult plain = run(base, steps);
  TrainConfig base_acc = base;
  base_acc.accumulation = 2;
  const RunResult plain_acc = run(base_acc, steps);
  for (const auto& v : knob_variants()) {
    SCOPED_TRACE(model + " " + v.label);
    const bool acc = v.label.find("accumulation=2") != std::string::npos;
    TrainConfig cfg = acc ? base_acc : base;
    v.apply(cfg);
    const RunResult r = run(cfg, steps);
    const RunResult& ref = acc ? plain_acc : plain;
    EXPECT_EQ(r.losses, ref.losses);
    expect_identical(r.grads, ref.grads, ref.names, "grads");
    expect_identical(r.params_after, ref.params_after, ref.names, "params_after");
  }
}

}  // namespace memtrade::testing
