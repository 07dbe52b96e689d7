// advise's calibration: the few measured steps the cost model's coefficients come from
// (advise_cost.h), run as isolated points (the grid runner) on the device at hand and cached per
// device and commit.
//
// The points, on the calibration model (the model advised, or a smaller one, see below): the
// plain configuration (plain_config: every axis advise turns at its default) at up to four
// micro-batch sizes with accumulation 1 (1, the step's samples and two between, geometrically,
// each a divisor of it), at b0 (the third of those, or the largest) with accumulation 2, and at
// b0 with each value the search must price, with accumulation 1 (and 2 for a row whose cost
// has a part per micro-batch and one per step: Knob::cost = copies). For checkpoint, the advise
// value recomputing the most whole-block FLOPs and the one recomputing selectively. Each point:
// 1 warm-up step and 8 measured ones, the whole list twice over (interleaved); the lower of the
// two medians counts, as the load of other processes only slows steps down. The host<->device
// bandwidth comes from a child `memtrade __bandwidth` (64 MiB both ways, best of 5).
//
// Where the device at hand cannot run the model advised (`--backend cuda` on a machine without
// a GPU), the coefficients come from the CPU and a proxy model: the listed model of the same
// family with the most FLOPs per step at micro-batch 8 within 10 GFLOP (gpt-mini, mlp-large,
// cnn-small: a minute of calibration), over micro-batches of 1, 4, 16 and 64 (b0 = 16), so that
// its FLOP-rate curve reaches the rows of a large model's micro-batches (flat beyond). The figures
// are then predictions of a CPU-calibrated model and say so (CostModel::transferred).
//
// The cache file (schema memtrade.calibration/1) holds, per (backend, device, commit, dirty),
// the bandwidth and the median step time of every point id measured: a later advise on the
// same build and device measures only what it lacks.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "harness/common/point_row.h"
#include "harness/run/advise_cost.h"
#include "harness/run/advise_space.h"
#include "harness/run/grid.h"

namespace memtrade {

struct CalibrationOptions {
  std::string backend = "cpu";  // where the points run: cpu | cuda (resolved, usable)
  std::string device_name;      // the cache key's device
  int threads = 0;
  std::string model;  // calibrate on this model ("": the start's, or the proxy; see above)
  std::filesystem::path cache;  // "" = no cache
  int warmup = 1, steps = 8;
  int rounds = 2;  // the points run this many times over, interleaved; the lowest median counts
  // Which time of a step counts: "wall" (the device's events), or "cpu" (the process's CPU
  // time: on the CPU backend with one thread, the work done without the waits for a core that
  // a shared machine adds; what bench/advise_vs_exhaustive.py uses).
  std::string clock = "wall";
  double timeout_s = 600;  // per point
  bool quiet = true;       // no progress lines
};

struct Calibration {
  CostModel model;
  CalibrationSet set;
  int measured = 0, cached = 0;  // points run now, points read from the cache
  double seconds = 0;
  std::vector<std::string> warnings;  // points that failed (their values are priced as plain)
};

// The default calibration model for `start` run on `run_backend` when the target is `target`.
std::string calibration_model(const TrainConfig& start, Backend target, Backend run_backend);

Calibration calibrate(const AdviseSpace& space, const CalibrationOptions& o);

// Runs `points` as one grid, each in its own process (the grid runner), with `capacity` emulated
// (0: none), o's steps and backend; their result rows.
std::vector<PointRow> run_isolated(const std::vector<GridPoint>& points,
                                   const CalibrationOptions& o, std::size_t capacity);

// A measured point's step time by `clock` (wall: time.median_s; cpu: time.cpu_median_s).
double step_seconds(const PointRow& row, const std::string& clock);

// Host<->device copy bandwidth of `dev` (bytes/s): the mean of both directions, each the best
// of 5 copies of 64 MiB between pinned host memory and device memory.
double measure_copy_bandwidth(Device& dev);

}  // namespace memtrade
