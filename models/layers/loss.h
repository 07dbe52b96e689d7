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

// A device copy of `t` with category c.cat() (for inputs that backward needs).
Tensor copy_for_backward(LayerCtx& c, const Tensor& t);

}  // namespace memtrade
