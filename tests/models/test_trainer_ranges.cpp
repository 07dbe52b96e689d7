// The profiler ranges (NVTX on CUDA) a step opens, recorded through a forwarding device: a
// timeline must read like the model — io, forward with stem / block i / head, backward with
// recompute and the offload copies, optimizer — and every push must be popped.
#include <algorithm>
#include <string>
#include <vector>

#include "tests/models/forwarding_device.h"
#include "tests/models/test_trainer_util.h"

namespace memtrade::testing {
namespace {

// Records range pushes ("+name") and pops ("-") of the device it wraps.
class RangeRecorder final : public ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  void range_push(const char* name) override {
    log.push_back(std::string("+") + name);
    open.push_back(name);
  }
  void range_pop() override {
    ASSERT_FALSE(open.empty()) << "range_pop without a push";
    log.push_back("-");
    open.pop_back();
  }

  std::vector<std::string> log;   // every push and pop in order
  std::vector<std::string> open;  // the stack now
};

// Names of the ranges pushed while `outer` was open (anywhere below it).
std::vector<std::string> inside(const std::vector<std::string>& log, const std::string& outer) {
  std::vector<std::string> out, stack;
  for (const std::string& e : log) {
    if (e == "-") {
      stack.pop_back();
      continue;
    }
    if (std::find(stack.begin(), stack.end(), outer) != stack.end()) out.push_back(e.substr(1));
    stack.push_back(e.substr(1));
  }
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(TrainerRanges, StepReadsLikeTheModel) {
  TrainConfig cfg = base_config("gpt-tiny", 2);
  cfg.checkpoint = *Checkpoint::parse("0.5");  // block 1 of 2 recomputed
  cfg.offload = Offload::activations;
  RangeRecorder dev(cpu_device());
  auto model = make_model(cfg.model);
  Trainer trainer(dev, *model, cfg);
  trainer.step();
  EXPECT_TRUE(dev.open.empty()) << "unbalanced: " << dev.open.size() << " ranges left open";
  const auto fwd = inside(dev.log, "forward");
  for (const char* r : {"stem", "block 0", "block 1", "head", "offload"})
    EXPECT_TRUE(has(fwd, r)) << "forward lacks " << r;
  const auto bwd = inside(dev.log, "backward");
  for (const char* r : {"head", "recompute", "block 1", "block 0", "stem", "prefetch"})
    EXPECT_TRUE(has(bwd, r)) << "backward lacks " << r;
  EXPECT_FALSE(has(fwd, "recompute"));
  EXPECT_TRUE(has(inside(dev.log, "optimizer"), "optimizer_step"));
  EXPECT_TRUE(has(inside(dev.log, "recompute"), "block 1"));
  EXPECT_FALSE(has(inside(dev.log, "recompute"), "block 0"));
}

TEST(TrainerRanges, ParamsOffloadUploadsInsideBlocks) {
  TrainConfig cfg = base_config("gpt-tiny", 2);
  cfg.offload = Offload::params;
  RangeRecorder dev(cpu_device());
  auto model = make_model(cfg.model);
  Trainer trainer(dev, *model, cfg);
  trainer.step();
  EXPECT_TRUE(dev.open.empty());
  EXPECT_TRUE(has(inside(dev.log, "block 0"), "param_upload"));
}

}  // namespace
}  // namespace memtrade::testing
