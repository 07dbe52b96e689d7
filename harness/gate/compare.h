// `memtrade compare`: judge a candidate (head) against a baseline (base).
//
// Inputs are memtrade results files (schema memtrade.results/1) or Google Benchmark JSON. Memory
// metrics use rel/abs thresholds; time metrics need a significant two-sided Mann-Whitney U test
// (Benjamini-Hochberg across every time test of the comparison) AND a median change beyond
// min_effect in the bad direction. A two-sided test serves regressions and improvements with one
// p-value and is the conservative choice (its p is twice the one-sided one).
#pragma once

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/common/point_row.h"
#include "harness/gate/thresholds.h"

namespace memtrade {

struct MetricValue {
  double value = 0;             // the reported figure (median for sampled metrics)
  std::vector<double> samples;  // per-step or per-repetition samples, when there are any
};

struct PointData {
  std::string id;
  ConfigMap config;  // flattened config (nested keys joined with '.'), plus "id"
  std::string status = "ok";
  std::map<std::string, MetricValue> metrics;
};

struct ResultSet {
  std::string label;    // file name or "base"/"head"
  std::string format;   // "memtrade" or "gbench"
  nlohmann::json meta;  // memtrade meta, or Google Benchmark context
  std::vector<PointData> points;
};

// Flattens a config object: nested keys joined with '.', values as text (strings unquoted).
ConfigMap flatten_config(const nlohmann::json& config);

// Parses a results document; throws BadInput naming `label` and the problem.
ResultSet results_from_json(const nlohmann::json& doc, const std::string& label);
// Reads and parses a file (memtrade results or Google Benchmark JSON, detected by keys).
ResultSet load_results(const std::string& path);

enum class Verdict { unchanged, regression, improvement, inconclusive, changed };
const char* verdict_name(Verdict v);

struct CompareRow {
  std::string point;
  std::string metric;  // metric name, or "status"
  std::string unit;    // "bytes", "s", "1/s" or "" (counters)
  bool statistical = false;
  double base = 0, head = 0;  // metric values (NaN for status rows)
  std::string base_status, head_status;
  double change = 0;               // head / base - 1 (relative)
  std::optional<double> p, p_adj;  // statistical rows that were tested
  std::size_t n_base = 0, n_head = 0;
  MetricRule rule;
  Verdict verdict = Verdict::unchanged;
  std::string note;  // why (too few samples, status change, below min effect, ...)
  // Counts toward the exit code: gated regressions (and inconclusive with --fail-on-inconclusive).
  bool gated() const { return rule.gate; }
};

struct Comparison {
  std::string base_label, head_label;
  nlohmann::json base_meta, head_meta;
  std::vector<CompareRow> rows;  // point order of head, then metric order
  std::vector<std::string> added, removed;
  bool fail_on_inconclusive = false;

  std::size_t count(Verdict v) const;
  std::size_t gated_regressions() const;
  // Exit status of the comparison: 1 when something gated regressed (or was inconclusive under
  // --fail-on-inconclusive), else 0.
  int exit_code() const;
};

Comparison compare_results(const ResultSet& base, const ResultSet& head,
                           const Thresholds& thresholds);

}  // namespace memtrade
