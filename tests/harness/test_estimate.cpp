// The memory model for a CUDA target: the backend-neutral allocations of the CPU model plus the
// CUDA ops' persistent cuBLASLt workspace, and none of the CPU's workspace (fp32 copies of
// 16-bit GEMM operands, im2col). Runs anywhere: the model's device is address space only.
#include <gtest/gtest.h>

#include "harness/run/estimate.h"
#include "kernels/cuda_workspace.h"
#include "models/config.h"

namespace memtrade {
namespace {

TrainConfig config(const char* model, Precision p) {
  TrainConfig cfg;
  cfg.model = model;
  cfg.batch_size = 4;
  cfg.precision = p;
  return cfg;
}

constexpr auto kWs = static_cast<std::size_t>(Category::workspace);

TEST(EstimateCuda, Fp32GptIsTheCpuModelPlusTheLtWorkspace) {
  // gpt-tiny in fp32 has no CPU workspace at all (no 16-bit operand, no convolution), so the
  // CUDA figure is the CPU one shifted by the persistent block, category by category.
  const TrainConfig cfg = config("gpt-tiny", Precision::fp32);
  const MemoryEstimate cpu = estimate_memory(cfg, Backend::cpu, 0);
  const MemoryEstimate cuda = estimate_memory(cfg, Backend::cuda, 0);
  ASSERT_TRUE(cpu.fits);
  ASSERT_TRUE(cuda.fits);
  EXPECT_EQ(cpu.breakdown_at_peak[kWs], 0);
  const auto ws = static_cast<std::int64_t>(kCudaLtWorkspaceBytes + kCudaSmallScratchBytes);
  EXPECT_EQ(cuda.breakdown_at_peak[kWs], ws);
  EXPECT_EQ(cuda.peak_allocated, cpu.peak_allocated + ws);
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    if (c == kWs) continue;
    EXPECT_EQ(cuda.breakdown_at_peak[c], cpu.breakdown_at_peak[c])
        << category_name(static_cast<Category>(c));
  }
}

TEST(EstimateCuda, SixteenBitAndConvNeedNoCpuWorkspace) {
  const auto ws = static_cast<std::int64_t>(kCudaLtWorkspaceBytes + kCudaSmallScratchBytes);
  for (const char* model : {"gpt-tiny", "mlp-tiny", "cnn-tiny"}) {
    const TrainConfig cfg = config(model, Precision::bf16);
    const MemoryEstimate cpu = estimate_memory(cfg, Backend::cpu, 0);
    const MemoryEstimate cuda = estimate_memory(cfg, Backend::cuda, 0);
    EXPECT_GT(cpu.breakdown_at_peak[kWs], 0) << model << ": the CPU copies 16-bit operands";
    EXPECT_EQ(cuda.breakdown_at_peak[kWs], ws) << model;
  }
}

}  // namespace
}  // namespace memtrade
