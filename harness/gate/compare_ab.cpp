#include "harness/gate/compare_ab.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include "harness/common/bad_input.h"
#include "harness/common/point_row.h"
#include "harness/common/process.h"
#include "harness/common/stats.h"
#include "harness/gate/compare.h"

namespace memtrade {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Captured {
  int rc = -1;
  std::string out;
  std::string err_tail;  // the child's last stderr lines, where they went to a file
};

// Runs a memtrade binary without a shell (no quoting problems with odd paths): stdout
// captured, stderr passed through so that the child's own messages reach the log, or into
// `err_file` where one is given.
Captured run_capture(const std::vector<std::string>& argv, const fs::path& err_file = {}) {
  SpawnOptions o;
  o.stdout_mode = SpawnOptions::Stdout::capture;
  if (!err_file.empty()) o.stderr_file = err_file;
  const ChildOutcome c = spawn(argv, o);
  return {c.kind == ChildOutcome::Kind::signaled ? 128 + c.signal : c.exit_code, c.stdout_text,
          c.stderr_tail};
}

// `BIN run [--grid G]`: without a grid, the knob flags of run_args describe the point.
std::vector<std::string> run_argv(const AbOptions& o, const std::string& bin) {
  std::vector<std::string> argv = {bin, "run"};
  if (!o.grid.empty()) argv.insert(argv.end(), {"--grid", o.grid});
  return argv;
}

// A fresh temporary folder (removed on destruction), or the caller's work dir (kept).
class RunDir {
 public:
  explicit RunDir(const std::string& work_dir) : path_(work_dir), temporary_(work_dir.empty()) {
    if (!temporary_) {
      fs::create_directories(path_);
      return;
    }
    std::string tmpl = (fs::temp_directory_path() / "memtrade-ab-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      throw std::runtime_error(fmt::format("mkdtemp: {}", std::strerror(errno)));
    path_ = tmpl;
  }
  ~RunDir() {
    std::error_code ec;
    if (temporary_) fs::remove_all(path_, ec);
  }
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  bool temporary_;
};

// Both binaries' points, head's order first; a point one side lacks runs on the other only.
struct PointLists {
  std::vector<std::string> ids;
  std::set<std::string> in_base, in_head;
};

PointLists list_both(const AbOptions& o) {
  const auto base_ids = list_points(o, o.base_bin);
  const auto head_ids = list_points(o, o.head_bin);
  PointLists l;
  l.in_base = {base_ids.begin(), base_ids.end()};
  l.in_head = {head_ids.begin(), head_ids.end()};
  l.ids = head_ids;
  for (const auto& id : base_ids)
    if (!l.in_head.contains(id)) l.ids.push_back(id);
  if (o.select.empty()) return l;
  for (const auto& id : o.select)
    if (!l.in_base.contains(id) && !l.in_head.contains(id))
      throw BadInput(fmt::format("--select: neither binary lists a point {}", id));
  std::erase_if(l.ids, [&](const std::string& id) {
    return std::find(o.select.begin(), o.select.end(), id) == o.select.end();
  });
  return l;
}

// One interleaved pass over `ids`: base first where (round + index) is even. `extra_args`
// gives each point's additional run flags.
void run_pass(const AbOptions& o, const PointLists& l, const std::vector<std::string>& ids,
              int round, const std::string& label, const fs::path& dir,
              const std::map<std::string, std::vector<std::string>>& extra_args,
              std::vector<json>& base_docs, std::vector<json>& head_docs, std::FILE* log) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const bool base_first = (static_cast<std::size_t>(round) + i) % 2 == 0;
    const auto extra = extra_args.find(ids[i]);
    const std::vector<std::string> args =
        extra == extra_args.end() ? std::vector<std::string>{} : extra->second;
    for (int k = 0; k < 2; ++k) {
      const bool is_base = (k == 0) == base_first;
      if (!(is_base ? l.in_base : l.in_head).contains(ids[i])) continue;
      const std::string& bin = is_base ? o.base_bin : o.head_bin;
      const fs::path out = dir / fmt::format("{}_{}_{}.json", is_base ? "base" : "head", round, i);
      if (log)
        std::fprintf(log, "[%s] %s %s\n", label.c_str(), is_base ? "base" : "head", ids[i].c_str());
      (is_base ? base_docs : head_docs).push_back(run_point(o, bin, ids[i], out, args, log));
    }
  }
}

}  // namespace

std::vector<std::string> list_points(const AbOptions& o, const std::string& bin) {
  std::vector<std::string> argv = run_argv(o, bin);
  // Without a grid the knob flags are the point, so the listing needs them too.
  if (o.grid.empty()) argv.insert(argv.end(), o.run_args.begin(), o.run_args.end());
  argv.push_back("--list");
  fs::path err;
  if (o.child_stderr_to_files)
    err = fs::temp_directory_path() / fmt::format("memtrade-list-{}.err", getpid());
  const Captured c = run_capture(argv, err);
  if (!err.empty()) {
    std::error_code ec;
    fs::remove(err, ec);
  }
  if (c.rc != 0)
    throw BadInput(fmt::format("{} run{} --list exited with {}{}", bin,
                               o.grid.empty() ? "" : " --grid " + o.grid, c.rc,
                               c.err_tail.empty() ? "" : ": " + c.err_tail));
  std::vector<std::string> ids;
  std::size_t start = 0;
  while (start < c.out.size()) {
    std::size_t end = c.out.find('\n', start);
    if (end == std::string::npos) end = c.out.size();
    std::string line = c.out.substr(start, end - start);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) ids.push_back(line);
    start = end + 1;
  }
  return ids;
}

json run_point(const AbOptions& o, const std::string& bin, const std::string& id,
               const fs::path& out, const std::vector<std::string>& extra_args, std::FILE* log) {
  std::vector<std::string> argv = run_argv(o, bin);
  argv.insert(argv.end(), {"--select", id, "--out", out.string()});
  argv.insert(argv.end(), o.run_args.begin(), o.run_args.end());
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  std::error_code ec;
  fs::remove(out, ec);
  const Captured c =
      run_capture(argv, o.child_stderr_to_files ? fs::path(out.string() + ".err") : fs::path());
  try {
    json doc = read_json_file(out);
    if (doc.contains("points") && doc["points"].is_array()) return doc;
  } catch (const BadInput&) {
  }
  if (log)
    std::fprintf(log, "  %s left no results for %s (exit %d)\n", bin.c_str(), id.c_str(), c.rc);
  ResultsFile failed;
  failed.points.push_back(
      PointRow::failed(id, json::object(), "error",
                       fmt::format("{} exited with {} and wrote no results{}", bin, c.rc,
                                   c.err_tail.empty() ? "" : ": " + c.err_tail)));
  return failed.to_json();
}

namespace {

void pool_round(json& into, const json& more) {
  // Worst status wins: a point that failed in any round failed.
  if (into.value("status", "ok") == "ok" && more.value("status", "ok") != "ok") {
    into = more;
    return;
  }
  if (more.value("status", "ok") != "ok") return;
  if (into.contains("memory") && into["memory"].is_object() && more.contains("memory") &&
      more["memory"].is_object())
    for (const char* k : {"peak_allocated", "peak_requested", "peak_reserved"})
      if (into["memory"].contains(k) && more["memory"].contains(k) &&
          more["memory"][k].is_number() && into["memory"][k].is_number())
        into["memory"][k] =
            std::max(into["memory"][k].get<int64_t>(), more["memory"][k].get<int64_t>());
  if (!into.contains("time") || !into["time"].is_object() || !more.contains("time") ||
      !more["time"].is_object())
    return;
  std::vector<double> samples = into["time"].value("samples_s", std::vector<double>{});
  const auto extra = more["time"].value("samples_s", std::vector<double>{});
  samples.insert(samples.end(), extra.begin(), extra.end());
  if (samples.empty()) return;
  const double old_median = into["time"].value("median_s", 0.0);
  const double new_median = median(samples);
  into["time"]["samples_s"] = samples;
  into["time"]["median_s"] = new_median;
  into["time"]["p10_s"] = quantile(samples, 0.1);
  into["time"]["p90_s"] = quantile(samples, 0.9);
  into["time"]["cv"] = coefficient_of_variation(samples);
  // Rates are work per step over the step time: rescale by the new median.
  if (old_median > 0 && new_median > 0 && into.contains("throughput") &&
      into["throughput"].is_object())
    for (const char* k : {"samples_per_s", "tokens_per_s", "tflops"})
      if (into["throughput"].contains(k) && into["throughput"][k].is_number())
        into["throughput"][k] = into["throughput"][k].get<double>() * old_median / new_median;
}

}  // namespace

json merge_point_files(const std::vector<json>& docs) {
  json merged = {
      {"schema", "memtrade.results/1"}, {"meta", json::object()}, {"points", json::array()}};
  std::map<std::string, std::size_t> where;
  for (std::size_t d = 0; d < docs.size(); ++d) {
    if (d == 0 && docs[d].contains("meta")) merged["meta"] = docs[d]["meta"];
    for (const json& p : docs[d]["points"]) {
      const std::string id = p.value("id", "");
      auto [it, fresh] = where.try_emplace(id, merged["points"].size());
      if (fresh)
        merged["points"].push_back(p);
      else
        pool_round(merged["points"][it->second], p);
    }
  }
  return merged;
}

AbResults run_ab(const AbOptions& o, std::FILE* log) {
  if (o.rounds < 1) throw BadInput(fmt::format("--rounds must be >= 1 (got {})", o.rounds));
  if (o.max_extra_rounds < 0)  // refused before the runs, not after them
    throw BadInput(fmt::format("--max-extra-rounds must be >= 0 (got {})", o.max_extra_rounds));
  for (const auto& bin : {o.base_bin, o.head_bin})
    if (access(bin.c_str(), X_OK) != 0)
      throw BadInput(fmt::format("{}: not an executable file", bin));
  const PointLists l = list_both(o);
  const RunDir dir(o.work_dir);
  std::vector<json> base_docs, head_docs;
  for (int round = 0; round < o.rounds; ++round)
    run_pass(o, l, l.ids, round, fmt::format("round {}/{}", round + 1, o.rounds), dir.path(), {},
             base_docs, head_docs, log);
  return {merge_point_files(base_docs), merge_point_files(head_docs), 0, {}};
}

namespace {

// `run` refuses more steps than this (kMaxSteps, harness/run/grid.h, which gate/ does not see).
constexpr std::int64_t kMaxRunSteps = 1'000'000;

// Points with an inconclusive time verdict; none where the two sides match nothing.
std::vector<std::string> inconclusive_points(const AbResults& r, const Thresholds& t) {
  GateRules rules;
  rules.allow_removed = true;
  std::vector<std::string> ids;
  try {
    const Comparison c = compare_results(results_from_json(r.base, "base"),
                                         results_from_json(r.head, "head"), t, rules);
    for (const auto& row : c.rows)
      if (row.statistical && row.verdict == Verdict::inconclusive &&
          std::find(ids.begin(), ids.end(), row.point) == ids.end())
        ids.push_back(row.point);
  } catch (const BadInput&) {
  }
  return ids;
}

// Steps of one run of `id`: its pooled sample count over the first rounds.
std::int64_t first_run_steps(const AbResults& r, const std::string& id, int rounds) {
  std::size_t n = 0;
  for (const json* doc : {&r.base, &r.head})
    for (const json& p : doc->value("points", json::array()))
      if (p.value("id", "") == id && p.contains("time") && p["time"].is_object())
        n = std::max(n, p["time"].value("samples_s", std::vector<double>{}).size());
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(n) / std::max(1, rounds));
}

// run_args without --steps (the extra rounds set their own).
std::vector<std::string> without_steps(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--steps") {
      ++i;
      continue;
    }
    if (!args[i].starts_with("--steps=")) out.push_back(args[i]);
  }
  return out;
}

}  // namespace

void resample_inconclusive(const AbOptions& o, const Thresholds& t, AbResults& r, std::FILE* log) {
  if (o.max_extra_rounds < 0)
    throw BadInput(fmt::format("--max-extra-rounds must be >= 0 (got {})", o.max_extra_rounds));
  if (o.max_extra_rounds == 0) return;
  std::vector<std::string> todo = inconclusive_points(r, t);
  if (todo.empty()) return;
  std::map<std::string, std::int64_t> first_steps;
  for (const auto& id : todo) first_steps[id] = first_run_steps(r, id, o.rounds);
  AbOptions extra = o;
  extra.run_args = without_steps(o.run_args);
  extra.select = todo;
  const PointLists l = list_both(extra);
  const RunDir dir(o.work_dir);
  for (int k = 1; k <= o.max_extra_rounds && !todo.empty(); ++k) {
    std::map<std::string, std::vector<std::string>> args;
    for (const auto& id : todo) {
      if (!first_steps.contains(id)) first_steps[id] = first_run_steps(r, id, o.rounds);
      const std::int64_t steps = std::min(kMaxRunSteps, first_steps[id] << std::min(k, 20));
      args[id] = {"--steps", std::to_string(steps)};
      auto it = std::find_if(r.resampled.begin(), r.resampled.end(),
                             [&](const Resampled& x) { return x.point == id; });
      if (it == r.resampled.end()) {
        r.resampled.push_back({id, {}});
        it = std::prev(r.resampled.end());
      }
      it->steps.push_back(steps);
    }
    if (log)
      std::fprintf(log, "[extra round %d/%d] %zu inconclusive point%s, steps doubled\n", k,
                   o.max_extra_rounds, todo.size(), todo.size() == 1 ? "" : "s");
    std::vector<json> base_docs = {r.base}, head_docs = {r.head};
    run_pass(extra, l, todo, o.rounds + k - 1,
             fmt::format("extra round {}/{}", k, o.max_extra_rounds), dir.path(), args, base_docs,
             head_docs, log);
    r.base = merge_point_files(base_docs);
    r.head = merge_point_files(head_docs);
    r.extra_rounds = k;
    todo = inconclusive_points(r, t);
  }
}

void note_resampling(Comparison& c, const AbResults& r) {
  for (auto& row : c.rows)
    for (const auto& x : r.resampled) {
      if (x.point != row.point) continue;
      const std::string note =
          fmt::format("{} extra round{} (steps {})", x.steps.size(), x.steps.size() == 1 ? "" : "s",
                      fmt::join(x.steps, ", "));
      row.note = row.note.empty() ? note : row.note + "; " + note;
    }
}

std::string resampling_summary(const AbResults& r) {
  if (r.extra_rounds == 0) return "";
  std::vector<std::string> points;
  for (const auto& x : r.resampled)
    points.push_back(fmt::format("{} (steps {})", x.point, fmt::join(x.steps, ", ")));
  return fmt::format("resampled: {} extra round{} for {} inconclusive point{}: {}\n",
                     r.extra_rounds, r.extra_rounds == 1 ? "" : "s", r.resampled.size(),
                     r.resampled.size() == 1 ? "" : "s", fmt::join(points, ", "));
}

}  // namespace memtrade
