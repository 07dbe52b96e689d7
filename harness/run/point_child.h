// The child side of an isolated point: `memtrade __point --config FILE --result FILE ...`
// runs one grid point in a fresh process and writes its result row (schema of one element of
// a results file's "points").
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/common/point_row.h"
#include "harness/run/grid.h"

namespace memtrade {

struct PointJob {
  GridPoint point;
  std::string backend = "cpu";  // resolved: cpu | cuda
  std::size_t capacity = 0;
  int warmup = 2;
  int steps = 8;
  int threads = 0;
  std::string trace_path;           // optional allocator trace of the last measured step
  std::string trace_snapshot_path;  // optional: that trace as a PyTorch memory snapshot
};

// Runs the job in this process and returns its row; never throws for OOM, bad configs or
// non-finite losses (they become statuses), only for programming errors.
PointRow run_point_row(const PointJob& job);

// Serialisation of a job for the child's command line.
nlohmann::json job_json(const PointJob& job);
PointJob job_from_json(const nlohmann::json& j);

}  // namespace memtrade
