// Argument validation shared by every backend's ops (kernels/ops.h): the same checks and the
// same messages on the CPU and on CUDA. Each throws std::invalid_argument "op: message".
// Free of fmt and CUDA headers, so that .cu files include it as they are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace memtrade {

[[noreturn]] void throw_bad_op_argument(std::string_view op, const std::string& message);

// t is defined and of a float dtype (F32, F16, BF16) / of I32.
void check_float(std::string_view op, std::string_view name, const Tensor& t);
void check_i32(std::string_view op, std::string_view name, const Tensor& t);
// t has exactly `shape`.
void check_shape(std::string_view op, std::string_view name, const Tensor& t, const Shape& shape);
void check_same_numel(std::string_view op, const Tensor& a, const Tensor& b);

// Rows of an (..., C) tensor: the product of its leading dimensions (not numel / C, which
// divides by zero when C == 0; an (N, 0) tensor has N rows). 1 for a 0-d tensor.
std::int64_t leading_rows(const Tensor& t);

// matmul: c = op(a)·op(b), all 2-D or all 3-D (a batch), float; the problem's sizes.
struct MatmulDims {
  std::int64_t batch, m, n, k;
};
MatmulDims check_matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a,
                        bool trans_b);

// linear: inp (..., C), weight (OC, C), out/dout (..., OC), bias/dbias (OC); grads nullptr
// where not wanted. rows = leading_rows(inp).
struct LinearDims {
  std::int64_t rows, oc, c;
};
LinearDims check_linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                const Tensor* bias);
LinearDims check_linear_backward(const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
                                 const Tensor& dout, const Tensor& inp, const Tensor& weight);

// layernorm over the last dimension C of inp (rows = leading_rows(inp)); mean, rstd (rows) F32.
struct RowDims {
  std::int64_t rows, c;
};
RowDims check_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& inp, const Tensor& weight, const Tensor& bias);
RowDims check_layernorm_backward(const Tensor& dinp, const Tensor* dweight, const Tensor* dbias,
                                 const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd);

// RMSNorm over the last dimension C of inp (rows = leading_rows(inp)): out, dinp and dout like
// inp, weight and dweight (C), all float; rstd (rows) F32.
RowDims check_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp,
                              const Tensor& weight);
RowDims check_rmsnorm_backward(const Tensor& dinp, const Tensor* dweight, const Tensor& dout,
                               const Tensor& inp, const Tensor& weight, const Tensor& rstd);

// softmax over the last dimension: out (and dinp, dout) shaped like inp / out, all float.
RowDims check_softmax_forward(const Tensor& out, const Tensor& inp);
RowDims check_softmax_backward(const Tensor& dinp, const Tensor& dout, const Tensor& out);

// Element-wise ops: float operands of one shape.
void check_unary(std::string_view op, const Tensor& out, const Tensor& inp);
void check_binary(std::string_view op, const Tensor& out, const Tensor& a, const Tensor& b);

// A per-row statistic (layer-norm mean/rstd, batch-norm mean/invstd): F32 with n elements.
void check_stat(std::string_view op, std::string_view name, const Tensor& t, std::int64_t n);

// (N, C, H, W) float tensor; a per-channel (C) vector, F32 when need_f32.
void check_nchw(std::string_view op, std::string_view name, const Tensor& t);
void check_channel_vec(std::string_view op, std::string_view name, const Tensor& t, std::int64_t c,
                       bool need_f32);

// batch-norm over (N, C, H, W): out/dinp/dout like inp, gamma/beta/dgamma/dbeta (C) of any float
// dtype, mean/invstd (C) F32, running statistics (C) when given. The channel count C.
std::int64_t check_batchnorm_forward(const Tensor& out, const Tensor& mean, const Tensor& invstd,
                                     const Tensor& inp, const Tensor& gamma, const Tensor& beta,
                                     const Tensor* running_mean, const Tensor* running_var);
std::int64_t check_batchnorm_backward(const Tensor& dinp, const Tensor* dgamma, const Tensor* dbeta,
                                      const Tensor& dout, const Tensor& inp, const Tensor& gamma,
                                      const Tensor& mean, const Tensor& invstd);

// (B, T) tokens, (V, C) wte-like and (maxT, C) wpe-like tables (either may be nullptr) against
// (B, T, C) activations.
void check_embedding_shapes(std::string_view op, const Tensor& bt_c, const Tensor& tokens,
                            const Tensor* wte, const Tensor* wpe);
// (N, V) float logits with V >= 1 and N I32 targets; returns N. (Target values are the
// backend's to check: the CPU reads them, CUDA cannot without a sync.)
std::int64_t check_ce(std::string_view op, const Tensor& logits, const Tensor& targets);

// Ops::optimizer_update's arguments: float param and grad of one element count, the states
// the kind needs (float, as many elements as the param), step >= 1.
void check_optimizer_update(const OptimizerHyper& h, const Tensor& param, const Tensor& grad,
                            const Tensor* state0, const Tensor* state1);

// Causal self-attention on packed qkv (B, T, (NH + 2·NKV)·hd) (kernels/ops.h).
struct AttentionDims {
  std::int64_t b, t;
  std::int64_t nh, nkv, hd;
  std::int64_t c;                                  // NH·hd: out's and dout's last dimension
  std::int64_t w;                                  // (NH + 2·NKV)·hd: qkv's last dimension
  std::int64_t group() const { return nh / nkv; }  // query heads per kv head
  // Columns of query head h, and of the key and value heads that query head h uses.
  std::int64_t q_col(std::int64_t h) const { return h * hd; }
  std::int64_t k_col(std::int64_t h) const { return (nh + h / group()) * hd; }
  std::int64_t v_col(std::int64_t h) const { return (nh + nkv + h / group()) * hd; }
};
// att (B, NH, T, T) float; out (B, T, NH·hd) float when given (attention_forward; nullptr for
// attention_probs). `op` names the caller.
AttentionDims check_attention_forward(std::string_view op, const Tensor* out, const Tensor& att,
                                      const Tensor& qkv, int n_head, int n_kv_head);
// dqkv like qkv, dout (B, T, NH·hd), att (B, NH, T, T), all float; probs, when given, F32 and
// shaped as att.
AttentionDims check_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                       const Tensor& att, int n_head, int n_kv_head,
                                       const Tensor* probs = nullptr);

// The scores of math attention (kernels/ops.h AttentionScores): scale and softcap finite and
// >= 0; with softcap > 0 a tanh tensor shaped as att in qkv's dtype, without it none.
void check_attention_scores(std::string_view op, const AttentionScores& scores, const Tensor* tanh,
                            const Tensor& att, const Tensor& qkv);

// Largest head dimension of flash attention: its CUDA tiles keep rows of hd fp32 values in
// shared memory, and the CPU's per-thread tiles are on the stack.
inline constexpr std::int64_t kFlashMaxHeadDim = 256;
// out (B, T, NH·hd) float, lse (B, NH, T) F32, 1 <= hd <= kFlashMaxHeadDim.
AttentionDims check_flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                            int n_head, int n_kv_head);
// dqkv like qkv; dout and out (B, T, NH·hd); lse (B, NH, T) F32; all others float.
AttentionDims check_flash_attention_backward(const Tensor& dqkv, const Tensor& dout,
                                             const Tensor& qkv, const Tensor& out,
                                             const Tensor& lse, int n_head, int n_kv_head);

// RoPE on packed qkv (B, T, (NH + 2·NKV)·hd), float, 1 <= NKV <= NH with NH a multiple of NKV
// (grouped-query attention's layout), hd even and at most kRopeMaxHeadDim. `op` names the caller.
struct RopeDims {
  std::int64_t b, t, nh, nkv, hd;
  std::int64_t row() const { return (nh + 2 * nkv) * hd; }  // elements per (b, t)
};
RopeDims check_rope(std::string_view op, const Tensor& qkv, int n_head, int n_kv_head);

// swiglu_backward (and geglu_backward, named by op): dgate, dup, dout, gate and up float, all of
// one shape.
void check_swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                           const Tensor& gate, const Tensor& up,
                           std::string_view op = "swiglu_backward");

// conv2d: inp (N, Ci, H, W), weight (Co, Ci, KH, KW), stride >= 1, pad >= 0, kernel within the
// padded input; out/dout (N, Co, OH, OW), bias/dbias (Co), dinp/dweight like inp/weight (grads
// nullptr where not wanted).
struct ConvDims {
  std::int64_t n, ci, h, w, co, kh, kw, oh, ow, stride, pad;
  std::int64_t k() const { return ci * kh * kw; }  // rows of the im2col matrix
  std::int64_t p() const { return oh * ow; }       // output pixels per image
};
ConvDims check_conv_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                            const Tensor* bias, int stride, int pad);
ConvDims check_conv_backward(const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
                             const Tensor& dout, const Tensor& inp, const Tensor& weight,
                             int stride, int pad);

}  // namespace memtrade
