// The CUDA device itself: discovery and versions (which must work without a GPU), memory,
// copies, streams, events, NVTX ranges, capacity emulation.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <numeric>

#include "kernels/cuda_probe.h"
#include "kernels/device.h"
#include "tests/gpu/gpu_test_util.h"

#ifdef MEMTRADE_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace memtrade {
namespace {

using gputest::CudaVsCpu;

// Runs everywhere: without a driver or device the probe says why, and never throws.
TEST(CudaProbe, ReportsAReasonWithoutThrowing) {
  CudaProbe p;
  EXPECT_NO_THROW(p = probe_cuda());
  EXPECT_FALSE(p.detail.empty());
  if (p.usable) {
    EXPECT_NE(p.detail.find("sm_"), std::string::npos) << p.detail;
    EXPECT_NE(p.detail.find("GiB"), std::string::npos) << p.detail;
  }
  // probe_backends() lists the CUDA entry with the same verdict.
  bool seen = false;
  for (const auto& b : probe_backends()) {
    if (b.backend != Backend::cuda) continue;
    seen = true;
    EXPECT_EQ(b.usable, p.usable);
    EXPECT_EQ(b.detail, p.detail);
  }
  EXPECT_TRUE(seen);
}

TEST(CudaProbe, AutoFallsBackToCpuWhenUnusable) {
  if (probe_cuda().usable) GTEST_SKIP() << "a CUDA device is usable here";
  auto d = make_device("auto");
  EXPECT_EQ(d->backend(), Backend::cpu);
  EXPECT_THROW(make_device("cuda"), std::runtime_error);
}

// Library versions come from the libraries, not a device: they work on any machine.
TEST(CudaLibraryVersions, ListedWithoutADevice) {
  std::map<std::string, std::string> v;
  for (auto& [k, val] : cuda_library_versions()) v[k] = val;
#ifdef MEMTRADE_HAVE_CUDA
  for (const char* key : {"CUDA runtime", "CUDA driver", "cuBLAS", "cuBLASLt", "cuDNN", "NVTX"}) {
    ASSERT_TRUE(v.count(key)) << key;
    EXPECT_FALSE(v[key].empty()) << key;
  }
  EXPECT_NE(v["CUDA runtime"], "unknown");
  EXPECT_NE(v["cuBLAS"], "unknown");
  EXPECT_EQ(v["cuDNN"].substr(0, 2), "9.");
  EXPECT_EQ(v["NVTX"], "3");
  if (!probe_cuda().usable && v["CUDA driver"] != "none")
    SUCCEED() << "driver present without a usable device: " << v["CUDA driver"];
  // They are part of library_versions() too.
  bool found = false;
  for (auto& [k, val] : library_versions()) found = found || k == "cuDNN";
  EXPECT_TRUE(found);
#else
  EXPECT_TRUE(v.empty());
#endif
}

#ifdef MEMTRADE_HAVE_CUDA
TEST(CudaExtras, RejectOtherBackends) {
  auto cpu = make_device("cpu");
  EXPECT_THROW(cuda::set_tf32(*cpu, true), std::invalid_argument);
  EXPECT_THROW(cuda::raw_stream(*cpu, StreamKind::compute), std::invalid_argument);
}
#endif

class CudaDeviceTest : public CudaVsCpu {};

TEST_F(CudaDeviceTest, Identity) {
  EXPECT_EQ(gpu_->backend(), Backend::cuda);
  EXPECT_FALSE(gpu_->name().empty());
  EXPECT_GT(gpu_->total_memory(), 1 * GiB);
  EXPECT_EQ(gpu_->memory().provider_name(), "cuda");
  EXPECT_EQ(gpu_->pinned().provider_name(), "cuda-pinned");
  EXPECT_EQ(gpu_->ops().name(), "cuda");
  EXPECT_NE(probe_cuda().detail.find(gpu_->name()), std::string::npos);
  // The driver's view includes at least what the allocator reserved.
  Tensor x = gpu_->empty({64 * static_cast<std::int64_t>(MiB)}, DType::F32, Category::activations);
  const auto used = gpu_->driver_used_bytes();
  ASSERT_TRUE(used.has_value());
  EXPECT_GE(*used, gpu_->memory().stats().reserved.current);
  EXPECT_FALSE(cpu_->driver_used_bytes().has_value());
#ifdef MEMTRADE_HAVE_CUDA
  EXPECT_NE(cuda::raw_stream(*gpu_, StreamKind::compute), nullptr);
  EXPECT_NE(cuda::raw_stream(*gpu_, StreamKind::copy), nullptr);
  EXPECT_NE(cuda::raw_stream(*gpu_, StreamKind::compute),
            cuda::raw_stream(*gpu_, StreamKind::copy));
#endif
}

TEST_F(CudaDeviceTest, UploadDownloadRoundTripCountsTransfers) {
  gpu_->reset_transfers();
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I32}) {
    Tensor x = gpu_->empty({3, 257}, t, Category::io);
    std::vector<float> v = gputest::random_ints(x.numel(), 7, -100, 100);
    gpu_->from_host_f32(x, v);
    EXPECT_EQ(gpu_->to_host_f32(x), v) << dtype_name(t);
  }
  const std::int64_t bytes = 3 * 257 * (4 + 2 + 2 + 4);
  EXPECT_EQ(gpu_->transfers().h2d_bytes, bytes);
  EXPECT_EQ(gpu_->transfers().d2h_bytes, bytes);
  EXPECT_EQ(gpu_->transfers().d2d_bytes, 0);
}

TEST_F(CudaDeviceTest, DeviceToDeviceAndPinnedCopies) {
  Tensor host = gpu_->empty_pinned({1000}, DType::F32, Category::io);
  for (int i = 0; i < 1000; ++i) host.as<float>()[i] = static_cast<float>(i);
  Tensor a = gpu_->empty({1000}, DType::F32, Category::io);
  Tensor b = gpu_->empty({1000}, DType::F32, Category::io);
  gpu_->reset_transfers();
  gpu_->copy(a.data(), host.data(), a.nbytes(), CopyKind::host_to_device, StreamKind::copy);
  auto ev = gpu_->make_event();
  ev->record(StreamKind::copy);
  gpu_->wait(StreamKind::compute, *ev);  // compute-stream work below sees the copy
  gpu_->copy(b.data(), a.data(), a.nbytes(), CopyKind::device_to_device, StreamKind::compute);
  gpu_->ops().scale(b, 2.0f);
  std::vector<float> out = gpu_->to_host_f32(b);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(out[i], 2.0f * i) << i;
  EXPECT_EQ(gpu_->transfers().h2d_bytes, 4000);
  EXPECT_EQ(gpu_->transfers().d2d_bytes, 4000);
  EXPECT_GT(gpu_->pinned().stats().reserved.current, 0);
}

TEST_F(CudaDeviceTest, EventsMeasureElapsedTime) {
  Tensor x = gpu_->empty({1 << 22}, DType::F32, Category::activations);
  auto start = gpu_->make_event();
  auto stop = gpu_->make_event();
  start->record(StreamKind::compute);
  for (int i = 0; i < 10; ++i) gpu_->ops().fill(x, 1.0f);
  stop->record(StreamKind::compute);
  stop->synchronize();
  const double s = stop->seconds_since(*start);
  EXPECT_GE(s, 0.0);
  EXPECT_LT(s, 10.0);
  // A CPU event is not a CUDA event.
  auto cpu_event = cpu_->make_event();
  cpu_event->record(StreamKind::compute);
  EXPECT_THROW(stop->seconds_since(*cpu_event), std::invalid_argument);
}

TEST_F(CudaDeviceTest, RangesNest) {
  {
    ScopedRange outer(*gpu_, "outer");
    ScopedRange inner(*gpu_, "inner");
    Tensor x = gpu_->empty({16}, DType::F32, Category::activations);
    gpu_->ops().fill(x, 0.0f);
  }
  gpu_->synchronize();
  SUCCEED();
}

TEST_F(CudaDeviceTest, CapacityIsEnforced) {
  DeviceOptions o;
  o.capacity = 64 * MiB;
  auto small = make_device("cuda", o);
  EXPECT_EQ(small->memory().capacity(), 64 * MiB);
  Tensor ok = small->empty({8 * static_cast<std::int64_t>(MiB)}, DType::F32, Category::activations);
  EXPECT_THROW(
      small->empty({32 * static_cast<std::int64_t>(MiB)}, DType::F32, Category::activations),
      OutOfMemory);
  EXPECT_EQ(small->memory().stats().num_ooms, 1);
}

TEST_F(CudaDeviceTest, AllocatorStatsTrackDeviceMemory) {
  auto& mem = gpu_->memory();
  const auto before = mem.stats().allocated.current;
  {
    Tensor x = gpu_->empty({1000}, DType::F32, Category::params);
    EXPECT_EQ(mem.stats().allocated.current - before, 4096);  // rounded to 512 B multiples
    EXPECT_TRUE(mem.owns(x.data()));
  }
  EXPECT_EQ(mem.stats().allocated.current, before);
  mem.empty_cache();
}

}  // namespace
}  // namespace memtrade
