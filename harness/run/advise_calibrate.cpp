#include "harness/run/advise_calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <unistd.h>

#include "harness/common/bad_input.h"
#include "harness/common/process.h"
#include "harness/run/estimate.h"
#include "harness/run/grid_runner.h"

namespace memtrade {
namespace {

constexpr const char* kSchema = "memtrade.calibration/1";
// A proxy's plain step at micro-batch 8 stays within this many FLOPs: a fraction of a second on
// one CPU core, so that its calibration takes a minute.
constexpr double kProxyFlops = 10e9;

// 1, g and two divisors of g between them, geometrically (all of them when g has at most 4).
std::vector<std::int64_t> curve_batches(std::int64_t g) {
  std::vector<std::int64_t> divisors;
  for (std::int64_t d = 1; d <= g; ++d)
    if (g % d == 0) divisors.push_back(d);
  if (divisors.size() <= 4) return divisors;
  std::vector<std::int64_t> out{1, g};
  for (double f : {1.0 / 3, 2.0 / 3}) {
    const double want = std::log(static_cast<double>(g)) * f;
    out.push_back(*std::min_element(divisors.begin(), divisors.end(), [&](auto a, auto b) {
      return std::abs(std::log(static_cast<double>(a)) - want) <
             std::abs(std::log(static_cast<double>(b)) - want);
    }));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

TrainConfig with_batch(TrainConfig c, std::int64_t b, std::int64_t a) {
  c.batch_size = b;
  c.accumulation = a;
  return c;
}

// The cache entry of this build and device, created when missing.
nlohmann::json& cache_entry(nlohmann::json& doc, const CalibrationOptions& o) {
  const nlohmann::json key = {{"backend", o.backend},
                              {"device", o.device_name},
                              {"clock", o.clock},
                              {"commit", git_commit()},
                              {"dirty", git_dirty()}};
  for (auto& e : doc["entries"])
    if (e.value("key", nlohmann::json()) == key) return e;
  doc["entries"].push_back({{"key", key}, {"points", nlohmann::json::object()}});
  return doc["entries"].back();
}

nlohmann::json load_cache(const std::filesystem::path& path) {
  nlohmann::json doc = {{"schema", kSchema}, {"entries", nlohmann::json::array()}};
  if (path.empty() || !std::filesystem::exists(path)) return doc;
  nlohmann::json j = read_json_file(path);
  if (j.value("schema", "") != kSchema || !j.contains("entries") || !j["entries"].is_array())
    throw BadInput(fmt::format("{}: not a calibration file ({})", path.string(), kSchema));
  return j;
}

double bandwidth_from_child(const CalibrationOptions& o) {
  SpawnOptions so;
  so.stdout_mode = SpawnOptions::Stdout::capture;
  so.timeout_s = 120;
  so.isolate = true;
  ChildOutcome r = spawn({self_executable().string(), "__bandwidth", "--backend", o.backend,
                          "--threads", std::to_string(o.threads)},
                         so);
  if (r.kind != ChildOutcome::Kind::exited || r.exit_code != 0)
    throw std::runtime_error("calibration: measuring the copy bandwidth failed");
  return std::stod(r.stdout_text);
}

// Runs `points` as an isolated grid, o.rounds times over, and returns the ok ones' step time by
// id: the lowest of the rounds' medians (another process's load only ever slows a step down).
std::map<std::string, double> run_points(const std::vector<GridPoint>& points,
                                         const CalibrationOptions& o,
                                         std::vector<std::string>& warnings) {
  std::map<std::string, double> out;
  for (int round = 0; round < o.rounds; ++round) {
    for (const PointRow& r : run_isolated(points, o, 0)) {
      if (r.ok() && r.time) {
        const double t = step_seconds(r, o.clock);
        auto [it, fresh] = out.emplace(r.id, t);
        if (!fresh) it->second = std::min(it->second, t);
      } else if (round == 0) {
        warnings.push_back(
            fmt::format("calibration point {}: {} {}", r.id, r.status, r.error.value_or("")));
      }
    }
  }
  return out;
}

}  // namespace

std::string calibration_model(const TrainConfig& start, Backend target, Backend run_backend) {
  if (target == run_backend) return start.model;
  const std::string family = make_model(start)->family();
  std::string best;
  double best_flops = 0;
  for (const std::string& name : model_names()) {
    const auto m = make_model(name);
    const FlopCount f = m->flops(8, RunOptions{});
    const double n = f.forward + f.backward;
    if (m->family() == family && n <= kProxyFlops && n > best_flops) {
      best = name;
      best_flops = n;
    }
  }
  return best.empty() ? start.model : best;
}

Calibration calibrate(const AdviseSpace& space, const CalibrationOptions& o) {
  const auto started = std::chrono::steady_clock::now();
  Calibration cal;
  const Backend run_backend = o.backend == "cuda" ? Backend::cuda : Backend::cpu;
  const bool proxy = !o.model.empty() && o.model != space.start.model;
  TrainConfig plain = plain_config(space.start);
  if (proxy) {
    plain.model = o.model;
    // The proxy is a listed model: a config file that defined the start's model does not define it.
    plain.model_config.clear();
    plain.model_config_sha256.clear();
    plain.seq_len = 0;  // the proxy's own
    resolve_config(plain);
  }
  const auto model = make_model(plain);
  const std::vector<std::int64_t> batches =
      proxy ? std::vector<std::int64_t>{1, 4, 16, 64} : curve_batches(space.global_batch);
  const std::int64_t b0 = batches[std::min<std::size_t>(2, batches.size() - 1)];

  // What to measure: (role, config) in the order the set is built.
  std::vector<TrainConfig> configs;
  for (std::int64_t b : batches) configs.push_back(with_batch(plain, b, 1));
  configs.push_back(with_batch(plain, b0, 2));
  std::vector<std::pair<std::string, std::string>> values;
  std::map<std::string, std::pair<double, std::string>> most_blocks, most_selective;
  for (const auto& [axis, value] : priced_values(space)) {
    const Knob& k = knob(axis);
    TrainConfig c = with_batch(plain, b0, 1);
    if (k.set(c, value) || !k.applies(c)) {
      cal.warnings.push_back(fmt::format("{}={} cannot run on {}: priced as {}", axis, value,
                                         plain.model, k.get(plain)));
      continue;
    }
    if (k.cost == CostDriver::recompute) {  // κ from the most recomputing values
      const CostInputs in = cost_inputs(c, *model, MemoryEstimate{}, 1);
      auto& slot = in.flops_selective > 0 ? most_selective[axis] : most_blocks[axis];
      const double f = in.flops_selective + in.flops_blocks;
      if (f > slot.first) slot = {f, value};
      continue;
    }
    values.emplace_back(axis, value);
  }
  for (const auto* m : {&most_blocks, &most_selective})
    for (const auto& [axis, best] : *m) values.emplace_back(axis, best.second);
  // A value copying both per micro-batch and per step also runs with two micro-batches.
  const TrainConfig plain1 = with_batch(plain, b0, 1);
  const CostInputs base = cost_inputs(plain1, *model, estimate_memory(plain1, run_backend, 0), 1);
  auto copies_both = [&](const TrainConfig& c) {
    const CostInputs in = cost_inputs(c, *model, estimate_memory(c, run_backend, 0), 1);
    return in.copied_per_micro > base.copied_per_micro && in.copied_per_step > base.copied_per_step;
  };
  for (const auto& [axis, value] : values) {
    TrainConfig c = with_batch(plain, b0, 1);
    set_knob(c, knob(axis), value);
    configs.push_back(c);
    if (knob(axis).cost == CostDriver::copies && copies_both(c))
      configs.push_back(with_batch(c, b0, 2));
  }

  // The cache, then the points it lacks.
  nlohmann::json doc = load_cache(o.cache);
  nlohmann::json& entry = cache_entry(doc, o);
  std::vector<GridPoint> missing;
  for (TrainConfig& c : configs) {
    resolve_config(c);
    const std::string id = point_id(c);
    if (!entry["points"].contains(id) &&
        std::none_of(missing.begin(), missing.end(), [&](const auto& p) { return p.id == id; }))
      missing.push_back({id, c});
  }
  cal.cached = static_cast<int>(configs.size() - missing.size());
  if (!missing.empty()) {
    if (!o.quiet)
      fmt::print(stderr, "advise: calibrating the cost model: {} points of {} on {}\n",
                 missing.size(), plain.model, o.device_name);
    for (const auto& [id, seconds] : run_points(missing, o, cal.warnings))
      entry["points"][id] = {{"median_s", seconds}};
    cal.measured = static_cast<int>(missing.size());
  }
  if (!entry.contains("bandwidth")) entry["bandwidth"] = bandwidth_from_child(o);
  if (!o.cache.empty()) {
    std::filesystem::create_directories(o.cache.parent_path().empty() ? "."
                                                                      : o.cache.parent_path());
    write_json_atomic(o.cache, doc);
  }

  auto measured = [&](const TrainConfig& c) -> std::optional<Measured> {
    const std::string id = point_id(c);
    if (!entry["points"].contains(id)) return std::nullopt;
    const MemoryEstimate e = estimate_memory(c, run_backend, 0);
    return Measured{c, cost_inputs(c, *model, e, c.accumulation),
                    entry["points"][id]["median_s"].get<double>()};
  };
  for (std::int64_t b : batches)
    if (auto m = measured(with_batch(plain, b, 1))) cal.set.curve.push_back(*m);
  auto p1 = measured(with_batch(plain, b0, 1));
  auto p2 = measured(with_batch(plain, b0, 2));
  if (!p1 || !p2)
    throw std::runtime_error(fmt::format(
        "calibration: the plain point of {} at micro-batch {} did not run: {}", plain.model, b0,
        cal.warnings.empty() ? std::string("?") : cal.warnings.back()));
  cal.set.plain1 = *p1;
  cal.set.plain2 = *p2;
  for (const auto& [axis, value] : values) {
    TrainConfig c = with_batch(plain, b0, 1);
    set_knob(c, knob(axis), value);
    resolve_config(c);
    auto a1 = measured(c);
    if (!a1) continue;
    cal.set.values.push_back({axis, value, *a1, measured(with_batch(c, b0, 2))});
  }
  cal.model = fit_cost_model(cal.set);
  cal.model.bandwidth = entry["bandwidth"].get<double>();
  cal.model.device = o.device_name;
  cal.model.model = plain.model;
  cal.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return cal;
}

std::vector<PointRow> run_isolated(const std::vector<GridPoint>& points,
                                   const CalibrationOptions& o, std::size_t capacity) {
  Grid g;
  g.name = "advise";
  g.run.warmup = o.warmup;
  g.run.steps = o.steps;
  g.run.timeout_s = o.timeout_s;
  g.run.capacity = capacity;
  g.points = points;
  g.hash = fmt::format("advise-{}", getpid());
  GridRunOptions ro;
  ro.backend = o.backend;
  ro.device_name = o.device_name;
  ro.threads = o.threads;
  ro.quiet = true;
  ro.out =
      std::filesystem::temp_directory_path() / fmt::format("memtrade-advise-{}.json", getpid());
  run_grid(g, ro);
  std::vector<PointRow> rows = load_results_file(ro.out).points;
  std::filesystem::remove(ro.out);
  return rows;
}

double step_seconds(const PointRow& row, const std::string& clock) {
  if (!row.time) return 0;
  return clock == "cpu" && row.time->cpu_median_s ? *row.time->cpu_median_s : row.time->median_s;
}

double measure_copy_bandwidth(Device& dev) {
  constexpr std::int64_t kBytes = 64 * 1024 * 1024;
  Tensor host = dev.empty_pinned({kBytes / 4}, DType::F32, Category::temporaries);
  Tensor device = dev.empty({kBytes / 4}, DType::F32, Category::temporaries);
  auto best = [&](CopyKind kind) {
    double fastest = 1e30;
    for (int i = 0; i < 6; ++i) {  // the first is a warm-up
      const auto t0 = std::chrono::steady_clock::now();
      if (kind == CopyKind::host_to_device)
        dev.copy(device.data(), host.data(), kBytes, kind, StreamKind::copy);
      else
        dev.copy(host.data(), device.data(), kBytes, kind, StreamKind::copy);
      dev.synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i > 0) fastest = std::min(fastest, s);
    }
    return static_cast<double>(kBytes) / fastest;
  };
  return (best(CopyKind::host_to_device) + best(CopyKind::device_to_host)) / 2;
}

}  // namespace memtrade
