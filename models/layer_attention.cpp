#include "models/layers/attention.h"

namespace memtrade {

Tensor attention_forward(LayerCtx& c, Tensor inp, std::int64_t B, std::int64_t T,
                         const CausalSelfAttention& a) {
  const std::int64_t C = inp.dim(1);
  const std::int64_t NH = a.n_head;
  Tensor qkv = c.act_tensor({B * T, 3 * C});  // (B·T, 3C)
  linear_forward(c, qkv, inp, a.c_attn);
  c.keep("attn.inp", std::move(inp));
  qkv.reshape({B, T, 3 * C});

  // Selective checkpointing drops the (B, NH, T, T) probabilities: the biggest tensor of the
  // block at long T, and only a QKᵀ + softmax away from qkv, which is saved anyway.
  const bool keep_att = c.save && !c.selective;
  Tensor att(c.dev.memory(), {B, NH, T, T}, c.act,
             keep_att ? Category::activations : Category::temporaries);
  Tensor y = c.act_tensor({B, T, C});  // (B, T, C)
  c.ops().attention_forward(y, att, qkv, a.n_head);
  c.keep("attn.qkv", std::move(qkv));
  if (keep_att) c.keep("attn.att", std::move(att));
  att.reset();

  y.reshape({B * T, C});
  Tensor out = c.temp({B * T, C});  // (B·T, C): added into the residual by the block
  linear_forward(c, out, y, a.c_proj);
  c.keep("attn.y", std::move(y));
  return out;
}

Tensor attention_backward(LayerCtx& c, const Tensor& dout, const CausalSelfAttention& a) {
  Tensor& qkv = c.get("attn.qkv");  // (B, T, 3C)
  const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  const std::int64_t NH = a.n_head;

  Tensor dy = c.temp({B * T, C});
  linear_backward(c, &dy, dout, c.get("attn.y"), a.c_proj);
  dy.reshape({B, T, C});

  Tensor recomputed;  // (B, NH, T, T) when selective
  const Tensor* att = nullptr;
  if (c.has("attn.att")) {
    att = &c.get("attn.att");
  } else {
    recomputed = c.temp({B, NH, T, T});
    c.ops().attention_probs(recomputed, qkv, a.n_head);
    att = &recomputed;
  }
  Tensor dqkv = c.temp({B, T, 3 * C});
  c.ops().attention_backward(dqkv, dy, qkv, *att, a.n_head);
  dy.reset();
  recomputed.reset();

  dqkv.reshape({B * T, 3 * C});
  Tensor dinp = c.temp({B * T, C});
  linear_backward(c, &dinp, dqkv, c.get("attn.inp"), a.c_attn);
  return dinp;
}

}  // namespace memtrade
