// Reading the two inputs of `memtrade compare`: memtrade results and Google Benchmark JSON.
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "harness/common/bad_input.h"
#include "harness/common/stats.h"
#include "harness/gate/compare.h"

namespace memtrade {
namespace {

using nlohmann::json;

void flatten(const json& j, const std::string& prefix, ConfigMap& out) {
  for (const auto& [k, v] : j.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object())
      flatten(v, key, out);
    else if (v.is_string())
      out[key] = v.get<std::string>();
    else if (!v.is_null())
      out[key] = v.dump();
  }
}

std::optional<double> number_at(const json& obj, const char* section, const char* key) {
  if (!obj.contains(section) || !obj[section].is_object()) return std::nullopt;
  const json& s = obj[section];
  if (!s.contains(key) || !s[key].is_number()) return std::nullopt;
  return s[key].get<double>();
}

ResultSet memtrade_results(const json& doc, const std::string& label) {
  auto bad = [&](const std::string& what) { return BadInput(fmt::format("{}: {}", label, what)); };
  if (!doc["schema"].is_string() || doc["schema"].get<std::string>() != "memtrade.results/1")
    throw bad(fmt::format("unsupported schema {} (expected \"memtrade.results/1\")",
                          doc["schema"].dump()));
  if (!doc.contains("points") || !doc["points"].is_array())
    throw bad("\"points\" must be an array");
  ResultSet rs;
  rs.label = label;
  rs.format = "memtrade";
  rs.meta = doc.contains("meta") ? doc["meta"] : json::object();
  std::set<std::string> seen;
  static const std::set<std::string> kStatuses = {"ok", "oom", "error", "timeout", "skipped"};
  for (std::size_t i = 0; i < doc["points"].size(); ++i) {
    const json& p = doc["points"][i];
    if (!p.is_object() || !p.contains("id") || !p["id"].is_string())
      throw bad(fmt::format("point #{} has no string \"id\"", i));
    PointData pd;
    pd.id = p["id"].get<std::string>();
    if (!seen.insert(pd.id).second) throw bad(fmt::format("duplicate point id {}", pd.id));
    if (p.contains("config") && p["config"].is_object()) pd.config = flatten_config(p["config"]);
    pd.config["id"] = pd.id;
    if (!p.contains("status") || !p["status"].is_string() ||
        !kStatuses.contains(p["status"].get<std::string>()))
      throw bad(
          fmt::format("point {}: status must be one of ok, oom, error, timeout, skipped", pd.id));
    pd.status = p["status"].get<std::string>();
    for (const char* m : {"peak_allocated", "peak_reserved"})
      if (auto v = number_at(p, "memory", m)) pd.metrics[m].value = *v;
    std::vector<double> steps;
    if (p.contains("time") && p["time"].is_object() && p["time"].contains("samples_s") &&
        p["time"]["samples_s"].is_array())
      for (const json& s : p["time"]["samples_s"]) {
        if (!s.is_number()) throw bad(fmt::format("point {}: non-numeric time sample", pd.id));
        steps.push_back(s.get<double>());
      }
    auto median_s = number_at(p, "time", "median_s");
    if (!median_s && !steps.empty()) median_s = median(steps);
    if (median_s) pd.metrics["median_s"] = {*median_s, steps};
    if (auto sps = number_at(p, "throughput", "samples_per_s")) {
      // Per-step throughput is (samples per step) / step time: a monotone map of the time
      // samples, so the rank test sees the same evidence in the opposite direction.
      MetricValue mv{*sps, {}};
      if (median_s && *median_s > 0)
        for (double t : steps) mv.samples.push_back(t > 0 ? *sps * *median_s / t : 0);
      pd.metrics["samples_per_s"] = std::move(mv);
    }
    rs.points.push_back(std::move(pd));
  }
  return rs;
}

double to_seconds(double v, const std::string& unit) {
  if (unit == "ns") return v * 1e-9;
  if (unit == "us") return v * 1e-6;
  if (unit == "ms") return v * 1e-3;
  return v;
}

// Google Benchmark: every non-aggregate entry is one repetition of the point named by run_name;
// real_time/cpu_time (in seconds) and every numeric counter become sampled metrics.
ResultSet gbench_results(const json& doc, const std::string& label) {
  auto bad = [&](const std::string& what) { return BadInput(fmt::format("{}: {}", label, what)); };
  if (!doc["benchmarks"].is_array()) throw bad("\"benchmarks\" must be an array");
  static const std::set<std::string> kNotCounters = {
      "name",           "run_name",         "run_type",
      "repetitions",    "repetition_index", "threads",
      "iterations",     "real_time",        "cpu_time",
      "time_unit",      "family_index",     "per_family_instance_index",
      "aggregate_name", "aggregate_unit",   "label",
      "error_occurred", "error_message",    "skipped",
      "skip_message"};
  ResultSet rs;
  rs.label = label;
  rs.format = "gbench";
  rs.meta = doc["context"];
  std::map<std::string, std::size_t> index;
  for (const json& b : doc["benchmarks"]) {
    if (!b.is_object() || !b.contains("name") || !b["name"].is_string())
      throw bad("a benchmark entry has no string \"name\"");
    if (b.value("run_type", std::string("iteration")) == "aggregate") continue;
    const std::string id = b.value("run_name", b["name"].get<std::string>());
    auto [it, fresh] = index.try_emplace(id, rs.points.size());
    if (fresh) {
      PointData pd;
      pd.id = id;
      pd.config = {{"id", id}, {"name", id}, {"benchmark", id.substr(0, id.find('/'))}};
      rs.points.push_back(std::move(pd));
    }
    PointData& pd = rs.points[it->second];
    if (b.value("error_occurred", false)) {
      pd.status = "error";
      continue;
    }
    const std::string unit = b.value("time_unit", std::string("ns"));
    for (const auto& [k, v] : b.items()) {
      if (!v.is_number() || (kNotCounters.contains(k) && k != "real_time" && k != "cpu_time"))
        continue;
      double x = v.get<double>();
      if (k == "real_time" || k == "cpu_time") x = to_seconds(x, unit);
      pd.metrics[k].samples.push_back(x);
    }
  }
  for (auto& pd : rs.points)
    for (auto& [k, mv] : pd.metrics) mv.value = median(mv.samples);
  return rs;
}

}  // namespace

ConfigMap flatten_config(const json& config) {
  ConfigMap out;
  flatten(config, "", out);
  return out;
}

ResultSet results_from_json(const json& doc, const std::string& label) {
  if (!doc.is_object()) throw BadInput(fmt::format("{}: not a JSON object", label));
  if (doc.contains("context") && doc.contains("benchmarks")) return gbench_results(doc, label);
  if (!doc.contains("schema"))
    throw BadInput(fmt::format(
        "{}: neither a memtrade results file (no \"schema\") nor Google Benchmark JSON", label));
  return memtrade_results(doc, label);
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw BadInput(fmt::format("{}: cannot read file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw BadInput(fmt::format("{}: empty file", path));
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw BadInput(
        fmt::format("{}: invalid JSON (truncated or garbage?) at byte {}", path, e.byte));
  }
}

ResultSet load_results(const std::string& path) {
  return results_from_json(read_json_file(path), path);
}

}  // namespace memtrade
