#include "models/config/autocast_policy.h"

#include <stdexcept>

namespace memtrade::autocast {
namespace {

using enum Op;
using C = Compute;
using D = Dtype;
using K = Kept;

// Rows whose dtypes and saved tensors are the same under both policies (only the source
// differs): the lower-precision ops, the loss, and the ops neither device lists.
constexpr Rule matmul_rule(std::string_view source) {
  return {matmul,
          C::lower,
          D::lower,
          {{K::input_cast, D::lower, "a (a contiguous copy when matmul reshapes a strided view)"},
           {K::input_cast, D::lower, "b"}},
          source};
}
constexpr Rule linear_rule(std::string_view source) {
  return {linear,
          C::lower,
          D::lower,
          {{K::input_cast, D::lower, "input (for the weight gradient)"},
           {K::weight_cast, D::lower,
            "weight (for the input gradient: not kept when the input needs none, a network's "
            "first linear; measured, tests/python/test_saved_bytes.py)"}},
          source};
}
constexpr Rule conv2d_rule(std::string_view source) {
  return {conv2d,
          C::lower,
          D::lower,
          {{K::input_cast, D::lower, "input"},
           {K::weight_cast, D::lower, "weight (kept even where the input needs no gradient)"}},
          source};
}
constexpr Rule crossentropy_rule(std::string_view source) {
  return {crossentropy,
          C::fp32,
          D::fp32,
          {{K::intermediate, D::fp32, "log-probabilities (N, V): log_softmax output"},
           {K::indices, D::i64, "targets"}},
          source};
}
constexpr Rule batchnorm_rule(std::string_view source) {
  return {batchnorm,
          C::input,
          D::input,
          {{K::input, D::input, "input"},
           {K::stats, D::fp32, "save_mean (C)"},
           {K::stats, D::fp32, "save_invstd (C)"}},
          source};
}
constexpr Rule maxpool_rule(std::string_view source) {
  return {maxpool,
          C::input,
          D::input,
          {{K::input, D::input, "input"}, {K::indices, D::i64, "argmax"}},
          source};
}
// HF's LlamaRMSNorm: hidden_states.to(float32) (its own cast, a new tensor for a 16-bit input),
// pow, mean, rsqrt and the multiply in fp32, .to(input dtype), then weight (fp32) · that, which
// promotes to fp32. None of these is on an autocast list on either device.
constexpr SavedTensor kRmsInput{K::input_cast, D::fp32,
                                "input in fp32 (HF's own .to(float32): a new copy when it arrives "
                                "in lower), for pow and for the multiply by rsqrt"};
constexpr SavedTensor kRmsStat{K::stats, D::fp32, "rsqrt(mean(x²) + eps) (rows)"};
constexpr SavedTensor kRmsNormed{K::intermediate, D::input,
                                 "the normalised rows (N, C) rounded to the input's dtype: the "
                                 "weight's multiplicand"};
// apply_rotary_pos_emb: q·cos + rotate_half(q)·sin (and k), cos and sin made in fp32 outside
// autocast and cast to q's dtype by LlamaRotaryEmbedding; mul, add, neg and cat are not listed.
constexpr Rule rope_rule(std::string_view source) {
  return {rope,
          C::input,
          D::input,
          {{K::intermediate, D::input, "cos (T, hd) in q's dtype: one per forward, every layer's"},
           {K::intermediate, D::input, "sin (T, hd), likewise"}},
          source};
}
// LlamaMLP's act_fn(gate_proj(x)) · up_proj(x): silu and mul are not listed.
constexpr Rule swiglu_rule(std::string_view source) {
  return {swiglu,
          C::input,
          D::input,
          {{K::input, D::input, "gate (N, I): silu's input"},
           {K::intermediate, D::input, "silu(gate) (N, I): the multiply's other operand"},
           {K::input, D::input, "up (N, I)"}},
          source};
}
constexpr Rule optimizer_rule() {
  return {optimizer, C::outside, D::none, {}, "after backward, outside the autocast region"};
}

// Citations. CUDA: the macro lists of autocast_mode.h @d70fe7f, registered for AutocastCUDA in
// autocast_mode.cpp @008ec6b (see the header). CPU: torch 1.13.1's AutocastCPU registrations,
// and bench/peers/autocast_probe.py's run of each op (the "probe" below).
constexpr std::array<Rule, kNumOps> kCuda = {{
    matmul_rule("AT_FORALL_LOWER_PRECISION_FP: matmul, mm, bmm"),
    linear_rule("AT_FORALL_LOWER_PRECISION_FP: linear, addmm; cached_cast caches the weight cast"),
    conv2d_rule("AT_FORALL_LOWER_PRECISION_FP: conv2d, convolution, _convolution; "
                "cudnn_convolution"),
    {layernorm,
     C::fp32,
     D::fp32,
     {{K::input_cast, D::fp32, "input (a new fp32 copy when it arrives in lower)"},
      {K::stats, D::fp32, "mean (rows)"},
      {K::stats, D::fp32, "rstd (rows)"}},
     "AT_FORALL_FP32: layer_norm, native_layer_norm"},
    {softmax,
     C::fp32,
     D::fp32,
     {{K::output, D::fp32, "probabilities"}},
     "AT_FORALL_FP32_SET_OPT_DTYPE: softmax.int (dtype=fp32: the output is fp32)"},
    {attention,
     C::lower,
     D::lower,
     {{K::input_cast, D::lower, "q (B·NH, T, hd), contiguous copy of the head view"},
      {K::input_cast, D::lower, "k (B·NH, T, hd), contiguous copy"},
      {K::mask, D::boolean, "causal mask (T, T) of masked_fill"},
      {K::intermediate, D::fp32, "probabilities (B, NH, T, T): softmax output, fp32"},
      {K::intermediate, D::lower, "probabilities cast to lower for ·V: a second copy"},
      {K::input_cast, D::lower, "v (B·NH, T, hd), contiguous copy"}},
     "QKᵀ and ·V: AT_FORALL_LOWER_PRECISION_FP matmul; softmax: AT_FORALL_FP32_SET_OPT_DTYPE. "
     "(F.scaled_dot_product_attention, also in AT_FORALL_LOWER_PRECISION_FP, is another path)"},
    crossentropy_rule("log_softmax.int: AT_FORALL_FP32_SET_OPT_DTYPE; nll_loss: AT_FORALL_FP32 "
                      "(cross_entropy decomposes into the two)"),
    {gelu, C::input, D::input, {{K::input, D::input, "input"}}, "not listed"},
    {relu, C::input, D::input, {{K::output, D::input, "output"}}, "not listed"},
    {add, C::promote, D::widest, {}, "not listed: add's own type promotion (fp32 + lower = fp32)"},
    {embedding,
     C::input,
     D::fp32,
     {{K::indices, D::i64, "token ids"}},
     "not listed: runs in the weight's dtype, fp32"},
    batchnorm_rule("not listed (batch_norm takes lower input with fp32 weight and statistics)"),
    {avgpool,
     C::input,
     D::input,
     {},
     "not listed; mean.dim saves only sizes (derivatives.yaml: mean_backward(grad, "
     "self.sym_sizes(), dim, self.sym_numel(), keepdim))"},
    maxpool_rule("not listed"),
    {rmsnorm,
     C::fp32,
     D::fp32,
     {kRmsInput, kRmsStat, kRmsNormed},
     "not listed: HF's LlamaRMSNorm casts to fp32 itself; mean.dim saves only sizes"},
    rope_rule("not listed: mul, add, neg, cat (HF apply_rotary_pos_emb)"),
    swiglu_rule("not listed: silu, mul"),
    {sum, C::fp32, D::fp32, {}, "AT_FORALL_FP32_SET_OPT_DTYPE: sum"},
    optimizer_rule(),
}};

constexpr std::array<Rule, kNumOps> kCpu = {{
    matmul_rule("AutocastCPU: matmul, mm, bmm (lower_precision_fp); probe"),
    linear_rule("AutocastCPU: linear, addmm (lower_precision_fp); probe: the weight cast is "
                "cached"),
    conv2d_rule("AutocastCPU: conv2d (lower_precision_fp); probe"),
    {layernorm,
     C::input,
     D::input,
     {{K::input, D::input, "input"},
      {K::stats, D::input, "mean (rows)"},
      {K::stats, D::input, "rstd (rows)"}},
     "not registered for AutocastCPU in 1.13; probe: fp32 input -> fp32, lower input with "
     "fp32 weight is an error ('expected scalar type BFloat16 but found Float')"},
    {softmax,
     C::input,
     D::input,
     {{K::output, D::input, "probabilities"}},
     "not registered for AutocastCPU in 1.13; probe"},
    {attention,
     C::lower,
     D::lower,
     {{K::input_cast, D::lower, "q (B·NH, T, hd), contiguous copy of the head view"},
      {K::input_cast, D::lower, "k (B·NH, T, hd), contiguous copy"},
      {K::mask, D::boolean, "causal mask (T, T) of masked_fill"},
      {K::intermediate, D::lower, "probabilities (B, NH, T, T): softmax in lower"},
      {K::input_cast, D::lower, "v (B·NH, T, hd), contiguous copy"}},
     "QKᵀ and ·V: AutocastCPU matmul (lower_precision_fp); softmax not registered: it runs "
     "in lower; probe"},
    crossentropy_rule("AutocastCPU: cross_entropy_loss, nll_loss (fp32); probe"),
    {gelu,
     C::input,
     D::input,
     {{K::input, D::input, "input"}},
     "not registered for AutocastCPU in 1.13; probe"},
    {relu, C::input, D::input, {{K::output, D::input, "output"}}, "not registered; probe"},
    {add,
     C::promote,
     D::widest,
     {},
     "not registered: add's own type promotion; torch_expect_builtin_promote in 1.13's "
     "autocast_test_lists.py; probe"},
    {embedding,
     C::input,
     D::fp32,
     {{K::indices, D::i64, "token ids"}},
     "not registered: runs in the weight's dtype, fp32; probe"},
    batchnorm_rule("not registered for AutocastCPU in 1.13; probe: lower input -> lower "
                   "output, fp32 stats"),
    {avgpool,
     C::input,
     D::input,
     {{K::input, D::input, "input (1.13's mean.dim saves self)"}},
     "not registered; probe"},
    maxpool_rule("not registered; probe"),
    {rmsnorm,
     C::fp32,
     D::fp32,
     {kRmsInput,
      {K::intermediate, D::fp32, "x² (N, C): 1.13's mean.dim saves its input"},
      kRmsStat,
      kRmsNormed},
     "not registered for AutocastCPU in 1.13: HF's LlamaRMSNorm casts to fp32 itself; probe"},
    rope_rule("not registered: mul, add, neg, cat; probe"),
    swiglu_rule("not registered: silu, mul; probe"),
    {sum, C::input, D::input, {}, "not registered for AutocastCPU in 1.13; probe"},
    optimizer_rule(),
}};

constexpr std::array<std::string_view, kNumOps> kOpNames = {
    "matmul",  "linear", "conv2d", "layernorm", "softmax",   "attention", "crossentropy",
    "gelu",    "relu",   "add",    "embedding", "batchnorm", "avgpool",   "maxpool",
    "rmsnorm", "rope",   "swiglu", "sum",       "optimizer"};

}  // namespace

std::span<const Rule> rules(Policy policy) {
  switch (policy) {
    case Policy::torch_cuda:
      return kCuda;
    case Policy::torch_cpu:
      return kCpu;
  }
  throw std::invalid_argument("unknown autocast policy");
}

const Rule& rule(Policy policy, Op op) {
  return rules(policy)[static_cast<std::size_t>(op)];
}

std::string_view op_name(Op op) {
  return kOpNames[static_cast<std::size_t>(op)];
}

namespace {
constexpr std::array<std::string_view, kNumPolicies> kPolicyNames = {"torch-cuda", "torch-cpu"};
}  // namespace

std::string_view policy_name(Policy policy) {
  return kPolicyNames.at(static_cast<std::size_t>(policy));
}

std::optional<Policy> parse_policy(std::string_view name) {
  for (std::size_t i = 0; i < kNumPolicies; ++i)
    if (kPolicyNames[i] == name) return static_cast<Policy>(i);
  return std::nullopt;
}

std::vector<std::string> policy_names() {
  return {kPolicyNames.begin(), kPolicyNames.end()};
}

namespace {

DType widest(DType a, DType b) {
  return a == DType::F32 || b == DType::F32 ? DType::F32 : a;
}

}  // namespace

DType Rule::input_dtype(DType lower, DType in, DType other) const {
  switch (compute) {
    case Compute::lower:
      return lower;
    case Compute::fp32:
      return DType::F32;
    case Compute::promote:
      return widest(in, other);
    case Compute::input:
      return in;
    case Compute::outside:
      break;
  }
  throw std::logic_error(std::string(op_name(op)) + " runs outside autocast: no input dtype");
}

DType Rule::output_dtype(DType lower, DType in, DType other) const {
  switch (output) {
    case Dtype::lower:
      return lower;
    case Dtype::fp32:
      return DType::F32;
    case Dtype::input:
      return in;
    case Dtype::widest:
      return widest(in, other);
    case Dtype::i64:
    case Dtype::boolean:
    case Dtype::none:
      break;
  }
  throw std::logic_error(std::string(op_name(op)) + " has no floating output");
}

}  // namespace memtrade::autocast
