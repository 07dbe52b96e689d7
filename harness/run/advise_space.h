// The configurations `memtrade advise` may recommend from a starting point, read off the knob
// table (models/config/knobs.h): the cartesian product of the advise values of every row it may
// turn (AdviseRole::turn, and the allow rows named by --allow), minus the rows held at the start's
// value, keeping the start's samples per optimizer step (dp × batch_size × accumulation), so
// that the training is the same one. A row that does not apply to a configuration (attention for
// a CNN) keeps the start's value there. No single-device axis is named here: a new row with an
// advise role is searched without a change to this file. With N GPUs (ParallelSearch) the rows
// that lay a step out over them (data_parallel, sharding, tensor_parallel, sequence_parallel:
// advise keeps them on one device) are searched too, every candidate on tp × dp = N GPUs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "models/config/knobs.h"

namespace memtrade {

struct AdviseSpace {
  TrainConfig start;
  std::int64_t global_batch = 0;     // samples per optimizer step, held
  std::vector<std::string> axes;     // the rows turned, in table order
  std::vector<std::string> allowed;  // the allow rows opened by --allow
  std::vector<TrainConfig> configs;  // every candidate, resolved, one per point id
};

// advise --gpus N: the layouts searched. tp divides N and is at most `max_tp` (the card's NVLink
// domain: Megatron keeps tensor parallelism inside a node) and a split the model's heads, KV
// heads and MLP take (the tensor_parallel row's resolve); dp = N / tp divides the samples per
// step; every sharding stage where dp > 1; sequence parallelism off and on where tp > 1.
struct ParallelSearch {
  int gpus = 1;
  int max_tp = 1;
};
// The rows ParallelSearch opens, in table order.
const std::vector<std::string>& parallel_axes();

// Throws BadInput for an --allow or --hold name that is not a row advise may turn (one line),
// and for a start advise cannot train from (mode eval).
AdviseSpace advise_space(const TrainConfig& start, const std::vector<std::string>& allow,
                         const std::vector<std::string>& hold, Backend backend,
                         const ParallelSearch& parallel = {});

// The fewest parameter bytes any configuration of the space keeps on the device: the weights
// outside the blocks and the largest block's (offload=params streams the others in), in the
// narrowest compute dtype of the space, over the largest split of the space (tp, and dp under
// zero3: each rank holds at least its part). A capacity below it is bad input.
std::int64_t least_param_bytes(const AdviseSpace& space);

// The start with every `turn` axis at the table's default, keeping the step's shape (batch_size
// × accumulation), the workload and the allow axes: the calibration's base ("plain") config.
TrainConfig plain_config(const TrainConfig& start);

// The (axis, value) pairs of `space` that differ from plain_config(space.start): what the cost
// model must price.
std::vector<std::pair<std::string, std::string>> priced_values(const AdviseSpace& space);

// The axes turned from `from` to `to`, as advise explains them: the rows that must change
// together to keep the samples per step (batch_size and accumulation, data_parallel) form one
// group, and with `keep_gpus` (advise --gpus N) so do those that keep tp × dp (tensor_parallel).
std::vector<std::vector<std::string>> turned_groups(const TrainConfig& from, const TrainConfig& to,
                                                    bool keep_gpus = false);

}  // namespace memtrade
