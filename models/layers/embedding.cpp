#include "models/layers/embedding.h"

#include "models/layers/loss.h"
#include "models/layers/tensor_parallel.h"

namespace memtrade {

namespace {

// wpe[t] added to (or, for the gradient, gathered from) every sample's rows: the batch as B
// views of (T·C) elements against the first T rows of wpe.
void add_positions(LayerCtx& c, Tensor& out, Tensor& wpe, std::int64_t B, std::int64_t T) {
  const std::int64_t C = out.dim(1);
  Tensor p = Tensor::view(wpe, 0, T * C);
  for (std::int64_t b = 0; b < B; ++b) {
    Tensor rows = Tensor::view(out, b * T * C, T * C);
    c.ops().add_inplace(rows, p);
  }
}

Tensor vocab_parallel_forward(LayerCtx& c, const Tensor& tokens, const Embedding& e) {
  const std::int64_t B = tokens.dim(0), T = tokens.dim(1);
  const Tensor& wte = c.weight(e.wte);
  const std::int64_t C = wte.dim(1);
  Tensor local = c.dev.empty({B, T}, DType::I32, c.cat());  // this rank's ids, −1 elsewhere
  c.ops().vocab_local_tokens(local, tokens, e.vocab_offset, wte.dim(0));
  Tensor out = c.dev.empty({B, T, C}, c.out_dtype(Op::embedding, wte), Category::activations);
  c.ops().embedding_forward(out, local, wte, nullptr);
  out.reshape({B * T, C});
  c.tp->all_reduce(out);  // every token's row, from the rank that holds it
  if (e.wpe >= 0) add_positions(c, out, c.weight(e.wpe), B, T);
  c.keep("tokens", std::move(local));
  return scatter_tokens(c, std::move(out), Category::activations);
}

void vocab_parallel_backward(LayerCtx& c, Tensor& dout_mine, const Embedding& e) {
  const Tensor& local = c.get("tokens");
  const std::int64_t B = local.dim(0), T = local.dim(1);
  Tensor gathered;  // SP: every token's gradient (the scatter's backward)
  (void)leave_row_parallel_grad(c, dout_mine, gathered);
  Tensor& dout = gathered.defined() ? gathered : dout_mine;
  const std::int64_t C = dout.dim(1);
  if (e.wpe >= 0) {
    OpGrad gpe = c.grad(e.wpe);
    if (!gpe.accumulate) c.ops().fill(gpe.t, 0.0f);
    Tensor g = Tensor::view(gpe.t, 0, T * C);
    for (std::int64_t b = 0; b < B; ++b)
      c.ops().add_inplace(g, Tensor::view(dout, b * T * C, T * C));
  }
  OpGrad gte = c.grad(e.wte);
  dout.reshape({B, T, C});
  c.ops().embedding_backward(&gte.t, nullptr, dout, local, gte.accumulate);
  dout.reshape({B * T, C});
}

// wte[tokens] (+ wpe), before Gemma's scale.
Tensor embedding_lookup(LayerCtx& c, const Tensor& tokens, const Embedding& e) {
  if (e.vocab_parallel) return vocab_parallel_forward(c, tokens, e);
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

// e.scale as a number of dtype t (HF's torch.tensor(hidden_size**0.5, dtype=hidden.dtype)).
float scale_in(DType t, float s) {
  std::uint32_t bits = 0;
  store_from_float(&bits, t, 0, s);
  return load_as_float(&bits, t, 0);
}

}  // namespace

Tensor embedding_forward(LayerCtx& c, const Tensor& tokens, const Embedding& e) {
  ScopedRange scope(c.dev, "embedding");  // names the trace's allocations
  Tensor out = embedding_lookup(c, tokens, e);
  if (e.scale > 0.0f) c.ops().scale(out, scale_in(out.dtype(), e.scale));
  return out;
}

void embedding_backward(LayerCtx& c, Tensor& dout, const Embedding& e) {
  ScopedRange scope(c.dev, "embedding");  // names the trace's allocations
  if (e.scale > 0.0f) c.ops().scale(dout, scale_in(dout.dtype(), e.scale));
  if (e.vocab_parallel) {
    vocab_parallel_backward(c, dout, e);
    return;
  }
  const Tensor& tokens = c.get("tokens");
  const Shape flat = dout.shape();
  dout.reshape({tokens.dim(0), tokens.dim(1), flat[1]});  // the op wants (B, T, C)
  OpGrad gte = c.grad(e.wte);
  if (e.wpe < 0) {
    c.ops().embedding_backward(&gte.t, nullptr, dout, tokens, gte.accumulate);
    dout.reshape(flat);
    return;
  }
  OpGrad gpe = c.grad(e.wpe);
  if (gte.accumulate == gpe.accumulate) {
    c.ops().embedding_backward(&gte.t, &gpe.t, dout, tokens, gte.accumulate);
  } else {
    c.ops().embedding_backward(&gte.t, nullptr, dout, tokens, gte.accumulate);
    c.ops().embedding_backward(nullptr, &gpe.t, dout, tokens, gpe.accumulate);
  }
  dout.reshape(flat);
}

}  // namespace memtrade
