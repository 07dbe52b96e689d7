// Grid files (TOML, docs/design.md "Grid file"): the knob table's axes (models/config/knobs.h) with
// lists of values, cartesian or sweep expansion, [[exclude]] and [[where]] filters, and run
// settings. Expansion is deterministic: the same file gives the same points in the same order,
// which sharding relies on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/config/knobs.h"

namespace memtrade {

// Bounds on a run's settings, wherever they are given (grid file or flag):
// warm-up and measured steps: every measured step's time is kept in the results file, and a
// million steps of the smallest model take hours; more is a typo (2^32 + 1 once ran 1 step).
inline constexpr std::int64_t kMaxSteps = 1'000'000;
// The per-point timeout: a week; a point that runs longer has hung.
inline constexpr double kMaxTimeoutS = 7 * 24 * 3600.0;
// The points of a grid before [[exclude]] and [[where]]: each combination is built and checked
// in memory, and each point runs in a process of its own (100,000 one-second points: a day).
inline constexpr std::int64_t kMaxGridPoints = 100'000;

// A duration: "120s", "5m", "1.5h", "250ms" (spaces around the unit allowed) or a number of
// seconds, read whole, up to kMaxTimeoutS; nullopt when the text is not one ("5s extra").
std::optional<double> parse_duration_text(std::string_view text);
// A count of steps in [min, kMaxSteps] (warmup 0, steps 1); nullopt when the text is not one.
std::optional<int> parse_steps_text(std::string_view text, int min);
// Whether `name` can name the grid's results file (out/<name>.json): one path component, not
// hidden, printable, at most 128 bytes.
bool valid_grid_name(std::string_view name);

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
