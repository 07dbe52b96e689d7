// Loss-scale unscaling with the inf/nan check, and one optimizer step with torch.optim's
// formulas (single-tensor path, foreach=False): the element arithmetic of
// kernels/optimizer_math.h, shared with CUDA, in cpu_vec.h's vector loop. This file and
// cpu_vec.cpp are compiled with -ffp-contract=off (kernels/CMakeLists.txt): the host update
// must round as the device's does.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"
#include "kernels/optimizer_math.h"

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
  const OptimizerScalars a = optimizer_scalars(h);
  for_chunks(param.numel(), [&](std::int64_t off, std::int64_t len) {
    float bp[kChunk], bg[kChunk], b0[kChunk], b1[kChunk];
    float op_[kChunk], o0[kChunk], o1[kChunk];
    const float* p_in = read_f32(param, off, len, bp);
    const float* g_in = read_f32(grad, off, len, bg);
    // A kind without a state reads zeros and writes into scratch: a branch-free loop.
    if (nstate < 2) std::fill_n(b1, len, 0.0f);
    if (nstate < 1) std::fill_n(b0, len, 0.0f);
    const float* s0_in = nstate >= 1 ? read_f32(*state0, off, len, b0) : b0;
    const float* s1_in = nstate >= 2 ? read_f32(*state1, off, len, b1) : b1;
    float* p = dest_f32(param, off, op_);
    float* s0 = nstate >= 1 ? dest_f32(*state0, off, o0) : o0;
    float* s1 = nstate >= 2 ? dest_f32(*state1, off, o1) : o1;
    // The element loop, vectorised for the CPU at hand (cpu_vec.h: the same bits on every
    // path, no FMA): element j reads and writes only index j.
    vec::optimizer_step(a, p_in, g_in, s0_in, s1_in, p, s0, s1, len);
    write_f32(param, off, len, p);
    if (nstate >= 1) write_f32(*state0, off, len, s0);
    if (nstate >= 2) write_f32(*state1, off, len, s1);
  });
}

}  // namespace memtrade::cpu
