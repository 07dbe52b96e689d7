// `memtrade fit`: the largest batch size that fits a capacity, per knob combination, from the
// memory model (exponential then binary search on estimate_memory), optionally confirmed by
// running the batch found (must fit) and the one above it (must not).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/run/grid.h"
#include "harness/run/time_model.h"
#include "kernels/device.h"
#include "kernels/gpu_specs.h"

namespace memtrade {

struct FitOptions {
  Backend backend = Backend::cpu;
  std::string backend_name = "cpu";  // for confirming runs
  std::size_t capacity = 0;
  std::int64_t max_batch = 65536;
  bool confirm = false;
  int threads = 0;
  const GpuSpec* gpu = nullptr;  // --gpu: also time the largest batch on it
};

struct FitRow {
  std::string id;  // the batch-1 id of the knob combination
  TrainConfig config;
  std::int64_t max_batch = 0;        // 0: not even batch 1 fits
  std::int64_t predicted_peak = -1;  // at max_batch, when it is > 0
  std::string confirmed_at, above;   // statuses of the confirming runs ("" when not run)
  std::optional<TimeModel> time;     // --gpu: the time model at max_batch
  bool confirmed_ok() const { return confirmed_at == "ok" && (above == "oom" || above == "-"); }
  nlohmann::json to_json(std::size_t capacity) const;  // a row of schema memtrade.fit/1
};

// One row per distinct knob combination of `points` (batch size is what fit searches).
std::vector<FitRow> fit_points(const std::vector<GridPoint>& points, const FitOptions& o);

}  // namespace memtrade
