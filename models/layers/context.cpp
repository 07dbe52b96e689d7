#include "models/layers/context.h"

#include <cstddef>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace memtrade {
namespace {

// Key of a weight's cast in a segment of SavedTensors.
std::string cast_key(ParamIndex index) {
  return fmt::format("cast.{}", index);
}

}  // namespace

void copy_columns(LayerCtx& c, Tensor& part, const Tensor& src, std::int64_t col) {
  const std::size_t es = dtype_size(src.dtype()), w = static_cast<std::size_t>(part.dim(1)) * es;
  if (part.dtype() != src.dtype() || part.dim(0) != src.dim(0) || col + part.dim(1) > src.dim(1))
    throw std::logic_error("copy_columns: part does not fit its source");
  c.dev.copy_2d(part.data(), w,
                static_cast<const std::byte*>(src.data()) + static_cast<std::size_t>(col) * es,
                static_cast<std::size_t>(src.dim(1)) * es, w, static_cast<std::size_t>(src.dim(0)),
                CopyKind::device_to_device);
}

void place_columns(LayerCtx& c, Tensor& dst, std::int64_t col, const Tensor& part) {
  const std::size_t es = dtype_size(dst.dtype()), w = static_cast<std::size_t>(part.dim(1)) * es;
  if (part.dtype() != dst.dtype() || part.dim(0) != dst.dim(0) || col + part.dim(1) > dst.dim(1))
    throw std::logic_error("place_columns: part does not fit its destination");
  c.dev.copy_2d(static_cast<std::byte*>(dst.data()) + static_cast<std::size_t>(col) * es,
                static_cast<std::size_t>(dst.dim(1)) * es, part.data(), w, w,
                static_cast<std::size_t>(dst.dim(0)), CopyKind::device_to_device);
}

DType LayerCtx::in_dtype(Op op, DType in, DType other) const {
  if (!amp) return act;
  return autocast::rule(amp->policy, op).input_dtype(amp->dtype, in, other);
}

DType LayerCtx::out_dtype(Op op, DType in, DType other) const {
  if (!amp) return act;
  return autocast::rule(amp->policy, op).output_dtype(amp->dtype, in, other);
}

void LayerCtx::expect_input(Op op, const Tensor& t) const {
  if (t.dtype() != in_dtype(op, t))
    throw std::logic_error(fmt::format("{} reads {}, got a {} input {}", autocast::op_name(op),
                                       dtype_name(in_dtype(op, t)), dtype_name(t.dtype()),
                                       shape_str(t.shape())));
}

Tensor LayerCtx::cast_input(Op op, Tensor t) {
  Tensor holder;
  cast_input(op, t, holder);
  return holder.defined() ? std::move(holder) : std::move(t);
}

const Tensor& LayerCtx::cast_input(Op op, const Tensor& t, Tensor& holder) {
  const DType dt = in_dtype(op, t);
  if (dt == t.dtype()) return t;
  holder = dev.empty(t.shape(), dt, cat());
  ops().cast(holder, t);
  return holder;
}

DType LayerCtx::weight_dtype(Op op, ParamIndex index) {
  const DType stored = store.weight(index).dtype();
  return amp ? in_dtype(op, stored, stored) : stored;
}

const Tensor& LayerCtx::op_weight(Op op, ParamIndex index, bool kept) {
  const DType dt = weight_dtype(op, index);
  if (dt == store.weight(index).dtype()) return store.weight(index);
  const std::string key = cast_key(index);
  if (kept && has(key)) return get(key);
  if (kept && backward && !recompute)
    throw std::logic_error(fmt::format(
        "segment {}: the cast of weight {} was not kept by forward; backward reads it from there",
        segment, index));
  std::shared_ptr<Tensor> cast = store.weight_cast(index, dt, ops());
  if (kept && save) saved.share(segment, key, cast);
  return *cast;  // the cache holds it until the autocast region ends
}

void LayerCtx::release_weight_cast(ParamIndex index) {
  const std::string key = cast_key(index);
  if (has(key)) saved.unshare(segment, key);
}

Tensor LayerCtx::grad_as(Tensor g, DType dtype) {
  Tensor holder;
  grad_as(g, dtype, holder);
  return holder.defined() ? std::move(holder) : std::move(g);
}

const Tensor& LayerCtx::grad_as(const Tensor& g, DType dtype, Tensor& holder) {
  if (g.dtype() == dtype) return g;
  holder = temp(g.shape(), dtype);
  ops().cast(holder, g);
  return holder;
}

AccumulateBuffer LayerCtx::accumulate_buffer(ParamIndex index, const GradRef& g) {
  AccumulateBuffer b;
  const bool hold = hold_next_ == index;
  if (hold) hold_next_ = -1;
  if (auto it = held_grads_.find(index); it != held_grads_.end() && !hold) {
    b.held = std::move(it->second);
    held_grads_.erase(it);
  }
  if (!g.accumulate) return b;  // eager's buffer becomes the gradient: `g.t` is it
  Tensor fresh = temp(g.t.shape(), g.t.dtype());
  if (!hold) {
    b.fresh = std::move(fresh);
    return b;
  }
  b.fresh = Tensor::view(fresh, 0, fresh.numel());
  b.fresh.reshape(g.t.shape());
  held_grads_[index] = std::move(fresh);
  return b;
}

ParamGrad::ParamGrad(LayerCtx& c, ParamIndex index, DType computed_in, bool eager_buffer)
    : c_(c), index_(index), eager_buffer_(eager_buffer) {
  if (computed_in == c.store.weight(index).dtype()) {
    GradRef g = c.store.grad(index);
    grad_ = &g.t;
    accumulate_ = g.accumulate;
    if (eager_buffer_) buffer_ = c.accumulate_buffer(index, g);
    return;
  }
  computed_ = c.temp(c.store.weight(index).shape(), computed_in);
}

void ParamGrad::finish() {
  if (!computed_.defined()) {
    buffer_ = {};
    return;
  }
  GradRef g = c_.store.grad(index_);
  // ToCopyBackward's fp32 output is eager's buffer, which AccumulateGrad adds in.
  AccumulateBuffer b = eager_buffer_ ? c_.accumulate_buffer(index_, g) : AccumulateBuffer{};
  if (!g.accumulate) {
    c_.ops().cast(g.t, computed_);
  } else {
    Tensor wide = b.fresh.defined() ? Tensor() : c_.temp(g.t.shape(), g.t.dtype());
    Tensor& into = b.fresh.defined() ? b.fresh : wide;
    c_.ops().cast(into, computed_);
    computed_.reset();
    c_.ops().add_inplace(g.t, into);
  }
  computed_.reset();
}

}  // namespace memtrade
