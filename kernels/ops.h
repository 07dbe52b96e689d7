// Ops: the compute interface every backend implements (CPU here, CUDA in kernels/cuda/).
//
// Model code calls only these, so it never knows which device it runs on. Conventions:
//   - tensors are contiguous, row-major; shapes are in the comment of each op;
//   - float tensors may be F32, F16 or BF16 independently of each other (runtime dispatch);
//     arithmetic is fp32, results are rounded to the output's dtype;
//   - "out"/"dinp" arguments are overwritten; parameter-gradient arguments (dweight, dbias, ...)
//     are overwritten when `accumulate` is false and added to when it is true, which is how
//     gradient accumulation and zero_grad(set_to_none) vs zero_grad() differ (PyTorch assigns
//     into a None grad and adds into an existing one);
//   - a pointer argument (Tensor*) may be nullptr when that output is not wanted;
//   - an op that needs scratch memory allocates it from the allocator of its output tensor with
//     category `temporaries` (library scratch such as im2col or cuDNN workspace: `workspace`)
//     and frees it before returning, so both backends make the same allocation sequence.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kernels/tensor.h"

namespace memtrade {

enum class OptimizerKind : std::uint8_t { sgd, sgd_momentum, adam, adamw, adagrad, rmsprop };

// Which attention ops a model's attention layer runs (RunOptions::attention): math saves the
// (B, NH, T, T) probabilities for backward; flash saves the output and the per-row log-sum-exp
// and recomputes the scores in backward. Spellings: models/config.h.
enum class AttentionKind : std::uint8_t { math, flash };

// Hyper-parameters with PyTorch's defaults (torch.optim.*), except lr which callers set.
struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::sgd;
  float lr = 1e-3f;
  float weight_decay = 0.0f;  // L2 added to the gradient; AdamW: decoupled (default 1e-2 there)
  float momentum = 0.9f;      // sgd_momentum (torch default is 0; our knob means "with momentum")
  float dampening = 0.0f;
  bool nesterov = false;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adam, adamw; rmsprop/adagrad use eps too
  float alpha = 0.99f;                              // rmsprop smoothing
  float lr_decay = 0.0f;                            // adagrad
  float initial_accumulator_value = 0.0f;           // adagrad
  std::int64_t step = 1;                            // 1-based step count (bias correction)
  // Gradients are multiplied by it in fp32 as they are read: the loss scaler's 1/scale, so the
  // unscale is fused into the update (no unscaled copy; 16-bit grads cannot underflow).
  float grad_scale = 1.0f;
};

// One parameter's tensors for Ops::optimizer_update_many; states nullptr where the kind has none.
struct OptimizerSlot {
  Tensor* param;
  const Tensor* grad;
  Tensor* state0;
  Tensor* state1;
};

// Number of fp32-sized state tensors per parameter: 0, 1, 2, 2, 1, 1.
int optimizer_state_count(OptimizerKind kind);

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;
  // TF32 tensor cores for fp32 GEMMs and convolutions (precision = tf32). Backends without
  // such a mode ignore it: on the CPU tf32 is refused before a step runs.
  virtual void set_tf32(bool /*on*/) {}

  // ---- dense algebra -------------------------------------------------------------------------
  // c (M, N) = alpha · op(a) · op(b) + beta · c, op(x) = x or xᵀ; a (M, K) or (K, M), b (K, N)
  // or (N, K). Batched when all three are 3-D with the same leading dim (B, ·, ·).
  virtual void matmul(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                      float alpha = 1.0f, float beta = 0.0f) = 0;
  // out (N, OC) = inp (N, C) · weightᵀ (OC, C) + bias (OC); bias may be nullptr.
  virtual void linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor* bias) = 0;
  // dinp (N, C) = dout (N, OC) · weight; dweight (OC, C) (+)= doutᵀ · inp; dbias (OC) (+)= Σ dout.
  virtual void linear_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                               const Tensor& inp, const Tensor& weight, bool accumulate) = 0;

  // ---- element-wise --------------------------------------------------------------------------
  virtual void fill(Tensor& t, float value) = 0;
  virtual void cast(Tensor& dst, const Tensor& src) = 0;                // same numel, any dtypes
  virtual void add(Tensor& out, const Tensor& a, const Tensor& b) = 0;  // out = a + b
  virtual void add_inplace(Tensor& y, const Tensor& x) = 0;             // y += x
  virtual void scale(Tensor& t, float s) = 0;                           // t *= s
  // GELU, tanh approximation (GPT-2): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
  virtual void gelu_forward(Tensor& out, const Tensor& inp) = 0;
  virtual void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) = 0;
  virtual void relu_forward(Tensor& out, const Tensor& inp) = 0;
  // Uses the forward *output* (in-place friendly): dinp = dout · [out > 0].
  virtual void relu_backward(Tensor& dinp, const Tensor& dout, const Tensor& out) = 0;

  // ---- normalisation and softmax -------------------------------------------------------------
  // inp (N, C) -> out (N, C); mean, rstd (N) F32, saved for backward.
  virtual void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                 const Tensor& weight, const Tensor& bias, float eps) = 0;
  virtual void layernorm_backward(Tensor& dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd, bool accumulate) = 0;
  // Row softmax over the last dim: inp (N, C) -> out (N, C).
  virtual void softmax_forward(Tensor& out, const Tensor& inp) = 0;
  virtual void softmax_backward(Tensor& dinp, const Tensor& dout, const Tensor& out) = 0;

  // ---- attention -----------------------------------------------------------------------------
  // Causal self-attention on packed qkv (B, T, (NH + 2·NKV)·hd): the NH query heads, then the NKV
  // key heads, then the NKV value heads, hd columns each (NH = n_head, NKV = n_kv_head, NH a
  // multiple of NKV). Query head h attends with kv head h / (NH / NKV), HF's repeat_kv
  // (grouped-query attention; NKV = NH is multi-head attention, the (B, T, 3C) layout of nanoGPT).
  // Scale 1/√hd. out (B, T, NH·hd).
  //
  // math: the probabilities are materialised. The one exception to rounding results only: with
  // 16-bit qkv the scaled scores, the probabilities, dP and dS are rounded to qkv's dtype between
  // the GEMMs, as GEMMs in that dtype write them. att (B, NH, T, T) receives the softmax
  // probabilities (saved for backward).
  virtual void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head,
                                 int n_kv_head) = 0;
  // Only the probabilities, for recompute in backward (selective checkpointing).
  virtual void attention_probs(Tensor& att, const Tensor& qkv, int n_head, int n_kv_head) = 0;
  // dqkv overwritten, from dout (B, T, NH·hd), qkv and the saved att; dk and dv of a kv head are
  // the sums over its NH/NKV query heads, accumulated in fp32 and rounded once. Scratch on every
  // backend: dP (NH, T, T) in qkv's dtype (Category::temporaries), reused across sequences.
  virtual void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                  const Tensor& att, int n_head, int n_kv_head) = 0;

  // flash: fused attention (FlashAttention-2's tiled online softmax) that never materialises a
  // (T, T) tensor: forward keeps only out and lse (B, NH, T) F32, the log-sum-exp of each row's
  // scaled causal scores; backward recomputes the scores from qkv and lse. Arithmetic is fp32
  // throughout (no 16-bit intermediates, unlike math); out and dqkv are rounded once to their
  // dtypes. hd <= kFlashMaxHeadDim (kernels/op_checks.h). Deterministic: no atomics, the same
  // result for any thread count or launch order.
  // Scratch, equal on every backend: forward none; backward D = rowsum(dout ∘ out) (B, NH, T)
  // F32 (Category::temporaries). CPU-only on top (Category::workspace): fp32 copies of 16-bit
  // qkv and dout, and an fp32 dqkv when dqkv is 16-bit; its per-thread tiles are on the stack
  // (kernels/cpu/cpu_ops_flash.cpp). CUDA's tiles live in shared memory.
  virtual void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head,
                                       int n_kv_head) = 0;
  // dqkv (B, T, (NH + 2·NKV)·hd) overwritten from dout (B, T, NH·hd), qkv, the forward's out and
  // lse.
  virtual void flash_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                        const Tensor& out, const Tensor& lse, int n_head,
                                        int n_kv_head) = 0;

  // ---- embeddings and loss -------------------------------------------------------------------
  // tokens (B, T) I32; wte (V, C); wpe (maxT, C) -> out (B, T, C) = wte[tokens] + wpe[t].
  virtual void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte,
                                 const Tensor& wpe) = 0;
  // dwte, dwpe (+)= scatter of dout (B, T, C); either may be nullptr.
  virtual void embedding_backward(Tensor* dwte, Tensor* dwpe, const Tensor& dout,
                                  const Tensor& tokens, bool accumulate) = 0;
  // logits (N, V), targets (N) I32 -> losses (N) F32: -log softmax(logits)[target].
  virtual void crossentropy_forward(Tensor& losses, const Tensor& logits,
                                    const Tensor& targets) = 0;
  // dlogits (N, V) = (softmax(logits) - onehot(target)) · dloss, dloss = scale / N_effective.
  virtual void crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                     float dloss) = 0;
  // Σ t as a host double (synchronises): how the loss is read back as one number.
  virtual double sum_to_host(const Tensor& t) = 0;

  // ---- convolution network -------------------------------------------------------------------
  // inp (N, Ci, H, W), weight (Co, Ci, KH, KW), bias (Co) or nullptr -> out (N, Co, OH, OW),
  // OH = (H + 2·pad - KH) / stride + 1.
  virtual void conv2d_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor* bias, int stride, int pad) = 0;
  virtual void conv2d_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                               const Tensor& inp, const Tensor& weight, int stride, int pad,
                               bool accumulate) = 0;
  // Batch-norm with training statistics over (N, H, W) per channel: inp (N, C, H, W) -> out;
  // mean, invstd (C) F32 saved; running_mean/var (C) F32 updated with momentum and the unbiased
  // variance as torch.nn.BatchNorm2d does (either may be nullptr).
  virtual void batchnorm_forward(Tensor& out, Tensor& mean, Tensor& invstd, const Tensor& inp,
                                 const Tensor& gamma, const Tensor& beta, Tensor* running_mean,
                                 Tensor* running_var, float eps, float momentum) = 0;
  virtual void batchnorm_backward(Tensor& dinp, Tensor* dgamma, Tensor* dbeta, const Tensor& dout,
                                  const Tensor& inp, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& invstd, bool accumulate) = 0;
  // inp (N, C, H, W) -> out (N, C): mean over H·W.
  virtual void global_avgpool_forward(Tensor& out, const Tensor& inp) = 0;
  virtual void global_avgpool_backward(Tensor& dinp, const Tensor& dout) = 0;
  // Max pooling, square window, no padding; argmax (N, C, OH, OW) I32 saved for backward.
  virtual void maxpool2d_forward(Tensor& out, Tensor& argmax, const Tensor& inp, int kernel,
                                 int stride) = 0;
  virtual void maxpool2d_backward(Tensor& dinp, const Tensor& dout, const Tensor& argmax) = 0;

  // ---- mixed precision and optimizers --------------------------------------------------------
  // g *= inv_scale for every tensor; returns true if any element was inf or nan (synchronises).
  // inv_scale = 1 only checks: nothing is written.
  virtual bool unscale_and_check(std::span<Tensor* const> grads, float inv_scale) = 0;
  // One optimizer step on one parameter with PyTorch's formulas. param: F32 master or 16-bit
  // (pure precision); grad: same numel, any float dtype; state0/state1: the optimizer's state
  // (exp_avg/exp_avg_sq, momentum_buffer, sum, square_avg), nullptr where the kind has none.
  // At h.step == 1 momentum SGD initialises its buffer with the gradient, as torch does.
  virtual void optimizer_update(const OptimizerHyper& h, Tensor& param, const Tensor& grad,
                                Tensor* state0, Tensor* state1) = 0;
  // optimizer_update for many parameters with the same hyper-parameters and step: one fused
  // launch per dtype combination on CUDA (multi-tensor apply), a loop here by default.
  virtual void optimizer_update_many(const OptimizerHyper& h,
                                     std::span<const OptimizerSlot> slots) {
    for (const OptimizerSlot& s : slots) optimizer_update(h, *s.param, *s.grad, s.state0, s.state1);
  }
};

}  // namespace memtrade
