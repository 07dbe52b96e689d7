#include "models/train/data.h"
#include "models/train/splitmix.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace memtrade {
namespace {

// Salts keep the teacher's and the rows' streams apart.
constexpr std::uint64_t kTeacher = 0x7465616368657200ull;
constexpr std::uint64_t kRow = 0x726f770000000000ull;

void check_range(std::int64_t first, std::int64_t batch) {
  if (first < 0 || batch < 0) throw std::invalid_argument("make_batch: negative row range");
}

}  // namespace

SplitMix::SplitMix(std::uint64_t seed, std::uint64_t stream, std::uint64_t salt)
    : s_(splitmix64(splitmix64(seed) ^ splitmix64(stream ^ salt))) {}

std::uint64_t SplitMix::next() {
  s_ += 0x9e3779b97f4a7c15ull;
  std::uint64_t z = s_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double SplitMix::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

std::uint64_t SplitMix::below(std::uint64_t n) {
  return static_cast<std::uint64_t>(uniform() * static_cast<double>(n)) % n;
}

float SplitMix::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]
  const double u2 = uniform();
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

// ---- tokens -------------------------------------------------------------------------------------

void make_token_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch, int seq_len,
                      int vocab, std::vector<float>& input, std::vector<std::int32_t>& targets) {
  check_range(first, batch);
  constexpr int kSucc = 4;
  constexpr double kCum[kSucc] = {0.5, 0.75, 0.875, 0.95};  // the rest: a uniform jump
  // successors[v·4 + j]: the j-th likely next token after v.
  std::vector<std::int32_t> successors(static_cast<std::size_t>(vocab) * kSucc);
  SplitMix teacher(seed, 0, kTeacher);
  for (auto& s : successors) s = static_cast<std::int32_t>(teacher.below(vocab));

  const auto T = static_cast<std::size_t>(seq_len);
  input.assign(static_cast<std::size_t>(batch) * T, 0.0f);
  targets.assign(static_cast<std::size_t>(batch) * T, 0);
  std::vector<std::int32_t> seq(T + 1);
  for (std::int64_t b = 0; b < batch; ++b) {
    SplitMix rng(seed, static_cast<std::uint64_t>(first + b), kRow);
    seq[0] = static_cast<std::int32_t>(rng.below(vocab));
    for (std::size_t t = 1; t <= T; ++t) {
      const double u = rng.uniform();
      int j = 0;
      while (j < kSucc && u >= kCum[j]) ++j;
      seq[t] = j < kSucc ? successors[static_cast<std::size_t>(seq[t - 1]) * kSucc + j]
                         : static_cast<std::int32_t>(rng.below(vocab));
    }
    for (std::size_t t = 0; t < T; ++t) {
      input[b * T + t] = static_cast<float>(seq[t]);
      targets[b * T + t] = seq[t + 1];
    }
  }
}

// ---- features -----------------------------------------------------------------------------------

void make_feature_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch, int features,
                        int classes, std::vector<float>& input,
                        std::vector<std::int32_t>& targets) {
  check_range(first, batch);
  constexpr int kHidden = 32;
  const auto F = static_cast<std::size_t>(features);
  std::vector<float> w1(kHidden * F), w2(static_cast<std::size_t>(classes) * kHidden);
  SplitMix teacher(seed, 1, kTeacher);
  const float s1 = 1.0f / std::sqrt(static_cast<float>(features));
  for (auto& w : w1) w = teacher.normal() * s1;
  for (auto& w : w2) w = teacher.normal();

  input.assign(static_cast<std::size_t>(batch) * F, 0.0f);
  targets.assign(static_cast<std::size_t>(batch), 0);
  std::vector<float> h(kHidden);
  for (std::int64_t b = 0; b < batch; ++b) {
    SplitMix rng(seed, static_cast<std::uint64_t>(first + b), kRow);
    float* x = input.data() + b * F;
    for (std::size_t i = 0; i < F; ++i) x[i] = rng.normal();
    for (int j = 0; j < kHidden; ++j) {
      float acc = 0.0f;
      for (std::size_t i = 0; i < F; ++i) acc += w1[j * F + i] * x[i];
      h[j] = std::tanh(acc);
    }
    int best = 0;
    float best_v = -INFINITY;
    for (int k = 0; k < classes; ++k) {
      float acc = 0.0f;
      for (int j = 0; j < kHidden; ++j) acc += w2[k * kHidden + j] * h[j];
      if (acc > best_v) {
        best_v = acc;
        best = k;
      }
    }
    targets[b] = best;
  }
}

// ---- images -------------------------------------------------------------------------------------

namespace {

// A smooth (3, S, S) pattern: per channel, 3 sinusoids of frequency <= 2 cycles per image.
void smooth_pattern(SplitMix& rng, int size, float* out) {
  const double two_pi = 2.0 * std::numbers::pi;
  const auto S = static_cast<std::size_t>(size);
  for (std::size_t ch = 0; ch < 3; ++ch) {
    float* p = out + ch * S * S;
    std::fill(p, p + S * S, 0.0f);
    for (int k = 0; k < 3; ++k) {
      const double fx = static_cast<double>(rng.below(3)), fy = static_cast<double>(rng.below(3));
      const double phase = two_pi * rng.uniform();
      const double amp = rng.normal();
      // The sine's argument depends on (x, y) only through the integer n = fx·x + fy·y (exact in
      // a double), so each of its at most 4·S values is computed once, by the very expression a
      // pixel would use: the same bits, with a 1/8 to 1/32 of the sines (these were 4% of
      // cnn-small's step).
      const std::size_t n_max = 4 * (S - 1) + 1;  // n <= 2·(S − 1) + 2·(S − 1)
      double wave[4 * 512];
      const bool cached = n_max <= std::size(wave);
      for (std::size_t n = 0; cached && n < n_max; ++n)
        wave[n] = amp * std::sin(two_pi * static_cast<double>(n) / size + phase);
      for (std::size_t y = 0; y < S; ++y)
        for (std::size_t x = 0; x < S; ++x) {
          const double n = fx * static_cast<double>(x) + fy * static_cast<double>(y);
          p[y * S + x] += static_cast<float>(cached ? wave[static_cast<std::size_t>(n)]
                                                    : amp * std::sin(two_pi * n / size + phase));
        }
    }
  }
}

// The class templates of one teacher (seed, size, classes), made once per thread and kept while
// that teacher's batches come: they are most of make_image_batch's sines (100 classes against 32
// backgrounds at cnn-small's batch), and the step time counts making the batch.
struct ImageTeacher {
  std::uint64_t seed = 0;
  int size = -1, classes = -1;
  std::vector<float> by_pixel;   // (P, classes): template k's pixel i at [i · classes + k]
  std::vector<double> inv_norm;  // (classes): 1 / ‖template k‖ (0 for an all-zero one)
};

const ImageTeacher& image_teacher(std::uint64_t seed, int size, int classes) {
  thread_local ImageTeacher t;
  if (t.seed == seed && t.size == size && t.classes == classes) return t;
  const std::size_t P = 3 * static_cast<std::size_t>(size) * size;
  const auto K = static_cast<std::size_t>(classes);
  t.by_pixel.assign(P * K, 0.0f);
  t.inv_norm.assign(K, 0.0);
  SplitMix teacher(seed, 2, kTeacher);
  std::vector<float> pattern(P);
  for (std::size_t k = 0; k < K; ++k) {
    smooth_pattern(teacher, size, pattern.data());
    double sq = 0.0;
    for (std::size_t i = 0; i < P; ++i) {
      sq += static_cast<double>(pattern[i]) * pattern[i];
      t.by_pixel[i * K + k] = pattern[i];
    }
    t.inv_norm[k] = sq > 0.0 ? 1.0 / std::sqrt(sq) : 0.0;
  }
  t.seed = seed;
  t.size = size;
  t.classes = classes;
  return t;
}

}  // namespace

void make_image_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch, int size,
                      int classes, std::vector<float>& input, std::vector<std::int32_t>& targets) {
  check_range(first, batch);
  const std::size_t P = 3 * static_cast<std::size_t>(size) * size;  // pixels per image
  const auto K = static_cast<std::size_t>(classes);
  const ImageTeacher& teacher = image_teacher(seed, size, classes);
  input.assign(static_cast<std::size_t>(batch) * P, 0.0f);
  targets.assign(static_cast<std::size_t>(batch), 0);
  // Each image from its own stream: the images are independent of one another and of the order
  // they are made in.
#pragma omp parallel for schedule(static) if (batch > 1)
  for (std::int64_t b = 0; b < batch; ++b) {
    SplitMix rng(seed, static_cast<std::uint64_t>(first + b), kRow);
    const auto cls = static_cast<std::size_t>(rng.below(classes));
    const float gain = 1.0f + 0.5f * static_cast<float>(rng.uniform());
    std::vector<float> background(P);
    smooth_pattern(rng, size, background.data());
    float* img = input.data() + b * P;
    for (std::size_t i = 0; i < P; ++i)
      img[i] = gain * teacher.by_pixel[i * K + cls] + 0.5f * background[i] + 0.1f * rng.normal();
    // Every class's correlation, each summed over pixels in order (the classes side by side, so
    // the sums are independent chains rather than one long one).
    std::vector<double> acc(K, 0.0);
    for (std::size_t i = 0; i < P; ++i) {
      const float* t = teacher.by_pixel.data() + i * K;
      const double x = img[i];
      for (std::size_t k = 0; k < K; ++k) acc[k] += static_cast<double>(t[k]) * x;
    }
    int best = 0;
    double best_v = -INFINITY;
    for (std::size_t k = 0; k < K; ++k) {
      const double v = acc[k] * teacher.inv_norm[k];  // cosine-like: energy must not decide
      if (v > best_v) {
        best_v = v;
        best = static_cast<int>(k);
      }
    }
    targets[b] = best;
  }
}

}  // namespace memtrade
