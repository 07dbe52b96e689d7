// Synthetic data with learnable structure, deterministic per (seed, row).
//
// Every sample row r of the stream `seed` is drawn from its own counter-based generator
// (splitmix64 of seed and r), and the "teacher" that makes labels learnable depends on the seed
// only. Rows are therefore independent of how a stream is sliced:
// batch(seed, 0, 8) == batch(seed, 0, 4) ++ batch(seed, 4, 4), which gradient-accumulation
// tests rely on.
#pragma once

#include <cstdint>
#include <vector>

namespace memtrade {

// A counter-based generator: splitmix64 steps, Box-Muller normals.
class SplitMix {
 public:
  explicit SplitMix(std::uint64_t state) : s_(state) {}
  SplitMix(std::uint64_t seed, std::uint64_t stream, std::uint64_t salt);
  std::uint64_t next();
  double uniform();                      // [0, 1)
  std::uint64_t below(std::uint64_t n);  // [0, n)
  float normal();

 private:
  std::uint64_t s_;
};

// GPT: a fixed sparse Markov chain over the vocabulary (each token has 4 likely successors with
// probabilities .5/.25/.125/.075, plus a 5% uniform jump). Row r is T + 1 tokens; input (B·T)
// holds the first T as floats, targets the last T.
void make_token_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch, int seq_len,
                      int vocab, std::vector<float>& input, std::vector<std::int32_t>& targets);

// MLP: x ~ N(0, 1)^in, label = argmax W2 · tanh(W1 · x) of a fixed random teacher (32 hidden).
void make_feature_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch, int features,
                        int classes, std::vector<float>& input, std::vector<std::int32_t>& targets);

// CNN: (3, H, W) images = a smooth class template (sum of low-frequency sinusoids) scaled by a
// random gain + smooth random background + a little pixel noise; label = the template with the
// largest correlation (usually, not always, the one used).
void make_image_batch(std::uint64_t seed, std::int64_t first, std::int64_t batch, int size,
                      int classes, std::vector<float>& input, std::vector<std::int32_t>& targets);

}  // namespace memtrade
