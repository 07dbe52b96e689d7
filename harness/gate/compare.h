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

// What the gate is told about deliberate grid changes. Without it, a point of BASE that HEAD
// does not have is a failure: a run that silently loses points, or a change that renames every
// point id, must not pass.
struct GateRules {
  bool allow_removed = false;  // removed points are listed, not failed
  // BASE id -> HEAD id, for points whose id changed on purpose (a renamed axis value, a new
  // axis in the id): the base point is judged against the head point of the new id.
  std::map<std::string, std::string> renames;
  bool fail_on_inconclusive = false;
};

struct Comparison {
  std::string base_label, head_label;
  nlohmann::json base_meta, head_meta;
  std::vector<CompareRow> rows;      // point order of head, then metric order
  std::vector<std::string> added;    // in HEAD only: reported, never judged
  std::vector<std::string> removed;  // in BASE only (after renames)
  std::vector<std::pair<std::string, std::string>> renamed;  // applied renames, base -> head
  std::size_t matched = 0;  // points present on both sides (after renames)
  GateRules rules;

  std::size_t count(Verdict v) const;
  std::size_t gated_regressions() const;
  bool removed_fails() const { return !removed.empty() && !rules.allow_removed; }
  // Exit status: 1 when something gated regressed, a BASE point is missing from HEAD (unless
  // allowed), or a gated row was inconclusive under fail_on_inconclusive; else 0. (Nothing
  // matched at all is bad input, exit 2: compare_results throws.)
  int exit_code() const;
};

// Throws BadInput when no point matches ("nothing to judge"), or when a rename names a base id
// that BASE does not have or maps two base ids to one head id.
Comparison compare_results(const ResultSet& base, const ResultSet& head,
                           const Thresholds& thresholds, const GateRules& rules = {});

// Reads a rename map: a JSON object {"old id": "new id", ...}; throws BadInput.
std::map<std::string, std::string> load_rename_map(const std::string& path);

}  // namespace memtrade
