#include "kernels/cpu/cpu_device.h"

#include <cstdlib>
#include "kernels/comm.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef MEMTRADE_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "kernels/cpu/cpu_ops.h"

namespace memtrade {
namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  }
  return "unknown CPU";
}

std::size_t physical_memory() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page)
                               : 0;
}

class CpuEvent final : public Event {
 public:
  void record(StreamKind) override { t_ = std::chrono::steady_clock::now(); }
  void synchronize() override {}
  double seconds_since(const Event& start) const override {
    const auto& s = dynamic_cast<const CpuEvent&>(start);
    return std::chrono::duration<double>(t_ - s.t_).count();
  }

 private:
  std::chrono::steady_clock::time_point t_{};
};

// Every core, except in one rank of several: its launcher's share (OMP_NUM_THREADS, which
// harness/common/launch.h sets to the cores over the ranks), so ranks do not fight for cores.
int default_threads() {
  if (launched_by_mpi() && std::getenv("OMP_NUM_THREADS") != nullptr) {
    const int n = std::atoi(std::getenv("OMP_NUM_THREADS"));
    if (n > 0) return n;
  }
  return static_cast<int>(std::thread::hardware_concurrency());
}

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const DeviceOptions& o)
      : threads_(o.threads > 0 ? o.threads : default_threads()),
        memory_(std::make_unique<HostProvider>(), o.capacity),
        pinned_(std::make_unique<HostProvider>()),
        ops_(make_cpu_ops()) {
    if (threads_ < 1) threads_ = 1;
#ifdef _OPENMP
    omp_set_num_threads(threads_);
#endif
#ifdef MEMTRADE_HAVE_OPENBLAS
    openblas_set_num_threads(threads_);
#endif
  }

  Backend backend() const override {
    return Backend::cpu;
  }
  std::string name() const override {
    return cpu_device_description(threads_);
  }
  std::size_t total_memory() const override {
    return physical_memory();
  }
  CachingAllocator& memory() override {
    return memory_;
  }
  CachingAllocator& pinned() override {
    return pinned_;
  }
  Ops& ops() override {
    return *ops_;
  }

  void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind, StreamKind) override {
    if (bytes == 0) return;
    std::memcpy(dst, src, bytes);
    count_transfer(kind, bytes);
  }
  void synchronize() override {}
  void synchronize(StreamKind) override {}
  std::unique_ptr<Event> make_event() override {
    return std::make_unique<CpuEvent>();
  }
  void wait(StreamKind, Event&) override {}

 private:
  int threads_;
  CachingAllocator memory_;
  CachingAllocator pinned_;
  std::unique_ptr<Ops> ops_;
};

}  // namespace

int cpu_thread_count() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

std::string cpu_device_description(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  return fmt::format("cpu ({}, {} threads, {:.1f} GiB)", cpu_model_name(), threads,
                     static_cast<double>(physical_memory()) / static_cast<double>(GiB));
}

std::unique_ptr<Device> make_cpu_device(const DeviceOptions& options) {
  return std::make_unique<CpuDevice>(options);
}

}  // namespace memtrade
