// Trainer: one optimizer step of a Model on a Device, with every knob of the grid.
//
// A step is `accumulation` micro-batches of `batch_size` samples; micro-batch m of step s holds
// the sample rows [s·B·k + m·B, +B) of the model's data stream, so 8×1, 4×2 and 2×4 see the
// same samples. Each micro-batch: the batch is staged in pinned (or pageable) host memory and
// copied to the device on the copy stream ("io"), forward keeps what backward needs per the
// checkpoint/offload policy ("forward"), backward adds into the grads ("backward") with
// dL/dloss_row = loss_scale / (rows of the whole effective batch), so the grads are those of the
// mean loss over the effective batch. Then ("optimizer"):
//   - fp16/fp16-o2/fp16-pure: the scaled grads are checked for inf/nan
//     (Ops::unscale_and_check with inv_scale 1, which leaves them untouched). On overflow the
//     update is skipped and the scale backs off (LossScaler, torch GradScaler semantics).
//     Otherwise each grad is unscaled as the update reads it (fp32 arithmetic): unscaling a
//     16-bit grad in place would flush everything below fp16's 2^-24 to zero (why torch's
//     GradScaler refuses fp16 grads). Autocast's grads are fp32, as GradScaler expects.
//   - the optimizer updates the fp32 master (O2), the fp32 weight (fp32/tf32 and autocast,
//     whose 16-bit weights are per-forward casts) or the 16-bit weight with 16-bit state (pure);
//     a master is then cast into the 16-bit weight.
//   - offload=optimizer/params: grads are copied into pinned host buffers and the update runs
//     on the host with CPU ops, on the host copies (see TrainerParamStore); the new weights are
//     copied back to the device (params: the resident ones; block weights stream in at use).
//   - zero_grad=set_to_none frees the grads after the update; zero keeps them and fill(0)s them
//     before the next step's first backward, which then accumulates. Both are bit-identical.
// The loss is read back once per step: the per-row losses of the micro-batches are added on
// the device and summed to one host number at the end.
// Eval mode runs only the forward passes (nothing saved) and returns the mean loss.
// tf32 runs exactly as fp32 here: Ops has no TF32 switch; the CUDA backend's GEMMs decide.
//
// Data parallelism (data_parallel > 1; models/train/data_parallel.h): this process is one rank of
// the group Comm makes (MPI, NCCL, or the meta device's). Rank r trains on its contiguous share
// of the step's samples; backward scales by the global row count. The grads are reduced during
// the last micro-batch's backward only (DDP/FSDP's no_sync on the others): zero2/3 reduce-scatter
// each block's grads once its backward is done, and everything left after the backward (DDP's
// buckets, zero1's all-reduce, the parameters outside the blocks). zero3 gathers the weights
// outside the blocks around each forward and backward. The loss and the overflow flag are
// all-reduced, so every rank returns the same StepResult.
//
// Tensor parallelism (tensor_parallel > 1; kernels/parallel_state.h): the world is tp × dp ranks;
// the tp ranks of one replica train on the same samples (first_sample by dp rank), the model is
// this rank's slice (make_model(cfg, tp rank)) and runs its collectives in the tp group
// (RunOptions::parallel), the store reduces over the dp group. Under sequence parallelism the
// gradients of the replicated parameters fed by this rank's tokens only (norms, row-parallel
// biases: ParamSpec::sequence_parallel_grad) are all-reduced over the tp group after the
// reduction (Megatron's finalize_model_grads). The fp16 overflow flag is reduced over the world.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/comm.h"
#include "kernels/device.h"
#include "kernels/parallel_state.h"
#include "models/config/config.h"
#include "models/model.h"
#include "models/train/loss_scaler.h"
#include "models/train/optimizer.h"
#include "models/train/param_store.h"

namespace memtrade {

struct StepResult {
  double loss;       // mean loss over the effective batch
  bool skipped;      // fp16 overflow: no update happened
  float loss_scale;  // the scale this step ran with
};

class Trainer {
 public:
  // Allocates the parameters (+ master copies) and initialises them from cfg.seed; grads and
  // optimizer state come into existence at the first step, as in PyTorch. Throws
  // std::invalid_argument for a bad config (batch_size < 1, accumulation < 1, lr < 0, ...).
  Trainer(Device& dev, Model& model, const TrainConfig& cfg);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  StepResult step();
  std::int64_t steps_done() const { return steps_; }  // step() calls, eval included

  // ---- introspection (dumps and tests): fp32 host copies, by index into model.params() -----
  std::vector<float> param_f32(int i);  // master copy if any, else the weight
  // Sets parameter i (before a step: `step --init`) to `values`, into what the optimizer updates
  // (the fp32 master, or an fp32 weight) and on to the weights the model reads. Throws
  // std::invalid_argument on a size mismatch or where that tensor is 16-bit (pure precisions).
  void set_param_f32(int i, const std::vector<float>& values);
  // Unscaled gradient of the mean loss over the effective batch: the copy captured during the
  // last step when set_capture_grads(true), else the resident grad (zero_grad=zero) divided by
  // the last step's scale; empty if there is none. Under data parallelism the reduced grad,
  // whole, and param_f32/grad_f32 are collectives (every rank calls them).
  std::vector<float> grad_f32(int i);
  void set_capture_grads(bool on) { capture_grads_ = on; }
  // The last step's whole effective batch (B·k samples; GPT token ids as floats); empty on a
  // device that holds no data, where no samples are made.
  const std::vector<float>& last_inputs() const { return last_inputs_; }
  const std::vector<std::int32_t>& last_targets() const { return last_targets_; }

  std::int64_t samples_per_step() const { return memtrade::samples_per_step(cfg_); }
  std::int64_t tokens_per_step() const { return samples_per_step() * model_.rows_per_sample(); }
  float loss_scale() const { return scaler_.scale(); }
  std::int64_t skipped_steps() const { return scaler_.skipped_steps(); }
  std::int64_t optimizer_steps() const { return optimizer_ ? optimizer_->steps() : 0; }
  const OptimizerHyper& optimizer_hyper() const { return hyper_; }
  const RunOptions& run_options() const { return run_; }
  const TrainConfig& config() const { return cfg_; }
  Optimizer* optimizer() { return optimizer_.get(); }  // null before the first train step
  TrainerParamStore& store() { return store_; }
  Comm& comm() { return parallel_.dp_comm(); }  // the data-parallel group (one rank: self)
  const ParallelState& parallel() const { return parallel_; }

 private:
  struct MicroBatch;
  MicroBatch stage(std::int64_t first);  // "io": make, stage and copy one micro-batch
  void optimizer_phase(bool& skipped);
  // Sequence parallelism: the tp group's sum of the replicated gradients fed by each rank's
  // tokens (ParamSpec::sequence_parallel_grad), after the dp reduction.
  void reduce_sequence_parallel_grads();

  Device& dev_;
  Model& model_;
  TrainConfig cfg_;
  RunOptions run_;
  OptimizerHyper hyper_;
  ParallelState parallel_;  // before store_, which keeps a reference to its dp group
  TrainerParamStore store_;
  LossScaler scaler_;
  std::unique_ptr<Ops> host_ops_;         // the device's ops on pinned memory (offload)
  std::unique_ptr<Optimizer> optimizer_;  // created at the first train step
  std::int64_t steps_ = 0;
  float last_scale_ = 1.0f;

  std::vector<float> last_inputs_;
  std::vector<std::int32_t> last_targets_;
  bool capture_grads_ = false;
  std::vector<std::vector<float>> captured_grads_;
  std::vector<Tensor> host_staging_;  // pinned input staging of the running step
};

}  // namespace memtrade
