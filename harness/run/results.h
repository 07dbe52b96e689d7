// Results files (schema memtrade.results/1; the rows are harness/common/point_row.h): the meta
// block a run writes, and the CSV export.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "harness/common/point_row.h"
#include "harness/run/grid.h"

namespace memtrade {

// meta: commit, dirty, time, host, backend, device, capacity, versions, grid name and hash, and
// the knob table (`knobs`, as `memtrade knobs --json` prints it), so that a results file says
// which axes it has and their defaults to any reader (reports/, bench/peers/).
nlohmann::json make_meta(const std::string& backend, const std::string& device_name,
                         std::size_t device_memory, const Grid* grid, std::size_t capacity);

// The row of a point that produced no measurement (oom, error, timeout, skipped).
PointRow failed_point(const GridPoint& p, const std::string& status, const std::string& error);

// Results as CSV for spreadsheets: one row per point; id, status, one column per axis of the
// knob table, then the metrics, then error.
std::string results_csv(const ResultsFile& results);

}  // namespace memtrade
