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

Optimizer::Optimizer(const OptimizerHyper& hyper, int num_params, OptimizerImpl impl)
    : hyper_(hyper),
      impl_(impl),
      state0_(static_cast<std::size_t>(num_params)),
      state1_(static_cast<std::size_t>(num_params)) {
  if (impl != OptimizerImpl::fused && hyper.weight_decay != 0.0f &&
      hyper.kind != OptimizerKind::adamw)
    throw std::invalid_argument(fmt::format(
        "optimizer {} with L2 weight decay {}: the temporaries of torch's {} path are not "
        "modelled (only AdamW's decoupled decay is)",
        optimizer_name(hyper.kind), hyper.weight_decay, optimizer_impl_name(impl)));
}

namespace {

// A temporary like `t` (torch's ops return a fresh tensor of the input's shape and dtype).
Tensor temporary_like(const Tensor& t) {
  return Tensor(*t.allocator(), t.shape(), t.dtype(), Category::temporaries);
}

// A Python list of tensors dies item by item from the end (CPython's list_dealloc).
void release(std::vector<Tensor>& values) {
  for (auto it = values.rbegin(); it != values.rend(); ++it) it->reset();
  values.clear();
}

// `local = fresh`: Python evaluates the new value before it drops the old one.
void assign(std::vector<Tensor>& local, std::vector<Tensor> fresh) {
  std::swap(local, fresh);
  release(fresh);
}

// One output per tensor of the group, as a _foreach_ op (or a per-tensor op) makes them.
std::vector<Tensor> outputs_like(std::span<const OptimizerSlot> slots) {
  std::vector<Tensor> out;
  out.reserve(slots.size());
  for (const OptimizerSlot& s : slots) out.push_back(temporary_like(*s.param));
  return out;
}

}  // namespace

void Optimizer::update_foreach(Ops& ops, const OptimizerHyper& h,
                               std::span<const OptimizerSlot> slots) {
  // Optimizer._group_tensors_by_device_and_dtype: groups in order of first appearance, each
  // keeping its tensors' order (one device here).
  std::vector<std::vector<OptimizerSlot>> groups;
  std::vector<DType> keys;
  for (const OptimizerSlot& s : slots) {
    std::size_t g = 0;
    while (g < keys.size() && keys[g] != s.param->dtype()) ++g;
    if (g == keys.size()) {
      keys.push_back(s.param->dtype());
      groups.emplace_back();
    }
    groups[g].push_back(s);
  }
  // The locals of _multi_tensor_<kind> that hold temporaries, reassigned group by group.
  std::vector<Tensor> first, second;
  for (const auto& group : groups) {
    switch (h.kind) {
      case OptimizerKind::adam:
      case OptimizerKind::adamw:    // exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)
      case OptimizerKind::rmsprop:  // avg = torch._foreach_sqrt(grouped_square_avgs)
        assign(first, outputs_like(group));
        break;
      case OptimizerKind::adagrad:  // std = _foreach_sqrt(...); numerator = _foreach_mul(...)
        assign(first, outputs_like(group));
        assign(second, outputs_like(group));
        break;
      case OptimizerKind::sgd:
      case OptimizerKind::sgd_momentum:  // in place: torch._foreach_add_(params, grads)
        break;
    }
    ops.optimizer_update_many(h, group);
  }
  release(first);  // the function returns: its locals die
  release(second);
}

void Optimizer::update_forloop(Ops& ops, const OptimizerHyper& h,
                               std::span<const OptimizerSlot> slots) {
  std::vector<Tensor> local;  // denom (adam, adamw), std (adagrad), avg (rmsprop)
  for (const OptimizerSlot& s : slots) {
    switch (h.kind) {
      case OptimizerKind::adam:
      case OptimizerKind::adamw: {
        // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps): the sqrt lives until
        // the division has made its output.
        Tensor sqrt = temporary_like(*s.param);
        std::vector<Tensor> denom;
        denom.push_back(temporary_like(*s.param));
        sqrt.reset();
        assign(local, std::move(denom));
        break;
      }
      case OptimizerKind::adagrad:    // std = state_sum.sqrt().add_(eps)
      case OptimizerKind::rmsprop: {  // avg = square_avg.sqrt(); avg = avg.add_(eps)
        std::vector<Tensor> value;
        value.push_back(temporary_like(*s.param));
        assign(local, std::move(value));
        break;
      }
      case OptimizerKind::sgd:
      case OptimizerKind::sgd_momentum:  // param.add_(d_p, alpha=-lr)
        break;
    }
    ops.optimizer_update(h, *s.param, *s.grad, s.state0, s.state1);
  }
  release(local);
}

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
  const OptimizerHyper h = step_hyper(grad_scale);
  switch (impl_) {
    case OptimizerImpl::fused:
      ops.optimizer_update_many(h, slots);
      break;
    case OptimizerImpl::foreach:
      update_foreach(ops, h, slots);
      break;
    case OptimizerImpl::forloop:
      update_forloop(ops, h, slots);
      break;
  }
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
