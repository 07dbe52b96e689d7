#include "harness/cli/gate_commands.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "harness/common/bad_input.h"
#include "harness/common/output_file.h"
#include "harness/gate/compare.h"
#include "harness/gate/compare_ab.h"
#include "harness/gate/compare_report.h"
#include "harness/gate/history.h"
#include "harness/gate/trust.h"

namespace memtrade {
namespace {

using nlohmann::json;

void write_text(const std::string& path, const std::string& text) {
  write_file_atomic(path, text);
}

struct CompareArgs {
  std::string base, head, thresholds, format = "text", output;
  std::string write_markdown, write_json, write_junit;
  bool fail_on_inconclusive = false, verbose = false, allow_removed = false;
  bool allow_env_change = false, allow_unstable = false;
  std::vector<std::string> renames;  // OLD=NEW
  std::string rename_map;
  AbOptions ab;
  std::string save_base, save_head;
};

int cmd_compare(const CompareArgs& a) {
  const ReportFormat format = parse_report_format(a.format);
  // Before any work (an A/B run takes minutes): every report file can be written.
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--output", a.output},
                                   {"--write-markdown", a.write_markdown},
                                   {"--write-json", a.write_json},
                                   {"--write-junit", a.write_junit},
                                   {"--save-base", a.save_base},
                                   {"--save-head", a.save_head}})
    check_output_file(flag, path);
  const Thresholds thresholds =
      a.thresholds.empty() ? Thresholds() : Thresholds::load(a.thresholds);
  ResultSet base, head;
  AbResults ab_runs;  // A/B: what ran, extra rounds included (the report notes them)
  const bool ab = !a.ab.base_bin.empty() || !a.ab.head_bin.empty();
  if (ab) {
    if (a.ab.base_bin.empty() || a.ab.head_bin.empty() || a.ab.grid.empty())
      throw BadInput("A/B compare needs --base-bin, --head-bin and --grid");
    if (!a.base.empty()) throw BadInput("give either BASE HEAD files or --base-bin/--head-bin");
    ab_runs = run_ab(a.ab, stderr);
    resample_inconclusive(a.ab, thresholds, ab_runs, stderr);  // --max-extra-rounds (default 0)
    const AbResults& r = ab_runs;
    if (!a.save_base.empty()) write_text(a.save_base, r.base.dump(1) + "\n");
    if (!a.save_head.empty()) write_text(a.save_head, r.head.dump(1) + "\n");
    base = results_from_json(r.base, a.ab.base_bin);
    head = results_from_json(r.head, a.ab.head_bin);
  } else {
    if (a.base.empty() || a.head.empty()) throw BadInput("compare needs BASE and HEAD files");
    base = load_results(a.base);
    head = load_results(a.head);
  }
  GateRules rules;
  rules.allow_removed = a.allow_removed;
  rules.fail_on_inconclusive = a.fail_on_inconclusive;
  if (!a.rename_map.empty()) rules.renames = load_rename_map(a.rename_map);
  for (const auto& r : a.renames) {
    const auto eq = r.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == r.size())
      throw BadInput(fmt::format("--rename {}: expected OLD_ID=NEW_ID", r));
    rules.renames[r.substr(0, eq)] = r.substr(eq + 1);
  }
  Comparison c = compare_results(base, head, thresholds, rules);
  note_resampling(c, ab_runs);
  // Two files measured apart: the environment and the machine's stability decide whether a
  // verdict is possible (harness/gate/trust.h). An A/B run is one machine at one time.
  bool unstable_verdict = false;
  if (!ab) {
    const auto diffs = environment_differences(base.meta, head.meta);
    const bool time_gated = std::any_of(c.rows.begin(), c.rows.end(), [](const CompareRow& r) {
      return r.statistical && r.gated();
    });
    // Memory on the CPU is exact on every CPU: it may be judged across machines. Time, and any
    // figure of a GPU (cuBLAS's workspaces differ by card and version), may not.
    const bool matters = time_gated || base.meta.value("backend", std::string("cpu")) != "cpu";
    if (!diffs.empty() && matters && !a.allow_env_change)
      throw BadInput(fmt::format(
          "no verdict: BASE and HEAD come from different environments ({}); a different machine "
          "is not a regression (--allow-env-change compares anyway)",
          fmt::join(diffs, "; ")));
    if (!diffs.empty())
      fmt::print(stderr, "memtrade compare: environments differ ({}){}\n", fmt::join(diffs, "; "),
                 matters ? ", compared as asked (--allow-env-change)"
                         : "; memory is exact on every CPU and time is not gated");
    const Instability inst = machine_instability(c, base, head);
    if (inst.unstable()) {
      for (auto& r : c.rows)
        if (r.statistical &&
            (r.verdict == Verdict::regression || r.verdict == Verdict::improvement)) {
          unstable_verdict = unstable_verdict || (r.gated() && r.verdict == Verdict::regression);
          r.verdict = Verdict::inconclusive;
          r.note = "unstable machine: rerun interleaved";
        }
      fmt::print(stderr, "memtrade compare: unstable machine: rerun interleaved ({})\n",
                 fmt::join(inst.reasons, "; "));
    }
  }

  if (!a.write_markdown.empty()) write_text(a.write_markdown, report_markdown(c));
  if (!a.write_json.empty()) write_text(a.write_json, report_json(c));
  if (!a.write_junit.empty()) write_text(a.write_junit, report_junit(c));
  if (!a.output.empty()) {
    write_text(a.output, render_report(c, format, false));
    std::printf("%s\n", detail::summary_line(c).c_str());
  } else {
    const bool color = format == ReportFormat::text && isatty(fileno(stdout)) &&
                       std::getenv("NO_COLOR") == nullptr;
    const std::string text = format == ReportFormat::text
                                 ? report_text(c, color, a.verbose) + resampling_summary(ab_runs)
                                 : render_report(c, format, false);
    std::fputs(text.c_str(), stdout);
  }
  // A time regression the machine's stability could not carry is no verdict: exit 2, as bad
  // input is (nothing to judge), unless the caller takes "inconclusive" for an answer.
  if (unstable_verdict && !a.allow_unstable && c.gated_regressions() == 0 && !c.removed_fails())
    return 2;
  return c.exit_code();
}

void register_compare(CLI::App& app, Commands& cmds) {
  auto& a = cmds.keep<CompareArgs>();
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Judge HEAD against BASE (results or Google Benchmark JSON): exit 0 ok, 1 regression or a "
      "point of BASE missing from HEAD, 2 bad input or nothing to judge");
  cmd->add_option("base", a.base, "Baseline results file");
  cmd->add_option("head", a.head, "Candidate results file");
  cmd->add_option("--thresholds", a.thresholds, "Thresholds TOML (default: built-in defaults)");
  cmd->add_option("--format", a.format, "text | markdown | json | junit")->capture_default_str();
  cmd->add_option("--output,-o", a.output, "Write the report here instead of stdout");
  cmd->add_option("--write-markdown", a.write_markdown, "Also write a Markdown report");
  cmd->add_option("--write-json", a.write_json, "Also write a JSON report");
  cmd->add_option("--write-junit", a.write_junit, "Also write a JUnit XML report");
  cmd->add_flag("--allow-env-change", a.allow_env_change,
                "Judge BASE and HEAD from different CPUs, GPUs, drivers or libraries anyway");
  cmd->add_flag("--allow-unstable", a.allow_unstable,
                "Exit 0, not 2, when an unstable machine leaves time regressions inconclusive");
  cmd->add_flag("--fail-on-inconclusive", a.fail_on_inconclusive,
                "Exit 1 when a gated metric is inconclusive (too few samples)");
  cmd->add_flag("--verbose,-v", a.verbose, "Text: list unchanged rows too");
  cmd->add_flag(
      "--allow-removed", a.allow_removed,
      "A deliberate grid change: points of BASE missing from HEAD are listed, not failed");
  cmd->add_option(
         "--rename", a.renames,
         "A deliberate id change, OLD_ID=NEW_ID: judge BASE's OLD_ID against HEAD's NEW_ID "
         "(repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--rename-map", a.rename_map,
                  "JSON object {\"old id\": \"new id\", ...}, as --rename for many points")
      ->check(CLI::ExistingFile);
  cmd->add_option("--base-bin", a.ab.base_bin, "A/B: baseline memtrade binary");
  cmd->add_option("--head-bin", a.ab.head_bin, "A/B: candidate memtrade binary");
  cmd->add_option("--grid", a.ab.grid, "A/B: grid TOML both binaries run");
  cmd->add_option("--rounds", a.ab.rounds, "A/B: passes over the grid")->capture_default_str();
  cmd->add_option("--max-extra-rounds", a.ab.max_extra_rounds,
                  "A/B: re-run inconclusive points, doubling their steps, up to N more rounds")
      ->capture_default_str();
  cmd->add_option("--work-dir", a.ab.work_dir, "A/B: keep per-run files here");
  cmd->add_option("--run-arg", a.ab.run_args, "A/B: extra flag for every run (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--save-base", a.save_base, "A/B: write the merged baseline results");
  cmd->add_option("--save-head", a.save_head, "A/B: write the merged candidate results");
  cmds.add(cmd, [&a] { return cmd_compare(a); });
}

struct HistoryArgs {
  std::string db, results, branch, gate = "none", metric, format = "csv", machine, like, out;
  std::vector<std::string> where;
  bool include_regressed = false;
};

int cmd_history_list(const HistoryArgs& a) {
  const auto runs = history_list(a.db);
  std::printf("%-5s %-20s %-12s %-12s %-16s %-6s %-10s %6s %-10s %s\n", "id", "time", "commit",
              "branch", "machine", "backend", "grid", "points", "gate", "device");
  for (const auto& r : runs)
    std::printf("%-5lld %-20s %-12s %-12s %-16s %-6s %-10s %6lld %-10s %s\n",
                static_cast<long long>(r.id), r.time.c_str(), r.commit.substr(0, 12).c_str(),
                r.branch.c_str(), r.machine.c_str(), r.backend.c_str(), r.grid.c_str(),
                static_cast<long long>(r.points), r.gate.c_str(), r.device.c_str());
  return 0;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

int cmd_history_trend(const HistoryArgs& a) {
  TrendQuery q;
  q.metric = a.metric;
  q.branch = a.branch;
  q.machine = a.machine;
  for (const auto& w : a.where) {
    const auto eq = w.find('=');
    if (eq == std::string::npos || eq == 0)
      throw BadInput(fmt::format("--where {}: expected key=value", w));
    q.where[w.substr(0, eq)] = w.substr(eq + 1);
  }
  if (a.format != "csv" && a.format != "json")
    throw BadInput(fmt::format("--format {}: expected csv or json", a.format));
  const auto rows = history_trend(a.db, q);
  if (a.format == "json") {
    json arr = json::array();
    for (const auto& r : rows)
      arr.push_back(
          {{"commit", r.commit}, {"time", r.time}, {"point_id", r.point_id}, {"value", r.value}});
    std::printf("%s\n", arr.dump(1).c_str());
    return 0;
  }
  std::printf("commit,time,point_id,%s\n", a.metric.c_str());
  for (const auto& r : rows)
    std::printf("%s,%s,%s,%.17g\n", csv_field(r.commit).c_str(), csv_field(r.time).c_str(),
                csv_field(r.point_id).c_str(), r.value);
  return 0;
}

int cmd_history_baseline(const HistoryArgs& a) {
  BaselineQuery q;
  q.branch = a.branch;
  q.include_regressed = a.include_regressed;
  if (!a.machine.empty() && !a.like.empty())
    throw BadInput("give either --machine or --like, not both");
  q.machine = a.machine;
  if (!a.like.empty()) {
    const json doc = read_json_file(a.like);
    q.machine = machine_fingerprint(doc.contains("meta") ? doc["meta"] : json::object());
  }
  check_output_file("--out", a.out);
  const auto doc = history_baseline(a.db, q);
  if (!doc) {
    std::fprintf(stderr, "memtrade: no baseline in %s for branch %s%s\n", a.db.c_str(),
                 a.branch.c_str(),
                 q.machine.empty() ? "" : fmt::format(" on machine {}", q.machine).c_str());
    return 1;
  }
  write_text(a.out, doc->dump(1) + "\n");
  std::printf("baseline: commit %s (%zu points) -> %s\n",
              doc->at("meta").value("commit", std::string("?")).c_str(), doc->at("points").size(),
              a.out.c_str());
  return 0;
}

void register_history(CLI::App& app, Commands& cmds) {
  auto& a = cmds.keep<HistoryArgs>();
  CLI::App* history = app.add_subcommand("history", "Results history in SQLite");
  history->require_subcommand(1);

  CLI::App* add = history->add_subcommand("add", "Add a results file to the history");
  add->add_option("results", a.results, "memtrade results JSON")->required();
  add->add_option("--db", a.db, "History database (created if missing)")->required();
  add->add_option("--branch", a.branch, "Branch name (default: $GITHUB_REF_NAME or \"local\")");
  add->add_option("--gate", a.gate, "Gate outcome: ok | regression | accepted | none")
      ->check(CLI::IsMember({"ok", "regression", "accepted", "none"}))
      ->capture_default_str();
  cmds.add(add, [&a] {
    HistoryAddOptions o;
    o.branch = a.branch;
    if (o.branch.empty())
      if (const char* ref = std::getenv("GITHUB_REF_NAME")) o.branch = ref;
    o.gate = a.gate;
    const int64_t id = history_add(a.db, read_json_file(a.results), o);
    std::printf("added run %lld to %s\n", static_cast<long long>(id), a.db.c_str());
    return 0;
  });

  CLI::App* list = history->add_subcommand("list", "List the runs in the history");
  list->add_option("--db", a.db, "History database")->required();
  cmds.add(list, [&a] { return cmd_history_list(a); });

  CLI::App* trend = history->add_subcommand("trend", "One metric over commits (CSV or JSON)");
  trend->add_option("--db", a.db, "History database")->required();
  trend
      ->add_option("--metric", a.metric,
                   "peak_allocated | peak_reserved | predicted_peak | "
                   "median_s | samples_per_s | tokens_per_s")
      ->required();
  trend->add_option("--where", a.where, "key=glob on the point's config (repeatable)")
      ->allow_extra_args(false);
  trend->add_option("--branch", a.branch, "Only runs of this branch");
  trend->add_option("--machine", a.machine, "Only runs of this machine fingerprint");
  trend->add_option("--format", a.format, "csv | json")->capture_default_str();
  cmds.add(trend, [&a] { return cmd_history_trend(a); });

  CLI::App* baseline = history->add_subcommand(
      "baseline",
      "Write the newest run of a branch (and machine) as a results file; exit 1 if none");
  baseline->add_option("--db", a.db, "History database")->required();
  baseline->add_option("--branch", a.branch, "Branch")->required();
  baseline->add_option("--machine", a.machine, "Machine fingerprint");
  baseline->add_option("--like", a.like, "Take the machine fingerprint of this results file");
  baseline->add_option("--out", a.out, "Output results file")->required();
  baseline->add_flag("--include-regressed", a.include_regressed,
                     "Also use runs whose gate said regression");
  cmds.add(baseline, [&a] { return cmd_history_baseline(a); });
}

}  // namespace

void register_gate_commands(CLI::App& app, Commands& cmds) {
  register_compare(app, cmds);
  register_history(app, cmds);
}

}  // namespace memtrade
