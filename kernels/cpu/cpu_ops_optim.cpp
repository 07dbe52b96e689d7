// Loss-scale unscaling with the inf/nan check, and one optimizer step with torch.optim's
// formulas (single-tensor path, foreach=False, maximize=False, amsgrad=False, centered=False).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops_impl.h"

namespace memtrade::cpu {
bool CpuOps::unscale_and_check(std::span<Tensor* const> grads, float inv_scale) {
  bool bad = false;
  const bool write = inv_scale != 1.0f;  // x·1 == x: a check-only call writes nothing
  for (Tensor* g : grads) {
    if (!g) continue;
    check_float("unscale_and_check", "grad", *g);
    const std::int64_t n = g->numel();
    const std::int64_t chunks = (n + kChunk - 1) / kChunk;
    bool tensor_bad = false;
#pragma omp parallel for schedule(static) reduction(|| : tensor_bad) if (chunks > 1)
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t off = c * kChunk, len = std::min(kChunk, n - off);
      float bx[kChunk], bo[kChunk];
      const float* x = read_f32(*g, off, len, bx);
      float* y = write ? dest_f32(*g, off, bo) : bo;
      for (std::int64_t j = 0; j < len; ++j) {
        // Checked before (an inf times 0 would hide) and after (a finite value may overflow).
        const float v = x[j] * inv_scale;
        if (!std::isfinite(x[j]) || !std::isfinite(v)) tensor_bad = true;
        y[j] = v;
      }
      if (write) write_f32(*g, off, len, y);
    }
    bad = bad || tensor_bad;
  }
  return bad;
}

void CpuOps::optimizer_update(const OptimizerHyper& h, Tensor& param, const Tensor& grad,
                              Tensor* state0, Tensor* state1) {
  check_optimizer_update(h, param, grad, state0, state1);
  const int nstate = optimizer_state_count(h.kind);
  const float lr = h.lr, wd = h.weight_decay, eps = h.eps;
  const double step = static_cast<double>(h.step);
  // Scalars of Adam's bias correction, in double like Python floats, then used in fp32.
  const float step_size = static_cast<float>(h.lr / (1.0 - std::pow(double{h.beta1}, step)));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double{h.beta2}, step)));
  const float clr = static_cast<float>(h.lr / (1.0 + (step - 1.0) * h.lr_decay));
  const OptimizerKind kind = h.kind;
  const float gs = h.grad_scale;
  for_chunks(param.numel(), [&](std::int64_t off, std::int64_t len) {
    float bp[kChunk], bg[kChunk], b0[kChunk], b1[kChunk];
    float op_[kChunk], o0[kChunk], o1[kChunk];
    const float* p_in = read_f32(param, off, len, bp);
    const float* g_in = read_f32(grad, off, len, bg);
    const float* s0_in = state0 && nstate >= 1 ? read_f32(*state0, off, len, b0) : nullptr;
    const float* s1_in = state1 && nstate >= 2 ? read_f32(*state1, off, len, b1) : nullptr;
    float* p = dest_f32(param, off, op_);
    float* s0 = nstate >= 1 ? dest_f32(*state0, off, o0) : nullptr;
    float* s1 = nstate >= 2 ? dest_f32(*state1, off, o1) : nullptr;
    for (std::int64_t j = 0; j < len; ++j) {
      float w = p_in[j];
      float g = g_in[j] * gs;
      switch (kind) {
        case OptimizerKind::sgd:
          g += wd * w;
          w -= lr * g;
          break;
        case OptimizerKind::sgd_momentum: {
          g += wd * w;
          const float buf = h.step == 1 ? g : h.momentum * s0_in[j] + (1.0f - h.dampening) * g;
          s0[j] = buf;
          g = h.nesterov ? g + h.momentum * buf : buf;
          w -= lr * g;
          break;
        }
        case OptimizerKind::adam:
        case OptimizerKind::adamw: {
          if (kind == OptimizerKind::adamw) {
            w *= 1.0f - lr * wd;  // decoupled weight decay
          } else {
            g += wd * w;
          }
          const float m = h.beta1 * s0_in[j] + (1.0f - h.beta1) * g;
          const float v = h.beta2 * s1_in[j] + (1.0f - h.beta2) * g * g;
          s0[j] = m;
          s1[j] = v;
          w -= step_size * m / (std::sqrt(v) / bc2_sqrt + eps);
          break;
        }
        case OptimizerKind::adagrad: {
          g += wd * w;
          const float sum = s0_in[j] + g * g;
          s0[j] = sum;
          w -= clr * g / (std::sqrt(sum) + eps);
          break;
        }
        case OptimizerKind::rmsprop: {
          g += wd * w;
          const float sq = h.alpha * s0_in[j] + (1.0f - h.alpha) * g * g;
          s0[j] = sq;
          w -= lr * g / (std::sqrt(sq) + eps);
          break;
        }
      }
      p[j] = w;
    }
    write_f32(param, off, len, p);
    if (s0) write_f32(*state0, off, len, s0);
    if (s1) write_f32(*state1, off, len, s1);
  });
}

}  // namespace memtrade::cpu
