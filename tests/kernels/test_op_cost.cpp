// The time model's parts (kernels/op_cost.h, kernels/gpu_specs.h): the GPU table, the GEMM
// efficiency's shape terms, the collectives' ring/tree formulas and the streams' timeline,
// each against the arithmetic it states.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/gpu_specs.h"
#include "kernels/op_cost.h"

namespace memtrade {
namespace {

const GpuSpec& gpu(const char* name) {
  const GpuSpec* g = find_gpu(name);
  if (!g) throw std::runtime_error(name);
  return *g;
}

TEST(GpuTable, EveryRowIsCompleteAndSourced) {
  EXPECT_EQ(gpu_specs().size(), 9u);
  for (const GpuSpec& g : gpu_specs()) {
    SCOPED_TRACE(std::string(g.name));
    EXPECT_GT(g.sms, 0);
    EXPECT_GT(g.fp32_flops, 0);
    EXPECT_GE(g.tf32_flops, g.fp32_flops);
    EXPECT_GT(g.bf16_flops, g.tf32_flops);
    EXPECT_GT(g.memory_gib, 0);
    EXPECT_GT(g.memory_bw, 0);
    EXPECT_GT(g.host_bw, 0);
    EXPECT_GE(g.nvlink_domain, 1);
    EXPECT_EQ(g.nvlink_bw > 0, g.nvlink_domain > 1);
    EXPECT_FALSE(g.source.empty());
    EXPECT_EQ(find_gpu(g.name), &g);
  }
  EXPECT_EQ(find_gpu("H100"), &gpu("h100"));  // case-insensitive
  EXPECT_EQ(find_gpu("h100-sxm"), &gpu("h100"));
  EXPECT_EQ(find_gpu("v100"), nullptr);
  // The datasheets' dense figures (sparse ones halved): A100 312, H100 SXM 989.5 TFLOP/s.
  EXPECT_DOUBLE_EQ(gpu("a100-80g").peak_flops(DType::BF16, false), 312e12);
  EXPECT_DOUBLE_EQ(gpu("h100").peak_flops(DType::F16, false), 989.5e12);
  EXPECT_DOUBLE_EQ(gpu("h100").peak_flops(DType::F32, true), 494.5e12);
  EXPECT_DOUBLE_EQ(gpu("h100").peak_flops(DType::F32, false), 67e12);
}

TEST(GemmEfficiency, LargeGemmsReachThePeakFractionSkinnyOnesDoNot) {
  const GpuSpec& a100 = gpu("a100-80g");
  const double peak = gemm_peak_efficiency(a100.arch);
  // 108 SMs: 8192 x 8192 is 64·64 = 4096 tiles in 38 waves, the last 100 of 108 busy.
  const double waves = std::ceil(4096.0 / 108);
  EXPECT_NEAR(gemm_efficiency(a100, 1, 8192, 8192, 8192),
              peak * 4096 / (waves * 108) * 8192 / (8192 + kGemmK0), 1e-12);
  // A 64-row GEMM fills half of each 128-row tile; 16 tiles leave most SMs idle.
  const double skinny = gemm_efficiency(a100, 1, 64, 2048, 2048);
  EXPECT_NEAR(skinny, peak * 0.5 * (16.0 / 108) * 2048 / (2048 + kGemmK0), 1e-12);
  EXPECT_LT(skinny, 0.1);
  // A short k pays the tile's fixed cost: k = 64 runs at half the rate of an endless k.
  EXPECT_NEAR(
      gemm_efficiency(a100, 1, 8192, 8192, 64) / gemm_efficiency(a100, 1, 8192, 8192, 1 << 30), 0.5,
      1e-6);
  // Batched: the batch multiplies the tiles.
  EXPECT_NEAR(gemm_efficiency(a100, 108, 128, 128, 4096), peak * 4096 / (4096 + kGemmK0), 1e-12);
}

TEST(Collectives, RingAndTreeFollowTheirFormulas) {
  const GpuSpec& h100 = gpu("h100");
  const Fabric fabric;
  const double bytes = 1e9, link = h100.nvlink_bw * kNvlinkEfficiency;
  // Large: the ring, 2(n-1)/n of the bytes over the link, 2(n-1) hops.
  EXPECT_NEAR(collective_seconds(h100, fabric, CollectiveKind::all_reduce, bytes, 8),
              2 * 7.0 / 8 * bytes / link + 14 * kNvlinkHopLatency, 1e-12);
  EXPECT_NEAR(collective_seconds(h100, fabric, CollectiveKind::reduce_scatter, bytes, 8),
              7.0 / 8 * bytes / link + 7 * kNvlinkHopLatency, 1e-12);
  // Small: the tree's log2(n) hops beat the ring's n - 1.
  EXPECT_NEAR(collective_seconds(h100, fabric, CollectiveKind::all_reduce, 8, 8),
              2 * 8 / link + 2 * 3 * kNvlinkHopLatency, 1e-15);
  // Beyond one NVLink domain the ring runs at InfiniBand's rate.
  EXPECT_NEAR(collective_seconds(h100, fabric, CollectiveKind::all_gather, bytes, 16),
              15.0 / 16 * bytes / (fabric.ib_bw * kIbEfficiency) + 15 * kIbHopLatency, 1e-12);
  EXPECT_EQ(collective_seconds(h100, fabric, CollectiveKind::all_reduce, bytes, 1), 0.0);
  // No NVLink (L4): PCIe-bound even on one node.
  const GpuSpec& l4 = gpu("l4");
  EXPECT_NEAR(collective_seconds(l4, fabric, CollectiveKind::all_gather, bytes, 2),
              0.5 * bytes / std::min(fabric.ib_bw * kIbEfficiency, l4.host_bw) + kIbHopLatency,
              1e-12);
}

TEST(StepClock, OpsAddUpOnTheComputeStream) {
  const GpuSpec& a100 = gpu("a100-80g");
  StepClock c(a100, {}, 1);
  c.memory_op(1e9);
  const double mem = 1e9 / (a100.memory_bw * kMemoryEfficiency);
  EXPECT_NEAR(c.elapsed(), mem + kKernelGap, 1e-12);
  // A big GEMM is compute-bound: 2·m·n·k over peak · efficiency.
  c.gemm(1, 8192, 8192, 8192, DType::BF16, false, 3 * 8192.0 * 8192 * 2);
  const double gemm =
      2.0 * 8192 * 8192 * 8192 / (312e12 * gemm_efficiency(a100, 1, 8192, 8192, 8192));
  EXPECT_NEAR(c.elapsed(), mem + gemm + 2 * kKernelGap, 1e-12);
  const auto s = c.shares();
  EXPECT_NEAR(s[static_cast<std::size_t>(TimeShare::memory)], mem, 1e-12);
  EXPECT_NEAR(s[static_cast<std::size_t>(TimeShare::compute)], gemm, 1e-12);
  EXPECT_NEAR(s[static_cast<std::size_t>(TimeShare::launch)], 2 * kKernelGap, 1e-12);
  EXPECT_EQ(c.kernels(), 2);
}

TEST(StepClock, ACopyStreamOverlapsComputeUntilWaitedFor) {
  const GpuSpec& h100 = gpu("h100");
  StepClock c(h100, {}, 1);
  const double copy = kCopyLatency + 1e9 / h100.host_bw;  // 20 ms at 50 GB/s
  c.copy(CopyKind::host_to_device, 1e9, StreamKind::copy);
  const double copied = c.now(StreamKind::copy);
  c.memory_op(1e9);  // 0.35 ms meanwhile on the compute stream
  const double busy = c.now(StreamKind::compute);
  EXPECT_LT(busy, copied);
  c.wait(StreamKind::compute, copied, TimeShare::copy);
  EXPECT_NEAR(c.elapsed(), copy, 1e-12);
  const auto s = c.shares();
  EXPECT_NEAR(s[static_cast<std::size_t>(TimeShare::copy)], copy - busy, 1e-12);
  double sum = 0;
  for (double v : s) sum += v;
  EXPECT_NEAR(sum, c.elapsed(), 1e-12);
  // The same copy on the compute stream is in line: the two add.
  StepClock d(h100, {}, 1);
  d.copy(CopyKind::host_to_device, 1e9, StreamKind::compute);
  d.memory_op(1e9);
  EXPECT_NEAR(d.elapsed(), copy + busy, 1e-12);
}

TEST(StepClock, StartedCollectivesOverlapUntilWaitedFor) {
  const GpuSpec& a100 = gpu("a100-80g");
  StepClock c(a100, {}, 8);
  const double ar = collective_seconds(a100, {}, CollectiveKind::all_reduce, 1e8, 8);
  c.start_collective(CollectiveKind::all_reduce, 1e8, 8);  // DDP's bucket, during backward
  c.memory_op(10e9);                                       // the rest of backward: longer
  const double compute = c.now(StreamKind::compute);
  ASSERT_GT(compute, ar);
  c.wait_collectives();
  EXPECT_NEAR(c.elapsed(), compute, 1e-12);  // hidden
  c.reset();
  c.collective(CollectiveKind::all_reduce, 1e8, 8);  // in line: adds
  EXPECT_NEAR(c.elapsed(), ar, 1e-12);
  EXPECT_NEAR(c.shares()[static_cast<std::size_t>(TimeShare::comm)], ar, 1e-12);
}

TEST(StepClock, TheHostsWorkWaitsForItsInputsAndHoldsTheNextKernel) {
  const GpuSpec& h100 = gpu("h100");
  StepClock c(h100, {}, 1);
  c.memory_op(1e9);
  c.synchronize(StreamKind::compute);  // the host reads what the device wrote
  c.host_op(kHostUpdateBandwidth);     // one second of host work
  c.memory_op(1e9);                    // issued after it
  const double mem = 1e9 / (h100.memory_bw * kMemoryEfficiency) + kKernelGap;
  EXPECT_NEAR(c.elapsed(), 2 * mem + 1.0, 1e-9);
  EXPECT_NEAR(c.shares()[static_cast<std::size_t>(TimeShare::host)], 1.0, 1e-9);
}

}  // namespace
}  // namespace memtrade
