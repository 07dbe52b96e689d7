// Results history in SQLite (docs/design.md, "History"): one row per run, one
// per point, so that nightly CI can compare against the last nightly and charts can draw trends.
// Without SQLite at build time every function throws BadInput("built without SQLite").
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/common/point_row.h"

namespace memtrade {

// Stable across builds and compilers (FNV-1a 64 of "host|device|backend", 16 hex digits), so a
// fingerprint written by one build of memtrade is found by the next.
std::string machine_fingerprint(const nlohmann::json& meta);

struct HistoryAddOptions {
  std::string branch;  // empty: "local"
  // Outcome of the gate for this run: "ok", "regression", "accepted" or "none" (no comparison).
  // Stored in meta_json as "gate"; `baseline` skips "regression" runs unless asked not to.
  std::string gate = "none";
};

struct HistoryRun {
  int64_t id = 0;
  std::string commit, branch, time, machine, backend, device, grid, gate;
  int64_t points = 0;
};

struct TrendRow {
  std::string commit, time, point_id;
  double value = 0;
};

struct TrendQuery {
  std::string metric;  // a points column: peak_allocated, peak_reserved, predicted_peak,
                       // median_s, samples_per_s, tokens_per_s
  std::map<std::string, std::string> where;  // config key -> glob; "id" matches the point id
  std::string branch, machine;               // empty: any
};

struct BaselineQuery {
  std::string branch;
  std::string machine;             // empty: any machine
  bool include_regressed = false;  // also consider runs whose gate said "regression"
};

// One point's series of one metric on one machine, in run order (time, then id): what change
// detection reads. Only `ok` rows carry a value.
struct HistorySeries {
  std::string point_id, column, machine, backend;
  std::vector<double> values;
  std::vector<std::string> commits, times;
};

// Adds a memtrade.results/1 document; returns the new run id. Creates the DB if needed.
int64_t history_add(const std::string& db, const nlohmann::json& results,
                    const HistoryAddOptions& options);
std::vector<HistoryRun> history_list(const std::string& db);
std::vector<TrendRow> history_trend(const std::string& db, const TrendQuery& q);
// Every (machine, point) series of `column` (a trend metric), optionally of one branch/machine.
std::vector<HistorySeries> history_series(const std::string& db, const std::string& column,
                                          const std::string& branch, const std::string& machine);
// The newest matching run (by time, then id) rewritten as a memtrade.results/1 document.
std::optional<nlohmann::json> history_baseline(const std::string& db, const BaselineQuery& q);

}  // namespace memtrade
