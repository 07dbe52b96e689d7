// `memtrade merge`: joins the shard results files of one grid (and one build) into one file in
// the grid's order, and names the points no shard has, with the shard that should have run
// each (point k belongs to shard k mod N).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "harness/common/point_row.h"

namespace memtrade {

struct MergeOutcome {
  ResultsFile merged;
  std::vector<std::string> missing;            // ids in grid order (only with a grid)
  std::vector<std::string> missing_note;       // "  ID  (shard i/N)" per missing point
  std::vector<std::string> incomplete_shards;  // "i/N"
};

// Throws BadInput when the inputs are not shards of one grid and build, or repeat a point.
MergeOutcome merge_shards(const std::vector<std::string>& inputs,
                          const std::filesystem::path& grid_path);

}  // namespace memtrade
