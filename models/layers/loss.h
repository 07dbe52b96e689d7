// Cross-entropy head: per-row losses from logits, saved logits and a copy of the targets.
#pragma once

#include "models/layers/context.h"

namespace memtrade {

// logits (N, V), moved in (saved as "logits"); targets (N) I32 (copied to "targets" when
// training). Returns losses (N) F32, category activations (the model's output).
Tensor crossentropy_loss_forward(LayerCtx& c, Tensor logits, const Tensor& targets);
// dlogits (N, V) (a temporary) = (softmax - onehot) · dloss; frees the saved logits.
Tensor crossentropy_loss_backward(LayerCtx& c, float dloss);

// A device copy of `t` with category c.cat() (for inputs that backward needs).
Tensor copy_for_backward(LayerCtx& c, const Tensor& t);

}  // namespace memtrade
