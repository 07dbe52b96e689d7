// Rotary position embeddings in place on packed qkv. Positions go to threads: each computes the
// cos and sin of its position once (in double from the fp32 angle, so they are the fp32 values
// nearest the true ones, as CUDA's are) and rotates that position's q and k heads in every
// sequence of the batch.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops_impl.h"

namespace memtrade::cpu {
namespace {

// sign +1: rope_forward's rotation; -1: its transpose (the inverse), for rope_backward.
void rotate(Tensor& qkv, const RopeDims& d, const std::vector<float>& inv_freq, float sign) {
  const std::int64_t half = d.hd / 2, heads = d.nh + d.nkv, row = d.row();
#pragma omp parallel for schedule(static)
  for (std::int64_t t = 0; t < d.t; ++t) {
    float cs[kRopeMaxHeadDim / 2], sn[kRopeMaxHeadDim / 2], buf[kRopeMaxHeadDim];
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<float>(t) * inv_freq[static_cast<std::size_t>(i)];
      cs[i] = static_cast<float>(std::cos(angle));
      sn[i] = sign * static_cast<float>(std::sin(angle));
    }
    for (std::int64_t b = 0; b < d.b; ++b) {
      for (std::int64_t h = 0; h < heads; ++h) {  // q heads, then k heads: contiguous
        const std::int64_t off = (b * d.t + t) * row + h * d.hd;
        // The head's fp32 values: its own memory for F32 (rotated in place), else buf.
        float* x = const_cast<float*>(read_f32(qkv, off, d.hd, buf));
        for (std::int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * cs[i] - x2 * sn[i];
          x[i + half] = x2 * cs[i] + x1 * sn[i];
        }
        write_f32(qkv, off, d.hd, x);
      }
    }
  }
}

}  // namespace

void CpuOps::rope_forward(Tensor& qkv, int n_head, int n_kv_head, const RopeConfig& rope) {
  const RopeDims d = check_rope("rope_forward", qkv, n_head, n_kv_head);
  rotate(qkv, d, rope_inv_freq(d.hd, rope), 1.0f);
}

void CpuOps::rope_backward(Tensor& dqkv, int n_head, int n_kv_head, const RopeConfig& rope) {
  const RopeDims d = check_rope("rope_backward", dqkv, n_head, n_kv_head);
  rotate(dqkv, d, rope_inv_freq(d.hd, rope), -1.0f);
}

}  // namespace memtrade::cpu
