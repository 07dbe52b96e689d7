// The arithmetic of one optimizer step on one element, shared by the CPU backend's loop
// (kernels/cpu/cpu_ops_optim.cpp) and the CUDA kernels (kernels/cuda/cuda_ops_optim.cu): the
// same operations in the same order on both. They must also round alike, bit for bit
// (kernels/ops.h, rounding rules): offload=optimizer and offload=params update on the host
// through the CPU ops, the plain run on the device, and the knob-equivalence tests expect the
// same weights either way.
//
// So every fp32 operation here is rounded on its own: never fused into an FMA, never
// approximate, never flushed to zero. On the device that is the __f*_rn intrinsics, which nvcc
// neither contracts nor approximates whatever --fmad or --use_fast_math say, in a file compiled
// with -ftz=false (the PTX of the optimizer kernels is scanned for all of it:
// tests/kernels/test_optimizer_rounding.cpp). On the host it is the plain operators in
// translation units compiled with -ffp-contract=off, so that a -march with FMA does not contract
// them either (kernels/CMakeLists.txt sets both flags).
#pragma once

#include <cmath>
#include <type_traits>

#include "kernels/ops.h"

#if defined(__CUDACC__)
#define MEMTRADE_HOST_DEVICE __host__ __device__
#else
#define MEMTRADE_HOST_DEVICE
#endif

namespace memtrade {

// OptimizerHyper for one step as the element arithmetic uses it: fp32 hyper-parameters and the
// step's scalars.
struct OptimizerScalars {
  OptimizerKind kind;
  float lr, wd, eps, momentum, dampening, beta1, beta2, alpha, grad_scale;
  float step_size, bc2_sqrt, clr;  // Adam's bias correction, Adagrad's decayed lr
  bool nesterov, first_step;
};

// Out of line (kernels/optimizer_math.cpp) so that both backends use one compiled computation.
OptimizerScalars optimizer_scalars(const OptimizerHyper& h);

// Separately rounded IEEE fp32 operations (round to nearest even).
namespace rn {
MEMTRADE_HOST_DEVICE inline float add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MEMTRADE_HOST_DEVICE inline float sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
MEMTRADE_HOST_DEVICE inline float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MEMTRADE_HOST_DEVICE inline float div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
MEMTRADE_HOST_DEVICE inline float sqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
}  // namespace rn

// One element of optimizer kind K with torch.optim's formulas (maximize=False, amsgrad=False,
// centered=False): w the parameter, g the gradient as stored (grad_scale is applied here: the
// loss scaler's unscale, fused), s0/s1 the states in fp32, read and written (unused by kinds
// without them). Returns the new parameter.
template <OptimizerKind K>
MEMTRADE_HOST_DEVICE inline float optimizer_element(const OptimizerScalars& a, float w, float g,
                                                    float& s0, float& s1) {
  g = rn::mul(g, a.grad_scale);
  if constexpr (K == OptimizerKind::adamw) {
    w = rn::mul(w, rn::sub(1.0f, rn::mul(a.lr, a.wd)));  // decoupled weight decay
  } else {
    g = rn::add(g, rn::mul(a.wd, w));  // L2
  }
  if constexpr (K == OptimizerKind::sgd) {
    return rn::sub(w, rn::mul(a.lr, g));
  } else if constexpr (K == OptimizerKind::sgd_momentum) {
    // torch creates the buffer from the first gradient (step 1), then decays it.
    s0 =
        a.first_step ? g : rn::add(rn::mul(a.momentum, s0), rn::mul(rn::sub(1.0f, a.dampening), g));
    g = a.nesterov ? rn::add(g, rn::mul(a.momentum, s0)) : s0;
    return rn::sub(w, rn::mul(a.lr, g));
  } else if constexpr (K == OptimizerKind::adam || K == OptimizerKind::adamw) {
    s0 = rn::add(rn::mul(a.beta1, s0), rn::mul(rn::sub(1.0f, a.beta1), g));
    s1 = rn::add(rn::mul(a.beta2, s1), rn::mul(rn::mul(rn::sub(1.0f, a.beta2), g), g));
    const float denom = rn::add(rn::div(rn::sqrt(s1), a.bc2_sqrt), a.eps);
    return rn::sub(w, rn::div(rn::mul(a.step_size, s0), denom));
  } else if constexpr (K == OptimizerKind::adagrad) {
    s0 = rn::add(s0, rn::mul(g, g));
    return rn::sub(w, rn::div(rn::mul(a.clr, g), rn::add(rn::sqrt(s0), a.eps)));
  } else {
    static_assert(K == OptimizerKind::rmsprop);
    s0 = rn::add(rn::mul(a.alpha, s0), rn::mul(rn::mul(rn::sub(1.0f, a.alpha), g), g));
    return rn::sub(w, rn::div(rn::mul(a.lr, g), rn::add(rn::sqrt(s0), a.eps)));
  }
}

// f(std::integral_constant<OptimizerKind, K>{}) for the runtime kind: the CPU hoists the switch
// out of its loop, the CUDA kernels switch per element (uniform across a launch).
template <typename F>
MEMTRADE_HOST_DEVICE inline decltype(auto) dispatch_optimizer(OptimizerKind kind, F&& f) {
  switch (kind) {
    case OptimizerKind::sgd:
      return f(std::integral_constant<OptimizerKind, OptimizerKind::sgd>{});
    case OptimizerKind::sgd_momentum:
      return f(std::integral_constant<OptimizerKind, OptimizerKind::sgd_momentum>{});
    case OptimizerKind::adam:
      return f(std::integral_constant<OptimizerKind, OptimizerKind::adam>{});
    case OptimizerKind::adamw:
      return f(std::integral_constant<OptimizerKind, OptimizerKind::adamw>{});
    case OptimizerKind::adagrad:
      return f(std::integral_constant<OptimizerKind, OptimizerKind::adagrad>{});
    case OptimizerKind::rmsprop:
      break;
  }
  return f(std::integral_constant<OptimizerKind, OptimizerKind::rmsprop>{});
}

}  // namespace memtrade
