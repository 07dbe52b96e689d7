// TrainerParamStore: where the Trainer keeps every copy of every parameter.
//
// What a model sees (ParamStore): the weight in the compute dtype on the device and its
// gradient. What the Trainer adds, decided by precision and offload:
//
//   knobs                      device                      pinned host
//   fp32/tf32, offload none    weight F32 (params)         -
//   fp16/bf16 (autocast)       weight F32 (params), and    -
//                              per forward 16-bit casts
//                              (casts: ParamStore::weight_cast, model.h)
//   fp16-o2/bf16-o2            weight 16-bit + master F32  -
//   fp16-pure/bf16-pure        weight 16-bit               -
//   offload=optimizer          weight (compute dtype)      "master": F32 (O2, and fp32/autocast:
//                                                          the host needs its own copy of the
//                                                          parameters to run the update), or
//                                                          16-bit in pure precision (category
//                                                          master either way)
//   offload=params             block weights only while    weight (compute dtype, params) +
//                              their block is entered;     master F32 (O2)
//                              non-block weights resident
//
// Gradients are always on the device in the compute dtype (category grads); with a host
// update they are copied into pinned buffers (category grads, on the pinned allocator) first.
// Buffers (trainable = false, e.g. batch-norm running stats) are F32 on the device, never
// streamed (forward mutates them), and have no gradient.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/device.h"
#include "models/config.h"
#include "models/model.h"

namespace memtrade {

struct ParamPlacement {
  DType compute = DType::F32;  // weights and grads on the device
  bool master = false;         // an fp32 master copy exists (mixed precision)
  Offload offload = Offload::none;

  static ParamPlacement from(const TrainConfig& cfg);
  // The optimizer runs on the host (ZeRO-Offload style) for offload=optimizer and =params.
  bool host_update() const { return offload == Offload::optimizer || offload == Offload::params; }
  bool stream_params() const { return offload == Offload::params; }
};

class TrainerParamStore final : public ParamStore {
 public:
  // Allocates and initialises every copy (per spec.init_std, from `seed`); no gradients yet.
  // On a device that does not hold data (Device::holds_data) it allocates only.
  TrainerParamStore(Device& dev, const std::vector<ParamSpec>& specs,
                    const ParamPlacement& placement, std::uint64_t seed);

  // ---- ParamStore ------------------------------------------------------------------------------
  // Throws std::logic_error for a streamed weight used outside enter_block/exit_block.
  Tensor& weight(int index) override;
  GradRef grad(int index) override;      // allocates on first use; throws for a buffer
  void enter_block(int block) override;  // nests: only the outermost enter/exit moves bytes
  void exit_block(int block) override;

  // ---- zero_grad -------------------------------------------------------------------------------
  // Before a step's first backward. set_to_none: grads are gone, the first write assigns.
  // zero: grads that exist are fill(0)ed with `ops` and every write accumulates.
  void begin_step(ZeroGrad zero_grad, Ops& ops);
  void release_grads();          // set_to_none after the optimizer step
  std::vector<Tensor*> grads();  // the device grads that exist, for the inf/nan check
  bool has_grad(int index) const;
  Tensor& device_grad(int index);

  // ---- the optimizer's view
  // ---------------------------------------------------------------------- The tensor the optimizer
  // updates: the master (device or host) if there is one, else the host weight (offload=params) or
  // the device weight.
  Tensor& update_target(int index);
  // Host update: copy the device grad into its pinned buffer (queued on the compute stream;
  // synchronise before reading) and return that buffer.
  Tensor& fetch_grad(int index);
  // After update_target(index) changed: carry the new values into the weights the model reads
  // (cast master -> weight on the device; or on the host and copy to the device).
  void publish(int index, Ops& device_ops, Ops* host_ops);
  // After the last publish(): waits for queued copies and frees their staging buffers.
  void finish_publish();

  // ---- introspection
  // -------------------------------------------------------------------------------
  int size() const { return static_cast<int>(slots_.size()); }
  const ParamSpec& spec(int index) const { return specs_.at(static_cast<std::size_t>(index)); }
  const ParamPlacement& placement() const { return place_; }
  std::vector<float> param_f32(int index);  // master if any, else the (host or device) weight
  // fp32 values of a device or pinned-host tensor; std::logic_error on a device without data.
  std::vector<float> read_f32(const Tensor& t);
  bool on_host(const Tensor& t) const { return t.allocator() == &dev_.pinned(); }

 private:
  struct Slot {
    Tensor weight;              // device, compute dtype (F32 for buffers)
    Tensor host_weight;         // pinned, compute dtype (offload=params)
    Tensor master;              // fp32 master on the device, or the host copy the update runs on
    Tensor grad;                // device, compute dtype
    Tensor host_grad;           // pinned copy of grad (host update)
    bool grad_written = false;  // a write this step: later writes accumulate
  };
  Slot& slot(int index);
  bool streamed(int index) const;
  void upload_weight(int index);  // host_weight -> device weight (compute stream)

  Device& dev_;
  const std::vector<ParamSpec>& specs_;
  ParamPlacement place_;
  std::vector<Slot> slots_;
  std::vector<std::vector<int>> block_params_;  // streamed parameter indices per block
  std::vector<int> block_depth_;                // enter_block nesting per block
  std::vector<Tensor> staging_;                 // pinned casts in flight until finish_publish
};

}  // namespace memtrade
