#include "models/train/optimizer.h"

#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {

float default_lr(OptimizerKind kind, std::string_view family) {
  // torch's own defaults where it has them (adam, adamw 1e-3; adagrad, rmsprop 1e-2), except
  // that the small MLP (a random-teacher classification) barely moves in 100 steps at Adam's
  // 1e-3 (last-10/first-10 loss 0.88 at batch 8) and takes 3e-3 (0.63). SGD has no default in
  // torch: 0.1 (the classic ImageNet/MNIST value), with momentum 0.9 a tenth of it, as its
  // effective step is 10x.
  const bool mlp = family == "mlp";
  switch (kind) {
    case OptimizerKind::sgd:
      return 0.1f;
    case OptimizerKind::sgd_momentum:
      return 0.01f;
    case OptimizerKind::adam:
      return mlp ? 3e-3f : 1e-3f;
    case OptimizerKind::adamw:
      return mlp ? 3e-3f : 1e-3f;
    case OptimizerKind::adagrad:
      return 1e-2f;
    case OptimizerKind::rmsprop:
      return 1e-2f;
  }
  return 1e-3f;
}

OptimizerHyper default_hyper(OptimizerKind kind, std::string_view family, float lr) {
  if (lr < 0.0f) throw std::invalid_argument(fmt::format("learning rate must be >= 0, got {}", lr));
  OptimizerHyper h;
  h.kind = kind;
  h.lr = lr > 0.0f ? lr : default_lr(kind, family);
  h.weight_decay = 0.0f;
  h.momentum = kind == OptimizerKind::sgd_momentum ? 0.9f : 0.0f;
  h.dampening = 0.0f;
  h.nesterov = false;
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  h.eps = 1e-8f;
  h.alpha = 0.99f;
  h.lr_decay = 0.0f;
  h.initial_accumulator_value = 0.0f;
  switch (kind) {
    case OptimizerKind::adamw:
      h.weight_decay = 1e-2f;
      break;
    case OptimizerKind::adagrad:
      h.eps = 1e-10f;
      break;
    default:
      break;
  }
  return h;
}

Optimizer::Optimizer(const OptimizerHyper& hyper, int num_params)
    : hyper_(hyper),
      state0_(static_cast<std::size_t>(num_params)),
      state1_(static_cast<std::size_t>(num_params)) {}

OptimizerSlot Optimizer::prepare(Ops& ops, int index, Tensor& param, const Tensor& grad) {
  if (index < 0 || static_cast<std::size_t>(index) >= state0_.size())
    throw std::out_of_range(fmt::format("optimizer: parameter index {} out of range", index));
  if (param.numel() != grad.numel())
    throw std::invalid_argument(fmt::format("optimizer: parameter {} and its gradient {} differ",
                                            shape_str(param.shape()), shape_str(grad.shape())));
  const int count = optimizer_state_count(hyper_.kind);
  Tensor* states[2] = {&state0_[index], &state1_[index]};
  for (int s = 0; s < count; ++s) {
    if (states[s]->defined()) continue;
    *states[s] = Tensor(*param.allocator(), param.shape(), param.dtype(), Category::optimizer);
    const bool adagrad_sum = hyper_.kind == OptimizerKind::adagrad;
    ops.fill(*states[s], adagrad_sum ? hyper_.initial_accumulator_value : 0.0f);
  }
  return OptimizerSlot{&param, &grad, count > 0 ? states[0] : nullptr,
                       count > 1 ? states[1] : nullptr};
}

OptimizerHyper Optimizer::step_hyper(float grad_scale) const {
  OptimizerHyper h = hyper_;
  h.step = steps_ + 1;  // 1-based, for Adam's bias correction and momentum's first step
  h.grad_scale = grad_scale;
  return h;
}

void Optimizer::update(Ops& ops, int index, Tensor& param, const Tensor& grad, float grad_scale) {
  const OptimizerSlot s = prepare(ops, index, param, grad);
  ops.optimizer_update(step_hyper(grad_scale), param, grad, s.state0, s.state1);
}

void Optimizer::update_many(Ops& ops, std::span<const Item> items, float grad_scale) {
  std::vector<OptimizerSlot> slots;
  slots.reserve(items.size());
  for (const Item& it : items) slots.push_back(prepare(ops, it.index, *it.param, *it.grad));
  ops.optimizer_update_many(step_hyper(grad_scale), slots);
}

const Tensor& Optimizer::state(int index, int which) const {
  return which == 0 ? state0_.at(static_cast<std::size_t>(index))
                    : state1_.at(static_cast<std::size_t>(index));
}

std::int64_t Optimizer::state_bytes() const {
  std::int64_t total = 0;
  for (const auto* v : {&state0_, &state1_})
    for (const auto& t : *v)
      if (t.defined()) total += static_cast<std::int64_t>(t.nbytes());
  return total;
}

}  // namespace memtrade
