// Thresholds for `memtrade compare`: how much change each metric may show before it counts,
// from a TOML file with per-metric [defaults] and [[override]] tables matched on config keys.
//
//   [defaults]
//   peak_allocated = {rel = 0.0, abs = 0}                 # threshold metric (rel/abs)
//   median_s = {min_effect = 0.05, alpha = 0.05}          # statistical metric (rank test)
//   [[override]]
//   match = {precision = "fp16", model = "gpt-*"}         # globs on the point's config keys
//   peak_reserved = {rel = 0.02}
//
// Fields of a metric table: rel, abs (threshold metrics); min_effect, alpha, min_samples
// (statistical metrics); gate (false: reported, never fails); better = "lower" | "higher".
#pragma once

#include <map>
#include <string>
#include <vector>

namespace memtrade {

struct MetricRule {
  enum class Kind { threshold, statistical };
  Kind kind = Kind::statistical;
  bool higher_is_better = false;
  double rel = 0;            // threshold: allowed relative increase (of the bad direction)
  double abs = 0;            // threshold: allowed absolute increase, in the metric's unit
  double min_effect = 0.05;  // statistical: smallest relative median change that counts
  double alpha = 0.05;       // statistical: false discovery rate after Benjamini-Hochberg
  int min_samples = 5;       // statistical: fewer samples per side is inconclusive
  bool gate = true;          // false: verdicts are shown but never fail the comparison
};

using ConfigMap = std::map<std::string, std::string>;  // flattened config, values as text

class Thresholds {
 public:
  // Built-in defaults (the ones ci/thresholds.toml spells out).
  Thresholds() = default;
  // Parses a TOML file; throws BadInput naming the file and the problem.
  static Thresholds load(const std::string& path);
  static Thresholds parse(const std::string& toml_text, const std::string& source_name);

  // The rule for one metric of one point: built-in default, then [defaults], then every
  // matching [[override]] in file order.
  MetricRule rule(const std::string& metric, const ConfigMap& config) const;

 private:
  struct Setting {  // one metric table: only the fields it names
    std::map<std::string, double> numbers;
    std::map<std::string, bool> flags;
    std::string better;
  };
  struct Override {
    std::map<std::string, std::string> match;
    std::map<std::string, Setting> metrics;
  };
  static void apply(MetricRule& rule, const Setting& s);
  std::map<std::string, Setting> defaults_;
  std::vector<Override> overrides_;
};

// Built-in rule for a metric name before any file applies: memory metrics exact, time and
// throughput statistical, Google Benchmark counters statistical with the direction guessed from
// the name (rates such as bytes_per_second are higher-is-better).
MetricRule builtin_rule(const std::string& metric);

}  // namespace memtrade
