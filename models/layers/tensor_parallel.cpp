#include "models/layers/tensor_parallel.h"

#include <cstddef>

namespace memtrade {

TpSlice TpSplit::even(int dim, std::int64_t n, std::int64_t groups) const {
  if (size == 1) return TpSlice{};
  const std::int64_t per = n / groups / size;
  return TpSlice{dim, n, groups, per * rank, per};
}

TpSlice TpSplit::vocab(std::int64_t vocab) const {
  if (size == 1) return TpSlice{};
  const Part p = even_part(vocab, size, rank);
  return TpSlice{0, vocab, 1, p.offset, p.count};
}

namespace {

// Element counts of every rank's token rows (C elements each): the collectives' parts.
std::vector<std::int64_t> token_counts(const LayerCtx& c, std::int64_t rows, std::int64_t width) {
  std::vector<std::int64_t> counts = even_parts(rows, c.tp->size());
  for (std::int64_t& n : counts) n *= width;
  return counts;
}

// The whole (B·T) rows of a tensor that holds this rank's: every rank holds (B·T) / tp rows
// (the decoder refuses sequence parallelism where tp does not divide B·T).
std::int64_t whole_rows(const LayerCtx& c, std::int64_t mine) {
  return mine * c.tp->size();
}

}  // namespace

Part sequence_part(const LayerCtx& c, std::int64_t rows) {
  if (c.tp == nullptr || !c.sequence_parallel) return Part{0, rows};
  return even_part(rows, c.tp->size(), c.tp->rank());
}

const Tensor& enter_column_parallel(LayerCtx& c, const Tensor& x, Tensor& holder, Category cat) {
  if (c.tp == nullptr || !c.sequence_parallel) return x;
  const std::int64_t rows = whole_rows(c, x.dim(0)), width = x.dim(1);
  holder = c.dev.empty({rows, width}, x.dtype(), cat);
  c.tp->all_gather(x, holder, token_counts(c, rows, width));
  return holder;
}

Tensor enter_column_parallel_grad(LayerCtx& c, Tensor dx) {
  if (c.tp == nullptr) return dx;
  if (!c.sequence_parallel) {
    c.tp->all_reduce(dx);
    return dx;
  }
  const std::int64_t rows = dx.dim(0), width = dx.dim(1);
  const std::vector<std::int64_t> counts = token_counts(c, rows, width);
  Tensor part = c.temp({counts[static_cast<std::size_t>(c.tp->rank())] / width, width}, dx.dtype());
  c.tp->reduce_scatter(dx, part, counts);
  return part;
}

Tensor leave_row_parallel(LayerCtx& c, Tensor partial) {
  if (c.tp == nullptr) return partial;
  if (!c.sequence_parallel) {
    c.tp->all_reduce(partial);
    return partial;
  }
  const std::int64_t rows = partial.dim(0), width = partial.dim(1);
  const std::vector<std::int64_t> counts = token_counts(c, rows, width);
  Tensor part = c.dev.empty({counts[static_cast<std::size_t>(c.tp->rank())] / width, width},
                            partial.dtype(), partial.category());
  c.tp->reduce_scatter(partial, part, counts);
  return part;
}

const Tensor& leave_row_parallel_grad(LayerCtx& c, const Tensor& dout, Tensor& holder) {
  if (c.tp == nullptr || !c.sequence_parallel) return dout;
  const std::int64_t rows = whole_rows(c, dout.dim(0)), width = dout.dim(1);
  holder = c.temp({rows, width}, dout.dtype());
  c.tp->all_gather(dout, holder, token_counts(c, rows, width));
  return holder;
}

Tensor scatter_tokens(LayerCtx& c, Tensor full, Category cat) {
  if (c.tp == nullptr || !c.sequence_parallel) return full;
  const std::int64_t width = full.dim(1);
  const Part p = sequence_part(c, full.dim(0));
  Tensor part = c.dev.empty({p.count, width}, full.dtype(), cat);
  const std::size_t row = static_cast<std::size_t>(width) * dtype_size(full.dtype());
  c.dev.copy(part.data(),
             static_cast<const std::byte*>(full.data()) + static_cast<std::size_t>(p.offset) * row,
             part.nbytes(), CopyKind::device_to_device);
  return part;
}

std::int64_t whole_tokens(const LayerCtx& c, std::int64_t mine) {
  return c.tp == nullptr || !c.sequence_parallel ? mine : whole_rows(c, mine);
}

void row_parallel_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const Linear& l) {
  if (c.tp == nullptr) {
    linear_forward(c, out, inp, l);
    return;
  }
  linear_forward(c, out, inp, Linear{l.weight, -1, l.input_grad});
  out = leave_row_parallel(c, std::move(out));
  add_row_bias(c, out, l.bias);
}

void row_parallel_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout, const Tensor& inp,
                           const Linear& l) {
  if (c.tp == nullptr) {
    linear_backward(c, dinp, dout, inp, l);
    return;
  }
  add_row_bias_backward(c, dout, l.bias);
  Tensor gathered;
  const Tensor& full = leave_row_parallel_grad(c, dout, gathered);
  linear_backward(c, dinp, full, inp, Linear{l.weight, -1, l.input_grad});
}

void add_row_bias(LayerCtx& c, Tensor& out, ParamIndex bias) {
  if (bias < 0) return;
  const Tensor& b = c.op_weight(Op::linear, bias, false);
  const std::int64_t rows = out.dim(0), width = out.dim(1);
  Tensor ones = c.temp({rows, 1}, out.dtype());
  c.ops().fill(ones, 1.0f);
  Tensor row = c.temp({1, width}, b.dtype());
  c.dev.copy(row.data(), b.data(), b.nbytes(), CopyKind::device_to_device);
  c.ops().matmul(out, ones, row, false, false, 1.0f, 1.0f);
}

void add_row_bias_backward(LayerCtx& c, const Tensor& dout_in, ParamIndex bias) {
  if (bias < 0) return;
  Tensor dout_cast;
  const Tensor& dout = c.grad_as(dout_in, c.weight_dtype(Op::linear, bias), dout_cast);
  ParamGrad gb(c, bias, c.weight_dtype(Op::linear, bias));
  const std::int64_t rows = dout.dim(0), width = dout.dim(1);
  Tensor ones = c.temp({rows, 1}, dout.dtype());
  c.ops().fill(ones, 1.0f);
  Tensor& g = gb.t();
  g.reshape({1, width});
  c.ops().matmul(g, ones, dout, true, false, 1.0f, gb.accumulate() ? 1.0f : 0.0f);
  g.reshape({width});
  gb.finish();
}

}  // namespace memtrade
