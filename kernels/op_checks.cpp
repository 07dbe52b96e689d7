#include "kernels/op_checks.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {
namespace {

template <typename... Args>
[[noreturn]] void fail(std::string_view op, fmt::format_string<Args...> f, Args&&... args) {
  throw_bad_op_argument(op, fmt::format(f, std::forward<Args>(args)...));
}

void check_state(std::string_view op, std::string_view name, const Tensor* s, bool needed,
                 const Tensor& param) {
  if (!needed) return;
  if (!s) fail(op, "{} is required for this optimizer", name);
  check_float(op, name, *s);
  if (s->numel() != param.numel())
    fail(op, "{} {} does not match param {}", name, shape_str(s->shape()),
         shape_str(param.shape()));
}

ConvDims check_conv(std::string_view op, const Tensor& inp, const Tensor& weight, int stride,
                    int pad) {
  check_float(op, "inp", inp);
  check_float(op, "weight", weight);
  if (inp.ndim() != 4 || weight.ndim() != 4 || weight.dim(1) != inp.dim(1))
    fail(op, "inp {} must be (N, Ci, H, W) and weight {} (Co, Ci, KH, KW)", shape_str(inp.shape()),
         shape_str(weight.shape()));
  if (stride < 1 || pad < 0) fail(op, "stride {} must be >= 1 and pad {} >= 0", stride, pad);
  ConvDims d{
      inp.dim(0), inp.dim(1), inp.dim(2), inp.dim(3), weight.dim(0), weight.dim(2), weight.dim(3),
      0,          0,          stride,     pad};
  if (d.h + 2 * pad < d.kh || d.w + 2 * pad < d.kw)
    fail(op, "kernel {} larger than the padded input {}", shape_str(weight.shape()),
         shape_str(inp.shape()));
  d.oh = (d.h + 2 * pad - d.kh) / stride + 1;
  d.ow = (d.w + 2 * pad - d.kw) / stride + 1;
  return d;
}

AttentionDims check_qkv(std::string_view op, const Tensor& qkv, int n_head, int n_kv_head) {
  check_float(op, "qkv", qkv);
  if (n_head < 1 || n_kv_head < 1 || n_head % n_kv_head != 0)
    fail(op, "n_head = {} must be a positive multiple of n_kv_head = {}", n_head, n_kv_head);
  const std::int64_t heads = n_head + 2 * std::int64_t{n_kv_head};
  if (qkv.ndim() != 3 || qkv.dim(2) % heads != 0)
    fail(op,
         "qkv {} must be (B, T, (n_head + 2·n_kv_head)·head_dim) with n_head = {}, "
         "n_kv_head = {}",
         shape_str(qkv.shape()), n_head, n_kv_head);
  const std::int64_t hd = qkv.dim(2) / heads;
  return {qkv.dim(0), qkv.dim(1), n_head, n_kv_head, hd, n_head * hd, qkv.dim(2)};
}

// flash: hd within the kernels' tiles; lse (B, NH, T) F32.
void check_flash(std::string_view op, const AttentionDims& d, const Tensor& lse) {
  if (d.hd < 1 || d.hd > kFlashMaxHeadDim)
    fail(op, "head_dim {} must be in [1, {}]", d.hd, kFlashMaxHeadDim);
  if (!lse.defined() || lse.dtype() != DType::F32)
    fail(op, "lse must be F32, got {}", lse.defined() ? dtype_name(lse.dtype()) : "undefined");
  check_shape(op, "lse", lse, {d.b, d.nh, d.t});
}

// An optional output or gradient: when given, float and shaped `shape`.
void check_optional(std::string_view op, std::string_view name, const Tensor* t,
                    const Shape& shape) {
  if (!t) return;
  check_float(op, name, *t);
  check_shape(op, name, *t, shape);
}

}  // namespace

void throw_bad_op_argument(std::string_view op, const std::string& message) {
  throw std::invalid_argument(fmt::format("{}: {}", op, message));
}

void check_float(std::string_view op, std::string_view name, const Tensor& t) {
  if (!t.defined()) fail(op, "{} is undefined", name);
  if (t.dtype() == DType::I32)
    fail(op, "{} {} must be a float tensor (f32, f16 or bf16), got i32", name,
         shape_str(t.shape()));
}

void check_i32(std::string_view op, std::string_view name, const Tensor& t) {
  if (!t.defined()) fail(op, "{} is undefined", name);
  if (t.dtype() != DType::I32)
    fail(op, "{} {} must be i32, got {}", name, shape_str(t.shape()), dtype_name(t.dtype()));
}

void check_shape(std::string_view op, std::string_view name, const Tensor& t, const Shape& shape) {
  if (t.shape() != shape)
    fail(op, "{} has shape {}, expected {}", name, shape_str(t.shape()), shape_str(shape));
}

void check_same_numel(std::string_view op, const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel())
    fail(op, "element counts differ: {} vs {}", shape_str(a.shape()), shape_str(b.shape()));
}

std::int64_t leading_rows(const Tensor& t) {
  std::int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) rows *= t.dim(i);
  return rows;
}

MatmulDims check_matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a,
                        bool trans_b) {
  constexpr std::string_view op = "matmul";
  check_float(op, "c", c);
  check_float(op, "a", a);
  check_float(op, "b", b);
  const int nd = c.ndim();
  if ((nd != 2 && nd != 3) || a.ndim() != nd || b.ndim() != nd)
    fail(op, "c {}, a {}, b {} must all be 2-D or all 3-D", shape_str(c.shape()),
         shape_str(a.shape()), shape_str(b.shape()));
  const std::int64_t batch = nd == 3 ? c.dim(0) : 1;
  const std::int64_t m = c.dim(-2), n = c.dim(-1);
  const std::int64_t k = trans_a ? a.dim(-2) : a.dim(-1);
  const std::int64_t am = trans_a ? a.dim(-1) : a.dim(-2);
  const std::int64_t bk = trans_b ? b.dim(-1) : b.dim(-2);
  const std::int64_t bn = trans_b ? b.dim(-2) : b.dim(-1);
  if (am != m || bk != k || bn != n || (nd == 3 && (a.dim(0) != batch || b.dim(0) != batch)))
    fail(op, "shapes do not match: c {} = a{} {} · b{} {}", shape_str(c.shape()),
         trans_a ? "ᵀ" : "", shape_str(a.shape()), trans_b ? "ᵀ" : "", shape_str(b.shape()));
  return {batch, m, n, k};
}

LinearDims check_linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                const Tensor* bias) {
  constexpr std::string_view op = "linear_forward";
  check_float(op, "out", out);
  check_float(op, "inp", inp);
  check_float(op, "weight", weight);
  if (weight.ndim() != 2 || inp.ndim() < 2)
    fail(op, "weight {} must be (OC, C) and inp {} (N, C)", shape_str(weight.shape()),
         shape_str(inp.shape()));
  const std::int64_t oc = weight.dim(0), ch = weight.dim(1);
  if (inp.dim(-1) != ch)
    fail(op, "inp {} vs weight {}", shape_str(inp.shape()), shape_str(weight.shape()));
  Shape out_shape = inp.shape();
  out_shape.back() = oc;
  check_shape(op, "out", out, out_shape);
  check_optional(op, "bias", bias, {oc});
  return {leading_rows(inp), oc, ch};
}

LinearDims check_linear_backward(const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
                                 const Tensor& dout, const Tensor& inp, const Tensor& weight) {
  constexpr std::string_view op = "linear_backward";
  check_float(op, "dout", dout);
  check_float(op, "inp", inp);
  check_float(op, "weight", weight);
  if (weight.ndim() != 2 || inp.ndim() < 2 || inp.dim(-1) != weight.dim(1))
    fail(op, "inp {} and weight {} do not match", shape_str(inp.shape()),
         shape_str(weight.shape()));
  const std::int64_t oc = weight.dim(0), ch = weight.dim(1);
  Shape dout_shape = inp.shape();
  dout_shape.back() = oc;
  check_shape(op, "dout", dout, dout_shape);
  check_optional(op, "dinp", dinp, inp.shape());
  check_optional(op, "dweight", dweight, weight.shape());
  check_optional(op, "dbias", dbias, {oc});
  return {leading_rows(inp), oc, ch};
}

RowDims check_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  constexpr std::string_view op = "layernorm_forward";
  check_float(op, "inp", inp);
  check_float(op, "out", out);
  check_float(op, "weight", weight);
  check_float(op, "bias", bias);
  check_shape(op, "out", out, inp.shape());
  const std::int64_t c = inp.dim(-1), n = leading_rows(inp);
  check_shape(op, "weight", weight, {c});
  check_shape(op, "bias", bias, {c});
  check_stat(op, "mean", mean, n);
  check_stat(op, "rstd", rstd, n);
  return {n, c};
}

RowDims check_layernorm_backward(const Tensor& dinp, const Tensor* dweight, const Tensor* dbias,
                                 const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd) {
  constexpr std::string_view op = "layernorm_backward";
  check_float(op, "dinp", dinp);
  check_float(op, "dout", dout);
  check_float(op, "inp", inp);
  check_float(op, "weight", weight);
  check_shape(op, "dinp", dinp, inp.shape());
  check_shape(op, "dout", dout, inp.shape());
  const std::int64_t c = inp.dim(-1), n = leading_rows(inp);
  check_shape(op, "weight", weight, {c});
  check_stat(op, "mean", mean, n);
  check_stat(op, "rstd", rstd, n);
  check_optional(op, "dweight", dweight, {c});
  check_optional(op, "dbias", dbias, {c});
  return {n, c};
}

RowDims check_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp,
                              const Tensor& weight) {
  constexpr std::string_view op = "rmsnorm_forward";
  check_float(op, "inp", inp);
  check_float(op, "out", out);
  check_float(op, "weight", weight);
  check_shape(op, "out", out, inp.shape());
  const std::int64_t c = inp.dim(-1), n = leading_rows(inp);
  check_shape(op, "weight", weight, {c});
  check_stat(op, "rstd", rstd, n);
  return {n, c};
}

RowDims check_rmsnorm_backward(const Tensor& dinp, const Tensor* dweight, const Tensor& dout,
                               const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  constexpr std::string_view op = "rmsnorm_backward";
  check_float(op, "dinp", dinp);
  check_float(op, "dout", dout);
  check_float(op, "inp", inp);
  check_float(op, "weight", weight);
  check_shape(op, "dinp", dinp, inp.shape());
  check_shape(op, "dout", dout, inp.shape());
  const std::int64_t c = inp.dim(-1), n = leading_rows(inp);
  check_shape(op, "weight", weight, {c});
  check_stat(op, "rstd", rstd, n);
  check_optional(op, "dweight", dweight, {c});
  return {n, c};
}

RowDims check_softmax_forward(const Tensor& out, const Tensor& inp) {
  constexpr std::string_view op = "softmax_forward";
  check_float(op, "out", out);
  check_float(op, "inp", inp);
  check_shape(op, "out", out, inp.shape());
  return {leading_rows(inp), inp.dim(-1)};
}

RowDims check_softmax_backward(const Tensor& dinp, const Tensor& dout, const Tensor& out) {
  constexpr std::string_view op = "softmax_backward";
  check_float(op, "dinp", dinp);
  check_float(op, "dout", dout);
  check_float(op, "out", out);
  check_shape(op, "dinp", dinp, out.shape());
  check_shape(op, "dout", dout, out.shape());
  return {leading_rows(out), out.dim(-1)};
}

void check_unary(std::string_view op, const Tensor& out, const Tensor& inp) {
  check_float(op, "out", out);
  check_float(op, "inp", inp);
  if (out.shape() != inp.shape())
    fail(op, "out {} and inp {} differ", shape_str(out.shape()), shape_str(inp.shape()));
}

void check_binary(std::string_view op, const Tensor& out, const Tensor& a, const Tensor& b) {
  check_float(op, "out", out);
  check_float(op, "a", a);
  check_float(op, "b", b);
  if (out.shape() != a.shape() || out.shape() != b.shape())
    fail(op, "shapes differ: {}, {}, {}", shape_str(out.shape()), shape_str(a.shape()),
         shape_str(b.shape()));
}

void check_stat(std::string_view op, std::string_view name, const Tensor& t, std::int64_t n) {
  if (!t.defined() || t.dtype() != DType::F32 || t.numel() != n)
    fail(op, "{} must be F32 with {} elements, got {} {}", name, n, shape_str(t.shape()),
         t.defined() ? dtype_name(t.dtype()) : "undefined");
}

void check_nchw(std::string_view op, std::string_view name, const Tensor& t) {
  check_float(op, name, t);
  if (t.ndim() != 4) fail(op, "{} must be (N, C, H, W), got {}", name, shape_str(t.shape()));
}

void check_channel_vec(std::string_view op, std::string_view name, const Tensor& t, std::int64_t c,
                       bool need_f32) {
  check_float(op, name, t);
  if (t.numel() != c || (need_f32 && t.dtype() != DType::F32))
    fail(op, "{} must be ({}){} , got {} {}", name, c, need_f32 ? " F32" : "", shape_str(t.shape()),
         dtype_name(t.dtype()));
}

std::int64_t check_batchnorm_forward(const Tensor& out, const Tensor& mean, const Tensor& invstd,
                                     const Tensor& inp, const Tensor& gamma, const Tensor& beta,
                                     const Tensor* running_mean, const Tensor* running_var) {
  constexpr std::string_view op = "batchnorm_forward";
  check_nchw(op, "inp", inp);
  check_float(op, "out", out);
  check_shape(op, "out", out, inp.shape());
  const std::int64_t c = inp.dim(1);
  check_channel_vec(op, "gamma", gamma, c, false);
  check_channel_vec(op, "beta", beta, c, false);
  check_channel_vec(op, "mean", mean, c, true);
  check_channel_vec(op, "invstd", invstd, c, true);
  if (running_mean) check_channel_vec(op, "running_mean", *running_mean, c, false);
  if (running_var) check_channel_vec(op, "running_var", *running_var, c, false);
  return c;
}

std::int64_t check_batchnorm_backward(const Tensor& dinp, const Tensor* dgamma, const Tensor* dbeta,
                                      const Tensor& dout, const Tensor& inp, const Tensor& gamma,
                                      const Tensor& mean, const Tensor& invstd) {
  constexpr std::string_view op = "batchnorm_backward";
  check_nchw(op, "inp", inp);
  check_float(op, "dinp", dinp);
  check_float(op, "dout", dout);
  check_shape(op, "dinp", dinp, inp.shape());
  check_shape(op, "dout", dout, inp.shape());
  const std::int64_t c = inp.dim(1);
  check_channel_vec(op, "gamma", gamma, c, false);
  check_channel_vec(op, "mean", mean, c, true);
  check_channel_vec(op, "invstd", invstd, c, true);
  if (dgamma) check_channel_vec(op, "dgamma", *dgamma, c, false);
  if (dbeta) check_channel_vec(op, "dbeta", *dbeta, c, false);
  return c;
}

void check_embedding_shapes(std::string_view op, const Tensor& bt_c, const Tensor& tokens,
                            const Tensor* wte, const Tensor* wpe) {
  if (tokens.ndim() != 2 || bt_c.ndim() != 3 || bt_c.dim(0) != tokens.dim(0) ||
      bt_c.dim(1) != tokens.dim(1))
    fail(op, "tokens {} must be (B, T) and activations {} (B, T, C)", shape_str(tokens.shape()),
         shape_str(bt_c.shape()));
  for (const Tensor* w : {wte, wpe}) {
    if (!w) continue;
    check_float(op, w == wte ? "wte" : "wpe", *w);
    if (w->ndim() != 2 || w->dim(1) != bt_c.dim(2))
      fail(op, "table {} must be (rows, {})", shape_str(w->shape()), bt_c.dim(2));
  }
  if (wpe && wpe->dim(0) < tokens.dim(1))
    fail(op, "T = {} exceeds the {} positions of wpe", tokens.dim(1), wpe->dim(0));
}

std::int64_t check_ce(std::string_view op, const Tensor& logits, const Tensor& targets) {
  check_float(op, "logits", logits);
  check_i32(op, "targets", targets);
  if (logits.ndim() < 2 || logits.dim(-1) < 1)
    fail(op, "logits {} must be (N, V) with V >= 1", shape_str(logits.shape()));
  const std::int64_t n = logits.numel() / logits.dim(-1);
  if (targets.numel() != n)
    fail(op, "targets {} do not match logits {}", shape_str(targets.shape()),
         shape_str(logits.shape()));
  return n;
}

void check_optimizer_update(const OptimizerHyper& h, const Tensor& param, const Tensor& grad,
                            const Tensor* state0, const Tensor* state1) {
  constexpr std::string_view op = "optimizer_update";
  check_float(op, "param", param);
  check_float(op, "grad", grad);
  check_same_numel(op, param, grad);
  const int nstate = optimizer_state_count(h.kind);
  check_state(op, "state0", state0, nstate >= 1, param);
  check_state(op, "state1", state1, nstate >= 2, param);
  if (h.step < 1) fail(op, "step {} must be >= 1", h.step);
}

AttentionDims check_attention_forward(std::string_view op, const Tensor* out, const Tensor& att,
                                      const Tensor& qkv, int n_head, int n_kv_head) {
  const AttentionDims d = check_qkv(op, qkv, n_head, n_kv_head);
  check_float(op, "att", att);
  check_shape(op, "att", att, {d.b, d.nh, d.t, d.t});
  check_optional(op, "out", out, {d.b, d.t, d.c});
  return d;
}

AttentionDims check_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                       const Tensor& att, int n_head, int n_kv_head,
                                       const Tensor* probs) {
  constexpr std::string_view op = "attention_backward";
  const AttentionDims d = check_qkv(op, qkv, n_head, n_kv_head);
  check_float(op, "dqkv", dqkv);
  check_float(op, "dout", dout);
  check_float(op, "att", att);
  check_shape(op, "dqkv", dqkv, qkv.shape());
  check_shape(op, "dout", dout, {d.b, d.t, d.c});
  check_shape(op, "att", att, {d.b, d.nh, d.t, d.t});
  if (probs) {
    check_shape(op, "probs", *probs, att.shape());
    if (probs->dtype() != DType::F32)
      fail(op, "probs must be F32 (the fp32 softmax output), got {}", dtype_name(probs->dtype()));
  }
  return d;
}

void check_attention_scores(std::string_view op, const AttentionScores& scores, const Tensor* tanh,
                            const Tensor& att, const Tensor& qkv) {
  if (!(scores.scale >= 0.0f) || !std::isfinite(scores.scale) || !(scores.softcap >= 0.0f) ||
      !std::isfinite(scores.softcap))
    fail(op, "scale {} and softcap {} must be finite and >= 0", scores.scale, scores.softcap);
  if ((scores.softcap > 0.0f) != (tanh != nullptr))
    fail(op, "a tanh tensor goes with softcap > 0 only (softcap {})", scores.softcap);
  if (!tanh) return;
  check_shape(op, "tanh", *tanh, att.shape());
  if (tanh->dtype() != qkv.dtype())
    fail(op, "tanh must be in qkv's dtype {}, got {}", dtype_name(qkv.dtype()),
         dtype_name(tanh->dtype()));
}

RopeDims check_rope(std::string_view op, const Tensor& qkv, int n_head, int n_kv_head) {
  check_float(op, "qkv", qkv);
  if (n_head < 1 || n_kv_head < 1 || n_head % n_kv_head != 0)  // so n_kv_head <= n_head
    fail(op, "n_head = {} must be a positive multiple of n_kv_head = {}", n_head, n_kv_head);
  const std::int64_t heads = n_head + 2 * static_cast<std::int64_t>(n_kv_head);
  if (qkv.ndim() != 3 || qkv.dim(2) % heads != 0)
    fail(op,
         "qkv {} must be (B, T, (n_head + 2·n_kv_head)·head_dim) with n_head = {}, n_kv_head = {}",
         shape_str(qkv.shape()), n_head, n_kv_head);
  const std::int64_t hd = qkv.dim(2) / heads;
  if (hd < 2 || hd % 2 != 0 || hd > kRopeMaxHeadDim)
    fail(op, "head_dim {} must be even, in [2, {}]", hd, kRopeMaxHeadDim);
  return {qkv.dim(0), qkv.dim(1), n_head, n_kv_head, hd};
}

void check_swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                           const Tensor& gate, const Tensor& up, std::string_view op) {
  check_float(op, "dgate", dgate);
  check_float(op, "dup", dup);
  check_float(op, "dout", dout);
  check_float(op, "gate", gate);
  check_float(op, "up", up);
  for (const Tensor* t : {&dgate, &dup, &dout, &up})
    if (t->shape() != gate.shape())
      fail(op, "shapes differ: dgate {}, dup {}, dout {}, gate {}, up {}", shape_str(dgate.shape()),
           shape_str(dup.shape()), shape_str(dout.shape()), shape_str(gate.shape()),
           shape_str(up.shape()));
}

AttentionDims check_flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                            int n_head, int n_kv_head) {
  constexpr std::string_view op = "flash_attention_forward";
  const AttentionDims d = check_qkv(op, qkv, n_head, n_kv_head);
  check_flash(op, d, lse);
  check_optional(op, "out", &out, {d.b, d.t, d.c});
  return d;
}

AttentionDims check_flash_attention_backward(const Tensor& dqkv, const Tensor& dout,
                                             const Tensor& qkv, const Tensor& out,
                                             const Tensor& lse, int n_head, int n_kv_head) {
  constexpr std::string_view op = "flash_attention_backward";
  const AttentionDims d = check_qkv(op, qkv, n_head, n_kv_head);
  check_flash(op, d, lse);
  check_optional(op, "dqkv", &dqkv, qkv.shape());
  check_optional(op, "dout", &dout, {d.b, d.t, d.c});
  check_optional(op, "out", &out, {d.b, d.t, d.c});
  return d;
}

ConvDims check_conv_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                            const Tensor* bias, int stride, int pad) {
  constexpr std::string_view op = "conv2d_forward";
  const ConvDims d = check_conv(op, inp, weight, stride, pad);
  check_float(op, "out", out);
  check_shape(op, "out", out, {d.n, d.co, d.oh, d.ow});
  check_optional(op, "bias", bias, {d.co});
  return d;
}

ConvDims check_conv_backward(const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
                             const Tensor& dout, const Tensor& inp, const Tensor& weight,
                             int stride, int pad) {
  constexpr std::string_view op = "conv2d_backward";
  const ConvDims d = check_conv(op, inp, weight, stride, pad);
  check_float(op, "dout", dout);
  check_shape(op, "dout", dout, {d.n, d.co, d.oh, d.ow});
  check_optional(op, "dinp", dinp, inp.shape());
  check_optional(op, "dweight", dweight, weight.shape());
  check_optional(op, "dbias", dbias, {d.co});
  return d;
}

}  // namespace memtrade
