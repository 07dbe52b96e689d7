// Data parallelism's rules, in one place: which samples a rank trains on, how a parameter is
// split over the ranks, and DDP's gradient buckets. The collectives are kernels/comm.h's; where
// the bytes live per sharding stage is TrainerParamStore's (models/train/param_store.h); the step's
// order (no_sync, reductions, gathers) is the Trainer's (models/train/trainer.h).
//
// Samples: a step trains on data_parallel × batch_size × accumulation samples. Rank r takes the
// contiguous share [(s·N + r)·B·k, +B·k) of step s, micro-batch m the rows from
// ((s·N + r)·k + m)·B, so dp 2 × b4 trains on exactly the samples of dp 1 × b8 (and of
// dp 1 × b4 × a2, in the same order). Each rank's backward scales by the global row count, so
// the sum over the ranks is the gradient of the mean loss over the global batch (DDP averages
// per-rank means: the same number).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "models/config/config.h"
#include "models/model.h"

namespace memtrade {

struct DataParallelLayout {
  int ranks = 1;
  int rank = 0;
};

// The first sample of rank `rank`'s micro-batch `micro` of step `step`.
std::int64_t first_sample(const TrainConfig& c, std::int64_t step, int rank, std::int64_t micro);

// DDP's gradient buckets (torch 1.13, torch/nn/parallel/distributed.py and reducer.cpp's
// compute_bucket_assignment_by_size): the trainable parameters in registration order, a bucket
// closed once its bytes reach its limit, the first bucket's limit 1 MiB
// (dist._DEFAULT_FIRST_BUCKET_BYTES), every later one bucket_cap_mb = 25 MiB. Each bucket is one
// flat buffer of its parameters' gradients, allocated when DDP is constructed.
struct DdpBucket {
  std::vector<int> params;  // indices into the model's params, in bucket order
  std::int64_t numel = 0;
  bool experts = false;  // expert parameters: all-reduced over the expert-data-parallel group
};
inline constexpr std::int64_t kDdpFirstBucketBytes = 1 << 20;
inline constexpr std::int64_t kDdpBucketCapBytes = 25 << 20;
// Under expert parallelism the expert parameters (ParamSpec::expert) have buckets of their own,
// planned the same way (`experts` true), as Megatron-core's DistributedDataParallel keeps
// expert_parallel_buffers beside its buffers, reduced over the expert-data-parallel group
// (megatron/core/distributed/distributed_data_parallel.py); `experts` false plans the rest.
std::vector<DdpBucket> ddp_buckets(const std::vector<ParamSpec>& specs, DType grad_dtype,
                                   bool experts = false);

}  // namespace memtrade
