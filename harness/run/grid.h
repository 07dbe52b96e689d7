// Grid files (TOML, docs/design.md "Grid file"): the knob table's axes (models/knobs.h) with
// lists of values, cartesian or sweep expansion, [[exclude]] and [[where]] filters, and run
// settings. Expansion is deterministic: the same file gives the same points in the same order,
// which sharding relies on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/knobs.h"

namespace memtrade {

struct RunSettings {
  std::string backend = "auto";  // auto | cpu | cuda
  int warmup = 2;
  int steps = 8;
  std::uint64_t seed = 0;
  std::size_t capacity = 0;  // emulated device memory, 0 = the device's own
  std::string capacity_text;
  double timeout_s = 300;  // per point
};

struct GridPoint {
  std::string id;  // stable, built from the config
  TrainConfig config;
};

struct Grid {
  std::string name;
  std::string mode = "cartesian";  // cartesian | sweep
  RunSettings run;
  std::vector<GridPoint> points;
  std::string hash;  // of the expanded point ids + run settings; shards of one grid share it
};

// Loads and expands a grid file. Throws BadInput "FILE:LINE: key: problem" on anything wrong.
// `backend` ("cpu" or "cuda", the one the grid will run on) decides [[exclude]]/[[where]]
// rules that name a backend; with "" such rules never match.
Grid load_grid(const std::filesystem::path& path, const std::string& backend);
Grid parse_grid(const std::string& text, const std::string& source_name,
                const std::string& backend);

// Points of shard `index` of `count` (0-based): every count-th point starting at index.
std::vector<GridPoint> shard_points(const std::vector<GridPoint>& points, int index, int count);
// Parses "i/N" with 0 <= i < N; throws BadInput.
std::pair<int, int> parse_shard(const std::string& text);

}  // namespace memtrade
