#include "harness/run/results.h"

#include <ctime>
#include <sstream>

#include <fmt/format.h>
#include <unistd.h>

#include "kernels/device.h"
#include "models/config/knobs.h"

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
          {"versions", versions},
          {"knobs", knobs_json()}};
}

PointRow failed_point(const GridPoint& p, const std::string& status, const std::string& error) {
  return PointRow::failed(p.id, config_json(p.config), status, error);
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

template <typename T>
nlohmann::json opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

std::string results_csv(const ResultsFile& results) {
  using Getter = std::function<nlohmann::json(const PointRow&)>;
  auto mem = [](auto f) -> Getter {
    return [f](const PointRow& p) { return p.memory ? nlohmann::json(f(*p.memory)) : nullptr; };
  };
  auto tim = [](auto f) -> Getter {
    return [f](const PointRow& p) { return p.time ? nlohmann::json(f(*p.time)) : nullptr; };
  };
  auto thr = [](auto f) -> Getter {
    return [f](const PointRow& p) {
      return p.throughput ? nlohmann::json(f(*p.throughput)) : nullptr;
    };
  };
  auto trn = [](auto f) -> Getter {
    return [f](const PointRow& p) { return p.train ? nlohmann::json(f(*p.train)) : nullptr; };
  };
  auto xfr = [](auto f) -> Getter {
    return [f](const PointRow& p) { return p.transfer ? nlohmann::json(f(*p.transfer)) : nullptr; };
  };
  const std::vector<std::pair<const char*, Getter>> metrics = {
      {"peak_allocated", mem([](const MemoryFigures& m) { return m.peak_allocated; })},
      {"peak_requested", mem([](const MemoryFigures& m) { return m.peak_requested; })},
      {"peak_reserved", mem([](const MemoryFigures& m) { return m.peak_reserved; })},
      {"predicted_peak", mem([](const MemoryFigures& m) { return opt(m.predicted_peak); })},
      {"host_pinned_peak", mem([](const MemoryFigures& m) { return m.host_pinned_peak; })},
      {"median_s", tim([](const TimeFigures& t) { return t.median_s; })},
      {"p10_s", tim([](const TimeFigures& t) { return t.p10_s; })},
      {"p90_s", tim([](const TimeFigures& t) { return t.p90_s; })},
      {"cv", tim([](const TimeFigures& t) { return t.cv; })},
      {"samples_per_s", thr([](const ThroughputFigures& t) { return t.samples_per_s; })},
      {"tokens_per_s", thr([](const ThroughputFigures& t) { return t.tokens_per_s; })},
      {"tflops", thr([](const ThroughputFigures& t) { return t.tflops; })},
      {"loss_first", trn([](const TrainFigures& t) { return t.loss_first; })},
      {"loss_last", trn([](const TrainFigures& t) { return t.loss_last; })},
      {"h2d_bytes", xfr([](const TransferFigures& t) { return t.h2d_bytes; })},
      {"d2h_bytes", xfr([](const TransferFigures& t) { return t.d2h_bytes; })}};
  // A file written before an axis existed ran at that axis's default.
  const nlohmann::json defaults = config_json(TrainConfig{});
  std::ostringstream out;
  out << "id,status";
  for (const Knob& k : knobs()) out << "," << k.name;
  for (const auto& [name, get] : metrics) out << "," << name;
  out << ",error\n";
  for (const PointRow& p : results.points) {
    out << csv_field(p.id) << "," << csv_field(p.status);
    for (const Knob& k : knobs())
      out << "," << csv_field(p.config.contains(k.name) ? p.config[k.name] : defaults[k.name]);
    for (const auto& [name, get] : metrics) out << "," << csv_field(get(p));
    out << "," << csv_field(opt(p.error));
    out << "\n";
  }
  return out.str();
}

}  // namespace memtrade
