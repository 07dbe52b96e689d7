// LayerCtx: what a layer's forward/backward needs besides its tensors — the device, the weights
// and gradients (ParamStore), where to save for backward (SavedTensors) and how, and which dtype
// each op runs in.
//
// Dtypes. Outside autocast every activation, and every activation gradient, has the dtype `act`
// (fp32, or 16 bits for the O2 and pure precisions). Under autocast (`amp`: fp16/bf16) each op
// runs as torch.autocast runs it, per the policy's rule for its kind
// (models/config/autocast_policy.h):
//   - a layer asks in_dtype/out_dtype for an op's input and output dtype, and passes its inputs
//     through cast_input, which makes autocast's cast where the op computes in another dtype than
//     the input has (a new tensor; an op that saves its input saves the cast, as autograd does);
//   - an op that computes in 16 bits reads its weights through op_weight: autocast's cached
//     16-bit cast (ParamStore::weight_cast), kept with the segment for backward when the op's
//     backward needs it (category casts, not activations);
//   - backward follows autograd: a gradient has the dtype of the tensor it belongs to, so the
//     gradient of a cast is cast back (grad_as: ToCopyBackward), and the gradient of a weight
//     read through its 16-bit cast is computed in 16 bits and then cast to fp32 and assigned or
//     added to the fp32 gradient (ParamGrad: ToCopyBackward + AccumulateGrad).
// Outside autocast all of these are no-ops (same tensors, same allocations), which is what keeps
// the O2 precisions byte for byte what fp16/bf16 were before autocast existed.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string_view>

#include "kernels/device.h"
#include "models/config/autocast_policy.h"
#include "models/model.h"
#include "models/train/saved_tensors.h"

namespace memtrade {

// A parameter's index in Model::params(), -1 when absent (a Linear without bias).
using ParamIndex = int;

using autocast::Op;

// The bytes eager autograd holds for one weight gradient beside the gradient itself
// (LayerCtx::accumulate_buffer); both are freed with it.
struct AccumulateBuffer {
  Tensor fresh;  // the op's output, which AccumulateGrad adds in
  Tensor held;   // the same weight's earlier gradients of this backward (a tied head's)
};

// A weight gradient as an op writes it (ParamStore::grad) with eager's buffer for it
// (LayerCtx::accumulate_buffer), both for the op's span.
struct OpGrad {
  Tensor& t;
  bool accumulate;
  AccumulateBuffer eager;
};

struct LayerCtx {
  Device& dev;
  ParamStore& store;
  SavedTensors& saved;
  DType act = DType::F32;  // activations and their gradients outside autocast; under autocast
                           // the dtype of the model input (fp32)
  std::optional<AutocastSpec> amp;  // set: torch.autocast with this dtype and policy
  int segment = -1;        // SavedTensors segment: the block index, -1 stem, num_blocks head
  bool save = false;       // keep what backward needs (training, block not dropped)
  bool selective = false;  // skip saving what is cheap to recompute (selective checkpointing)
  bool recompute = false;  // re-running a forward for backward: no side effects (BN stats)
  AttentionKind attention = AttentionKind::math;  // RunOptions::attention
  // RunOptions::llama_layers is hf_eager: the Llama-like layers (RMSNorm, the Llama MLP, RoPE
  // attention) keep what HF's eager code keeps besides what their fused ops need, the bytes
  // autograd holds; the ops and so the arithmetic are the same (models/families/llama.h).
  bool hf_eager = false;
  bool backward = false;  // in Model::backward: saved weight casts are read, never made
  // In a block's backward, where BlockModel::block_backward_fetches(): brings the block's
  // offloaded saved tensors back (the first call; later ones do nothing).
  std::function<void()> fetch_saved = nullptr;
  // Tensor parallelism (models/layers/tensor_parallel.h): the tp group of this model replica
  // (null: one rank, no collective), and whether the residual stream's tokens are split over it
  // (sequence parallelism).
  Comm* tp = nullptr;
  bool sequence_parallel = false;
  // Expert parallelism (models/layers/moe.h): the ep group the MoE layers exchange tokens in
  // (null: every expert on this rank).
  Comm* ep = nullptr;

  Ops& ops() { return dev.ops(); }
  Tensor& weight(int index) { return store.weight(index); }

  // Saved for backward when `save`, else freed within the forward.
  Category cat() const { return save ? Category::activations : Category::temporaries; }
  // A tensor that will be saved if this forward saves: of dtype `act`, or `dtype`.
  Tensor act_tensor(Shape shape) { return act_tensor(std::move(shape), act); }
  Tensor act_tensor(Shape shape, DType dtype) { return dev.empty(std::move(shape), dtype, cat()); }
  // A buffer that never outlives the current forward/backward step of a layer.
  Tensor temp(Shape shape, DType dtype) {
    return dev.empty(std::move(shape), dtype, Category::temporaries);
  }
  Tensor temp(Shape shape) { return temp(std::move(shape), act); }
  // A temporary shaped like `t`, of its dtype: the gradient of `t` in backward.
  Tensor temp_like(const Tensor& t) { return temp(t.shape(), t.dtype()); }

  void keep(std::string_view key, Tensor t) {
    if (save) saved.save(segment, key, std::move(t));
  }
  Tensor& get(std::string_view key) { return saved.get(segment, key); }
  bool has(std::string_view key) const { return saved.has(segment, key); }

  // ---- dtypes ---------------------------------------------------------------------------------
  // The dtype `op` reads its floating inputs in / writes its output in, given the dtypes they
  // arrive in (`other`: a second floating input, for ops that promote): `act` outside autocast,
  // else the policy's rule.
  DType in_dtype(Op op, DType in, DType other) const;
  DType out_dtype(Op op, DType in, DType other) const;
  DType in_dtype(Op op, const Tensor& in) const { return in_dtype(op, in.dtype(), in.dtype()); }
  DType out_dtype(Op op, const Tensor& in) const { return out_dtype(op, in.dtype(), in.dtype()); }
  // std::logic_error unless `t` already has the dtype `op` reads (for layers that leave the
  // cast to their caller: a dataflow mistake fails loudly instead of computing mixed).
  void expect_input(Op op, const Tensor& t) const;

  // `t` in `op`'s input dtype: `t` itself, or autocast's cast of it (category cat()); a cast
  // frees `t`.
  Tensor cast_input(Op op, Tensor t);
  // The same for a tensor the caller keeps: `t`, or the cast, made in `holder`.
  const Tensor& cast_input(Op op, const Tensor& t, Tensor& holder);

  // The weight params()[index] as `op` reads it: the stored weight, or autocast's cached 16-bit
  // cast for an op that computes in 16 bits. With `kept` (the op's backward reads the weight) a
  // saving forward keeps the cast with this segment, where backward finds it; without (a bias:
  // no backward use) it lives in the cache until the autocast region ends.
  const Tensor& op_weight(Op op, ParamIndex index, bool kept = true);
  // The dtype op_weight gives, without making anything.
  DType weight_dtype(Op op, ParamIndex index);
  // Backward is done with the weight's cast that this segment kept (a no-op where it kept
  // none): autograd frees the cast an op saved once that op's backward has run, before the
  // weight's gradient goes on to ToCopyBackward and AccumulateGrad.
  void release_weight_cast(ParamIndex index);

  // A gradient in `dtype`, the dtype of the tensor it belongs to: `g` itself, or its cast (a
  // temporary; the gradient of autocast's cast of that tensor), and then `g` is freed.
  Tensor grad_as(Tensor g, DType dtype);
  // The same for a gradient the caller keeps: `g`, or the cast, made in `holder`.
  const Tensor& grad_as(const Tensor& g, DType dtype, Tensor& holder);

  // ---- weight gradients as eager autograd holds them ------------------------------------------
  // Eager autograd computes every weight gradient into a fresh buffer, which AccumulateGrad then
  // makes the gradient (when there is none yet: no extra bytes) or adds into the existing one and
  // frees (a later micro-batch, zero_grad(set_to_none=False), the second use of a tied weight).
  // memtrade's ops add into the existing gradient in place (the same sum), so for an op writing
  // gradient `g` of params()[index] with g.accumulate this is a temporary of the gradient's shape
  // and dtype standing for eager's buffer: keep it for the op's span (empty otherwise). A weight
  // read twice in one forward (a tied head) has its first gradient held in its AccumulateGrad
  // node's input buffer until the other arrives (torch/csrc/autograd/input_buffer.cpp): after
  // hold_grad(index), the next buffer of that weight is kept by the context (`fresh` is a view of
  // it) and handed over as `held` with the weight's following one.
  AccumulateBuffer accumulate_buffer(ParamIndex index, const GradRef& g);
  void hold_grad(ParamIndex index) { hold_next_ = index; }
  // The gradient of params()[index] for an op that writes it in the stored weight's dtype, with
  // that buffer: what a layer's backward takes for each such weight (ParamGrad for an op that
  // may read a 16-bit cast).
  OpGrad grad(ParamIndex index) {
    GradRef g = store.grad(index);
    return {g.t, g.accumulate, accumulate_buffer(index, g)};
  }

  ParamIndex hold_next_ = -1;
  std::map<ParamIndex, Tensor> held_grads_{};
};

// Column blocks of a row-major matrix (Device::copy_2d, one copy of `part.dim(1)` columns per
// row): copy_columns fills the contiguous (N, w) `part` from columns [col, col + w) of the (N, W)
// `src`; place_columns writes `part` into those columns of `dst`. Same dtype; for the halves of
// Phi-3's gate_up and the q and k heads of Qwen3's packed qkv, which the kernels take contiguous.
void copy_columns(LayerCtx& c, Tensor& part, const Tensor& src, std::int64_t col);
void place_columns(LayerCtx& c, Tensor& dst, std::int64_t col, const Tensor& part);

// The gradient of params()[index] as an op writes it: in the dtype of the weight the op read.
// When that is the stored weight's dtype, t() is the ParamStore's gradient itself (and
// accumulate() its flag). An op that read autocast's 16-bit cast writes a 16-bit gradient into a
// temporary instead (accumulate() false), which finish() casts to the fp32 gradient: assigned to
// a fresh one, or added into an existing one through an fp32 temporary (autograd's ToCopyBackward
// output, which AccumulateGrad adds in). Either way call finish() after the op. With
// `eager_buffer` it holds LayerCtx::accumulate_buffer until finish() (without: the caller's own
// temporary stands for it, as StackedGrads' stacked gradient does).
class ParamGrad {
 public:
  ParamGrad(LayerCtx& c, ParamIndex index, DType computed_in, bool eager_buffer = true);
  Tensor& t() { return computed_.defined() ? computed_ : *grad_; }
  bool accumulate() const { return accumulate_; }
  void finish();

 private:
  LayerCtx& c_;
  ParamIndex index_;
  Tensor computed_;  // the 16-bit gradient (autocast)
  Tensor* grad_ = nullptr;
  bool accumulate_ = false;
  bool eager_buffer_ = true;
  AccumulateBuffer buffer_;
};

}  // namespace memtrade
