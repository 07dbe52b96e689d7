#include "models/layers/gpt_mlp.h"

namespace memtrade {

Tensor mlp_forward(LayerCtx& c, Tensor inp, const GptMlp& m) {
  const std::int64_t N = inp.dim(0), C = inp.dim(1);
  // Selective checkpointing drops the GELU input: one c_fc GEMM recomputes it from mlp.inp.
  const bool keep_h = c.save && !c.selective;
  Tensor h(c.dev.memory(), {N, 4 * C}, c.act,
           keep_h ? Category::activations : Category::temporaries);  // (N, 4C)
  linear_forward(c, h, inp, m.c_fc);
  c.keep("mlp.inp", std::move(inp));
  Tensor g = c.act_tensor({N, 4 * C});  // (N, 4C)
  c.ops().gelu_forward(g, h);
  if (keep_h) c.keep("mlp.h", std::move(h));
  h.reset();
  Tensor out = c.temp({N, C});  // (N, C): added into the residual by the block
  linear_forward(c, out, g, m.c_proj);
  c.keep("mlp.g", std::move(g));
  return out;
}

Tensor mlp_backward(LayerCtx& c, const Tensor& dout, const GptMlp& m) {
  const Tensor& g = c.get("mlp.g");
  const Tensor& inp = c.get("mlp.inp");
  const std::int64_t N = g.dim(0), C4 = g.dim(1);
  Tensor dg = c.temp({N, C4});
  linear_backward(c, &dg, dout, g, m.c_proj);

  Tensor recomputed;  // (N, 4C) when selective
  const Tensor* h = nullptr;
  if (c.has("mlp.h")) {
    h = &c.get("mlp.h");
  } else {
    recomputed = c.temp({N, C4});
    linear_forward(c, recomputed, inp, m.c_fc);
    h = &recomputed;
  }
  Tensor dh = c.temp({N, C4});
  c.ops().gelu_backward(dh, dg, *h);
  dg.reset();
  recomputed.reset();

  Tensor dinp = c.temp(inp.shape());
  linear_backward(c, &dinp, dh, inp, m.c_fc);
  return dinp;
}

}  // namespace memtrade
