// TrainerParamStore on its own: initialisation, where copies live, gradient write semantics
// and the block streaming protocol of offload=params.
#include <cmath>

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

}  // namespace
}  // namespace memtrade::testing
