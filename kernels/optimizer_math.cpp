// Compiled with -ffp-contract=off (kernels/CMakeLists.txt): see kernels/optimizer_math.h.
#include "kernels/optimizer_math.h"

namespace memtrade {

OptimizerScalars optimizer_scalars(const OptimizerHyper& h) {
  const double step = static_cast<double>(h.step);
  OptimizerScalars a{};
  a.kind = h.kind;
  a.lr = h.lr;
  a.wd = h.weight_decay;
  a.eps = h.eps;
  a.momentum = h.momentum;
  a.dampening = h.dampening;
  a.beta1 = h.beta1;
  a.beta2 = h.beta2;
  a.alpha = h.alpha;
  a.grad_scale = h.grad_scale;
  // Adam's bias correction and Adagrad's decayed lr in double, like Python floats, then fp32.
  a.step_size = static_cast<float>(h.lr / (1.0 - std::pow(double{h.beta1}, step)));
  a.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double{h.beta2}, step)));
  a.clr = static_cast<float>(h.lr / (1.0 + (step - 1.0) * h.lr_decay));
  a.nesterov = h.nesterov;
  a.first_step = h.step == 1;
  return a;
}

}  // namespace memtrade
