// The Trainer on the CUDA backend against the CPU backend: same losses, grads and updates to
// GEMM-order rounding, and the same allocations (docs/design.md: the same model and knobs make the
// same allocation sequence on both backends). Skipped without a usable CUDA device.
#include <cctype>
#include <ostream>
#include <string>

#include "kernels/cuda_probe.h"
#include "tests/models/test_trainer_util.h"

namespace memtrade::testing {
namespace {

#define REQUIRE_CUDA()                                                            \
  do {                                                                            \
    const CudaProbe probe = probe_cuda();                                         \
    if (!probe.usable) GTEST_SKIP() << "no usable CUDA device: " << probe.detail; \
  } while (0)

struct CudaCase {
  std::string model;
  std::string label;
  void (*apply)(TrainConfig&);
};

void PrintTo(const CudaCase& c, std::ostream* os) {
  *os << c.model << " " << c.label;
}

class TrainerCuda : public ::testing::TestWithParam<CudaCase> {};

// fp32: cuBLAS and OpenBLAS sum in different orders; 1e-4 of each tensor's largest grad
// (fp32 eps 1.2e-7 times a few hundred accumulated terms, with margin). 16-bit: 8·eps(dtype).
TEST_P(TrainerCuda, MatchesCpu) {
  REQUIRE_CUDA();
  const CudaCase c = GetParam();
  TrainConfig cfg = base_config(c.model, 4);
  // Adam's first steps are ≈ lr·sign(g): rounding-level grad differences on near-zero elements
  // become O(lr) parameter differences. Momentum SGD is linear in the grads and keeps state.
  cfg.optimizer = OptimizerKind::sgd_momentum;
  c.apply(cfg);
  auto cpu = cpu_device();
  auto cuda = make_cuda_device(DeviceOptions{});
  const RunResult a = run_steps(*cpu, cfg, 2);
  const RunResult b = run_steps(*cuda, cfg, 2);
  const DType dt = autocast_dtype(cfg.precision).value_or(compute_dtype(cfg.precision));
  const double tol = dt == DType::F32 ? 1e-4 : 8 * dtype_eps(dt);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t s = 0; s < a.losses.size(); ++s) {
    EXPECT_NEAR(b.losses[s], a.losses[s], tol * a.losses[s]) << c.label;
    EXPECT_EQ(b.skipped[s], a.skipped[s]) << c.label;
  }
  for (std::size_t p = 0; p < a.grads.size(); ++p) {
    EXPECT_LE(max_rel_err(b.grads[p], a.grads[p]), tol) << c.label << " " << a.names[p];
    // Compare the updates, not the parameters: relative to max|param| a missing update passes.
    std::vector<float> da(a.params_after[p].size()), db(da.size());
    for (std::size_t j = 0; j < da.size(); ++j) {
      da[j] = a.params_after[p][j] - a.params_before[p][j];
      db[j] = b.params_after[p][j] - b.params_before[p][j];
    }
    EXPECT_LE(max_rel_err(db, da), dt == DType::F32 ? tol : 2 * tol)
        << c.label << " update of " << a.names[p];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Knobs, TrainerCuda,
    ::testing::Values(
        CudaCase{"mlp-tiny", "plain", [](TrainConfig&) {}},
        CudaCase{"gpt-tiny", "plain", [](TrainConfig&) {}},
        CudaCase{"gpt-tiny", "accumulation", [](TrainConfig& c) { c.accumulation = 2; }},
        CudaCase{"gpt-tiny", "offload_optimizer",
                 [](TrainConfig& c) { c.offload = Offload::optimizer; }},
        CudaCase{"gpt-tiny", "offload_params", [](TrainConfig& c) { c.offload = Offload::params; }},
        CudaCase{"gpt-tiny", "offload_activations",
                 [](TrainConfig& c) { c.offload = Offload::activations; }},
        CudaCase{"gpt-tiny", "checkpoint", [](TrainConfig& c) { c.checkpoint.density = 1.0; }},
        CudaCase{"gpt-tiny", "pageable_zero",
                 [](TrainConfig& c) {
                   c.input = InputMemory::pageable;
                   c.zero_grad = ZeroGrad::zero;
                 }},
        CudaCase{"gpt-tiny", "fp16", [](TrainConfig& c) { c.precision = Precision::fp16; }},
        CudaCase{"gpt-tiny", "bf16", [](TrainConfig& c) { c.precision = Precision::bf16; }},
        CudaCase{"gpt-tiny", "bf16_torch_cpu",
                 [](TrainConfig& c) {
                   c.precision = Precision::bf16;
                   c.autocast_policy = autocast::Policy::torch_cpu;
                 }},
        CudaCase{"gpt-tiny", "bf16_o2", [](TrainConfig& c) { c.precision = Precision::bf16_o2; }},
        CudaCase{"gpt-tiny", "fp16_o2", [](TrainConfig& c) { c.precision = Precision::fp16_o2; }},
        CudaCase{"cnn-tiny", "bf16", [](TrainConfig& c) { c.precision = Precision::bf16; }},
        CudaCase{"gpt-tiny", "bf16_offload_optimizer",
                 [](TrainConfig& c) {
                   c.precision = Precision::bf16;
                   c.offload = Offload::optimizer;
                 }},
        CudaCase{"cnn-tiny", "plain", [](TrainConfig&) {}},
        // Llama: GQA, RoPE, SwiGLU, RMSNorm, the stacked q/k/v projection; tied and untied.
        CudaCase{"llama-tiny", "plain", [](TrainConfig&) {}},
        CudaCase{"llama-tiny:tie_word_embeddings=true", "tied", [](TrainConfig&) {}},
        CudaCase{"llama-mini", "plain", [](TrainConfig&) {}},
        CudaCase{"llama-tiny", "flash", [](TrainConfig& c) { c.attention = AttentionKind::flash; }},
        CudaCase{"llama-tiny", "selective",
                 [](TrainConfig& c) { c.checkpoint = *Checkpoint::parse("selective"); }},
        CudaCase{"llama-tiny", "checkpoint", [](TrainConfig& c) { c.checkpoint.density = 1.0; }},
        CudaCase{"llama-tiny", "offload_params",
                 [](TrainConfig& c) { c.offload = Offload::params; }},
        CudaCase{"llama-tiny", "pageable_zero_accumulation",
                 [](TrainConfig& c) {
                   c.input = InputMemory::pageable;
                   c.zero_grad = ZeroGrad::zero;
                   c.accumulation = 2;
                 }},
        CudaCase{"llama-tiny", "bf16", [](TrainConfig& c) { c.precision = Precision::bf16; }},
        CudaCase{"llama-tiny", "fp16", [](TrainConfig& c) { c.precision = Precision::fp16; }}),
    [](const auto& p) {
      std::string s = p.param.model + "_" + p.param.label;
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

// Same knobs, same allocations: the breakdown at the peak matches byte for byte, library
// workspace and op scratch (temporaries) aside.
TEST(TrainerCudaMemory, SameBreakdownAsCpu) {
  REQUIRE_CUDA();
  for (std::string name : {"gpt-tiny", "llama-tiny", "mlp-tiny"}) {
    TrainConfig cfg = base_config(name, 4);
    std::array<std::int64_t, kNumCategories> at_peak[2];
    for (int backend = 0; backend < 2; ++backend) {
      auto dev = backend == 0 ? cpu_device() : make_cuda_device(DeviceOptions{});
      auto model = make_model(name);
      Trainer trainer(*dev, *model, cfg);
      trainer.step();
      dev->memory().reset_peak();
      trainer.step();
      at_peak[backend] = dev->memory().stats().by_category_at_peak;
    }
    for (Category c : {Category::params, Category::master, Category::casts, Category::grads,
                       Category::optimizer, Category::activations, Category::io})
      EXPECT_EQ(at_peak[1][static_cast<std::size_t>(c)], at_peak[0][static_cast<std::size_t>(c)])
          << name << " " << category_name(c);
  }
}

}  // namespace
}  // namespace memtrade::testing
