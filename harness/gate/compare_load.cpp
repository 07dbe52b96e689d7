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

ResultSet memtrade_results(const json& doc, const std::string& label) {
  const ResultsFile file = ResultsFile::from_json(doc, label);
  ResultSet rs;
  rs.label = label;
  rs.format = "memtrade";
  rs.meta = file.meta;
  for (const PointRow& p : file.points) {
    PointData pd;
    pd.id = p.id;
    pd.config = flatten_config(p.config);
    pd.config["id"] = pd.id;
    pd.status = p.status;
    if (p.memory) {
      pd.metrics["peak_allocated"].value = static_cast<double>(p.memory->peak_allocated);
      pd.metrics["peak_reserved"].value = static_cast<double>(p.memory->peak_reserved);
    }
    if (p.time) {
      const std::vector<double>& steps = p.time->samples_s;
      const double median_s = p.time->median_s;
      pd.metrics["median_s"] = {median_s, steps};
      if (p.throughput) {
        // Per-step throughput is (samples per step) / step time: a monotone map of the time
        // samples, so the rank test sees the same evidence in the opposite direction.
        const double sps = p.throughput->samples_per_s;
        MetricValue mv{sps, {}};
        if (median_s > 0)
          for (double t : steps) mv.samples.push_back(t > 0 ? sps * median_s / t : 0);
        pd.metrics["samples_per_s"] = std::move(mv);
      }
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

ResultSet load_results(const std::string& path) {
  return results_from_json(read_json_file(path), path);
}

}  // namespace memtrade
