// A simple ParamStore for model tests: device-resident weights in one dtype (buffers F32),
// initialised from each ParamSpec with a seeded generator; gradients allocated lazily with
// set_to_none semantics (first contribution of a step overwrites, later ones add). Also helpers
// to run one forward/backward on synthetic data and to measure activation memory.
#pragma once

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "models/model.h"
#include "models/train/data.h"

namespace memtrade::testing {

class TestStore final : public ParamStore {
 public:
  // init_scale multiplies every normal init's std (a model's own init makes some gradients too
  // small for finite differences to see).
  TestStore(Device& dev, const Model& model, DType dtype = DType::F32, std::uint64_t seed = 1,
            float init_scale = 1.0f)
      : dev_(dev), model_(model), dtype_(dtype) {
    const auto& specs = model.params();
    grads_.resize(specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const ParamSpec& p = specs[i];
      const DType dt = p.trainable ? dtype : DType::F32;
      weights_.push_back(dev.empty(p.shape, dt, Category::params));
      std::vector<float> v(static_cast<std::size_t>(shape_numel(p.shape)));
      SplitMix rng(seed, i, 0x5eed);
      for (auto& x : v)
        x = p.init_std > 0 ? init_scale * p.init_std * rng.normal() : (p.init_std < 0 ? 1.f : 0.f);
      dev.from_host_f32(weights_.back(), v);
    }
  }

  Tensor& weight(int index) override { return weights_.at(index); }
  GradRef grad(int index) override {
    if (!model_.params().at(index).trainable)
      throw std::logic_error("grad() of buffer " + model_.params()[index].name);
    Tensor& g = grads_.at(index);
    const bool accumulate = g.defined();
    if (!accumulate) g = dev_.empty(model_.params()[index].shape, dtype_, Category::grads);
    return {g, accumulate};
  }
  void enter_block(int block) override {
    if (open_ != -2) throw std::logic_error("enter_block inside another block");
    open_ = block;
    ++enters_;
  }
  void exit_block(int block) override {
    if (open_ != block) throw std::logic_error("exit_block without its enter_block");
    open_ = -2;
  }

  void zero_grad_set_to_none() {
    for (auto& g : grads_) g.reset();
  }
  // Allocates every gradient now (zero-filled), as zero_grad = zero would keep them.
  void allocate_grads() {
    for (std::size_t i = 0; i < grads_.size(); ++i) {
      if (!model_.params()[i].trainable || grads_[i].defined()) continue;
      grads_[i] = dev_.empty(model_.params()[i].shape, dtype_, Category::grads);
      dev_.ops().fill(grads_[i], 0.0f);
    }
  }
  bool has_grad(int index) const { return grads_.at(index).defined(); }
  std::vector<float> grad_host(int index) { return dev_.to_host_f32(grads_.at(index)); }
  std::vector<float> weight_host(int index) { return dev_.to_host_f32(weights_.at(index)); }
  void set_weight_host(int index, const std::vector<float>& v) {
    dev_.from_host_f32(weights_.at(index), v);
  }
  int index(std::string_view name) const {
    const auto& specs = model_.params();
    for (std::size_t i = 0; i < specs.size(); ++i)
      if (specs[i].name == name) return static_cast<int>(i);
    throw std::invalid_argument("no parameter " + std::string(name));
  }
  int enters() const { return enters_; }
  bool inside_block() const { return open_ != -2; }

 private:
  Device& dev_;
  const Model& model_;
  DType dtype_;
  std::vector<Tensor> weights_;
  std::vector<Tensor> grads_;
  int open_ = -2;
  int enters_ = 0;
};

// One micro-batch of synthetic data on the device.
struct Batch {
  Tensor input;
  Tensor targets;
};

inline Batch make_device_batch(Device& dev, const Model& m, std::uint64_t seed, std::int64_t first,
                               std::int64_t batch, DType act) {
  std::vector<float> in;
  std::vector<std::int32_t> tg;
  m.make_batch(seed, first, batch, in, tg);
  Batch b{dev.empty(m.input_shape(batch), m.input_dtype(act), Category::io),
          dev.empty(m.target_shape(batch), DType::I32, Category::io)};
  dev.from_host_f32(b.input, in);
  dev.upload(b.targets, tg.data(), tg.size() * sizeof(std::int32_t));
  return b;
}

// Largest number of live activation bytes seen in an allocator's trace (independent of when
// the total peak happened), and the breakdown at the total peak.
struct ActivationPeak {
  std::int64_t max_live = 0;  // from the trace
  std::int64_t at_peak = 0;   // by_category_at_peak[activations]
};

class ActivationMeter {
 public:
  explicit ActivationMeter(CachingAllocator& a) : a_(a) {
    start_ = a.stats().by_category[static_cast<std::size_t>(Category::activations)];
    a_.clear_trace();
    a_.enable_trace(true);
    a_.reset_peak();
  }
  ActivationPeak stop() {
    a_.enable_trace(false);
    ActivationPeak p;
    std::int64_t live = start_;
    p.max_live = live;
    for (const auto& e : a_.trace()) {
      if (e.category != Category::activations) continue;
      const auto b = static_cast<std::int64_t>(e.bytes);
      if (e.kind == TraceEvent::Kind::alloc) live += b;
      if (e.kind == TraceEvent::Kind::free) live -= b;
      p.max_live = std::max(p.max_live, live);
    }
    p.at_peak = a_.stats().by_category_at_peak[static_cast<std::size_t>(Category::activations)];
    a_.clear_trace();
    return p;
  }

 private:
  CachingAllocator& a_;
  std::int64_t start_ = 0;
};

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace memtrade::testing
