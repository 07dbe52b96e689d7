// Device: memory, copies, streams, events and ops of one backend (ggml's "backend" idea).
//
// Model and trainer code hold a Device& and never ask which kind it is. The CPU device is a
// real device in this sense: its memory comes from a CachingAllocator over host memory (so the
// memory figures and the emulated `capacity` work exactly as on a GPU), its streams are
// synchronous and its events are steady-clock timestamps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace memtrade {

enum class Backend : std::uint8_t { cpu, cuda };
std::string_view backend_name(Backend b);

enum class StreamKind : std::uint8_t { compute, copy };
enum class CopyKind : std::uint8_t {
  host_to_device,
  device_to_host,
  device_to_device,
  host_to_host
};

// A point in a stream's timeline (cudaEvent_t on CUDA, a timestamp on the CPU).
class Event {
 public:
  virtual ~Event() = default;
  virtual void record(StreamKind stream) = 0;
  virtual void synchronize() = 0;
  // Seconds from `start` to this event; both must have been recorded and completed.
  virtual double seconds_since(const Event& start) const = 0;
};

// Bytes moved between host and device, for the results' `transfer` figures.
struct TransferStats {
  std::int64_t h2d_bytes = 0;
  std::int64_t d2h_bytes = 0;
  std::int64_t d2d_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual Backend backend() const = 0;
  virtual std::string name() const = 0;          // "cpu (AMD EPYC ..., 2 threads)", "NVIDIA H200"
  virtual std::size_t total_memory() const = 0;  // physical bytes of the device

  virtual CachingAllocator& memory() = 0;  // device memory
  virtual CachingAllocator& pinned() = 0;  // page-locked host memory (offload, pinned inputs)
  virtual Ops& ops() = 0;                  // throws std::runtime_error if not built for it

  // Copies run in order on `stream`; on CUDA they are asynchronous with respect to the host
  // (host memory must be pinned for true asynchrony).
  virtual void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                    StreamKind stream = StreamKind::compute) = 0;
  // `rows` rows of `width` bytes, row r from src + r·spitch to dst + r·dpitch (cudaMemcpy2DAsync):
  // a column block of a row-major matrix, e.g. one half of Phi-3's fused gate_up output. The
  // default is one copy() per row.
  virtual void copy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                       std::size_t width, std::size_t rows, CopyKind kind,
                       StreamKind stream = StreamKind::compute);
  virtual void synchronize() = 0;  // every stream
  virtual void synchronize(StreamKind stream) = 0;
  virtual std::unique_ptr<Event> make_event() = 0;
  // Work submitted to `waiter` after this call waits for `event` (cudaStreamWaitEvent).
  virtual void wait(StreamKind waiter, Event& event) = 0;

  // Bytes in use on the device as the driver sees them (cudaMemGetInfo: total - free), a
  // cross-check of the allocator's figures; nullopt where there is no such notion (CPU).
  virtual std::optional<std::int64_t> driver_used_bytes() const { return std::nullopt; }

  // Named ranges for profilers (NVTX on CUDA; no-ops on the CPU).
  virtual void range_push(const char* /*name*/) {}
  virtual void range_pop() {}

  // False for the memory model's meta device (harness/estimate.cpp), whose device and pinned
  // memory are address space without bytes: code that would write or read them (parameter
  // init, input batches, host staging) skips that work there but makes every allocation it
  // would make, so the allocation sequence stays the real one.
  virtual bool holds_data() const { return true; }
  // The data-parallel rank a device without data plays (its collectives move nothing: Comm's
  // meta backend, kernels/comm.h), so that the memory model can run any rank of N.
  virtual int meta_rank() const { return 0; }
  // The time model's timeline of a device without data (kernels/op_cost.h), where it keeps one:
  // its collectives charge it too. nullptr elsewhere.
  virtual class StepClock* step_clock() { return nullptr; }
  // Ops for tensors in pinned() memory, the host side of the offload modes: CPU ops (their
  // scratch comes from the tensors' allocator, i.e. pinned memory); the meta device's take the
  // same scratch and do no arithmetic.
  virtual std::unique_ptr<Ops> make_host_ops() const;

  // ---- conveniences on top of the virtual interface -----------------------------------------
  Tensor empty(Shape shape, DType dtype, Category category) {
    return Tensor(memory(), std::move(shape), dtype, category);
  }
  Tensor empty_pinned(Shape shape, DType dtype, Category category) {
    return Tensor(pinned(), std::move(shape), dtype, category);
  }
  // Host data in, host data out (float conversion by dtype; synchronises).
  void upload(Tensor& dst, const void* host, std::size_t bytes,
              StreamKind stream = StreamKind::compute);
  void download(void* host, const Tensor& src, std::size_t bytes,
                StreamKind stream = StreamKind::compute);
  std::vector<float> to_host_f32(const Tensor& t);
  void from_host_f32(Tensor& t, const std::vector<float>& values);

  const TransferStats& transfers() const { return transfers_; }
  void reset_transfers() { transfers_ = {}; }

 protected:
  void count_transfer(CopyKind kind, std::size_t bytes);

 private:
  TransferStats transfers_;
};

// RAII profiler range: `ScopedRange r(dev, "forward");`. It is also a scope of the device
// allocator, so the trace's events name the layer and op they come from.
class ScopedRange {
 public:
  ScopedRange(Device& d, const char* name) : d_(d) {
    d_.range_push(name);
    d_.memory().push_scope(name);
  }
  ~ScopedRange() {
    d_.memory().pop_scope();
    d_.range_pop();
  }
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  Device& d_;
};

// What `memtrade devices` prints and `--backend auto` decides from.
struct BackendStatus {
  Backend backend;
  bool usable;
  std::string detail;  // device name when usable, the runtime's reason when not
};
std::vector<BackendStatus> probe_backends();

struct DeviceOptions {
  std::size_t capacity = 0;  // emulated device memory limit, 0 = the device's own
  int threads = 0;           // CPU threads, 0 = all cores
};
// Creates a device; "auto" picks CUDA when usable, else the CPU. Throws std::runtime_error
// with the reason when the requested backend cannot be used.
std::unique_ptr<Device> make_device(std::string_view backend, const DeviceOptions& options = {});

// Versions of memtrade and of every library linked: {("memtrade", "0.1.0 (abc1234)"), ...}.
std::vector<std::pair<std::string, std::string>> library_versions();
std::string git_commit();  // full hash of the tree this binary was built from, or "unknown"
bool git_dirty();          // uncommitted changes to tracked files at build time

}  // namespace memtrade
