#include "models/layers/loss.h"

namespace memtrade {

Tensor copy_for_backward(LayerCtx& c, const Tensor& t) {
  Tensor out = c.dev.empty(t.shape(), t.dtype(), c.cat());
  c.dev.copy(out.data(), t.data(), t.nbytes(), CopyKind::device_to_device);
  return out;
}

Tensor saved_in_place(const Tensor& t) {
  // The view writes nothing; Tensor::view takes a mutable base only because views in general
  // (a rank's part of a parameter) are written through.
  Tensor v = Tensor::view(const_cast<Tensor&>(t), 0, t.numel());
  v.reshape(t.shape());
  return v;
}

Tensor crossentropy_loss_forward(LayerCtx& c, Tensor logits, const Tensor& targets) {
  ScopedRange scope(c.dev, "cross_entropy");  // names the trace's allocations
  logits = c.cast_input(Op::crossentropy, std::move(logits));
  const std::int64_t N = logits.dim(0);
  Tensor losses = c.dev.empty({N}, DType::F32, Category::activations);  // (N)
  c.ops().crossentropy_forward(losses, logits, targets);
  c.keep("logits", std::move(logits));
  if (c.save) c.keep("targets", copy_for_backward(c, targets));
  return losses;
}

Tensor crossentropy_loss_backward(LayerCtx& c, float dloss, DType logits_dtype) {
  ScopedRange scope(c.dev, "cross_entropy");          // names the trace's allocations
  Tensor logits = c.saved.take(c.segment, "logits");  // (N, V)
  // Eager PyTorch runs F.cross_entropy as log_softmax + nll_loss, and its backward holds three
  // (N, V) buffers at once: the saved log_softmax output, NllLossBackward's gradient (at::zeros,
  // then −dloss at each target) and LogSoftmaxBackward's. The fused kernel below computes the
  // same dlogits from the logits alone; the zeroed buffer is NllLossBackward's, held (and
  // written, the memset eager makes) until LogSoftmaxBackward is done, so that the step's
  // memory is eager's. The N target entries it would then receive are folded into the kernel.
  Tensor dnll = c.temp_like(logits);
  c.ops().fill(dnll, 0.0f);
  Tensor dlogits = c.temp_like(logits);
  c.ops().crossentropy_backward(dlogits, logits, c.get("targets"), dloss);
  logits.reset();
  dnll.reset();
  return c.grad_as(std::move(dlogits), logits_dtype);
}

Tensor vocab_parallel_loss_forward(LayerCtx& c, Tensor logits, const Tensor& targets,
                                   std::int64_t vocab_offset) {
  ScopedRange scope(c.dev, "cross_entropy");  // names the trace's allocations
  logits = c.cast_input(Op::crossentropy, std::move(logits));
  const std::int64_t N = logits.dim(0);
  const int ranks = c.tp->size();
  Tensor losses = c.dev.empty({N}, DType::F32, Category::activations);  // (N)
  Tensor lse = c.dev.empty({N}, DType::F32, c.cat());                   // (N)
  {
    Tensor stats = c.temp({N, 3}, DType::F32);  // this rank's max, Σ exp, target logit per row
    c.ops().vocab_crossentropy_stats(stats, logits, targets, vocab_offset);
    Tensor all = c.temp({ranks, N, 3}, DType::F32);
    c.tp->all_gather(stats, all, std::vector<std::int64_t>(static_cast<std::size_t>(ranks), 3 * N));
    c.ops().vocab_crossentropy_combine(losses, lse, all, targets);
  }
  c.keep("logits", std::move(logits));
  c.keep("lse", std::move(lse));
  if (c.save) c.keep("targets", copy_for_backward(c, targets));
  return losses;
}

Tensor vocab_parallel_loss_backward(LayerCtx& c, float dloss, DType logits_dtype,
                                    std::int64_t vocab_offset) {
  ScopedRange scope(c.dev, "cross_entropy");          // names the trace's allocations
  Tensor logits = c.saved.take(c.segment, "logits");  // (N, Vr)
  Tensor dlogits = c.temp_like(logits);
  c.ops().vocab_crossentropy_backward(dlogits, logits, c.get("targets"), c.get("lse"), vocab_offset,
                                      dloss);
  logits.reset();
  return c.grad_as(std::move(dlogits), logits_dtype);
}

}  // namespace memtrade
