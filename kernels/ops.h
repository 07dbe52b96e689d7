// Ops: the compute interface every backend implements (CPU here, CUDA in kernels/cuda/).
//
// Model code calls only these, so it never knows which device it runs on. Conventions:
//   - tensors are contiguous, row-major; shapes are in the comment of each op;
//   - float tensors may be F32, F16 or BF16 independently of each other (runtime dispatch);
//     arithmetic is fp32, results are rounded to the output's dtype (rounding rules below);
//   - "out"/"dinp" arguments are overwritten; parameter-gradient arguments (dweight, dbias, ...)
//     are overwritten when `accumulate` is false and added to when it is true, which is how
//     gradient accumulation and zero_grad(set_to_none) vs zero_grad() differ (PyTorch assigns
//     into a None grad and adds into an existing one);
//   - a pointer argument (Tensor*) may be nullptr when that output is not wanted;
//   - an op that needs scratch memory allocates it from the allocator of its output tensor with
//     category `temporaries` (library scratch such as im2col or cuDNN workspace: `workspace`)
//     and frees it before returning, so both backends make the same allocation sequence.
//
// Rounding rules. Arithmetic is fp32; an op rounds its outputs once, to nearest even, to their
// dtype, and nothing in between unless its comment below says so. The CPU backend is the
// reference; another backend matches it
//   - bit for bit where a memory knob depends on it. offload=optimizer and offload=params update
//     on the host with the CPU ops (optimizer_update, cast, fill) while the plain run updates on
//     the device, and a knob must not change results (tests/gpu/test_cuda_knob_equivalence.cpp).
//     So optimizer_update(_many) is one element arithmetic for both backends
//     (kernels/optimizer_math.h): one IEEE rounding per operation, never fused into an FMA (nvcc
//     fuses a·b + c by default; GCC does with -march=native), nothing approximate or flushed
//     to zero; tests/kernels/test_optimizer_rounding.cpp holds the CPU to it and scans the CUDA
//     kernels' PTX. cast and fill are bit for bit too (round-to-nearest-even conversions; NaN
//     payloads may differ), and so are unscale_and_check, add, add_inplace, scale, relu_* and
//     embedding_forward: one operation per element;
//   - within a tolerance everywhere else (tests/gpu/test_cuda_ops_*.cpp states each op's): GEMMs
//     and convolutions sum in their library's order; reductions (norm statistics, softmax and
//     cross-entropy sums, bias and batch-norm parameter gradients) sum in another order, in fp32
//     on CUDA, where the CPU sums norm statistics, softmax and cross-entropy in double (in 8
//     fixed lanes: kernels/cpu/cpu_vec.h); exp differs by an ulp or so between CUDA's expf and
//     the CPU's own (cpu_vec.h: within 1 ulp, used by GELU, SwiGLU, the softmaxes and
//     cross-entropy; the same bits on every instruction set), logf and tanhf by a few between
//     CUDA and glibc; and nvcc contracts the multiply-adds of those kernels into FMA.
// Intermediate roundings, at the same places on both backends: attention with 16-bit qkv
// (below). Different places, forced by CUDA's libraries: a GEMM runs in one dtype, the output's
// unless both operands share a 16-bit dtype and the output is F32, so operands of another dtype
// than a 16-bit output are rounded to it first (cuBLASLt takes A and B alike; the CPU multiplies in
// fp32); conv2d_forward computes in inp's dtype (cuDNN takes x, w and y alike), so a 16-bit inp's
// result is rounded to it even for an F32 out, and before the bias is added, as PyTorch's cuDNN
// path does (the CPU adds the bias first). linear_forward's bias is in before the output's one
// rounding on both backends.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/tensor.h"

namespace memtrade {

enum class OptimizerKind : std::uint8_t { sgd, sgd_momentum, adam, adamw, adagrad, rmsprop };

// Which attention ops a model's attention layer runs (RunOptions::attention): math saves the
// (B, NH, T, T) probabilities for backward; flash saves the output and the per-row log-sum-exp
// and recomputes the scores in backward. Spellings: models/config/config.h.
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

// Rotary position embeddings as HF transformers' LlamaRotaryEmbedding computes them: rope_theta,
// and rope_scaling of type "llama3" (Llama 3.1/3.2 configs) when factor > 0.
struct RopeConfig {
  double theta = 10000.0;
  double factor = 0.0;  // 0: no scaling
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  std::int64_t original_max_position = 8192;
};

// Largest head_dim rope_forward/backward take: CUDA passes the frequencies as a kernel argument.
inline constexpr std::int64_t kRopeMaxHeadDim = 1024;

// How math attention turns q·kᵀ into the scores it softmaxes (Gemma 2, transformers 4.46.3
// modeling_gemma2.py Gemma2Attention): s = scale·q·kᵀ (scale 0: 1/√hd), then, when softcap > 0,
// s = softcap·tanh(s / softcap) (attn_logit_softcapping). The defaults are plain attention.
struct AttentionScores {
  float scale = 0.0f;
  float softcap = 0.0f;

  float scale_for(std::int64_t hd) const {
    return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(hd));
  }
};

// The head_dim / 2 inverse frequencies, on the host, in HF's fp32 arithmetic (kernels/rope.cpp
// says which operations round where): both backends and the tests take them from here. Throws
// std::invalid_argument for an odd or non-positive head_dim or a config HF would divide by
// zero with (theta <= 0; with scaling: factor, low_freq_factor or original_max_position <= 0,
// or high_freq_factor <= low_freq_factor).
std::vector<float> rope_inv_freq(std::int64_t head_dim, const RopeConfig& rope);

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
  // math: the probabilities are materialised; att (B, NH, T, T) receives them (saved for
  // backward). With 16-bit qkv the GEMMs run in qkv's dtype, and the rounding follows them: the
  // scaled scores, the probabilities, dP and dS are rounded to qkv's dtype between the GEMMs; att
  // and dout of another dtype are read rounded to it; out and dqkv of another dtype are computed
  // in it and then converted (two roundings for the other 16-bit dtype). One exception, HF's
  // softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype): an F32 att with 16-bit qkv receives
  // the probabilities unrounded (computed in fp32 from the rounded scores), and only the ·V
  // product reads them rounded to qkv's dtype (the .to()).
  //
  // scores (AttentionScores): the scale and the soft-capping. With softcap > 0, tanh_out (B, NH,
  // T, T) in qkv's dtype receives tanh(s / softcap) of the scaled scores (autograd's saved
  // tensor of HF's torch.tanh; its masked entries 0), computed in fp32 from the rounded scores
  // and rounded once; the capped scores are rounded to qkv's dtype before the softmax. No other
  // scratch. tanh_out is nullptr without softcap.
  virtual void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int n_head,
                                 int n_kv_head, const AttentionScores& scores = {},
                                 Tensor* tanh_out = nullptr) = 0;
  // Only the probabilities, for recompute in backward (selective checkpointing).
  virtual void attention_probs(Tensor& att, const Tensor& qkv, int n_head, int n_kv_head,
                               const AttentionScores& scores = {}, Tensor* tanh_out = nullptr) = 0;
  // dqkv overwritten, from dout (B, T, NH·hd), qkv and the saved att; dk and dv of a kv head are
  // the sums over its NH/NKV query heads, accumulated in fp32 and rounded once. Scratch on every
  // backend: dP (NH, T, T) in qkv's dtype (Category::temporaries), reused across sequences.
  // With softcap, tanh_in is the forward's tanh_out: dS of the capped scores times
  // (1 − tanh²), rounded to qkv's dtype, is the raw scores' (same scratch).
  // probs: the F32 probabilities that att holds rounded (HF's softmax(..., dtype=float32) output,
  // which autograd saves beside its .to(q.dtype) cast), or nullptr. dV = Pᵀ·dO reads att (the
  // cast, as the ·V matmul's backward does); dS = P ⊙ (dP − Σ_j P·dP) reads probs when given, so
  // the softmax's backward sees the unrounded P, as torch's _softmax_backward_data does.
  virtual void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                  const Tensor& att, int n_head, int n_kv_head,
                                  const AttentionScores& scores = {},
                                  const Tensor* tanh_in = nullptr,
                                  const Tensor* probs = nullptr) = 0;

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
  // tokens (B, T) I32; wte (V, C); wpe (maxT, C) -> out (B, T, C) = wte[tokens] + wpe[t]. wpe
  // may be nullptr (a model without learned positions, Llama): out = wte[tokens].
  virtual void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte,
                                 const Tensor* wpe) = 0;
  // dwte, dwpe (+)= scatter of dout (B, T, C); either may be nullptr.
  virtual void embedding_backward(Tensor* dwte, Tensor* dwpe, const Tensor& dout,
                                  const Tensor& tokens, bool accumulate) = 0;
  // logits (N, V), targets (N) I32 -> losses (N) F32: -log softmax(logits)[target].
  virtual void crossentropy_forward(Tensor& losses, const Tensor& logits,
                                    const Tensor& targets) = 0;
  // dlogits (N, V) = (softmax(logits) - onehot(target)) · dloss, dloss = scale / N_effective.
  virtual void crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                     float dloss) = 0;
  // ---- vocabulary parallelism (Megatron's VocabParallelEmbedding and
  // vocab_parallel_cross_entropy): this rank holds the vocabulary rows [offset, offset + count)
  // of the embedding and the head, so its logits (N, Vr) are those columns of the full (N, V).
  // A negative token is no row: embedding_forward gives its wpe row alone (zeros without wpe)
  // and embedding_backward no gradient. local (B, T) I32 = token − offset for this rank's
  // tokens, else −1.
  virtual void vocab_local_tokens(Tensor& local, const Tensor& tokens, std::int64_t offset,
                                  std::int64_t count) = 0;
  // stats (N, 3) F32 per row of this rank's logits: max, Σ exp(x − max) (in double, rounded
  // once) and the target's logit where target − offset is a column of this rank's (else 0).
  virtual void vocab_crossentropy_stats(Tensor& stats, const Tensor& logits, const Tensor& targets,
                                        std::int64_t offset) = 0;
  // From every rank's stats (R, N, 3), rank after rank (all-gathered): lse (N) F32 = log Σ_r
  // s_r·exp(m_r − M) + M with M = max_r m_r, and losses (N) F32 = lse − Σ_r target logit_r;
  // rows whose target is negative (ignored) get loss 0.
  virtual void vocab_crossentropy_combine(Tensor& losses, Tensor& lse, const Tensor& stats,
                                          const Tensor& targets) = 0;
  // dlogits (N, Vr) = (exp(x − lse) − onehot(target − offset)) · dloss; rows whose target is
  // negative get 0.
  virtual void vocab_crossentropy_backward(Tensor& dlogits, const Tensor& logits,
                                           const Tensor& targets, const Tensor& lse,
                                           std::int64_t offset, float dloss) = 0;
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

  // ---- Llama family ---------------------------------------------------------------------------
  // RMSNorm (HF LlamaRMSNorm) over the last dim: inp (N, C) -> out (N, C); rstd (N) F32, saved
  // for backward, = 1/√(mean(x²) + eps) with the sum in double (as layer-norm's statistics).
  // out = weight · (x·rstd rounded to inp's dtype), rounded to out's dtype: HF rounds the
  // normalised row back to the input's dtype before the weight multiplies it.
  // unit_offset (Gemma2RMSNorm, transformers 4.46.3 modeling_gemma2.py): out = (x·rstd)·(1 + w),
  // all in fp32 and rounded once to out's dtype (no rounding of the normalised row).
  virtual void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                               float eps, bool unit_offset = false) = 0;
  // dinp (N, C) overwritten (may alias dout); dweight (C) (+)= Σ_rows dout · (x·rstd rounded to
  // inp's dtype), the factor the forward multiplied the weight by. The rounding is a straight-
  // through step for dinp, as in autograd. A residual stream adds dinp into its gradient with
  // add_inplace, as models/layers/layernorm.cpp does for layer-norm.
  // unit_offset: (1 + w) in place of w, and dweight's factor x·rstd unrounded.
  virtual void rmsnorm_backward(Tensor& dinp, Tensor* dweight, const Tensor& dout,
                                const Tensor& inp, const Tensor& weight, const Tensor& rstd,
                                bool accumulate, bool unit_offset = false) = 0;
  // RoPE in place on packed qkv (B, T, (NH + 2·NKV)·hd): NH query heads, then NKV key heads, then
  // NKV value heads, hd wide each (GPT's (B, T, 3C) is NKV = NH). The q and k heads of position
  // t = 0..T-1 are rotated, v is left alone; HF's rotate_half convention: element i pairs with
  // i + hd/2 and both use angle t·inv_freq[i mod hd/2] (inv_freq from rope_inv_freq):
  //   y[i] = x[i]·cos − x[i + hd/2]·sin,  y[i + hd/2] = x[i + hd/2]·cos + x[i]·sin.
  // The angle is t·inv_freq rounded to fp32 (as HF's), cos and sin are the fp32 values nearest
  // the true ones, and the rotation is fp32 with one rounding to qkv's dtype. HF instead rounds
  // cos/sin to a 16-bit activation dtype and then each product and the sum; the two differ by
  // less than 2 ulps of the dtype (tests/python/test_rope_reference.py), and the one-rounding
  // rule above is what every other op follows and what makes both backends agree.
  // hd must be even and at most kRopeMaxHeadDim. No scratch.
  virtual void rope_forward(Tensor& qkv, int n_head, int n_kv_head, const RopeConfig& rope) = 0;
  // The transpose (= inverse) rotation of rope_forward on the q and k parts of dqkv, in place:
  // the gradient with respect to the unrotated q and k. dv is left alone.
  virtual void rope_backward(Tensor& dqkv, int n_head, int n_kv_head, const RopeConfig& rope) = 0;
  // SwiGLU's gating (HF LlamaMLP's act_fn(gate_proj(x)) · up_proj(x)): out = silu(gate) · up,
  // silu(g) = g·σ(g); all (N, I), any float dtypes, out may alias gate or up.
  virtual void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) = 0;
  // dgate = dout · up · σ(g)·(1 + g·(1 − σ(g))), dup = dout · silu(g), both overwritten; each may
  // alias one of the inputs (dgate gate or dout, dup up or dout), not the other output.
  virtual void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                               const Tensor& up) = 0;
  // GeGLU (HF Gemma2MLP's act_fn(gate_proj(x)) · up_proj(x), hidden_activation
  // gelu_pytorch_tanh): out = gelu(gate) · up with gelu_forward's tanh GELU; the same dtypes and
  // aliasing as swiglu.
  virtual void geglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) = 0;
  // dgate = dout · up · gelu'(g), dup = dout · gelu(g); aliasing as swiglu_backward.
  virtual void geglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                              const Tensor& up) = 0;
  // Soft-capping (Gemma 2's final_logit_softcapping): out = cap·tanh(inp / cap) in fp32, rounded
  // once to out's dtype; any float dtypes, out may alias inp. No scratch.
  virtual void softcap_forward(Tensor& out, const Tensor& inp, float cap) = 0;
  // From the forward's output: dinp = dout · (1 − (out / cap)²); dinp may alias dout or out.
  virtual void softcap_backward(Tensor& dinp, const Tensor& dout, const Tensor& out, float cap) = 0;

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
