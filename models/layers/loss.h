// Cross-entropy head: per-row losses from logits, saved logits and a copy of the targets.
#pragma once

#include "models/layers/context.h"

namespace memtrade {

// logits (N, V), moved in (saved as "logits"); targets (N) I32 (copied to "targets" when
// training). Returns losses (N) F32, category activations (the model's output). Under autocast
// the loss is an fp32 op: 16-bit logits are cast to fp32 and the cast is what is saved (PyTorch
// keeps log_softmax's fp32 output instead: the same bytes).
Tensor crossentropy_loss_forward(LayerCtx& c, Tensor logits, const Tensor& targets);
// dlogits (N, V) (a temporary) = (softmax - onehot) · dloss, in `logits_dtype`, the dtype the
// logits had before crossentropy_loss_forward cast them (computed in the saved logits' dtype and
// cast back, as autograd does); frees the saved logits first.
Tensor crossentropy_loss_backward(LayerCtx& c, float dloss, DType logits_dtype);

// Vocabulary-parallel cross-entropy (Megatron's vocab_parallel_cross_entropy): logits (N, Vr)
// are this rank's columns [vocab_offset, vocab_offset + Vr) of the full vocabulary. Each rank
// reduces its columns to (max, Σ exp, target logit) per row, the tp group all-gathers those
// (N, 3) stats and every rank combines them into the same losses (N) F32 and log-sum-exp; saved:
// the logits (as crossentropy_loss_forward), "lse" (N) F32 and the targets. Megatron all-reduces
// the max, then the sums and the target logits (three collectives of (N)); one gather of the
// three is the same arithmetic, each rank's sum taken against its own max.
Tensor vocab_parallel_loss_forward(LayerCtx& c, Tensor logits, const Tensor& targets,
                                   std::int64_t vocab_offset);
// dlogits (N, Vr) = (softmax − onehot) · dloss over this rank's columns, in `logits_dtype`.
Tensor vocab_parallel_loss_backward(LayerCtx& c, float dloss, DType logits_dtype,
                                    std::int64_t vocab_offset);

// A device copy of `t` with category c.cat() (for inputs that backward needs).
Tensor copy_for_backward(LayerCtx& c, const Tensor& t);
// `t` itself for backward: a view of its bytes (no allocation), as autograd saves a tensor it
// was handed rather than a copy. For the model input, which Model::forward's caller keeps alive
// and unchanged until backward.
Tensor saved_in_place(const Tensor& t);

}  // namespace memtrade
