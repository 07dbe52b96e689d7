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
#include "tests/models/forwarding_device.h"
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

// A CUDA device whose streams stall around every cross-stream hand-off.
class StallingDevice final : public ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
            StreamKind stream) override {
    if (stream == StreamKind::copy) stall(inner(), stream);  // the transfer lands late
    ForwardingDevice::copy(dst, src, bytes, kind, stream);
  }
  std::unique_ptr<Event> make_event() override {
    return std::make_unique<StallingEvent>(inner(), ForwardingDevice::make_event());
  }
  void wait(StreamKind waiter, Event& e) override {
    ForwardingDevice::wait(waiter, static_cast<StallingEvent&>(e).inner());
  }
};
#endif

class CudaKnobEquivalence : public ::testing::TestWithParam<std::string> {};

#ifdef MEMTRADE_HAVE_CUDA
// Every knob of the CPU suite (tests/models/test_trainer_util.h: knob_variants) at `precision`,
// on a plain CUDA device and on one that stalls its streams.
void expect_cuda_knobs_bit_identical(const std::string& model, Precision precision) {
  for (bool stalled : {false, true}) {
    SCOPED_TRACE(stalled ? "stalled streams" : "plain streams");
    expect_knobs_bit_identical(
        model,
        [stalled](const TrainConfig& cfg, int steps) {
          std::unique_ptr<Device> dev = make_cuda_device(DeviceOptions{});
          if (stalled) dev = std::make_unique<StallingDevice>(std::move(dev));
          return run_steps(*dev, cfg, steps);
        },
        3, precision);
  }
}
#endif

// gpt-tiny, llama-tiny and mlp-tiny only: the CNN's cuDNN algorithms are not filtered for
// determinism.
TEST_P(CudaKnobEquivalence, BitIdenticalToPlainEvenWithStalledStreams) {
  MEMTRADE_REQUIRE_CUDA();
#ifdef MEMTRADE_HAVE_CUDA
  expect_cuda_knobs_bit_identical(GetParam(), Precision::fp32);
#endif
}

// The same under bf16 autocast (CUDA's own policy): weight casts remade by recompute and by
// streamed weights, 16-bit weight gradients added into kept fp32 grads.
TEST_P(CudaKnobEquivalence, Bf16AutocastBitIdenticalToPlainEvenWithStalledStreams) {
  MEMTRADE_REQUIRE_CUDA();
#ifdef MEMTRADE_HAVE_CUDA
  expect_cuda_knobs_bit_identical(GetParam(), Precision::bf16);
#endif
}

INSTANTIATE_TEST_SUITE_P(Models, CudaKnobEquivalence,
                         ::testing::Values("gpt-tiny", "llama-tiny", "mlp-tiny"), model_test_name);

}  // namespace
}  // namespace memtrade::testing
