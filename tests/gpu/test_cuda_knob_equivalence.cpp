// Knobs that trade memory for time give bit-identical numbers on CUDA too (the CPU suite,
// tests/models/test_trainer_equivalence.cpp, cannot see stream races: its streams are
// synchronous). Run once plainly and once on a device that stalls every copy-stream transfer
// and every compute-stream event record, so that a missing cross-stream wait reads stale or
// unwritten bytes instead of winning the race by luck. Skipped without a usable CUDA device.
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "kernels/cuda_probe.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/models/test_trainer_util.h"

#ifdef MEMTRADE_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_device.h"
#endif

namespace memtrade::testing {
namespace {

#ifdef MEMTRADE_HAVE_CUDA
void CUDART_CB sleep_2ms(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

// Delays `stream` of `d` by 2 ms at this point of its queue (a host function blocks it).
void stall(Device& d, StreamKind stream) {
  if (cudaLaunchHostFunc(cuda::raw_stream(d, stream), sleep_2ms, nullptr) != cudaSuccess)
    throw std::runtime_error("cudaLaunchHostFunc failed");
}

class StallingEvent final : public Event {
 public:
  StallingEvent(Device& inner, std::unique_ptr<Event> e) : inner_(inner), e_(std::move(e)) {}
  void record(StreamKind s) override {
    if (s == StreamKind::compute) stall(inner_, s);  // the producer finishes late
    e_->record(s);
  }
  void synchronize() override { e_->synchronize(); }
  double seconds_since(const Event& start) const override {
    return e_->seconds_since(*static_cast<const StallingEvent&>(start).e_);
  }
  Event& inner() { return *e_; }

 private:
  Device& inner_;
  std::unique_ptr<Event> e_;
};

// Forwards everything to a CUDA device, stalling the streams around cross-stream hand-offs.
class StallingDevice final : public Device {
 public:
  explicit StallingDevice(std::unique_ptr<Device> d) : d_(std::move(d)) {}
  Backend backend() const override { return d_->backend(); }
  std::string name() const override { return d_->name(); }
  std::size_t total_memory() const override { return d_->total_memory(); }
  CachingAllocator& memory() override { return d_->memory(); }
  CachingAllocator& pinned() override { return d_->pinned(); }
  Ops& ops() override { return d_->ops(); }
  void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
            StreamKind stream) override {
    if (stream == StreamKind::copy) stall(*d_, stream);  // the transfer lands late
    d_->copy(dst, src, bytes, kind, stream);
  }
  void synchronize() override { d_->synchronize(); }
  void synchronize(StreamKind s) override { d_->synchronize(s); }
  std::unique_ptr<Event> make_event() override {
    return std::make_unique<StallingEvent>(*d_, d_->make_event());
  }
  void wait(StreamKind waiter, Event& e) override {
    d_->wait(waiter, static_cast<StallingEvent&>(e).inner());
  }
  std::optional<std::int64_t> driver_used_bytes() const override { return d_->driver_used_bytes(); }

 private:
  std::unique_ptr<Device> d_;
};
#endif

struct Variant {
  std::string label;
  void (*apply)(TrainConfig&);
};

const std::vector<Variant> kVariants = {
    {"checkpoint=1", [](TrainConfig& c) { c.checkpoint = *Checkpoint::parse("1"); }},
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
    {"input=pageable", [](TrainConfig& c) { c.input = InputMemory::pageable; }},
    {"empty_cache=per_step", [](TrainConfig& c) { c.empty_cache = EmptyCache::per_step; }},
};

class CudaKnobEquivalence : public ::testing::TestWithParam<std::string> {};

// gpt-tiny and mlp-tiny only: the CNN's cuDNN algorithms are not filtered for determinism.
TEST_P(CudaKnobEquivalence, BitIdenticalToPlainEvenWithStalledStreams) {
  MEMTRADE_REQUIRE_CUDA();
#ifdef MEMTRADE_HAVE_CUDA
  const std::string model = GetParam();
  const TrainConfig base = base_config(model, 4);
  auto plain_dev = make_cuda_device(DeviceOptions{});
  const RunResult plain = run_steps(*plain_dev, base, 3);
  for (bool stalled : {false, true}) {
    for (const auto& v : kVariants) {
      SCOPED_TRACE(model + " " + v.label + (stalled ? " (stalled streams)" : ""));
      TrainConfig cfg = base;
      v.apply(cfg);
      std::unique_ptr<Device> dev = make_cuda_device(DeviceOptions{});
      if (stalled) dev = std::make_unique<StallingDevice>(std::move(dev));
      const RunResult r = run_steps(*dev, cfg, 3);
      EXPECT_EQ(r.losses, plain.losses);
      expect_identical(r.grads, plain.grads, plain.names, "grads");
      expect_identical(r.params_after, plain.params_after, plain.names, "params_after");
    }
  }
#endif
}

INSTANTIATE_TEST_SUITE_P(Models, CudaKnobEquivalence, ::testing::Values("gpt-tiny", "mlp-tiny"),
                         model_test_name);

}  // namespace
}  // namespace memtrade::testing
