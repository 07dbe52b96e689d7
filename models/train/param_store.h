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
//
// Data parallelism over N ranks (models/train/data_parallel.h has the rules): each trainable
// parameter of n elements is split into N parts of ceil(n / N) (DeepSpeed ZeRO's per-parameter
// partitioning); this rank owns part `rank`. By sharding stage:
//   none   everything replicated; DDP's buckets (category grads) hold a second copy of the grads
//          while they are all-reduced (reduce_grads, after the last micro-batch's backward).
//   zero1  the fp32 master (O2) is the rank's part only; the optimizer updates the part (a view
//          of the weight without a master) and the weights are all-gathered after the update.
//   zero2  + a block's grads are reduce-scattered into the rank's part (category grads) as soon
//          as the last micro-batch's backward of that block is done, and the full grads freed.
//   zero3  + the weights themselves are the rank's part; the full weight of a block exists
//          between enter_block and exit_block (all-gathered there, as FSDP FULL_SHARD), that of
//          the parameters outside the blocks between gather_root and release_root.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/comm.h"
#include "kernels/device.h"
#include "models/config/config.h"
#include "models/model.h"
#include "models/train/data_parallel.h"

namespace memtrade {

struct ParamPlacement {
  DType compute = DType::F32;  // weights and grads on the device
  bool master = false;         // an fp32 master copy exists (mixed precision)
  Offload offload = Offload::none;
  Sharding sharding = Sharding::none;  // over comm.size() ranks; none where there is one

  static ParamPlacement from(const TrainConfig& cfg);
  // The optimizer runs on the host (ZeRO-Offload style) for offload=optimizer and =params.
  bool host_update() const { return offload == Offload::optimizer || offload == Offload::params; }
  bool stream_params() const { return offload == Offload::params; }
};

class TrainerParamStore final : public ParamStore {
 public:
  // Allocates and initialises every copy (per spec.init_std, from `seed`); no gradients yet.
  // On a device that does not hold data (Device::holds_data) it allocates only.
  // `comm`: the data-parallel group (one rank: no parallelism); it must outlive the store.
  // `expert_comm`: the expert-data-parallel group (kernels/parallel_state.h) over which the
  // expert parameters (ParamSpec::expert) are reduced and sharded instead; null: `comm`.
  TrainerParamStore(Device& dev, const std::vector<ParamSpec>& specs,
                    const ParamPlacement& placement, std::uint64_t seed, Comm& comm = self_comm(),
                    Comm* expert_comm = nullptr);

  // ---- ParamStore ------------------------------------------------------------------------------
  // Throws std::logic_error for a streamed weight used outside enter_block/exit_block.
  Tensor& weight(int index) override;
  GradRef grad(int index) override;      // allocates on first use; throws for a buffer
  void enter_block(int block) override;  // nests: only the outermost enter/exit moves bytes
  void exit_block(int block) override;
  void block_grads_done(int block) override;  // zero2/3: reduce-scatter when syncing
  // zero3: FSDP's default backward_prefetch=BACKWARD_PRE: the next block's weights (block - 1)
  // are gathered before this block's backward runs, and kept to the end of their own.
  void block_backward_begins(int block) override;

  // ---- data parallelism (no-ops on one rank) ---------------------------------------------------
  // zero3: all-gather the weights outside the blocks (embeddings, final norm, head) around a
  // forward and a backward, as FSDP's root unit; release frees them again. For a backward, the
  // first block backward reaches is prefetched too (BACKWARD_PRE from the root's pre-backward).
  void gather_root(bool for_backward = false);
  void release_root();
  // Whether this micro-batch's backward reduces the grads (the last of the step: DDP/FSDP's
  // no_sync on the others).
  void set_sync(bool sync) { sync_ = sync; }
  // After the last backward: the reduction of every grad not reduced yet (DDP's buckets; zero1's
  // all-reduce; zero2/3: the parameters outside the blocks).
  void reduce_grads(Ops& ops);
  // DDP's broadcast_buffers: rank 0's buffers (batch-norm running stats) before a forward.
  void broadcast_buffers();
  const DataParallelLayout& layout() const { return layout_; }
  // DDP underneath (sharding none or torch-zero1): buckets, buffers broadcast from rank 0.
  bool ddp() const {
    return layout_.ranks > 1 &&
           (place_.sharding == Sharding::none || place_.sharding == Sharding::torch_zero1);
  }
  // Whether this rank updates parameter `index`: all of them, except under torch-zero1, where
  // each parameter has one owner (torch 1.13 zero_redundancy_optimizer.py
  // _partition_parameters: sorted by numel, largest first, each to the rank with the fewest
  // elements so far, the lowest such rank on ties).
  bool owns(int index) const {
    return owner_.empty() || owner_.at(static_cast<std::size_t>(index)) == layout_.rank;
  }
  // Under sharding: the first element of this rank's part of parameter `index`.
  std::int64_t part_offset(int index) const {
    return slots_.at(static_cast<std::size_t>(index)).offset;
  }

  // ---- zero_grad -------------------------------------------------------------------------------
  // Before a step's first backward. set_to_none: grads are gone, the first write assigns.
  // zero: grads that exist are fill(0)ed with `ops` and every write accumulates.
  void begin_step(ZeroGrad zero_grad, Ops& ops);
  void release_grads();  // set_to_none after the optimizer step
  // The grads the update reads that exist (the rank's parts under zero2/3), for the inf/nan check.
  std::vector<Tensor*> grads();
  bool has_grad(int index) const;
  Tensor& device_grad(int index);

  // ---- the optimizer's view
  // ---------------------------------------------------------------------- The tensor the optimizer
  // updates: the master (device or host) if there is one, else the host weight (offload=params) or
  // the device weight.
  // Under zero1-3, the rank's part of the parameter (empty where the rank owns none of it).
  Tensor& update_target(int index);
  // The gradient the update reads: the device grad, or the rank's part of it (zero1-3).
  Tensor& update_grad(int index);
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
  // Master if any, else the (host or device) weight; under sharding gathered from every rank
  // (a collective: every rank calls it).
  std::vector<float> param_f32(int index);
  // The reduced gradient, whole (gathered from the ranks' parts under zero2/3: a collective);
  // empty if there is none.
  std::vector<float> grad_f32(int index);
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
    // Data parallelism: this rank's part (zero3: the weight's; zero1-3 under O2: the master is
    // that size), the reduced grad's part (zero2/3), and views into the full tensors.
    Tensor shard;
    Tensor grad_part;
    Tensor target_view, grad_view;
    std::int64_t part = 0, offset = 0;  // this rank's part: elements and first element
  };
  Slot& slot(int index);
  bool streamed(int index) const;
  bool gathered(int index) const;  // zero3: a block weight, gathered per enter_block
  bool sharded() const {           // the per-parameter parts of zero1-3
    return layout_.ranks > 1 && place_.sharding != Sharding::none &&
           place_.sharding != Sharding::torch_zero1;
  }
  void publish_local(int index, Ops& device_ops, Ops* host_ops);
  void upload_weight(int index);  // host_weight -> device weight (compute stream)
  // A host copy into a device tensor (compute stream), cast on the host first where the dtypes
  // differ (the staging lives until finish_publish).
  void upload_from_host(Tensor& dst, const Tensor& host, Ops& host_ops);
  void gather_weight(int index);  // zero3: allocate the full weight and all-gather the parts
  void reduce_scatter_grad(int index, Ops& ops);
  void make_buckets();
  // DDP's bucket b: its grads copied in and its all-reduce started; then, once every started
  // all-reduce is done, copied back.
  void start_bucket(std::size_t b);
  void finish_bucket(std::size_t b);
  std::vector<float> gather_f32(int index, Tensor& part);  // every rank's part, whole, as fp32

  Device& dev_;
  const std::vector<ParamSpec>& specs_;
  ParamPlacement place_;
  std::vector<Slot> slots_;
  std::vector<std::vector<int>> block_params_;  // streamed parameter indices per block
  std::vector<int> block_depth_;                // enter_block nesting per block
  std::vector<Tensor> staging_;                 // pinned casts in flight until finish_publish
  Comm& comm_;
  Comm& expert_comm_;
  // The group a parameter's gradient is reduced and its copies sharded over.
  Comm& group(int index) const {
    return specs_[static_cast<std::size_t>(index)].expert ? expert_comm_ : comm_;
  }
  DataParallelLayout layout_;
  std::vector<DdpBucket> bucket_plan_;  // DDP's buckets (none, torch-zero1): which grads
  std::vector<Tensor> buckets_;         // and their flat buffers, one per bucket
  // The block whose backward completes each bucket's grads (the lowest block among its
  // parameters: backward runs from the last block down), -1 for a bucket with a parameter
  // outside the blocks (complete only when backward ends); and whether a bucket has started.
  std::vector<int> bucket_ready_block_;
  std::vector<bool> bucket_started_;
  bool sync_ = true;
  std::vector<bool> prefetched_;  // zero3: blocks held by a backward prefetch
  std::vector<int> owner_;        // torch-zero1: each parameter's rank (empty otherwise)
  void prefetch(int block);
};

}  // namespace memtrade
