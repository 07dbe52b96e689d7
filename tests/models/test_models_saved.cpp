// SavedTensors (keep / offload / fetch / release) and the checkpoint plan rules.
#include <gtest/gtest.h>

#include "kernels/device.h"
#include "models/train/saved_tensors.h"

namespace memtrade {
namespace {

constexpr auto kAct = static_cast<std::size_t>(Category::activations);

std::vector<int> recomputed_blocks(const CheckpointPlan& p, int n) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i)
    if (p.recomputed(i)) out.push_back(i);
  return out;
}

TEST(CheckpointPlan, DensityIsEvenlySpaced) {
  auto plan = [](double d, int n) {
    return CheckpointPlan::make({Checkpoint::Kind::density, d}, n);
  };
  EXPECT_EQ(recomputed_blocks(plan(0.0, 4), 4), (std::vector<int>{}));
  EXPECT_EQ(recomputed_blocks(plan(1.0, 4), 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(recomputed_blocks(plan(0.5, 4), 4), (std::vector<int>{1, 3}));
  EXPECT_EQ(recomputed_blocks(plan(0.25, 12), 12), (std::vector<int>{3, 7, 11}));
  EXPECT_EQ(recomputed_blocks(plan(0.5, 3), 3), (std::vector<int>{1, 2}));  // round(1.5) = 2
  EXPECT_EQ(plan(0.5, 12).num_recomputed(), 6);
  EXPECT_EQ(plan(0.5, 4).segments.size(), 4u);
  EXPECT_FALSE(plan(1.0, 4).selective);
  EXPECT_THROW(plan(1.5, 4), std::invalid_argument);
}

TEST(CheckpointPlan, FirstRecomputesTheFirstBlocks) {
  auto plan = [](double d, int n) { return CheckpointPlan::make({Checkpoint::Kind::first, d}, n); };
  EXPECT_EQ(recomputed_blocks(plan(0.5, 4), 4), (std::vector<int>{0, 1}));
  EXPECT_EQ(recomputed_blocks(plan(0.25, 12), 12), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(recomputed_blocks(plan(0.5, 3), 3), (std::vector<int>{0, 1}));  // round(1.5) = 2
  EXPECT_EQ(recomputed_blocks(plan(0.0, 4), 4), (std::vector<int>{}));
  EXPECT_EQ(recomputed_blocks(plan(1.0, 4), 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(plan(0.75, 4).segments.size(), 4u);  // each recomputed block its own segment
  EXPECT_THROW(plan(1.5, 4), std::invalid_argument);
  // Spelling: "first" + the density, both ways.
  EXPECT_EQ(Checkpoint::parse("first0.5"), (Checkpoint{Checkpoint::Kind::first, 0.5}));
  EXPECT_EQ((Checkpoint{Checkpoint::Kind::first, 0.25}).str(), "first0.25");
  EXPECT_FALSE(Checkpoint::parse("first"));
  EXPECT_FALSE(Checkpoint::parse("first1.5"));
  EXPECT_FALSE(Checkpoint::parse("firstsqrt"));
}

TEST(CheckpointPlan, SqrtSegments) {
  auto p = CheckpointPlan::make({Checkpoint::Kind::sqrt, 0.0}, 12);  // ⌈√12⌉ = 4
  ASSERT_EQ(p.segments.size(), 3u);
  EXPECT_EQ(p.segments[1].begin, 4);
  EXPECT_EQ(p.segments[1].end, 8);
  EXPECT_TRUE(p.segments[2].recompute);
  auto q = CheckpointPlan::make({Checkpoint::Kind::sqrt, 0.0}, 5);  // ⌈√5⌉ = 3: [0,3) [3,5)
  ASSERT_EQ(q.segments.size(), 2u);
  EXPECT_EQ(q.segments[1].end, 5);
  EXPECT_EQ(q.num_recomputed(), 5);
}

TEST(CheckpointPlan, SelectiveKeepsBlocks) {
  auto p = CheckpointPlan::make({Checkpoint::Kind::selective, 0.0}, 4);
  EXPECT_TRUE(p.selective);
  EXPECT_EQ(p.num_recomputed(), 0);
}

class SavedTensorsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> dev = make_device("cpu");
  Tensor filled(float start, std::int64_t n = 300) {
    Tensor t = dev->empty({n}, DType::F32, Category::activations);
    std::vector<float> v(n);
    for (std::int64_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
    dev->from_host_f32(t, v);
    return t;
  }
  std::int64_t device_act() { return dev->memory().stats().by_category[kAct]; }
  std::int64_t pinned_act() { return dev->pinned().stats().by_category[kAct]; }
};

TEST_F(SavedTensorsTest, KeepGetTakeRelease) {
  SavedTensors s(*dev);
  s.save(0, "a", filled(1));
  s.save(0, "b", filled(2));
  s.save(1, "a", filled(3));
  EXPECT_TRUE(s.has(0, "b"));
  EXPECT_FALSE(s.has(2, "a"));
  EXPECT_EQ(dev->to_host_f32(s.get(1, "a"))[0], 3.0f);
  EXPECT_THROW(s.get(2, "a"), std::logic_error);
  EXPECT_THROW(s.save(0, "a", filled(0)), std::logic_error);
  Tensor t = s.take(0, "a");
  EXPECT_FALSE(s.has(0, "a"));
  EXPECT_EQ(dev->to_host_f32(t)[1], 2.0f);
  t.reset();
  s.release(0);
  EXPECT_FALSE(s.has(0, "b"));
  EXPECT_EQ(s.device_bytes(), 300 * 4);
  s.release(1);
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(device_act(), 0);
}

TEST_F(SavedTensorsTest, OffloadMovesToPinnedAndFetchRestores) {
  SavedTensors s(*dev);
  s.set_offload(true);
  s.save(0, "a", filled(5));
  s.save(0, "b", filled(7, 2000));
  s.flush();
  EXPECT_EQ(device_act(), 0);  // nothing left on the device
  EXPECT_GE(pinned_act(), 2300 * 4);
  EXPECT_EQ(s.host_bytes(), 2300 * 4);
  EXPECT_THROW(s.get(0, "a"), std::logic_error);  // not fetched
  const auto h2d = dev->transfers().h2d_bytes;
  s.fetch(0);
  s.fetch(0);  // idempotent
  EXPECT_EQ(dev->transfers().h2d_bytes - h2d, 2300 * 4);
  EXPECT_EQ(dev->to_host_f32(s.get(0, "a"))[299], 5.0f + 299);
  EXPECT_EQ(dev->to_host_f32(s.get(0, "b"))[1999], 7.0f + 1999);
  s.release(0);
  EXPECT_EQ(device_act(), 0);
  EXPECT_EQ(pinned_act(), 0);
}

TEST_F(SavedTensorsTest, PrefetchBringsASegmentBackEarlyOnce) {
  SavedTensors s(*dev);
  s.set_offload(true);
  s.save(1, "a", filled(3));
  s.flush();
  s.save(0, "a", filled(4, 1000));
  s.flush();
  EXPECT_EQ(device_act(), 0);
  const auto h2d = dev->transfers().h2d_bytes;
  s.fetch(1);
  s.prefetch(0);  // what backward does while block 1 runs: block 0 arrives meanwhile
  EXPECT_EQ(s.device_bytes(), (300 + 1000) * 4);
  EXPECT_EQ(dev->transfers().h2d_bytes - h2d, (300 + 1000) * 4);
  s.release(1);
  s.prefetch(0);  // already issued: no second copy
  s.fetch(0);
  EXPECT_EQ(dev->transfers().h2d_bytes - h2d, (300 + 1000) * 4);
  EXPECT_EQ(dev->to_host_f32(s.get(0, "a"))[999], 4.0f + 999);
  s.prefetch(5);  // nothing saved there: a no-op
  s.release(0);
  EXPECT_EQ(device_act(), 0);
  EXPECT_EQ(pinned_act(), 0);
}

// A shared tensor (autocast's weight cast, held by ParamStore's cache too) lives until both
// owners let go, stays on the device under offload, and cannot be taken.
TEST_F(SavedTensorsTest, SharedTensorsOutliveTheOtherOwnerAndStayOnTheDevice) {
  SavedTensors s(*dev);
  s.set_offload(true);
  auto cast = std::make_shared<Tensor>(filled(9));
  std::weak_ptr<Tensor> alive = cast;
  s.share(0, "w", cast);
  EXPECT_THROW(s.share(0, "w", cast), std::logic_error);
  EXPECT_THROW(s.share(0, "none", nullptr), std::logic_error);
  cast.reset();  // the cache is cleared: the saved reference keeps it
  ASSERT_FALSE(alive.expired());
  s.flush();
  const auto d2h = dev->transfers().d2h_bytes;
  s.fetch(0);
  EXPECT_EQ(dev->transfers().d2h_bytes, d2h);
  EXPECT_EQ(s.host_bytes(), 0);
  EXPECT_EQ(s.device_bytes(), 0);  // not counted as the segment's activations
  EXPECT_EQ(dev->to_host_f32(s.get(0, "w"))[1], 10.0f);
  EXPECT_THROW(s.take(0, "w"), std::logic_error);
  s.release(0);
  EXPECT_TRUE(alive.expired());
  EXPECT_EQ(device_act(), 0);
}

TEST_F(SavedTensorsTest, OffloadOffKeepsOnDevice) {
  SavedTensors s(*dev);
  s.set_offload(true);
  s.save(0, "a", filled(1));
  s.set_offload(false);
  s.save(0, "b", filled(1));
  s.flush();
  EXPECT_EQ(s.device_bytes(), 300 * 4);
  EXPECT_EQ(s.host_bytes(), 300 * 4);
  s.clear();
  EXPECT_TRUE(s.empty());
}

}  // namespace
}  // namespace memtrade
