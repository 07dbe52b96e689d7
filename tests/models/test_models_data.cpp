// Synthetic data: slicing, determinism, ranges and learnable structure.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "models/model.h"
#include "models/train/data.h"

namespace memtrade {
namespace {

class DataSlicing : public ::testing::TestWithParam<const char*> {};

TEST_P(DataSlicing, BatchIsConcatenationOfSlices) {
  auto m = make_model(GetParam());
  std::vector<float> in8, in_a, in_b;
  std::vector<std::int32_t> tg8, tg_a, tg_b;
  m->make_batch(7, 0, 8, in8, tg8);
  m->make_batch(7, 0, 4, in_a, tg_a);
  m->make_batch(7, 4, 4, in_b, tg_b);
  in_a.insert(in_a.end(), in_b.begin(), in_b.end());
  tg_a.insert(tg_a.end(), tg_b.begin(), tg_b.end());
  EXPECT_EQ(in8, in_a);
  EXPECT_EQ(tg8, tg_a);
  EXPECT_EQ(static_cast<std::int64_t>(in8.size()), shape_numel(m->input_shape(8)));
  EXPECT_EQ(static_cast<std::int64_t>(tg8.size()), shape_numel(m->target_shape(8)));
}

TEST_P(DataSlicing, DeterministicPerSeedAndSeedsDiffer) {
  auto m = make_model(GetParam());
  std::vector<float> a, b, c;
  std::vector<std::int32_t> ta, tb, tc;
  m->make_batch(3, 10, 4, a, ta);
  m->make_batch(3, 10, 4, b, tb);
  m->make_batch(4, 10, 4, c, tc);
  EXPECT_EQ(a, b);
  EXPECT_EQ(ta, tb);
  EXPECT_NE(a, c);
}

TEST_P(DataSlicing, ValuesInRange) {
  auto m = make_model(GetParam());
  std::vector<float> in;
  std::vector<std::int32_t> tg;
  m->make_batch(1, 0, 16, in, tg);
  const auto h = m->hyper();
  const int classes = m->family() == "gpt" ? h["vocab_size"].get<int>() : h["classes"].get<int>();
  for (auto t : tg) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, classes);
  }
  if (m->family() == "gpt") {
    for (auto x : in) {
      EXPECT_GE(x, 0.0f);
      EXPECT_LT(x, static_cast<float>(classes));
      EXPECT_EQ(x, static_cast<float>(static_cast<int>(x)));
    }
  }
  // Several classes appear (the teacher is not constant).
  EXPECT_GT(std::set<std::int32_t>(tg.begin(), tg.end()).size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Models, DataSlicing,
                         ::testing::Values("gpt-tiny", "gpt-mini", "mlp-tiny", "mlp-small",
                                           "cnn-tiny", "cnn-small"));

TEST(Data, GptTargetsAreNextTokens) {
  std::vector<float> in;
  std::vector<std::int32_t> tg;
  make_token_batch(5, 0, 3, 16, 100, in, tg);
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t + 1 < 16; ++t)
      EXPECT_EQ(static_cast<int>(in[b * 16 + t + 1]), tg[b * 16 + t]);
}

TEST(Data, GptChainIsSparse) {
  // Most transitions go to one of 4 successors: the best bigram predictor is right about half
  // the time, far above 1/vocab.
  std::vector<float> in;
  std::vector<std::int32_t> tg;
  make_token_batch(11, 0, 64, 64, 32, in, tg);
  std::map<int, std::map<int, int>> counts;
  for (std::size_t i = 0; i < tg.size(); ++i) ++counts[static_cast<int>(in[i])][tg[i]];
  int best = 0;
  for (const auto& [tok, next] : counts) {
    int mx = 0;
    for (const auto& [n, c] : next) mx = std::max(mx, c);
    best += mx;
  }
  EXPECT_GT(static_cast<double>(best) / tg.size(), 0.4);
}

TEST(Data, ImageLabelsMostlyFollowTheTemplate) {
  // Labels depend on the images: two different seeds (teachers) label the same rows differently,
  // but a fixed teacher gives a fixed label. Check the label spread is not degenerate.
  std::vector<float> in;
  std::vector<std::int32_t> tg;
  make_image_batch(2, 0, 200, 8, 5, in, tg);
  std::map<int, int> hist;
  for (auto t : tg) ++hist[t];
  EXPECT_EQ(hist.size(), 5u);
  for (const auto& [k, c] : hist) EXPECT_GT(c, 10) << "class " << k;
}

// FNV-1a of the bytes: pins generated data bit for bit.
template <typename T>
std::uint64_t fnv1a(const std::vector<T>& v) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

TEST(Data, ImageBatchBitsArePinned) {
  // The bits the serial, uncached generator made (the teacher's templates per call, one class
  // sum after another): caching the templates and making the images in parallel changed none.
  std::vector<float> in;
  std::vector<std::int32_t> tg;
  make_image_batch(0, 32, 32, 32, 100, in, tg);  // cnn-small's second batch
  EXPECT_EQ(fnv1a(in), 0xb0d1441430ae5d83ull);
  EXPECT_EQ(fnv1a(tg), 0x59c02dc4c8bc5be6ull);
  make_image_batch(7, 5, 13, 16, 10, in, tg);
  EXPECT_EQ(fnv1a(in), 0x9f810f6ded4bf852ull);
  EXPECT_EQ(fnv1a(tg), 0x64e4f5d2e1dd7520ull);
}

TEST(Data, ImageTeacherFollowsEveryCall) {
  // The templates are kept between calls: another teacher or size in between must not leak.
  std::vector<float> a, b, c;
  std::vector<std::int32_t> ta, tb, tc;
  make_image_batch(3, 0, 4, 8, 5, a, ta);
  make_image_batch(4, 0, 4, 8, 5, b, tb);
  make_image_batch(3, 0, 4, 16, 5, b, tb);
  make_image_batch(3, 0, 4, 8, 7, b, tb);
  make_image_batch(3, 0, 4, 8, 5, c, tc);
  EXPECT_EQ(a, c);
  EXPECT_EQ(ta, tc);
}

TEST(Data, NegativeRangeThrows) {
  std::vector<float> in;
  std::vector<std::int32_t> tg;
  EXPECT_THROW(make_feature_batch(1, -1, 2, 4, 3, in, tg), std::invalid_argument);
}

}  // namespace
}  // namespace memtrade
