// The configurations `memtrade advise` may recommend from a starting point, read off the knob
// table (models/config/knobs.h): the cartesian product of the advise values of every row it may
// turn (AdviseRole::turn, and the allow rows named by --allow), minus the rows held at the start's
// value, keeping the start's samples per optimizer step (batch_size × accumulation), so that
// the training is the same one. A row that does not apply to a configuration (attention for a
// CNN) keeps the start's value there. No axis is named here: a new row with an advise role is
// searched without a change to this file.
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

// Throws BadInput for an --allow or --hold name that is not a row advise may turn (one line),
// and for a start advise cannot train from (mode eval).
AdviseSpace advise_space(const TrainConfig& start, const std::vector<std::string>& allow,
                         const std::vector<std::string>& hold, Backend backend);

// The fewest parameter bytes any configuration of the space keeps on the device: the weights
// outside the blocks and the largest block's (offload=params streams the others in), in the
// narrowest compute dtype of the space. A capacity below it is bad input.
std::int64_t least_param_bytes(const AdviseSpace& space);

// The start with every `turn` axis at the table's default, keeping the step's shape (batch_size
// × accumulation), the workload and the allow axes: the calibration's base ("plain") config.
TrainConfig plain_config(const TrainConfig& start);

// The (axis, value) pairs of `space` that differ from plain_config(space.start): what the cost
// model must price.
std::vector<std::pair<std::string, std::string>> priced_values(const AdviseSpace& space);

// The axes turned from `from` to `to`, as advise explains them: the rows that must change
// together to keep the samples per step (batch_size and accumulation) form one group.
std::vector<std::vector<std::string>> turned_groups(const TrainConfig& from, const TrainConfig& to);

}  // namespace memtrade
