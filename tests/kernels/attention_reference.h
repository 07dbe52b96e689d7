// Causal (grouped-query) self-attention in double on packed qkv, kernels/ops.h's layout: the
// reference of the math and flash attention tests.
#pragma once

#include <algorithm>
#include <cmath>

#include "tests/kernels/test_cpu_ops_common.h"

namespace memtrade::test {

struct AttnShape {
  int b, t, nh, nkv, hd;
  int c() const { return nh * hd; }              // out's row
  int w() const { return (nh + 2 * nkv) * hd; }  // qkv's row
  std::size_t qkv_numel() const { return static_cast<std::size_t>(b) * t * w(); }
  std::size_t out_numel() const { return static_cast<std::size_t>(b) * t * c(); }
  std::size_t rows() const { return static_cast<std::size_t>(b) * nh * t; }  // lse's numel
};

// out (B, T, NH·hd); optionally att (B, NH, T, T), zeros above the diagonal, and lse (B, NH, T).
// Query head h uses kv head h / (NH / NKV). The scores are scale·q·kᵀ (scale 0: 1/√hd), and with
// cap > 0 Gemma2Attention's soft-capped cap·tanh(scale·q·kᵀ / cap), whose tanh goes to `tanh`
// (B, NH, T, T), zeros above the diagonal.
inline Vec ref_attention(const Vec& qkv, const AttnShape& s, Vec* att = nullptr, Vec* lse = nullptr,
                         double scale = 0.0, double cap = 0.0, Vec* tanh = nullptr) {
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
  Vec out(s.out_numel(), 0.0);
  if (att) att->assign(s.rows() * s.t, 0.0);
  if (lse) lse->assign(s.rows(), 0.0);
  if (tanh) tanh->assign(s.rows() * s.t, 0.0);
  for (int b = 0; b < s.b; ++b)
    for (int h = 0; h < s.nh; ++h) {
      const int g = h / (s.nh / s.nkv);
      const int col[3] = {h * s.hd, (s.nh + g) * s.hd, (s.nh + s.nkv + g) * s.hd};
      auto at = [&](int t, int part, int i) {
        return qkv[(static_cast<std::size_t>(b) * s.t + t) * s.w() + col[part] + i];
      };
      for (int t = 0; t < s.t; ++t) {
        Vec sc(t + 1);
        double mx = -1e300;
        const std::size_t row = (static_cast<std::size_t>(b) * s.nh + h) * s.t + t;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < s.hd; ++i) d += at(t, 0, i) * at(j, 1, i);
          sc[j] = d * scale;
          if (cap > 0.0) {
            const double th = std::tanh(sc[j] / cap);
            if (tanh) (*tanh)[row * s.t + j] = th;
            sc[j] = cap * th;
          }
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
        if (lse) (*lse)[row] = mx + std::log(sum);
        for (int j = 0; j <= t; ++j) {
          const double p = sc[j] / sum;
          if (att) (*att)[row * s.t + j] = p;
          for (int i = 0; i < s.hd; ++i)
            out[(static_cast<std::size_t>(b) * s.t + t) * s.c() + h * s.hd + i] += p * at(j, 2, i);
        }
      }
    }
  return out;
}

}  // namespace memtrade::test
