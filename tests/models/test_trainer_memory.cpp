// Memory physics: each knob changes what is allocated, by the bytes one expects, asserted on
// the allocator's per-category breakdown at the peak of a steady-state step.
#include <set>
#include <string>

#include "tests/models/test_trainer_util.h"

namespace memtrade::testing {
namespace {

using Cat = Category;

std::int64_t rounded(std::int64_t bytes) {
  return static_cast<std::int64_t>(CachingAllocator::round_size(static_cast<std::size_t>(bytes)));
}

// Σ over trainable params of round512(numel · bytes_per_element), optionally one block only.
std::int64_t param_bytes(const Model& m, std::size_t elem, bool trainable = true, int block = -2) {
  std::int64_t total = 0;
  for (const auto& s : m.params()) {
    if (s.trainable != trainable) continue;
    if (block != -2 && s.block != block) continue;
    total += rounded(shape_numel(s.shape) * static_cast<std::int64_t>(elem));
  }
  return total;
}

struct Peak {
  std::array<std::int64_t, kNumCategories> device{};    // by category at the device peak
  std::array<std::int64_t, kNumCategories> own_peak{};  // each category's own high-water mark
  std::array<std::int64_t, kNumCategories> device_now{};
  std::array<std::int64_t, kNumCategories> pinned_now{};  // host pinned, after the step
  std::int64_t peak = 0;
};

std::int64_t at(const std::array<std::int64_t, kNumCategories>& a, Cat c) {
  return a[static_cast<std::size_t>(c)];
}

// One warm-up step (grads and state come into existence), then the peak of the next step.
Peak steady_peak(const TrainConfig& cfg) {
  auto dev = cpu_device();
  auto model = make_model(cfg.model);
  Trainer trainer(*dev, *model, cfg);
  trainer.step();
  dev->memory().reset_peak();
  dev->memory().enable_trace(true);
  trainer.step();
  Peak p;
  // Each category's own peak, replayed from the trace (the breakdown at the overall peak shows
  // one moment only, which may be in backward or in the optimizer).
  std::array<std::int64_t, kNumCategories> now = dev->memory().stats().by_category;
  for (auto it = dev->memory().trace().rbegin(); it != dev->memory().trace().rend(); ++it) {
    const auto c = static_cast<std::size_t>(it->category);
    if (it->kind == TraceEvent::Kind::alloc) now[c] -= static_cast<std::int64_t>(it->bytes);
    if (it->kind == TraceEvent::Kind::free) now[c] += static_cast<std::int64_t>(it->bytes);
  }  // now: by category at the start of the step
  p.own_peak = now;
  for (const auto& e : dev->memory().trace()) {
    const auto c = static_cast<std::size_t>(e.category);
    if (e.kind == TraceEvent::Kind::alloc) now[c] += static_cast<std::int64_t>(e.bytes);
    if (e.kind == TraceEvent::Kind::free) now[c] -= static_cast<std::int64_t>(e.bytes);
    p.own_peak[c] = std::max(p.own_peak[c], now[c]);
  }
  p.device = dev->memory().stats().by_category_at_peak;
  p.device_now = dev->memory().stats().by_category;
  p.pinned_now = dev->pinned().stats().by_category;
  p.peak = dev->memory().stats().allocated.peak;
  return p;
}

class OptimizerBytes : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerBytes, StateIsCountTimesFp32Params) {
  const std::string name = GetParam();
  auto model = make_model(name);
  const std::int64_t fp32 = param_bytes(*model, 4);
  for (OptimizerKind k : {OptimizerKind::sgd, OptimizerKind::sgd_momentum, OptimizerKind::adam,
                          OptimizerKind::adamw, OptimizerKind::adagrad, OptimizerKind::rmsprop}) {
    TrainConfig cfg = base_config(name, 4);
    cfg.optimizer = k;
    const Peak p = steady_peak(cfg);
    EXPECT_EQ(at(p.device, Cat::optimizer), optimizer_state_count(k) * fp32) << optimizer_name(k);
    EXPECT_EQ(at(p.device, Cat::master), 0);
    EXPECT_EQ(at(p.device, Cat::params), fp32 + param_bytes(*model, 4, false));
    EXPECT_EQ(at(p.own_peak, Cat::grads), fp32);
  }
  // Pure bf16: state in bf16; O2 bf16: fp32 state and an fp32 master next to bf16 weights;
  // autocast bf16: fp32 weights, grads and state as fp32, no master.
  TrainConfig pure = base_config(name, 4);
  pure.precision = Precision::bf16_pure;
  const Peak pp = steady_peak(pure);
  EXPECT_EQ(at(pp.device, Cat::optimizer), 2 * param_bytes(*model, 2));
  EXPECT_EQ(at(pp.device, Cat::master), 0);
  EXPECT_EQ(at(pp.own_peak, Cat::grads), param_bytes(*model, 2));
  TrainConfig mixed = pure;
  mixed.precision = Precision::bf16_o2;
  const Peak pm = steady_peak(mixed);
  EXPECT_EQ(at(pm.device, Cat::optimizer), 2 * fp32);
  EXPECT_EQ(at(pm.device, Cat::master), fp32);
  EXPECT_EQ(at(pm.device, Cat::params), param_bytes(*model, 2) + param_bytes(*model, 4, false));
  EXPECT_EQ(at(pm.own_peak, Cat::grads), param_bytes(*model, 2));
  TrainConfig amp = pure;
  amp.precision = Precision::bf16;
  const Peak pa = steady_peak(amp);
  EXPECT_EQ(at(pa.device, Cat::optimizer), 2 * fp32);
  EXPECT_EQ(at(pa.device, Cat::master), 0);
  EXPECT_EQ(at(pa.device, Cat::params), fp32 + param_bytes(*model, 4, false));
  EXPECT_EQ(at(pa.own_peak, Cat::grads), fp32);
}

INSTANTIATE_TEST_SUITE_P(Models, OptimizerBytes,
                         ::testing::Values("gpt-tiny", "mlp-tiny", "cnn-tiny"), model_test_name);

TEST(MemoryPhysics, Bf16O2HalvesActivations) {
  for (std::string name : {"gpt-tiny", "mlp-tiny", "cnn-tiny"}) {
    TrainConfig cfg = base_config(name, 8);
    const std::int64_t a32 = at(steady_peak(cfg).own_peak, Cat::activations);
    cfg.precision = Precision::bf16_o2;
    const std::int64_t a16 = at(steady_peak(cfg).own_peak, Cat::activations);
    const double ratio = static_cast<double>(a16) / static_cast<double>(a32);
    RecordProperty(name + "_bf16_over_fp32", std::to_string(ratio));
    // Not exactly 0.5: per-row statistics (layer-norm mean/rstd, losses) stay fp32, and 512 B
    // rounding weighs on small tensors.
    EXPECT_GT(ratio, 0.45) << name << " fp32 " << a32 << " bf16 " << a16;
    EXPECT_LT(ratio, 0.65) << name << " fp32 " << a32 << " bf16 " << a16;
  }
}

TEST(MemoryPhysics, CheckpointingLowersActivationPeak) {
  for (std::string name : {"gpt-tiny", "cnn-tiny"}) {
    TrainConfig cfg = base_config(name, 8);
    const std::int64_t none = at(steady_peak(cfg).own_peak, Cat::activations);
    for (const char* ck : {"1", "selective"}) {
      cfg.checkpoint = *Checkpoint::parse(ck);
      const std::int64_t with = at(steady_peak(cfg).own_peak, Cat::activations);
      EXPECT_LT(with, none) << name << " checkpoint=" << ck;
    }
  }
}

TEST(MemoryPhysics, EvalHasNoGradsNorOptimizerState) {
  TrainConfig cfg = base_config("gpt-tiny", 8);
  // Gradients resident through the step: with set_to_none training's peak is the loss backward
  // (its three (N, V) buffers), before any gradient exists, as in eager PyTorch.
  cfg.zero_grad = ZeroGrad::zero;
  const Peak train = steady_peak(cfg);
  cfg.mode = Mode::eval;
  const Peak eval = steady_peak(cfg);
  EXPECT_EQ(at(eval.device, Cat::grads), 0);
  EXPECT_EQ(at(eval.device, Cat::optimizer), 0);
  EXPECT_GT(at(eval.device, Cat::params), 0);
  EXPECT_LT(at(eval.device, Cat::activations), at(train.device, Cat::activations));
  EXPECT_GT(at(train.device, Cat::grads), 0);
}

TEST(MemoryPhysics, ZeroGradKeepsGradsResident) {
  TrainConfig cfg = base_config("mlp-tiny", 8);
  auto model = make_model(cfg.model);
  const Peak none = steady_peak(cfg);
  EXPECT_EQ(at(none.device_now, Cat::grads), 0);  // set_to_none: freed after the step
  cfg.zero_grad = ZeroGrad::zero;
  const Peak zero = steady_peak(cfg);
  EXPECT_EQ(at(zero.device_now, Cat::grads), param_bytes(*model, 4));
}

TEST(MemoryPhysics, OffloadOptimizerKeepsStateOffTheDevice) {
  for (Precision prec :
       {Precision::fp32, Precision::bf16, Precision::bf16_o2, Precision::bf16_pure}) {
    SCOPED_TRACE(std::string(precision_name(prec)));
    TrainConfig cfg = base_config("gpt-tiny", 4);
    cfg.precision = prec;
    cfg.offload = Offload::optimizer;
    auto model = make_model(cfg.model);
    const std::size_t elem = dtype_size(compute_dtype(prec));
    const std::size_t host_elem = prec == Precision::bf16_pure ? 2 : 4;
    const Peak p = steady_peak(cfg);
    EXPECT_EQ(at(p.device, Cat::optimizer), 0);
    EXPECT_EQ(at(p.device, Cat::master), 0);
    EXPECT_EQ(at(p.device, Cat::params), param_bytes(*model, elem));
    // On the host: Adam's two state tensors and the copy the update runs on.
    EXPECT_EQ(at(p.pinned_now, Cat::optimizer), 2 * param_bytes(*model, host_elem));
    EXPECT_EQ(at(p.pinned_now, Cat::master), param_bytes(*model, host_elem));
    EXPECT_EQ(at(p.pinned_now, Cat::grads), param_bytes(*model, elem));
  }
}

// Activation offload on the MLP: a block's input comes back only after its ReLU mask has run and
// freed the ReLU output its consumer handed on (MlpModel::block_backward_fetches), as autograd
// unpacks AddmmBackward's input after ReluBackward. Fetched before the mask, both were on the
// device at once and offload saved nothing here (mlp-tiny b256 fp32 SGD: 328,704 B with and
// without it; now 280,064 B with it).
TEST(MemoryPhysics, OffloadActivationsLowersTheMlpPeak) {
  TrainConfig cfg = base_config("mlp-tiny", 256);
  cfg.optimizer = OptimizerKind::sgd;
  const Peak none = steady_peak(cfg);
  cfg.offload = Offload::activations;
  const Peak off = steady_peak(cfg);
  EXPECT_LT(off.peak, none.peak);
  EXPECT_LT(at(off.device, Cat::activations), at(none.device, Cat::activations));
}

TEST(MemoryPhysics, OffloadParamsStreamsOneBlockAtATime) {
  for (std::string name : {"gpt-tiny", "cnn-tiny"}) {
    for (const char* ck : {"0", "1"}) {
      SCOPED_TRACE(name + " checkpoint=" + ck);
      TrainConfig cfg = base_config(name, 4);
      cfg.offload = Offload::params;
      cfg.checkpoint = *Checkpoint::parse(ck);
      auto model = make_model(name);
      std::int64_t largest_block = 0;
      for (int b = 0; b < model->num_blocks(); ++b)
        largest_block = std::max(largest_block, param_bytes(*model, 4, true, b));
      const std::int64_t resident =
          param_bytes(*model, 4, true, -1) + param_bytes(*model, 4, false);
      const Peak p = steady_peak(cfg);
      EXPECT_LE(at(p.device, Cat::params), resident + largest_block);
      EXPECT_LT(at(p.device, Cat::params), param_bytes(*model, 4) + param_bytes(*model, 4, false));
      EXPECT_EQ(at(p.device, Cat::optimizer), 0);
      EXPECT_EQ(at(p.device_now, Cat::params), resident) << "blocks dropped after use";
      EXPECT_EQ(at(p.pinned_now, Cat::params), param_bytes(*model, 4));
      EXPECT_EQ(at(p.pinned_now, Cat::optimizer), 2 * param_bytes(*model, 4));
    }
  }
}

TEST(MemoryPhysics, PinnedInputStagingIsOnThePinnedAllocator) {
  TrainConfig cfg = base_config("mlp-tiny", 8);
  auto model = make_model(cfg.model);
  // Device: the batch's inputs (8, 32) F32 and targets (8) I32, each rounded to 512 B.
  EXPECT_EQ(at(steady_peak(cfg).own_peak, Cat::io), rounded(8 * 32 * 4) + rounded(8 * 4));
  auto dev = cpu_device();
  Trainer trainer(*dev, *model, cfg);
  trainer.step();
  EXPECT_GT(dev->pinned().stats().allocated.peak, 0);
  cfg.input = InputMemory::pageable;
  auto dev2 = cpu_device();
  Trainer pageable(*dev2, *model, cfg);
  pageable.step();
  EXPECT_EQ(dev2->pinned().stats().allocated.peak, 0);
}

TEST(MemoryPhysics, EmptyCachePerStepReleasesSegments) {
  TrainConfig cfg = base_config("gpt-tiny", 8);
  auto dev = cpu_device();
  auto model = make_model(cfg.model);
  cfg.empty_cache = EmptyCache::per_step;
  Trainer trainer(*dev, *model, cfg);
  trainer.step();
  trainer.step();
  const auto& s = dev->memory().stats();
  // After empty_cache only segments holding live blocks remain: reserved shrinks to the
  // segments of params, grads-free state, i.e. well below the step's reserved peak.
  EXPECT_LT(s.reserved.current, s.reserved.peak);
  EXPECT_GT(s.num_segment_frees, 0);
}

TEST(MemoryPhysics, PhasesLabelTheTrace) {
  TrainConfig cfg = base_config("mlp-tiny", 4);
  auto dev = cpu_device();
  auto model = make_model(cfg.model);
  Trainer trainer(*dev, *model, cfg);
  dev->memory().enable_trace(true);
  trainer.step();
  std::set<std::string> phases;
  for (const auto& e : dev->memory().trace()) phases.insert(e.phase);
  for (const char* ph : {"io", "forward", "backward", "optimizer"})
    EXPECT_TRUE(phases.count(ph)) << ph;
}

}  // namespace
}  // namespace memtrade::testing
