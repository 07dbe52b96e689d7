// Flash attention on the CPU: the same function as math attention (forward output and dqkv
// within fp32 rounding, lse against the double reference) for multi-head, grouped-query and
// multi-query heads, sequences shorter, longer and not a multiple of the 64-row tiles, T = 1 and
// several head dims; 16-bit storage rounds once; any thread count gives the same bits; the
// scratch is D (temporaries) plus the documented CPU workspace.
#include "tests/kernels/attention_reference.h"

namespace memtrade::test {
namespace {

// max |got − want| <= tol · max|want|: errors relative to the tensor's scale, so that elements
// near zero (sums that cancel) are judged against the rounding of the terms that made them.
void expect_close_rel_max(const std::vector<float>& got, const std::vector<float>& want, double tol,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0, worst = 0.0;
  std::size_t at = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::abs(w)));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= worst)) {
      worst = err;
      at = i;
    }
  }
  EXPECT_LE(worst, tol * scale) << what << ": worst at [" << at << "] got " << got[at] << " want "
                                << want[at] << ", max|want| " << scale;
}

struct FlashCase {
  AttnShape s;
  const char* name;
};

class FlashVsMath : public OpsTest, public ::testing::WithParamInterface<FlashCase> {};

// Forward out and lse, then backward from the same dout: flash against math (fp32) and the
// double reference.
TEST_P(FlashVsMath, ForwardAndBackward) {
  const AttnShape s = GetParam().s;
  auto qkv = rand_vec(s.qkv_numel(), 1, 2.0f), r = rand_vec(s.out_numel(), 2);
  Tensor tq = make({s.b, s.t, s.w()}, qkv), dout = make({s.b, s.t, s.c()}, r);
  Tensor out = garbage({s.b, s.t, s.c()}), lse = garbage({s.b, s.nh, s.t});
  ops().flash_attention_forward(out, lse, tq, s.nh, s.nkv);
  Tensor mout = garbage({s.b, s.t, s.c()}), att = garbage({s.b, s.nh, s.t, s.t});
  ops().attention_forward(mout, att, tq, s.nh, s.nkv);
  expect_close_rel_max(get(out), get(mout), 1e-5, "out vs math");
  Vec want_lse;
  expect_close(get(out), ref_attention(to_d(qkv), s, nullptr, &want_lse), 1e-6, 1e-5,
               "out vs double");
  expect_close(get(lse), want_lse, 1e-6, 1e-6, "lse vs double");

  Tensor dqkv = garbage({s.b, s.t, s.w()}), mdqkv = garbage({s.b, s.t, s.w()});
  ops().flash_attention_backward(dqkv, dout, tq, out, lse, s.nh, s.nkv);
  ops().attention_backward(mdqkv, dout, tq, att, s.nh, s.nkv);
  expect_close_rel_max(get(dqkv), get(mdqkv), 1e-5, "dqkv vs math");
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashVsMath,
                         ::testing::Values(FlashCase{{2, 5, 2, 2, 4}, "mha_short"},
                                           FlashCase{{2, 1, 4, 2, 8}, "t1_gqa"},
                                           FlashCase{{1, 64, 2, 2, 16}, "one_tile"},
                                           FlashCase{{2, 67, 4, 1, 32}, "mqa_tile_plus_3"},
                                           FlashCase{{1, 130, 6, 3, 64}, "gqa_three_tiles"},
                                           FlashCase{{1, 200, 2, 2, 80}, "hd80_t200"},
                                           FlashCase{{1, 70, 2, 1, 256}, "hd256"}),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// GQA's gradients against finite differences of the double reference, through flash.
TEST_F(OpsTest, FlashGroupedQueryGradientMatchesFiniteDifferences) {
  const AttnShape s{1, 7, 4, 2, 3};
  auto qkv = rand_vec(s.qkv_numel(), 3, 1.5f), r = rand_vec(s.out_numel(), 4);
  Tensor tq = make({s.b, s.t, s.w()}, qkv), out = garbage({s.b, s.t, s.c()}),
         lse = garbage({s.b, s.nh, s.t}), dqkv = garbage({s.b, s.t, s.w()});
  ops().flash_attention_forward(out, lse, tq, s.nh, s.nkv);
  ops().flash_attention_backward(dqkv, make({s.b, s.t, s.c()}, r), tq, out, lse, s.nh, s.nkv);
  expect_close(get(dqkv),
               fd_grad([&](const Vec& v) { return ref_attention(v, s); }, to_d(qkv), to_d(r)), 1e-5,
               1e-4, "flash GQA dqkv");
}

// 16-bit storage: the arithmetic is the fp32 path's on the same (rounded) values, so out and
// dqkv are exactly the fp32 results rounded once; and within that rounding of the double
// reference.
class FlashLowp : public OpsTest, public ::testing::WithParamInterface<DType> {};

TEST_P(FlashLowp, RoundsOnceAndOnlyOnce) {
  const DType dt = GetParam();
  const AttnShape s{2, 70, 4, 2, 32};
  const auto qkv = quantize(rand_vec(s.qkv_numel(), 5, 2.0f), dt);
  const auto r = quantize(rand_vec(s.out_numel(), 6), dt);
  Tensor q16 = make({s.b, s.t, s.w()}, qkv, dt), q32 = make({s.b, s.t, s.w()}, qkv);
  Tensor o16 = garbage({s.b, s.t, s.c()}, dt), o32 = garbage({s.b, s.t, s.c()});
  Tensor l16 = garbage({s.b, s.nh, s.t}), l32 = garbage({s.b, s.nh, s.t});
  ops().flash_attention_forward(o16, l16, q16, s.nh, s.nkv);
  ops().flash_attention_forward(o32, l32, q32, s.nh, s.nkv);
  const std::vector<float> out32 = get(o32);
  EXPECT_TRUE(get(o16) == quantize(out32, dt)) << "out: the fp32 result rounded once";
  EXPECT_TRUE(get(l16) == get(l32)) << "lse is F32 either way";
  expect_close(get(o16), ref_attention(to_d(qkv), s), 1e-6, 0.5 * dtype_eps(dt) + 1e-5,
               "16-bit out vs double");

  // Backward from the same out values (the 16-bit forward's) in both runs.
  const std::vector<float> out16 = get(o16);
  Tensor oo32 = make({s.b, s.t, s.c()}, out16);
  Tensor g16 = make({s.b, s.t, s.c()}, r, dt), g32 = make({s.b, s.t, s.c()}, r);
  Tensor d16 = garbage({s.b, s.t, s.w()}, dt), d32 = garbage({s.b, s.t, s.w()});
  ops().flash_attention_backward(d16, g16, q16, o16, l16, s.nh, s.nkv);
  ops().flash_attention_backward(d32, g32, q32, oo32, l32, s.nh, s.nkv);
  EXPECT_TRUE(get(d16) == quantize(get(d32), dt)) << "dqkv: the fp32 result rounded once";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FlashLowp, ::testing::Values(DType::BF16, DType::F16),
                         [](const auto& param_info) {
                           return std::string(dtype_name(param_info.param));
                         });

// The same bits for 1, 2 and 3 threads (tasks own their outputs; sums run in a fixed order).
TEST(FlashDeterminism, SameBitsForAnyThreadCount) {
  const AttnShape s{3, 150, 4, 2, 64};
  const auto qkv = rand_vec(s.qkv_numel(), 7, 2.0f), r = rand_vec(s.out_numel(), 8);
  std::vector<float> first[3];
  for (int threads : {1, 2, 3}) {
    auto dev = make_device("cpu", {.threads = threads});
    Tensor tq = dev->empty({s.b, s.t, s.w()}, DType::F32, Category::activations);
    Tensor dout = dev->empty({s.b, s.t, s.c()}, DType::F32, Category::activations);
    dev->from_host_f32(tq, qkv);
    dev->from_host_f32(dout, r);
    Tensor out = dev->empty({s.b, s.t, s.c()}, DType::F32, Category::activations);
    Tensor lse = dev->empty({s.b, s.nh, s.t}, DType::F32, Category::activations);
    Tensor dqkv = dev->empty({s.b, s.t, s.w()}, DType::F32, Category::activations);
    dev->ops().flash_attention_forward(out, lse, tq, s.nh, s.nkv);
    dev->ops().flash_attention_backward(dqkv, dout, tq, out, lse, s.nh, s.nkv);
    const std::vector<float> got[3] = {dev->to_host_f32(out), dev->to_host_f32(lse),
                                       dev->to_host_f32(dqkv)};
    for (int i = 0; i < 3; ++i) {
      if (threads == 1)
        first[i] = got[i];
      else
        EXPECT_TRUE(got[i] == first[i]) << "output " << i << " with " << threads << " threads";
    }
  }
  make_device("cpu");  // back to every core for the tests that follow
}

// Scratch: forward none in fp32; backward D (B, NH, T) F32 as its only temporaries, and no
// workspace in fp32. 16-bit adds the CPU's fp32 copies (workspace) and nothing else.
TEST_F(OpsTest, FlashScratchIsDAndTheCpuCopies) {
  const AttnShape s{2, 40, 4, 2, 16};
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor tq = make({s.b, s.t, s.w()}, rand_vec(s.qkv_numel(), 9), dt);
    Tensor out = zeros({s.b, s.t, s.c()}, dt), lse = zeros({s.b, s.nh, s.t});
    Tensor dout = make({s.b, s.t, s.c()}, rand_vec(s.out_numel(), 10), dt);
    Tensor dqkv = zeros({s.b, s.t, s.w()}, dt);
    const auto& st = mem().stats();
    const auto before = st.allocated.current;
    mem().reset_peak();
    ops().flash_attention_forward(out, lse, tq, s.nh, s.nkv);
    EXPECT_EQ(st.allocated.current, before);
    const auto qkv32 = static_cast<std::int64_t>(
        dt == DType::F32 ? 0 : CachingAllocator::round_size(s.qkv_numel() * 4));
    EXPECT_EQ(st.allocated.peak - before, qkv32) << "forward: the fp32 copy of 16-bit qkv only";
    mem().reset_peak();
    ops().flash_attention_backward(dqkv, dout, tq, out, lse, s.nh, s.nkv);
    EXPECT_EQ(st.allocated.current, before);
    constexpr auto kTmp = static_cast<std::size_t>(Category::temporaries);
    constexpr auto kWs = static_cast<std::size_t>(Category::workspace);
    EXPECT_EQ(st.by_category_at_peak[kTmp],
              static_cast<std::int64_t>(CachingAllocator::round_size(s.rows() * 4)))
        << "D (B, NH, T) F32";
    const auto copies = static_cast<std::int64_t>(
        dt == DType::F32 ? 0
                         : CachingAllocator::round_size(s.qkv_numel() * 4) * 2 +
                               CachingAllocator::round_size(s.out_numel() * 4));
    EXPECT_EQ(st.by_category_at_peak[kWs], copies) << "qkv, dqkv and dout in fp32";
  }
}

TEST_F(OpsTest, FlashRejectsBadArguments) {
  const AttnShape s{1, 4, 2, 1, 8};
  Tensor tq = zeros({s.b, s.t, s.w()}), out = zeros({s.b, s.t, s.c()}),
         lse = zeros({s.b, s.nh, s.t});
  EXPECT_NO_THROW(ops().flash_attention_forward(out, lse, tq, s.nh, s.nkv));
  Tensor lse16 = zeros({s.b, s.nh, s.t}, DType::BF16), lse_bad = zeros({s.b, s.t, s.nh});
  EXPECT_THROW(ops().flash_attention_forward(out, lse16, tq, s.nh, s.nkv), std::invalid_argument);
  EXPECT_THROW(ops().flash_attention_forward(out, lse_bad, tq, s.nh, s.nkv), std::invalid_argument);
  EXPECT_THROW(ops().flash_attention_forward(out, lse, tq, 2, 2), std::invalid_argument);
  // head_dim 257 is past the kernels' tiles
  Tensor wide = zeros({1, 2, 3 * 257}), wout = zeros({1, 2, 257}), wlse = zeros({1, 1, 2});
  try {
    ops().flash_attention_forward(wout, wlse, wide, 1, 1);
    ADD_FAILURE() << "head_dim 257 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 257"), std::string::npos) << e.what();
  }
  Tensor dq = zeros({s.b, s.t, s.w()}), dout_bad = zeros({s.b, s.t, s.c() + 1});
  EXPECT_THROW(ops().flash_attention_backward(dq, dout_bad, tq, out, lse, s.nh, s.nkv),
               std::invalid_argument);
}

}  // namespace
}  // namespace memtrade::test
