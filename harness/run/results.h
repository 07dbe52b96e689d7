// Results files (DESIGN.md "Results (JSON)", schema memtrade.results/1): creation, validation,
// and atomic rewriting after every point so that a crash or Ctrl-C loses nothing finished.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/run/grid.h"
#include "kernels/device.h"

namespace memtrade {

inline constexpr const char* kResultsSchema = "memtrade.results/1";

// meta: commit, dirty, time, host, backend, device, capacity, versions, grid name and hash.
nlohmann::json make_meta(const std::string& backend, const std::string& device_name,
                         std::size_t device_memory, const Grid* grid, std::size_t capacity);

// Reads and validates a results file; throws BadInput "FILE: problem" (unreadable, malformed or
// truncated JSON, wrong schema, points without id/status).
nlohmann::json load_results(const std::filesystem::path& path);

// Writes via a temporary file in the same directory + rename(2): readers see the old or the new
// file, never half of one.
void write_json_atomic(const std::filesystem::path& path, const nlohmann::json& j);

// A row for a point that produced no measurement (oom, error, timeout, skipped).
nlohmann::json failed_point(const GridPoint& p, const std::string& status,
                            const std::string& error);

// Results as CSV for spreadsheets: one row per point, config columns then metrics.
std::string results_csv(const nlohmann::json& results);

}  // namespace memtrade
