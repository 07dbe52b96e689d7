// `memtrade history changes`: the change points of every point's nightly series in the history
// (harness/gate/change_points.h), for people (text) and the nightly job (exit 1 when a regression
// starts within the last K runs).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "harness/cli/command.h"
#include "harness/common/bad_input.h"
#include "harness/common/point_row.h"
#include "harness/gate/change_points.h"
#include "harness/gate/history.h"
#include "kernels/allocator.h"
#include "models/config/input_text.h"

namespace memtrade {
namespace {

using nlohmann::json;

struct ChangesArgs {
  std::string db, series_file, metric = "all", branch, machine;
  bool json = false;
  std::size_t recent = 2, min_runs = 2;
  double max_p = 0.001;
  // Time changes smaller than this are not reported: the machine's night-to-night noise (2% in
  // the quality table of docs/changes.md, where 2% keeps false alarms near 1 per 1000
  // point-nights and finds a 5% step 96 times in 100), as Perfherder's 2% floor.
  double min_effect_time = 0.02;
};

// Which columns --metric names; memory is peak_allocated (what the gate judges), time median_s.
std::vector<std::string> columns_of(const std::string& metric) {
  if (metric == "memory") return {"peak_allocated"};
  if (metric == "time") return {"median_s"};
  if (metric == "all") return {"peak_allocated", "median_s"};
  throw BadInput(fmt::format("--metric: expected memory, time or all, got '{}'", echo(metric)));
}

// --series FILE: {"series": [{"id", "metric" (peak_allocated | median_s), "values": [...],
// optional "commits", "times", "backend"}]} — synthetic or exported series, same analysis.
std::vector<HistorySeries> series_from_file(const std::string& path) {
  const json doc = read_json_file(path);
  auto bad = [&](const std::string& what) {
    return BadInput(fmt::format("{}: {}", echo(path, kEchoPathMax), what));
  };
  if (!doc.is_object() || !doc.contains("series") || !doc["series"].is_array())
    throw bad("expected {\"series\": [...]}");
  std::vector<HistorySeries> out;
  for (const json& s : doc["series"]) {
    if (!s.is_object() || !s.contains("id") || !s["id"].is_string() || !s.contains("values") ||
        !s["values"].is_array())
      throw bad("each series needs a string 'id' and an array 'values'");
    HistorySeries h;
    h.point_id = s["id"];
    h.column = s.value("metric", std::string("median_s"));
    if (h.column != "peak_allocated" && h.column != "median_s")
      throw bad(
          fmt::format("series {}: metric must be peak_allocated or median_s", echo(h.point_id)));
    h.backend = s.value("backend", std::string("cpu"));
    for (const json& v : s["values"]) {
      if (!v.is_number() || !std::isfinite(v.get<double>()))
        throw bad(fmt::format("series {}: values must be finite numbers", echo(h.point_id)));
      h.values.push_back(v.get<double>());
    }
    const json commits = s.value("commits", json::array()), times = s.value("times", json::array());
    for (std::size_t i = 0; i < h.values.size(); ++i) {
      h.commits.push_back(i < commits.size() && commits[i].is_string()
                              ? commits[i].get<std::string>()
                              : fmt::format("run{}", i));
      h.times.push_back(i < times.size() && times[i].is_string() ? times[i].get<std::string>()
                                                                 : "");
    }
    out.push_back(std::move(h));
  }
  return out;
}

std::string level_text(const std::string& column, double v) {
  return column == "median_s" ? fmt::format("{:.3f} ms", v * 1e3)
                              : format_bytes(static_cast<std::int64_t>(std::llround(v)));
}

int cmd_changes(const ChangesArgs& a) {
  if (a.db.empty() == a.series_file.empty())
    throw BadInput("history changes: give --db or --series");
  if (!(a.max_p > 0 && a.max_p < 1)) throw BadInput("--max-p: expected a number in (0, 1)");
  if (!(a.min_effect_time >= 0 && a.min_effect_time < 10))
    throw BadInput("--min-effect: expected a fraction >= 0 (0.05 is 5%)");
  if (a.min_runs < 2 || a.min_runs > 1000) throw BadInput("--min-runs: expected 2 to 1000");
  std::vector<HistorySeries> all;
  if (!a.series_file.empty()) {
    for (auto& s : series_from_file(a.series_file))
      for (const auto& c : columns_of(a.metric))
        if (s.column == c) all.push_back(s);
  } else {
    for (const auto& c : columns_of(a.metric))
      for (auto& s : history_series(a.db, c, a.branch, a.machine)) all.push_back(std::move(s));
  }
  json changes = json::array();
  std::size_t recent_regressions = 0;
  std::vector<std::string> lines;
  for (const HistorySeries& s : all) {
    ChangeOptions o;
    o.max_p = a.max_p;
    o.min_runs = a.min_runs;
    // Memory on the CPU is exact: every run of a commit gives the same bytes, so any lasting
    // step is a change. Elsewhere (CUDA's allocator, time) the statistics decide.
    o.exact = s.column == "peak_allocated" && s.backend == "cpu";
    o.min_effect = s.column == "median_s" ? a.min_effect_time : 0.0;
    for (const Change& c : find_changes(s.values, o)) {
      const bool regression = c.after > c.before;  // more bytes or more seconds
      const bool recent = c.index + a.recent >= s.values.size();
      if (regression && recent) ++recent_regressions;
      changes.push_back({{"point", s.point_id},
                         {"metric", s.column},
                         {"machine", s.machine},
                         {"index", c.index},
                         {"runs", s.values.size()},
                         {"commit", s.commits[c.index]},
                         {"commit_before", s.commits[c.index - 1]},
                         {"time", s.times[c.index]},
                         {"before", c.before},
                         {"after", c.after},
                         {"relative", std::isfinite(c.relative) ? json(c.relative) : json(nullptr)},
                         {"p", c.p},
                         {"direction", regression ? "regression" : "improvement"},
                         {"recent", recent}});
      lines.push_back(
          fmt::format("{:<11} {:<14} {:>+8.2f}%  {} -> {}  p {:.2g}  at run {}/{} (commit {})  {}",
                      regression ? "REGRESSION" : "improvement", s.column, 100 * c.relative,
                      level_text(s.column, c.before), level_text(s.column, c.after), c.p,
                      c.index + 1, s.values.size(), s.commits[c.index].substr(0, 12), s.point_id));
    }
  }
  if (a.json) {
    fmt::print("{}\n", json{{"schema", "memtrade.changes/1"},
                            {"options",
                             {{"max_p", a.max_p},
                              {"min_effect_time", a.min_effect_time},
                              {"min_runs", a.min_runs},
                              {"recent", a.recent}}},
                            {"series", all.size()},
                            {"changes", changes},
                            {"recent_regressions", recent_regressions}}
                           .dump(1));
  } else {
    for (const auto& l : lines) fmt::print("{}\n", l);
    fmt::print("{} series, {} changes, {} regressions starting within the last {} runs\n",
               all.size(), changes.size(), recent_regressions, a.recent);
  }
  return recent_regressions > 0 ? 1 : 0;
}

}  // namespace

void register_changes_command(CLI::App& app, Commands& cmds) {
  auto& a = cmds.keep<ChangesArgs>();
  CLI::App* history = app.get_subcommand("history");
  CLI::App* cmd = history->add_subcommand(
      "changes",
      "Change points of every point's series (E-divisive means, t-test): exit 1 when a "
      "regression starts within the last --recent runs");
  cmd->add_option("--db", a.db, "History database");
  cmd->add_option("--series", a.series_file, "Series from a JSON file instead of --db");
  cmd->add_option("--metric", a.metric, "memory | time | all")->capture_default_str();
  cmd->add_option("--branch", a.branch, "Only runs of this branch");
  cmd->add_option("--machine", a.machine, "Only runs of this machine fingerprint");
  cmd->add_option("--recent", a.recent, "Runs counted as recent for the exit code")
      ->capture_default_str();
  cmd->add_option("--max-p", a.max_p, "Significance of a change")->capture_default_str();
  cmd->add_option("--min-effect", a.min_effect_time, "Smallest relative time change (0.05 = 5%)")
      ->capture_default_str();
  cmd->add_option("--min-runs", a.min_runs, "Runs each side of a change (persistence)")
      ->capture_default_str();
  cmd->add_flag("--json", a.json, "JSON (memtrade.changes/1)");
  cmds.add(cmd, [&a] { return cmd_changes(a); });
}

}  // namespace memtrade
