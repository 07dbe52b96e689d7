// The CUDA device: cudaMalloc / cudaHostAlloc behind the caching allocator, a compute and a copy
// stream (both non-blocking), CUDA events, NVTX ranges, and device discovery / library versions
// (kernels/cuda_probe.h), which must work — and never throw — on a machine without a driver.
#include "kernels/cuda/cuda_device.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>
#include <fmt/format.h>
#include <nvtx3/nvToolsExt.h>

#include <memory>
#include <optional>
#include <stdexcept>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_raii.h"
#include "kernels/cuda_probe.h"

namespace memtrade {
namespace cuda {
namespace {

// The oldest architecture this build has code for (CMAKE_CUDA_ARCHITECTURES 80 90).
constexpr int kMinMajor = 8;

class CudaProvider final : public RawProvider {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it: running out is the allocator's business, not an error
      return nullptr;
    }
    CUDA_CHECK(e);
    return p;
  }
  void release(void* ptr, std::size_t) noexcept override { CUDA_CHECK_NOTHROW(cudaFree(ptr)); }
  std::string_view name() const override { return "cuda"; }
};

class CudaPinnedProvider final : public RawProvider {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    CUDA_CHECK(e);
    return p;
  }
  void release(void* ptr, std::size_t) noexcept override { CUDA_CHECK_NOTHROW(cudaFreeHost(ptr)); }
  std::string_view name() const override { return "cuda-pinned"; }
};

class CudaEvent final : public Event {
 public:
  CudaEvent(cudaStream_t compute, cudaStream_t copy)
      : compute_(compute), copy_(copy), event_(EventHandle::create()) {}
  void record(StreamKind stream) override {
    CUDA_CHECK(cudaEventRecord(event_.get(), stream == StreamKind::compute ? compute_ : copy_));
  }
  void synchronize() override { CUDA_CHECK(cudaEventSynchronize(event_.get())); }
  double seconds_since(const Event& start) const override {
    const auto* s = dynamic_cast<const CudaEvent*>(&start);
    if (!s) throw std::invalid_argument("CudaEvent::seconds_since: start is not a CUDA event");
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, s->event_.get(), event_.get()));
    return static_cast<double>(ms) / 1e3;
  }
  cudaEvent_t get() const { return event_.get(); }

 private:
  cudaStream_t compute_, copy_;  // not owned: the device's streams
  EventHandle event_;
};

cudaMemcpyKind memcpy_kind(CopyKind kind) {
  switch (kind) {
    case CopyKind::host_to_device:
      return cudaMemcpyHostToDevice;
    case CopyKind::device_to_host:
      return cudaMemcpyDeviceToHost;
    case CopyKind::device_to_device:
      return cudaMemcpyDeviceToDevice;
    case CopyKind::host_to_host:
      return cudaMemcpyHostToHost;
  }
  return cudaMemcpyDefault;
}

int select_device(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  return device;
}

cudaDeviceProp device_props(int device) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return p;
}

}  // namespace

// Members are declared in destruction-safe order: the ops (whose workspace lives in memory_)
// go first, then the allocators (cudaFree), then the streams.
class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const DeviceOptions& o)
      : device_(select_device(0)),
        props_(device_props(device_)),
        compute_(Stream::create()),
        copy_(Stream::create()),
        memory_(std::make_unique<CudaProvider>(), o.capacity),
        pinned_(std::make_unique<CudaPinnedProvider>()),
        ops_(std::make_unique<CudaOps>(memory_, compute_.get())) {}

  ~CudaDevice() override {
    // Queued work may still read memory that the allocators are about to release.
    CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());
  }

  Backend backend() const override { return Backend::cuda; }
  std::string name() const override { return props_.name; }
  std::size_t total_memory() const override {
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return props_.totalGlobalMem;
    }
    return total;
  }

  // What the driver sees in use on the whole device (this process's segments, the CUDA context,
  // library handles, and anything else running on it): a cross-check of the allocator.
  std::optional<std::int64_t> driver_used_bytes() const override {
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::nullopt;
    }
    return static_cast<std::int64_t>(total - free);
  }

  CachingAllocator& memory() override { return memory_; }
  CachingAllocator& pinned() override { return pinned_; }
  Ops& ops() override { return *ops_; }
  CudaOps& cuda_ops() { return *ops_; }

  void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
            StreamKind stream) override {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), this->stream(stream)));
    count_transfer(kind, bytes);
  }
  void copy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
               std::size_t width, std::size_t rows, CopyKind kind, StreamKind stream) override {
    if (width == 0 || rows == 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, memcpy_kind(kind),
                                 this->stream(stream)));
    count_transfer(kind, width * rows);
  }
  void synchronize() override {
    CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
    CUDA_CHECK(cudaStreamSynchronize(copy_.get()));
  }
  void synchronize(StreamKind stream) override {
    CUDA_CHECK(cudaStreamSynchronize(this->stream(stream)));
  }
  std::unique_ptr<Event> make_event() override {
    return std::make_unique<CudaEvent>(compute_.get(), copy_.get());
  }
  void wait(StreamKind waiter, Event& event) override {
    auto* e = dynamic_cast<CudaEvent*>(&event);
    if (!e) throw std::invalid_argument("CudaDevice::wait: not a CUDA event");
    CUDA_CHECK(cudaStreamWaitEvent(stream(waiter), e->get(), 0));
  }
  void range_push(const char* name) override { nvtxRangePushA(name); }
  void range_pop() override { nvtxRangePop(); }

  cudaStream_t stream(StreamKind kind) const {
    return kind == StreamKind::compute ? compute_.get() : copy_.get();
  }

 private:
  int device_;
  cudaDeviceProp props_;
  Stream compute_;
  Stream copy_;
  CachingAllocator memory_;
  CachingAllocator pinned_;
  std::unique_ptr<CudaOps> ops_;
};

namespace {
CudaDevice& as_cuda(Device& device, const char* what) {
  auto* d = dynamic_cast<CudaDevice*>(&device);
  if (!d)
    throw std::invalid_argument(fmt::format("{}: {} is not a CUDA device", what, device.name()));
  return *d;
}
}  // namespace

cudaStream_t raw_stream(Device& device, StreamKind kind) {
  return as_cuda(device, "raw_stream").stream(kind);
}

void set_tf32(Device& device, bool on) {
  as_cuda(device, "set_tf32").cuda_ops().set_tf32(on);
}

}  // namespace cuda

CudaProbe probe_cuda() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return {false, cudaGetErrorString(e)};
  }
  if (count == 0) return {false, "no CUDA-capable device is detected"};
  cudaDeviceProp p{};
  e = cudaGetDeviceProperties(&p, 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return {false, cudaGetErrorString(e)};
  }
  const double gib = static_cast<double>(p.totalGlobalMem) / static_cast<double>(GiB);
  if (p.major < cuda::kMinMajor)
    return {false, fmt::format("{} (sm_{}{}) is older than sm_80, the oldest this build targets",
                               p.name, p.major, p.minor)};
  return {true, fmt::format("{} (sm_{}{}, {:.1f} GiB)", p.name, p.major, p.minor, gib)};
}

std::unique_ptr<Device> make_cuda_device(const DeviceOptions& options) {
  return std::make_unique<cuda::CudaDevice>(options);
}

std::vector<std::pair<std::string, std::string>> cuda_library_versions() {
  std::vector<std::pair<std::string, std::string>> v;
  int rt = 0;
  v.emplace_back("CUDA runtime", cudaRuntimeGetVersion(&rt) == cudaSuccess
                                     ? fmt::format("{}.{}", rt / 1000, rt % 1000 / 10)
                                     : std::string("unknown"));
  int drv = 0;
  // 0 (with success) when no driver is installed.
  if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
  v.emplace_back("CUDA driver", drv == 0 ? std::string("none")
                                         : fmt::format("{}.{}", drv / 1000, drv % 1000 / 10));
  (void)cudaGetLastError();
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    v.emplace_back("cuBLAS", fmt::format("{}.{}.{}", major, minor, patch));
  } else {
    v.emplace_back("cuBLAS", "unknown");
  }
  const std::size_t lt = cublasLtGetVersion();
  v.emplace_back("cuBLASLt", fmt::format("{}.{}.{}", lt / 10000, lt / 100 % 100, lt % 100));
  const std::size_t dnn = cudnnGetVersion();
  v.emplace_back("cuDNN", fmt::format("{}.{}.{}", dnn / 10000, dnn / 100 % 100, dnn % 100));
  v.emplace_back("NVTX", "3");
  return v;
}

}  // namespace memtrade
