// Autocast policies as data: for each memtrade op kind (kernels/ops.h), the dtype PyTorch's
// autocast computes it in and what autograd then keeps for backward, in which dtype. The engine
// follows it for the autocast precisions fp16/bf16 (models/config/config.h): layers ask LayerCtx
// (models/layers/context.h) for each op's input and output dtype, which come from
// Rule::input_dtype/output_dtype below; the `kept` lists document what PyTorch saves and are
// what tests/python/test_saved_bytes.py holds memtrade's activations to.
//
// Two policies:
//   torch_cuda: CUDA autocast of PyTorch main. The op lists are the AT_FORALL_LOWER_PRECISION_FP,
//     AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE and AT_FORALL_PROMOTE macros of
//     aten/src/ATen/autocast_mode.h at pytorch/pytorch@d70fe7f33910bbe8bc8b6027388a84bb102a453d,
//     registered for AutocastCUDA by TORCH_LIBRARY_IMPL(aten, Autocast, m) in
//     aten/src/ATen/autocast_mode.cpp at pytorch/pytorch@008ec6b1840c94ff6d0f685bc10fbf585167c673.
//     Read from the source, not run (no GPU here).
//   torch_cpu: CPU autocast of torch 1.13 (Debian's python3-torch 1.13.1+dfsg, the reference
//     that tests/python runs): the ops its binary registers for AutocastCPU
//     (torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU"), registered by
//     TORCH_LIBRARY_IMPL(aten, AutocastCPU, m) at aten/src/ATen/autocast_mode.cpp:487 of v1.13),
//     each row checked by running it: bench/peers/autocast_probe.py.
// "lower" is the autocast dtype: fp16 by default on CUDA (bf16 when asked), bf16 on the CPU.
// The dtype an op receives follows from the rows before it (dataflow): e.g. in the GPT the
// residual stream stays fp32 (embedding output fp32, fp32 + lower promotes to fp32), so its
// layer norms get fp32 and linears cast their input to lower.
//
// What a row lists is what autograd saves, from the op's derivative formula: activations only.
// Parameters and buffers a formula also saves (weights, running statistics) are not listed;
// autocast's cached casts of the weights are (Kept::weight_cast), since they are new tensors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace memtrade::autocast {

// memtrade's op kinds (kernels/ops.h), as the models use them. `attention` is the math path
// (QKᵀ, scale, causal mask, softmax, ·V: attention_forward); `crossentropy` is log_softmax +
// nll_loss (crossentropy_forward); `avgpool` is the global average pool (x.mean over H, W);
// `rmsnorm`, `rope` and `swiglu` are the Llama ops as HF writes them in Python (LlamaRMSNorm,
// apply_rotary_pos_emb, act_fn(gate) · up); `sum` the loss reduction (sum_to_host);
// `optimizer` the parameter update.
enum class Op : std::uint8_t {
  matmul,
  linear,
  conv2d,
  layernorm,
  softmax,
  attention,
  crossentropy,
  gelu,
  relu,
  add,
  embedding,
  batchnorm,
  avgpool,
  maxpool,
  rmsnorm,
  rope,
  swiglu,
  sum,
  optimizer,
};
inline constexpr std::size_t kNumOps = static_cast<std::size_t>(Op::optimizer) + 1;

enum class Policy : std::uint8_t { torch_cuda, torch_cpu };
inline constexpr std::size_t kNumPolicies = 2;

// The dtype rule of an op under autocast (c10 CastPolicy, autocast_mode.h).
enum class Compute : std::uint8_t {
  lower,    // CastPolicy::lower_precision_fp: every floating input is cast to lower first
  fp32,     // CastPolicy::fp32 (inputs cast to fp32) or fp32_set_opt_dtype (output dtype fp32)
  promote,  // the widest floating input dtype: fp32 when any input is fp32 (CastPolicy::promote,
            // or, for ops autocast does not list, the op's own type promotion)
  input,    // not listed: runs in the dtype of the floating input it gets (for embedding: the
            // fp32 weight)
  outside,  // not run under autocast (the optimizer step, after backward)
};

enum class Dtype : std::uint8_t {
  lower,    // the autocast dtype
  fp32,     // float32
  input,    // the dtype of the op's floating (activation) input as it arrives
  widest,   // fp32 if any floating input is fp32, else lower
  i64,      // int64 (indices)
  boolean,  // bool (masks)
  none,     // no output tensor (the optimizer updates in place)
};

// What a saved tensor is.
enum class Kept : std::uint8_t {
  input,         // the activation input as it arrived: no new memory of the op's own
  input_cast,    // the activation input in the compute dtype: the input itself when it already
                 // has that dtype, else autocast's cast of it, a new tensor that is kept
  output,        // the op's output
  weight_cast,   // autocast's cached lower cast of an fp32 weight: made once per autocast
                 // region (per forward), kept until the backward that uses it
  stats,         // per-row or per-channel statistics (mean, rstd, invstd): rows or C elements
  indices,       // int64: targets, max-pool argmax, token ids
  mask,          // bool mask
  intermediate,  // a tensor made inside a composite op (attention, crossentropy)
};

struct SavedTensor {
  Kept kind = Kept::input;
  Dtype dtype = Dtype::input;
  std::string_view what;  // which tensor, its shape where it matters
};

inline constexpr std::size_t kMaxSaved = 6;

struct Rule {
  Op op;
  Compute compute;
  Dtype output;
  std::array<SavedTensor, kMaxSaved> saved{};
  std::size_t num_saved = 0;
  std::string_view source;  // the list or registration (and measurement) the row rests on

  constexpr Rule(Op o, Compute c, Dtype out, std::initializer_list<SavedTensor> s,
                 std::string_view src)
      : op(o), compute(c), output(out), source(src) {
    for (const SavedTensor& t : s) saved[num_saved++] = t;  // > kMaxSaved: not a constant
  }
  std::span<const SavedTensor> kept() const { return {saved.data(), num_saved}; }

  // The dtypes the rule gives when the autocast dtype is `lower` and the op's floating inputs
  // arrive as `in` and `other` (a second floating input where the op has one, else `in`): what
  // autocast casts those inputs to before the op runs (input_dtype; `in` itself where it does
  // not cast), and the dtype of the op's output. std::logic_error for `outside` (no dtype).
  DType input_dtype(DType lower, DType in, DType other) const;
  DType output_dtype(DType lower, DType in, DType other) const;
};

// Every op's rule under `policy`, in Op order (rules(p)[i].op == Op(i)).
std::span<const Rule> rules(Policy policy);
const Rule& rule(Policy policy, Op op);

std::string_view op_name(Op op);
// The spellings "torch-cuda" and "torch-cpu" (the --autocast-policy values, models/config/knobs.h).
std::string_view policy_name(Policy policy);
std::optional<Policy> parse_policy(std::string_view name);
std::vector<std::string> policy_names();

}  // namespace memtrade::autocast
