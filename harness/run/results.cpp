#include "harness/run/results.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <unistd.h>

#include "harness/common/bad_input.h"

namespace memtrade {

nlohmann::json make_meta(const std::string& backend, const std::string& device_name,
                         std::size_t device_memory, const Grid* grid, std::size_t capacity) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json versions = nlohmann::json::object();
  for (const auto& [lib, version] : library_versions()) versions[lib] = version;
  return {{"commit", git_commit()},
          {"dirty", git_dirty()},
          {"time", when},
          {"host", host},
          {"backend", backend},
          {"device", device_name},
          {"device_memory", device_memory},
          {"capacity", capacity > 0 ? nlohmann::json(capacity) : nlohmann::json(nullptr)},
          {"grid", grid ? nlohmann::json(grid->name) : nlohmann::json(nullptr)},
          {"grid_hash", grid ? nlohmann::json(grid->hash) : nlohmann::json(nullptr)},
          {"memtrade", MEMTRADE_VERSION},
          {"versions", versions}};
}

nlohmann::json load_results(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw BadInput(fmt::format("{}: cannot read results file", path.string()));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw BadInput(fmt::format("{}: malformed or truncated JSON (byte {})", path.string(), e.byte));
  }
  if (!j.is_object() || j.value("schema", "") != kResultsSchema)
    throw BadInput(fmt::format("{}: not a memtrade results file (schema must be \"{}\")",
                               path.string(), kResultsSchema));
  if (!j.contains("points") || !j["points"].is_array())
    throw BadInput(fmt::format("{}: 'points' must be an array", path.string()));
  for (const auto& p : j["points"])
    if (!p.is_object() || !p.contains("id") || !p["id"].is_string() || !p.contains("status"))
      throw BadInput(fmt::format("{}: a point lacks 'id' or 'status'", path.string()));
  return j;
}

void write_json_atomic(const std::filesystem::path& path, const nlohmann::json& j) {
  auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (!dir.empty()) std::filesystem::create_directories(dir);
  auto tmp = dir / fmt::format(".{}.{}.tmp", path.filename().string(), getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write " + tmp.string());
    out << j.dump(1) << "\n";
    out.flush();
    if (!out) throw std::runtime_error("write failed: " + tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

nlohmann::json failed_point(const GridPoint& p, const std::string& status,
                            const std::string& error) {
  return {{"id", p.id},
          {"config", config_json(p.config)},
          {"status", status},
          {"error", error},
          {"memory", nullptr},
          {"time", nullptr},
          {"throughput", nullptr},
          {"train", nullptr},
          {"transfer", nullptr}};
}

namespace {
std::string csv_field(const nlohmann::json& v) {
  if (v.is_null()) return "";
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  if (s.find_first_of(",\"\n") != std::string::npos) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  return s;
}
const nlohmann::json& at_path(const nlohmann::json& p, const char* a, const char* b) {
  static const nlohmann::json null_value;
  if (!p.contains(a) || !p[a].is_object() || !p[a].contains(b)) return null_value;
  return p[a][b];
}
}  // namespace

std::string results_csv(const nlohmann::json& results) {
  static const char* config_cols[] = {"model",      "batch_size",  "accumulation", "precision",
                                      "checkpoint", "optimizer",   "offload",      "zero_grad",
                                      "mode",       "empty_cache", "input"};
  static const std::pair<const char*, const char*> metric_cols[] = {{"memory", "peak_allocated"},
                                                                    {"memory", "peak_requested"},
                                                                    {"memory", "peak_reserved"},
                                                                    {"memory", "predicted_peak"},
                                                                    {"memory", "host_pinned_peak"},
                                                                    {"time", "median_s"},
                                                                    {"time", "p10_s"},
                                                                    {"time", "p90_s"},
                                                                    {"time", "cv"},
                                                                    {"throughput", "samples_per_s"},
                                                                    {"throughput", "tokens_per_s"},
                                                                    {"throughput", "tflops"},
                                                                    {"train", "loss_first"},
                                                                    {"train", "loss_last"},
                                                                    {"transfer", "h2d_bytes"},
                                                                    {"transfer", "d2h_bytes"}};
  std::ostringstream out;
  out << "id,status";
  for (const char* c : config_cols) out << "," << c;
  for (const auto& [a, b] : metric_cols) out << "," << b;
  out << ",error\n";
  for (const auto& p : results["points"]) {
    out << csv_field(p["id"]) << "," << csv_field(p["status"]);
    for (const char* c : config_cols) out << "," << csv_field(at_path(p, "config", c));
    for (const auto& [a, b] : metric_cols) out << "," << csv_field(at_path(p, a, b));
    out << "," << csv_field(p.value("error", nlohmann::json()));
    out << "\n";
  }
  return out.str();
}

}  // namespace memtrade
