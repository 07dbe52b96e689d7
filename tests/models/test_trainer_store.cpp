// TrainerParamStore on its own: initialisation, where copies live, gradient write semantics
// and the block streaming protocol of offload=params.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/comm.h"
#include "models/train/param_store.h"
#include "tests/models/test_trainer_util.h"

namespace memtrade::testing {
namespace {

std::vector<ParamSpec> specs() {
  return {
      {"emb", {64, 32}, 0.02f, -1, true},        // normal(0, 0.02)
      {"b0.w", {32, 32}, 0.5f, 0, true},         // normal(0, 0.5)
      {"b0.g", {32}, -1.0f, 0, true},            // ones
      {"b1.w", {32, 32}, 0.5f, 1, true},         //
      {"b1.bias", {32}, 0.0f, 1, true},          // zeros
      {"bn.running_var", {8}, -1.0f, 1, false},  // a buffer
  };
}

TEST(ParamStore, InitialisesPerSpecDeterministically) {
  auto dev = cpu_device();
  const auto s = specs();
  TrainerParamStore a(*dev, s, ParamPlacement{}, 7), b(*dev, s, ParamPlacement{}, 7),
      c(*dev, s, ParamPlacement{}, 8);
  for (int i : {0, 1}) {
    const auto v = a.param_f32(i);
    double mean = 0, sq = 0;
    for (float x : v) mean += x;
    mean /= static_cast<double>(v.size());
    for (float x : v) sq += (x - mean) * (x - mean);
    const double sd = std::sqrt(sq / static_cast<double>(v.size()));
    const double want = s[static_cast<std::size_t>(i)].init_std;
    EXPECT_NEAR(sd, want, 0.06 * want) << s[static_cast<std::size_t>(i)].name;  // n >= 1024
    EXPECT_NEAR(mean, 0.0, 4 * want / std::sqrt(static_cast<double>(v.size())));
    EXPECT_EQ(v, b.param_f32(i));  // same seed, same values
    EXPECT_NE(v, c.param_f32(i));  // another seed, other values
  }
  EXPECT_NE(a.param_f32(1), a.param_f32(3));  // parameters do not share a stream
  for (float x : a.param_f32(2)) EXPECT_EQ(x, 1.0f);
  for (float x : a.param_f32(4)) EXPECT_EQ(x, 0.0f);
  for (float x : a.param_f32(5)) EXPECT_EQ(x, 1.0f);
}

TEST(ParamStore, GradWritesAssignThenAccumulate) {
  auto dev = cpu_device();
  const auto s = specs();
  TrainerParamStore st(*dev, s, ParamPlacement{}, 1);
  st.begin_step(ZeroGrad::set_to_none, dev->ops());
  EXPECT_FALSE(st.has_grad(0));
  GradRef g1 = st.grad(0);
  EXPECT_FALSE(g1.accumulate);  // a None grad is assigned
  EXPECT_EQ(g1.t.category(), Category::grads);
  EXPECT_TRUE(st.grad(0).accumulate);          // a tied weight or the next micro-batch adds
  EXPECT_THROW(st.grad(5), std::logic_error);  // buffers have no grad
  st.release_grads();
  EXPECT_FALSE(st.has_grad(0));

  // zero: the grad stays, is zeroed, and every write accumulates.
  st.begin_step(ZeroGrad::zero, dev->ops());
  GradRef g2 = st.grad(1);
  EXPECT_FALSE(g2.accumulate);  // first ever backward still assigns (nothing to zero yet)
  dev->ops().fill(g2.t, 3.0f);
  st.begin_step(ZeroGrad::zero, dev->ops());
  EXPECT_TRUE(st.grad(1).accumulate);
  for (float x : st.read_f32(st.device_grad(1))) EXPECT_EQ(x, 0.0f);
}

TEST(ParamStore, PlacementByPrecisionAndOffload) {
  auto dev = cpu_device();
  const auto s = specs();
  ParamPlacement mixed{DType::BF16, true, Offload::none};
  TrainerParamStore m(*dev, s, mixed, 1);
  EXPECT_EQ(m.weight(1).dtype(), DType::BF16);
  EXPECT_EQ(m.weight(5).dtype(), DType::F32);  // buffers stay fp32
  EXPECT_EQ(m.update_target(1).dtype(), DType::F32);
  EXPECT_EQ(m.update_target(1).category(), Category::master);
  EXPECT_FALSE(m.on_host(m.update_target(1)));
  EXPECT_THROW(m.update_target(5), std::logic_error);

  ParamPlacement off{DType::F32, false, Offload::optimizer};
  TrainerParamStore o(*dev, s, off, 1);
  EXPECT_TRUE(o.on_host(o.update_target(0)));  // fp32: the host copy plays master
  EXPECT_EQ(o.update_target(0).category(), Category::master);
  EXPECT_EQ(o.param_f32(0), o.read_f32(o.weight(0)));

  ParamPlacement pure{DType::F16, false, Offload::optimizer};
  TrainerParamStore p(*dev, s, pure, 1);
  EXPECT_EQ(p.update_target(0).dtype(), DType::F16);  // pure: the host copy stays 16-bit
}

TEST(ParamStore, OffloadParamsStreamsBlocks) {
  auto dev = cpu_device();
  const auto s = specs();
  TrainerParamStore st(*dev, s, ParamPlacement{DType::F32, false, Offload::params}, 1);
  const auto resident =
      dev->memory().stats().by_category[static_cast<std::size_t>(Category::params)];
  EXPECT_NO_THROW(st.weight(0));  // outside the blocks: resident
  EXPECT_NO_THROW(st.weight(5));  // buffers are never streamed
  EXPECT_THROW(st.weight(1), std::logic_error);
  st.enter_block(0);
  EXPECT_EQ(st.read_f32(st.weight(1)), st.param_f32(1));  // the host values came in
  EXPECT_THROW(st.weight(3), std::logic_error);           // block 1 is not in
  st.enter_block(0);                                      // nesting (recompute inside backward)
  st.exit_block(0);
  EXPECT_NO_THROW(st.weight(1));
  st.exit_block(0);
  EXPECT_THROW(st.weight(1), std::logic_error);
  EXPECT_EQ(dev->memory().stats().by_category[static_cast<std::size_t>(Category::params)],
            resident);
  EXPECT_THROW(st.exit_block(0), std::logic_error);
  EXPECT_TRUE(st.on_host(st.update_target(1)));
  st.enter_block(7);  // a block without parameters is fine
  st.exit_block(7);
}

// DDP's buckets overlap backward: a bucket is all-reduced (started) by the block_grads_done of the
// lowest block among its parameters, during backward; buckets with a parameter outside the blocks
// start in reduce_grads, which then waits for every started one and hands the sums back. Against
// a recording group of 2 ranks whose sum doubles (both ranks hold the same grads).
class RecordingComm final : public Comm {
 public:
  std::vector<std::string> log;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  CommBackend backend() const override { return CommBackend::mpi; }
  std::string name() const override { return "recording"; }
  void all_reduce(Tensor&) override { log.push_back("all_reduce"); }
  void start_all_reduce(Tensor& t) override {
    log.push_back("start " + std::to_string(t.numel()));
    pending_.push_back(&t);
  }
  void progress() override { log.push_back("progress"); }
  std::unique_ptr<Comm> split(int, int) override { return make_self_comm(); }
  void wait_started() override {
    log.push_back("wait");
    for (Tensor* t : pending_) {  // the sum over 2 ranks holding the same values
      std::vector<float> v = dev->to_host_f32(*t);
      for (float& x : v) x *= 2.0f;
      dev->from_host_f32(*t, v);
    }
    pending_.clear();
  }
  void reduce_scatter(const Tensor&, Tensor&, std::span<const std::int64_t>) override {}
  void all_gather(const Tensor&, Tensor&, std::span<const std::int64_t>) override {}
  void all_gather_in_place(Tensor&, std::span<const std::int64_t>) override {}
  void broadcast(Tensor&, int) override { log.push_back("broadcast"); }
  void all_to_all(const Tensor&, std::span<const std::int64_t>, Tensor&,
                  std::span<const std::int64_t>) override {}
  void barrier() override {}
  double all_reduce_sum(double v) override { return 2 * v; }
  double all_reduce_max(double v) override { return v; }
  std::vector<std::int64_t> all_gather_host(std::span<const std::int64_t> mine) override {
    std::vector<std::int64_t> out(mine.begin(), mine.end());
    out.insert(out.end(), mine.begin(), mine.end());
    return out;
  }
  Device* dev = nullptr;

 private:
  std::vector<Tensor*> pending_;
};

TEST(ParamStore, DdpBucketsStartDuringBackwardOnceTheirGradsAreFinal) {
  auto dev = cpu_device();
  // Buckets in registration order (DDP's first, 1 MiB; then 25 MiB): {emb, b0.w} (emb is
  // outside the blocks), then {b1.w, b2.w}, complete once block 1's backward is done.
  const std::vector<ParamSpec> s = {{"emb", {16, 16}, 0.02f, -1, true},
                                    {"b0.w", {512, 512}, 0.02f, 0, true},
                                    {"b1.w", {512, 512}, 0.02f, 1, true},
                                    {"b2.w", {512, 512}, 0.02f, 2, true}};
  RecordingComm comm;
  comm.dev = dev.get();
  TrainerParamStore st(*dev, s, ParamPlacement{}, 3, comm);
  st.begin_step(ZeroGrad::set_to_none, dev->ops());
  auto fill = [&](int i, float v) {
    GradRef g = st.grad(i);
    dev->from_host_f32(g.t, std::vector<float>(static_cast<std::size_t>(g.t.numel()), v));
  };
  for (bool sync : {false, true}) {  // no_sync's micro-batch starts nothing
    comm.log.clear();
    st.set_sync(sync);
    for (int block = 2; block >= 0; --block) {
      fill(block + 1, static_cast<float>(block + 1));
      st.block_grads_done(block);
      if (!sync) continue;
      const std::vector<std::string> want =
          block == 2 ? std::vector<std::string>{"progress"}
          : block == 1
              ? std::vector<std::string>{"progress", "start 524288", "progress"}
              : std::vector<std::string>{"progress", "start 524288", "progress", "progress"};
      EXPECT_EQ(comm.log, want) << "after block " << block;
    }
    if (!sync) {
      EXPECT_TRUE(comm.log.empty());
    }
  }
  fill(0, 0.5f);
  st.reduce_grads(dev->ops());
  const std::vector<std::string> tail(comm.log.end() - 2, comm.log.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"start 262400", "wait"}));
  for (int i = 0; i < 4; ++i)
    for (float x : st.grad_f32(i)) ASSERT_EQ(x, i == 0 ? 1.0f : 2.0f * static_cast<float>(i));
}

}  // namespace
}  // namespace memtrade::testing
