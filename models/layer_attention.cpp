#include "models/layers/attention.h"

namespace memtrade {
namespace {

// Width of the attention output y, NH·hd, from the packed qkv width (NH + 2·NKV)·hd.
std::int64_t y_width(std::int64_t qkv_width, const CausalSelfAttention& a) {
  return a.n_head * (qkv_width / (a.n_head + 2 * std::int64_t{a.n_kv_head}));
}

}  // namespace

Tensor attention_forward(LayerCtx& c, Tensor inp, std::int64_t B, std::int64_t T,
                         const CausalSelfAttention& a) {
  const std::int64_t C = inp.dim(1);
  const bool split = !a.qkv_proj.parts.empty();
  const std::int64_t W =
      split ? stacked_out_features(c, a.qkv_proj) : c.weight(a.c_attn.weight).dim(0);
  const std::int64_t Y = y_width(W, a), NH = a.n_head;
  Tensor qkv = c.act_tensor({B * T, W});  // (B·T, (NH + 2·NKV)·hd)
  if (split)
    linear_forward(c, qkv, inp, a.qkv_proj);
  else
    linear_forward(c, qkv, inp, a.c_attn);
  c.keep("attn.inp", std::move(inp));
  qkv.reshape({B, T, W});
  if (a.rope) c.ops().rope_forward(qkv, a.n_head, a.n_kv_head, *a.rope);

  Tensor y;  // (B, T, NH·hd)
  if (c.attention == AttentionKind::flash) {
    Tensor lse(c.dev.memory(), {B, NH, T}, DType::F32, c.cat());
    y = c.act_tensor({B, T, Y});
    c.ops().flash_attention_forward(y, lse, qkv, a.n_head, a.n_kv_head);
    c.keep("attn.qkv", std::move(qkv));
    c.keep("attn.lse", std::move(lse));
  } else {
    // Selective checkpointing drops the (B, NH, T, T) probabilities: the biggest tensor of the
    // block at long T, and only a QKᵀ + softmax away from qkv, which is saved anyway.
    const bool keep_att = c.save && !c.selective;
    Tensor att(c.dev.memory(), {B, NH, T, T}, c.act,
               keep_att ? Category::activations : Category::temporaries);
    y = c.act_tensor({B, T, Y});
    c.ops().attention_forward(y, att, qkv, a.n_head, a.n_kv_head);
    c.keep("attn.qkv", std::move(qkv));
    if (keep_att) c.keep("attn.att", std::move(att));
  }

  y.reshape({B * T, Y});
  Tensor out = c.temp({B * T, C});  // (B·T, C): added into the residual by the block
  linear_forward(c, out, y, a.c_proj);
  c.keep("attn.y", std::move(y));
  return out;
}

Tensor attention_backward(LayerCtx& c, const Tensor& dout, const CausalSelfAttention& a) {
  Tensor& qkv = c.get("attn.qkv");  // (B, T, (NH + 2·NKV)·hd)
  const std::int64_t B = qkv.dim(0), T = qkv.dim(1), W = qkv.dim(2), Y = y_width(W, a);
  const std::int64_t NH = a.n_head;
  const std::int64_t C = c.get("attn.inp").dim(1);
  Tensor& y = c.get("attn.y");  // (B·T, NH·hd)

  Tensor dy = c.temp({B * T, Y});
  linear_backward(c, &dy, dout, y, a.c_proj);
  dy.reshape({B, T, Y});

  Tensor dqkv;
  if (c.attention == AttentionKind::flash) {
    dqkv = c.temp({B, T, W});
    y.reshape({B, T, Y});  // the attention output, as the op sees it
    c.ops().flash_attention_backward(dqkv, dy, qkv, y, c.get("attn.lse"), a.n_head, a.n_kv_head);
    y.reshape({B * T, Y});
    dy.reset();
  } else {
    Tensor recomputed;  // (B, NH, T, T) when selective
    const Tensor* att = nullptr;
    if (c.has("attn.att")) {
      att = &c.get("attn.att");
    } else {
      recomputed = c.temp({B, NH, T, T});
      c.ops().attention_probs(recomputed, qkv, a.n_head, a.n_kv_head);
      att = &recomputed;
    }
    dqkv = c.temp({B, T, W});
    c.ops().attention_backward(dqkv, dy, qkv, *att, a.n_head, a.n_kv_head);
    dy.reset();
  }

  // The rotation is orthogonal: its transpose takes d(rotated q, k) to d(q, k).
  if (a.rope) c.ops().rope_backward(dqkv, a.n_head, a.n_kv_head, *a.rope);
  dqkv.reshape({B * T, W});
  Tensor dinp = c.temp({B * T, C});
  if (!a.qkv_proj.parts.empty())
    linear_backward(c, &dinp, dqkv, c.get("attn.inp"), a.qkv_proj);
  else
    linear_backward(c, &dinp, dqkv, c.get("attn.inp"), a.c_attn);
  return dinp;
}

}  // namespace memtrade
