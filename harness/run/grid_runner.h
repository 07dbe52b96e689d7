// The parent side of `memtrade run`: expands a grid, runs each point in its own child process,
// writes the results file atomically after every point, resumes an interrupted file, shows
// progress, and prints the summary table.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/common/point_row.h"
#include "harness/run/grid.h"

namespace memtrade {

struct GridRunOptions {
  std::string backend;  // resolved: cpu | cuda
  std::string device_name;
  std::size_t device_memory = 0;
  std::filesystem::path out;
  bool resume = false;
  int threads = 0;
  std::string trace_path;           // one-point runs only
  std::string trace_snapshot_path;  // one-point runs only: the trace as a PyTorch snapshot
  bool quiet = false;               // no progress, no table (tests)
  std::string shard;                // "i/N" when this is one shard of the grid
};

// Runs the points of `grid` (already sharded/selected) and returns the exit code: 0 when every
// point has a row whose status is ok, oom or skipped; 1 when some point errored or timed out;
// 130 when interrupted (what finished is in the file).
int run_grid(const Grid& grid, const GridRunOptions& options);

// The summary table of a results file, as printed at the end of a run.
std::string summary_table(const ResultsFile& results);

}  // namespace memtrade
