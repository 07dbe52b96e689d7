#include "harness/gate/compare_ab.h"

#include <fmt/format.h>
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
};

// Runs a memtrade binary without a shell (no quoting problems with odd paths): stdout
// captured, stderr passed through so that the child's own messages reach the log.
Captured run_capture(const std::vector<std::string>& argv) {
  SpawnOptions o;
  o.stdout_mode = SpawnOptions::Stdout::capture;
  const ChildOutcome c = spawn(argv, o);
  return {c.kind == ChildOutcome::Kind::signaled ? 128 + c.signal : c.exit_code, c.stdout_text};
}

std::vector<std::string> list_points(const std::string& bin, const std::string& grid) {
  const Captured c = run_capture({bin, "run", "--grid", grid, "--list"});
  if (c.rc != 0)
    throw BadInput(fmt::format("{} run --grid {} --list exited with {}", bin, grid, c.rc));
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

json run_one(const AbOptions& o, const std::string& bin, const std::string& id, const fs::path& out,
             std::FILE* log) {
  std::vector<std::string> argv = {bin,        "run", "--grid", o.grid,
                                   "--select", id,    "--out",  out.string()};
  argv.insert(argv.end(), o.run_args.begin(), o.run_args.end());
  std::error_code ec;
  fs::remove(out, ec);
  const Captured c = run_capture(argv);
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
                       fmt::format("{} exited with {} and wrote no results", bin, c.rc)));
  return failed.to_json();
}

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
  for (const auto& bin : {o.base_bin, o.head_bin})
    if (access(bin.c_str(), X_OK) != 0)
      throw BadInput(fmt::format("{}: not an executable file", bin));
  const auto base_ids = list_points(o.base_bin, o.grid);
  const auto head_ids = list_points(o.head_bin, o.grid);
  const std::set<std::string> in_base(base_ids.begin(), base_ids.end());
  const std::set<std::string> in_head(head_ids.begin(), head_ids.end());
  std::vector<std::string> ids = head_ids;
  for (const auto& id : base_ids)
    if (!in_head.contains(id)) ids.push_back(id);

  fs::path dir = o.work_dir;
  const bool temporary = dir.empty();
  if (temporary) {
    std::string tmpl = (fs::temp_directory_path() / "memtrade-ab-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      throw std::runtime_error(fmt::format("mkdtemp: {}", std::strerror(errno)));
    dir = tmpl;
  } else {
    fs::create_directories(dir);
  }
  std::vector<json> base_docs, head_docs;
  for (int round = 0; round < o.rounds; ++round) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const bool base_first = (static_cast<std::size_t>(round) + i) % 2 == 0;
      for (int k = 0; k < 2; ++k) {
        const bool is_base = (k == 0) == base_first;
        if (!(is_base ? in_base : in_head).contains(ids[i])) continue;
        const std::string& bin = is_base ? o.base_bin : o.head_bin;
        const fs::path out =
            dir / fmt::format("{}_{}_{}.json", is_base ? "base" : "head", round, i);
        if (log)
          std::fprintf(log, "[round %d/%d] %s %s\n", round + 1, o.rounds, is_base ? "base" : "head",
                       ids[i].c_str());
        (is_base ? base_docs : head_docs).push_back(run_one(o, bin, ids[i], out, log));
      }
    }
  }
  if (temporary) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return {merge_point_files(base_docs), merge_point_files(head_docs)};
}

}  // namespace memtrade
