// Tensor and sequence parallelism's layer pieces (Megatron-LM, Shoeybi et al. 2019; Korthikanti
// et al. 2022): the split a model is built for, the parameter slices, and the four regions that
// join the parallel layers, each a forward and its backward (megatron/core/tensor_parallel/
// mappings.py):
//
//   entering a column-parallel layer (qkv, fc, gate/up, the vocabulary-parallel head):
//     SP off  copy_to_tensor_model_parallel_region      identity      /  all-reduce of dx
//     SP on   gather_from_sequence_parallel_region      all-gather    /  reduce-scatter of dx
//   leaving a row-parallel layer (attention proj, MLP down/c_proj, the vocabulary embedding):
//     SP off  reduce_from_tensor_model_parallel_region  all-reduce    /  identity
//     SP on   reduce_scatter_to_sequence_parallel_region reduce-scatter / all-gather of dx
//
// Under sequence parallelism the residual stream, the norms and what they save hold this rank's
// tokens only: rows [offset, offset + count) of the flattened (B·T) tokens, even parts of
// ceil(B·T / tp) rows (Megatron splits the sequence of its (s, b, h) layout; the rows of
// (b, s, h) split the same bytes per rank). A layer never tests its rank: the split sizes are in
// the types, and the collectives are LayerCtx::tp's (none for one rank).
#pragma once

#include <cstdint>

#include "models/layers/linear.h"

namespace memtrade {

// The tensor-parallel split a model is built for: `size` ranks, this one `rank`.
struct TpSplit {
  int size = 1;
  int rank = 0;
  // This rank's slice of a dimension of `n` split in `groups` equal groups (n % groups == 0, and
  // each group's n / groups % size == 0, checked by the model): [offset, offset + count).
  TpSlice even(int dim, std::int64_t n, std::int64_t groups = 1) const;
  // The vocabulary: ceil(V / size) rows each, the last ones shorter (no padding: Megatron pads
  // to a multiple of 128·tp instead, which changes the model).
  TpSlice vocab(std::int64_t vocab) const;
};

// ---- the regions --------------------------------------------------------------------------------
// Token rows of this rank under sequence parallelism, of `rows` in all.
Part sequence_part(const LayerCtx& c, std::int64_t rows);

// Entering a column-parallel layer: the input every rank's slice reads, (B·T, C), from x: SP on,
// all-gathered from every rank's tokens into `holder` (category `cat`); otherwise x itself.
const Tensor& enter_column_parallel(LayerCtx& c, const Tensor& x, Tensor& holder, Category cat);
// Its backward: dx (B·T, C) of this rank's slice -> the gradient of the input: SP off, summed
// over the ranks in place (returned); SP on, reduce-scattered to this rank's tokens (a new
// temporary; dx freed).
Tensor enter_column_parallel_grad(LayerCtx& c, Tensor dx);
// Leaving a row-parallel layer: this rank's partial output (B·T, C) -> SP off, summed over the
// ranks in place (returned); SP on, reduce-scattered to this rank's tokens (a new tensor of the
// partial's category; the partial freed).
Tensor leave_row_parallel(LayerCtx& c, Tensor partial);
// Its backward: d(output) -> d(partial) (B·T, C): SP off, dout itself; SP on, all-gathered into
// `holder` (a temporary).
const Tensor& leave_row_parallel_grad(LayerCtx& c, const Tensor& dout, Tensor& holder);
// This rank's rows of a tensor every rank holds whole (Megatron's
// scatter_to_sequence_parallel_region: a copy, category `cat`); without SP, `full` itself.
Tensor scatter_tokens(LayerCtx& c, Tensor full, Category cat);

// The token rows of the whole batch, from this rank's under sequence parallelism.
std::int64_t whole_tokens(const LayerCtx& c, std::int64_t mine);

// RowParallelLinear (Megatron): `l` holds this rank's input columns (OC, IC/tp); out (N, OC)
// comes back reduced over the ranks (leave_row_parallel: all rows, or this rank's tokens under
// SP), the bias added once after the reduction. `out` is allocated by the caller as for
// linear_forward and replaced by the reduced tensor. On one rank: linear_forward itself.
void row_parallel_forward(LayerCtx& c, Tensor& out, const Tensor& inp, const Linear& l);
// dinp (N, IC/tp) and the gradients of this rank's slice, from dout (this rank's tokens under SP)
// and the forward input.
void row_parallel_backward(LayerCtx& c, Tensor* dinp, const Tensor& dout, const Tensor& inp,
                           const Linear& l);

// A bias added after a row-parallel layer's reduction (Megatron's RowParallelLinear adds it to
// the reduced output, once): out (N, C) += bias, and its gradient Σ_rows dout (ParamGrad). As a
// rank-one GEMM with a column of ones, exact: 1·b + y rounds once, as y + b.
void add_row_bias(LayerCtx& c, Tensor& out, ParamIndex bias);
void add_row_bias_backward(LayerCtx& c, const Tensor& dout, ParamIndex bias);

}  // namespace memtrade
