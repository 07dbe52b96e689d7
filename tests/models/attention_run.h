// One training forward/backward of a BlockModel with a chosen attention kind, and what the
// attention-kind tests compare: the loss, every gradient, the bytes saved for backward and
// which attention tensors each block saved. Shared by tests/models/test_models_attention.cpp
// (CPU) and tests/gpu/test_cuda_ops_flash.cpp (CUDA).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "models/families/block_model.h"
#include "tests/models/test_store.h"

namespace memtrade::testing {

struct AttentionRun {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // trainable parameters, in order
  std::int64_t saved_bytes = 0;           // BlockModel::saved()->device_bytes() after forward
  std::int64_t activation_bytes = 0;      // allocator's live activations after forward (rounded)
  int blocks_with_att = 0, blocks_with_lse = 0;
};

inline AttentionRun run_attention(Device& dev, const std::string& name, std::int64_t batch,
                                  AttentionKind kind, DType act = DType::F32,
                                  Checkpoint checkpoint = {}) {
  auto model = make_model(name);
  auto& m = dynamic_cast<BlockModel&>(*model);
  TestStore store(dev, m, act, 7);
  auto b = make_device_batch(dev, m, 5, 0, batch, act);
  RunOptions o;
  o.act_dtype = act;
  o.attention = kind;
  o.checkpoint = checkpoint;
  constexpr auto kAct = static_cast<std::size_t>(Category::activations);
  const std::int64_t act_before = dev.memory().stats().by_category[kAct];
  AttentionRun r;
  Tensor losses = m.forward(dev, store, b.input, b.targets, o);
  r.activation_bytes = dev.memory().stats().by_category[kAct] - act_before;
  r.saved_bytes = m.saved()->device_bytes();
  for (int i = 0; i < m.num_blocks(); ++i) {
    r.blocks_with_att += m.saved()->has(i, "attn.att");
    r.blocks_with_lse += m.saved()->has(i, "attn.lse");
  }
  r.loss = dev.ops().sum_to_host(losses);
  m.backward(dev, store, 1.0f / static_cast<float>(batch * m.rows_per_sample()));
  for (int i = 0; i < static_cast<int>(m.params().size()); ++i)
    if (m.params()[i].trainable) r.grads.push_back(store.grad_host(i));
  return r;
}

// max |got − want| / max|want| over one tensor: the error against the tensor's own scale.
inline double error_of_max(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 0, worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

// The relative error of one tensor, element by element: max |got − want| / (|want| + m/10),
// m = max|want|. The floor keeps elements that are sums cancelling to ~0 from dominating, while
// a relative error in any sizeable part of the tensor shows in full.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 0, worst = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::abs(w)));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double den = std::abs(static_cast<double>(want[i])) + 0.1 * scale;
    worst = std::max(worst, den > 0 ? err / den : err);
    if (std::isnan(err)) return INFINITY;
  }
  return worst;
}

// Every gradient of `got` equals `want`'s to tol of the tensor's largest element
// (error_of_max), and element by element to 3·tol (relative_error): fp32 reorderings anywhere
// (flash vs math) propagate through the blocks to ~1e-5 element-wise (gpt-small, measured),
// while a relative error confined to part of a tensor (one of q, k, v) still shows. Returns
// the worst {error_of_max, relative_error}.
inline std::pair<double, double> expect_grads_close(const AttentionRun& got,
                                                    const AttentionRun& want, double tol) {
  EXPECT_EQ(got.grads.size(), want.grads.size());
  std::pair<double, double> worst{0, 0};
  for (std::size_t i = 0; i < std::min(got.grads.size(), want.grads.size()); ++i) {
    const double m = error_of_max(got.grads[i], want.grads[i]);
    const double e = relative_error(got.grads[i], want.grads[i]);
    worst = {std::max(worst.first, std::isnan(m) ? INFINITY : m), std::max(worst.second, e)};
    EXPECT_LE(m, tol) << "gradient #" << i << " (of the tensor's max)";
    EXPECT_LE(e, 3 * tol) << "gradient #" << i << " (element-wise)";
  }
  return worst;
}

}  // namespace memtrade::testing
