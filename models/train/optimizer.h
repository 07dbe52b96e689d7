// Optimizer: PyTorch's optimizers (torch.optim defaults) on top of Ops::optimizer_update.
//
// The update formulas live in the ops (one fused multi-tensor kernel on CUDA); this class owns
// what torch.optim keeps between steps: the per-parameter state tensors and the step count.
// State is created lazily at the first update of a parameter, as torch does, from the same
// allocator as the tensor being updated (device memory, or pinned host memory when the
// optimizer is offloaded) with category `optimizer`. Its dtype is the updated tensor's: fp32
// next to an fp32 master or fp32 weight, 16-bit in the pure-precision modes.
//
// What an update holds besides the state is how torch.optim runs it (OptimizerImpl, the
// `optimizer_impl` knob), transcribed from torch/optim of PyTorch 2.x as of 2025 (main after
// 2.8, read at the mirror cyyever/pytorch: adam.py b1d94d6, adagrad.py and rmsprop.py 7b617ae;
// adam.py, adamw.py, adagrad.py, rmsprop.py, sgd.py; memtrade's hyper-parameters: no amsgrad,
// maximize, centered,
// RMSprop momentum or L2 weight decay outside AdamW's decoupled one), category temporaries,
// the updated tensor's dtype and shape (n: one parameter, N: every parameter of a group):
//
// - sgd, sgd-momentum: none (foreach: in-place _foreach_add_; forloop: param.add_).
// - adam, adamw: foreach exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs), N (div_, add_ in place,
//   then addcdiv_); forloop denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps): the sqrt (n), then
//   the quotient (n), then the sqrt freed.
// - adagrad: foreach std = _foreach_sqrt(state_sums), N, and numerator = _foreach_mul(grads,
//   minus_clr), N, both live; forloop std = state_sum.sqrt().add_(eps), n.
// - rmsprop: foreach avg = _foreach_sqrt(square_avgs), N; forloop avg = square_avg.sqrt(), n.
//
// A local of torch's function keeps its value until it is assigned again, after the new value
// is made: the previous parameter's (or group's) temporaries are freed only once the next
// one's exist, and the last ones when the step returns. fused (fused=True) makes none; its
// kernel is memtrade's fused update. The arithmetic is the same in all three: only the
// allocations differ (tests/models/test_trainer_optimizers.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/ops.h"
#include "models/config/config.h"

namespace memtrade {

// Learning rate used when the config says 0: per optimizer, tuned so that the tiny models of
// each family train visibly within 100 steps (see tests/models/test_trainer_convergence.cpp).
float default_lr(OptimizerKind kind, std::string_view family);

// torch.optim's defaults for `kind` with learning rate `lr` (0: default_lr(kind, family)).
// The one deliberate difference: sgd-momentum uses momentum 0.9 (torch's default is 0, which
// would make it plain SGD; the knob means "SGD with momentum").
OptimizerHyper default_hyper(OptimizerKind kind, std::string_view family, float lr);

class Optimizer {
 public:
  // `impl` decides the temporaries of update_many (fused: none). Throws std::invalid_argument
  // for an L2 weight decay outside AdamW with foreach or forloop (torch's grad.add(param)
  // temporaries are not modelled: memtrade's hyper-parameters never have one).
  Optimizer(const OptimizerHyper& hyper, int num_params, OptimizerImpl impl = OptimizerImpl::fused);

  // One update of parameter `index`: `param` (an fp32 master, an fp32 weight, or a 16-bit
  // weight in pure precision) moves along `grad` (same numel, any float dtype). `ops` must be
  // able to address both tensors (the device's ops, or CPU ops for pinned host tensors).
  // State tensors are created (zero, or adagrad's initial_accumulator_value) at the first call.
  // grad_scale multiplies the gradient as it is read (the loss scaler's 1/scale).
  void update(Ops& ops, int index, Tensor& param, const Tensor& grad, float grad_scale = 1.0f);
  // The same for many parameters (states created first, in order), with the temporaries of
  // `impl`: fused in one Ops::optimizer_update_many call, foreach one call per dtype group,
  // forloop one Ops::optimizer_update per parameter.
  struct Item {
    int index;
    Tensor* param;
    const Tensor* grad;
  };
  void update_many(Ops& ops, std::span<const Item> items, float grad_scale = 1.0f);
  // Called once after every parameter was updated: the step count advances. A skipped step
  // (fp16 overflow) calls neither update() nor finish_step(), so it does not count.
  void finish_step() { ++steps_; }

  std::int64_t steps() const { return steps_; }  // optimizer steps taken
  const OptimizerHyper& hyper() const { return hyper_; }
  OptimizerImpl impl() const { return impl_; }
  // State tensors of parameter `index` (undefined before its first update, or when the kind
  // has fewer), for introspection.
  const Tensor& state(int index, int which) const;
  std::int64_t state_bytes() const;  // sum of nbytes() over every state tensor

 private:
  // Checks `index` against the parameter, creates its states if needed; the slot to update.
  OptimizerSlot prepare(Ops& ops, int index, Tensor& param, const Tensor& grad);
  OptimizerHyper step_hyper(float grad_scale) const;

  void update_foreach(Ops& ops, const OptimizerHyper& h, std::span<const OptimizerSlot> slots);
  void update_forloop(Ops& ops, const OptimizerHyper& h, std::span<const OptimizerSlot> slots);

  OptimizerHyper hyper_;
  OptimizerImpl impl_;
  std::int64_t steps_ = 0;
  std::vector<Tensor> state0_, state1_;
};

}  // namespace memtrade
