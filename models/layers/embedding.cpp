#include "models/layers/embedding.h"

#include "models/layers/loss.h"

namespace memtrade {

Tensor embedding_forward(LayerCtx& c, const Tensor& tokens, const Embedding& e) {
  const std::int64_t B = tokens.dim(0), T = tokens.dim(1);
  const Tensor& wte = c.weight(e.wte);
  const std::int64_t C = wte.dim(1);
  // Under autocast: the weights' dtype, fp32 (embedding is on no autocast list).
  Tensor out = c.dev.empty({B, T, C}, c.out_dtype(Op::embedding, wte), Category::activations);
  c.ops().embedding_forward(out, tokens, wte, e.wpe >= 0 ? &c.weight(e.wpe) : nullptr);
  out.reshape({B * T, C});
  if (c.save) c.keep("tokens", copy_for_backward(c, tokens));
  return out;
}

void embedding_backward(LayerCtx& c, Tensor& dout, const Embedding& e) {
  const Tensor& tokens = c.get("tokens");
  const Shape flat = dout.shape();
  dout.reshape({tokens.dim(0), tokens.dim(1), flat[1]});  // the op wants (B, T, C)
  GradRef gte = c.store.grad(e.wte);
  if (e.wpe < 0) {
    c.ops().embedding_backward(&gte.t, nullptr, dout, tokens, gte.accumulate);
    dout.reshape(flat);
    return;
  }
  GradRef gpe = c.store.grad(e.wpe);
  if (gte.accumulate == gpe.accumulate) {
    c.ops().embedding_backward(&gte.t, &gpe.t, dout, tokens, gte.accumulate);
  } else {
    c.ops().embedding_backward(&gte.t, nullptr, dout, tokens, gte.accumulate);
    c.ops().embedding_backward(nullptr, &gpe.t, dout, tokens, gpe.accumulate);
  }
  dout.reshape(flat);
}

}  // namespace memtrade
