#include "models/layers/attention.h"

namespace memtrade {
namespace {

// Keeps the probabilities and, where the ·V matmul reads them in another dtype, its cast.
void keep_probs(LayerCtx& c, Tensor att) {
  Tensor cast;
  c.cast_input(Op::matmul, att, cast);
  if (cast.defined()) c.keep("attn.att_mm", std::move(cast));
  c.keep("attn.att", std::move(att));
}

}  // namespace

Tensor attention_forward(LayerCtx& c, Tensor inp, std::int64_t B, std::int64_t T,
                         const CausalSelfAttention& a) {
  const std::int64_t C = inp.dim(1);
  const std::int64_t NH = a.n_head;
  inp = c.cast_input(Op::linear, std::move(inp));
  Tensor qkv = c.act_tensor({B * T, 3 * C}, c.out_dtype(Op::linear, inp));  // (B·T, 3C)
  linear_forward(c, qkv, inp, a.c_attn);
  c.keep("attn.inp", std::move(inp));
  qkv.reshape({B, T, 3 * C});

  // Selective checkpointing drops the (B, NH, T, T) probabilities: the biggest tensor of the
  // block at long T, and only a QKᵀ + softmax away from qkv, which is saved anyway.
  const bool keep_att = c.save && !c.selective;
  Tensor att(c.dev.memory(), {B, NH, T, T}, c.out_dtype(Op::softmax, qkv),
             keep_att ? Category::activations : Category::temporaries);
  Tensor y = c.act_tensor({B, T, C}, c.out_dtype(Op::attention, qkv));  // (B, T, C)
  c.ops().attention_forward(y, att, qkv, a.n_head);
  c.keep("attn.qkv", std::move(qkv));
  if (keep_att) keep_probs(c, std::move(att));
  att.reset();

  y.reshape({B * T, C});
  y = c.cast_input(Op::linear, std::move(y));
  // (B·T, C): added into the residual by the block
  Tensor out = c.temp({B * T, C}, c.out_dtype(Op::linear, y));
  linear_forward(c, out, y, a.c_proj);
  c.keep("attn.y", std::move(y));
  return out;
}

Tensor attention_backward(LayerCtx& c, const Tensor& dout, const CausalSelfAttention& a) {
  Tensor& qkv = c.get("attn.qkv");  // (B, T, 3C)
  const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  const std::int64_t NH = a.n_head;

  const Tensor& y = c.get("attn.y");
  Tensor dy = c.temp_like(y);
  linear_backward(c, &dy, dout, y, a.c_proj);
  dy.reshape({B, T, C});

  Tensor recomputed;  // (B, NH, T, T) when selective
  const Tensor* att = nullptr;
  if (c.has("attn.att")) {
    att = &c.get(c.has("attn.att_mm") ? "attn.att_mm" : "attn.att");
  } else {
    recomputed = c.temp({B, NH, T, T}, c.out_dtype(Op::softmax, qkv));
    c.ops().attention_probs(recomputed, qkv, a.n_head);
    att = &recomputed;
  }
  Tensor dqkv = c.temp({B, T, 3 * C}, qkv.dtype());
  c.ops().attention_backward(dqkv, dy, qkv, *att, a.n_head);
  dy.reset();
  recomputed.reset();

  dqkv.reshape({B * T, 3 * C});
  const Tensor& inp = c.get("attn.inp");
  Tensor dinp = c.temp_like(inp);
  linear_backward(c, &dinp, dqkv, inp, a.c_attn);
  return dinp;
}

}  // namespace memtrade
