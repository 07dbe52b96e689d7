#include "harness/run/advise.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/common/bad_input.h"
#include "harness/run/estimate.h"
#include "kernels/allocator.h"

namespace memtrade {
namespace {

// Micro-batches the search estimates a step with (see advise.h).
constexpr std::int64_t kEstimatedMicroBatches = 2;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// How many axes differ between two configurations.
int turned(const TrainConfig& a, const TrainConfig& b) {
  int n = 0;
  for (const Knob& k : knobs()) n += k.get(a) != k.get(b) ? 1 : 0;
  return n;
}

// Peaks from the memory model, step times from the cost model, or with a GPU from its time
// model: the same dry run timed, with every micro-batch (the step's time is the sum of all).
class Evaluator {
 public:
  Evaluator(Backend backend, std::size_t limit, const CostModel& cost, const GpuSpec* gpu = nullptr)
      : backend_(backend), limit_(limit), cost_(cost), gpu_(gpu) {}

  AdvisePoint operator()(const TrainConfig& c, bool exact) {
    TrainConfig e = c;
    e.accumulation =
        exact || gpu_ ? c.accumulation : std::min(c.accumulation, kEstimatedMicroBatches);
    const MemoryEstimate m = estimate_memory(e, backend_, 0, 1, 0, gpu_, fabric_);
    ++estimates;
    AdvisePoint p;
    p.id = point_id(c);
    p.config = c;
    p.peak = m.peak_allocated;
    p.reserved = m.peak_reserved;
    p.exact = e.accumulation == c.accumulation;
    p.fits = m.peak_reserved <= static_cast<std::int64_t>(limit_);
    if (!p.fits && m.peak_allocated <= static_cast<std::int64_t>(limit_)) {
      // The allocator releases its cache; the card's generation sizes PyTorch's workspaces.
      p.fits = estimate_memory(e, backend_, limit_, 1, 0, gpu_, fabric_).fits;
      ++estimates;
    }
    last_inputs = cost_inputs(c, model_for(c), m, e.accumulation);
    p.time = m.time;
    p.step_s = m.time ? m.time->step_s : cost_.predict(last_inputs);
    p.samples_per_s = p.step_s > 0 ? static_cast<double>(samples_per_step(c)) / p.step_s : 0;
    return p;
  }

  std::size_t estimates = 0;
  CostInputs last_inputs;

 private:
  const Model& model_for(const TrainConfig& c) {
    auto& m = models_[fmt::format("{}/{}/tp{}", c.model, c.seq_len, c.tensor_parallel)];
    if (!m) m = make_model(c);
    return *m;
  }
  Backend backend_;
  std::size_t limit_;
  const CostModel& cost_;
  const GpuSpec* gpu_;
  Fabric fabric_;
  std::map<std::string, std::unique_ptr<Model>> models_;
};

// Higher predicted throughput first; equal ones (the same arithmetic: a measured cost of zero)
// go to the configuration turning fewer axes, then to the larger micro-batch, then to the larger
// peak: what the model cannot tell apart, the one nearest the start and using the card.
bool better(const AdvisePoint& a, const AdvisePoint& b, const TrainConfig& start) {
  const double tol = 1e-9 * std::max(a.samples_per_s, b.samples_per_s);
  if (std::abs(a.samples_per_s - b.samples_per_s) > tol) return a.samples_per_s > b.samples_per_s;
  const int ta = turned(start, a.config), tb = turned(start, b.config);
  if (ta != tb) return ta < tb;
  if (a.config.batch_size != b.config.batch_size) return a.config.batch_size > b.config.batch_size;
  if (a.peak != b.peak) return a.peak > b.peak;
  return a.id < b.id;
}

}  // namespace

std::vector<AdvisePoint> pareto_frontier(std::vector<AdvisePoint> pts, const TrainConfig& start) {
  std::sort(pts.begin(), pts.end(), [&](const auto& a, const auto& b) {
    return a.peak != b.peak ? a.peak < b.peak : better(a, b, start);
  });
  std::vector<AdvisePoint> front;
  for (const AdvisePoint& p : pts)
    if (front.empty() || p.samples_per_s > front.back().samples_per_s * (1 + 1e-9))
      front.push_back(p);
  return front;
}

std::vector<AdvisePoint> evaluate(const AdviseSpace& space, Backend backend, std::size_t limit,
                                  const CostModel& cost, std::size_t* estimates, int threads,
                                  const GpuSpec* gpu) {
  // Every estimate has its own meta device, model and Trainer: the configurations are evaluated
  // on `threads` threads, each taking every n-th one; the result does not depend on n.
  const std::size_t n = std::max<std::size_t>(
      1, std::min<std::size_t>(space.configs.size(),
                               threads > 0 ? static_cast<std::size_t>(threads)
                                           : std::max(1u, std::thread::hardware_concurrency())));
  std::vector<AdvisePoint> all(space.configs.size());
  std::vector<std::size_t> counts(n, 0);
  std::vector<std::exception_ptr> errors(n);
  auto work = [&](std::size_t t) {
    try {
      Evaluator eval(backend, limit, cost, gpu);
      for (std::size_t i = t; i < all.size(); i += n) all[i] = eval(space.configs[i], false);
      counts[t] = eval.estimates;
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < n; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  if (estimates)
    for (std::size_t c : counts) *estimates += c;
  return all;
}

namespace {

bool contains_axis(const std::vector<std::string>& names, const std::vector<std::string>& axes) {
  for (const std::string& a : axes)
    if (std::find(names.begin(), names.end(), a) != names.end()) return true;
  return false;
}

std::string seconds_text(double s) {
  return s >= 1 ? fmt::format("{:.3g} s", s) : fmt::format("{:.3g} ms", s * 1e3);
}

std::string join_values(const std::vector<std::string>& axes, const TrainConfig& c) {
  std::vector<std::string> parts;
  for (const std::string& a : axes) parts.push_back(knob(a).get(c));
  return fmt::format("{}", fmt::join(parts, " × "));
}

// Why a group of axes costs time, in words, from the drivers the cost model prices.
std::string reason(const std::vector<std::string>& axes, const AdvisePoint& rec,
                   const CostInputs& in, const CostModel& cost) {
  const Knob& k = knob(axes.front());
  const double k_mb = static_cast<double>(rec.config.accumulation);
  switch (k.cost) {
    case CostDriver::structure:
      return fmt::format("{} micro-batch{} of {} a step", rec.config.accumulation,
                         rec.config.accumulation > 1 ? "es" : "", rec.config.batch_size);
    case CostDriver::recompute:
      return fmt::format("recomputes {:.3g} GFLOP a step",
                         k_mb * (in.flops_blocks + in.flops_selective) / 1e9);
    case CostDriver::copies:
      return fmt::format(
          "copies {} a step between host and device",
          format_bytes(static_cast<std::int64_t>(k_mb * in.copied_per_micro + in.copied_per_step)));
    case CostDriver::params:
      return "work per parameter every step";
    case CostDriver::reserved:
      return "returns the cached memory every step";
    case CostDriver::compute:
      for (const CostModel::Term& t : cost.terms)
        if (t.axis == k.name && t.value == k.get(rec.config))
          return fmt::format("{:.2f}× the compute, measured", t.ratio);
      return "not measured";
  }
  return "";
}

// Seconds by share of a point's step on the GPU.
std::array<double, kNumTimeShares> share_seconds(const AdvisePoint& p) {
  std::array<double, kNumTimeShares> out{};
  if (p.time)
    for (std::size_t i = 0; i < kNumTimeShares; ++i) out[i] = p.time->shares[i] * p.step_s;
  return out;
}

std::string signed_seconds(double s) {
  return fmt::format("{}{}", s >= 0 ? "+" : "-", seconds_text(std::abs(s)));
}

// Why a group of axes costs (or saves) time on the GPU: what the time model's step does more
// than without the turn, in that card's terms, and where its seconds go (the shares that moved
// by more than 1% of the step).
std::string gpu_reason(const std::vector<std::string>& axes, const AdvisePoint& rec,
                       const AdvisePoint& without, const CostInputs& in, const GpuSpec& gpu) {
  const Knob& k = knob(axes.front());
  const double k_mb = static_cast<double>(rec.config.accumulation);
  std::string what;
  if (k.cost == CostDriver::structure)
    what = fmt::format("{} micro-batch{} of {} a step", rec.config.accumulation,
                       rec.config.accumulation > 1 ? "es" : "", rec.config.batch_size);
  if (contains_axis(parallel_axes(), axes))
    what += fmt::format(
        "{}tp {} × dp {}{}{}: collectives over NVLink {:.0f} GB/s within {} GPUs, IB {:.0f} GB/s "
        "beyond",
        what.empty() ? "" : ", ", rec.config.tensor_parallel, rec.config.data_parallel,
        rec.config.data_parallel > 1 ? fmt::format(" {}", sharding_name(rec.config.sharding)) : "",
        rec.config.sequence_parallel == SequenceParallel::on ? " SP" : "", gpu.nvlink_bw / 1e9,
        gpu.nvlink_domain, Fabric{}.ib_bw / 1e9);
  else if (k.cost == CostDriver::recompute)
    what = fmt::format("recomputes {:.3g} TFLOP a step per GPU",
                       k_mb * (in.flops_blocks + in.flops_selective) / 1e12);
  else if (k.cost == CostDriver::copies)
    what = fmt::format(
        "copies {} a step at PCIe {} {:.0f} GB/s",
        format_bytes(static_cast<std::int64_t>(k_mb * in.copied_per_micro + in.copied_per_step)),
        gpu.pcie_gen, gpu.host_bw / 1e9);
  const auto a = share_seconds(rec), b = share_seconds(without);
  std::string moved;
  for (std::size_t i = 0; i < kNumTimeShares; ++i)
    if (std::abs(a[i] - b[i]) > 0.01 * rec.step_s)
      moved += fmt::format("{}{} {}", moved.empty() ? "" : ", ",
                           time_share_name(static_cast<TimeShare>(i)), signed_seconds(a[i] - b[i]));
  std::string out = fmt::format("{}{}step {} vs {} on {}", what, what.empty() ? "" : "; ",
                                seconds_text(rec.step_s), seconds_text(without.step_s), gpu.name);
  if (without.gpus() != rec.gpus()) out += fmt::format(" ×{}", without.gpus());
  if (!moved.empty()) out += ": " + moved;
  return out;
}

nlohmann::json point_json(const AdvisePoint& p) {
  nlohmann::json j = {{"id", p.id},
                      {"config", config_json(p.config, *make_model(p.config))},
                      {"predicted_peak", p.peak},
                      {"predicted_reserved", p.reserved},
                      {"fits", p.fits},
                      {"exact", p.exact},
                      {"predicted_step_s", p.step_s},
                      {"predicted_samples_per_s", p.samples_per_s}};
  if (p.time) j["time_model"] = time_model_json(*p.time);
  return j;
}

std::vector<Confirmation> confirm(const std::vector<AdvisePoint>& top, const AdviseOptions& o) {
  std::vector<GridPoint> points;
  for (const AdvisePoint& p : top) points.push_back({p.id, p.config});
  const std::vector<PointRow> rows = run_isolated(points, o.calibration, o.capacity);
  std::vector<Confirmation> out;
  for (const AdvisePoint& p : top)
    for (const PointRow& row : rows)
      if (row.id == p.id) out.push_back({p, row});
  return out;
}

}  // namespace

AdviseResult advise(const AdviseOptions& o) {
  AdviseResult r;
  r.backend = std::string(backend_name(o.backend));
  r.clock = o.calibration.clock;
  r.capacity = o.capacity;
  r.margin = o.margin;
  r.limit = o.capacity - std::min(o.margin, o.capacity);
  r.held = o.hold;
  r.gpu = o.gpu ? std::string(o.gpu->name) : "";
  r.gpus = static_cast<int>(o.start.data_parallel * o.start.tensor_parallel);
  if (o.gpus > 1 && r.gpus != o.gpus)
    throw BadInput(
        fmt::format("advise over {} GPUs: the start is laid out on {} (dp × tp)", o.gpus, r.gpus));
  auto t0 = std::chrono::steady_clock::now();
  const AdviseSpace space =
      advise_space(o.start, o.allow, o.hold, o.backend,
                   ParallelSearch{o.gpus, o.gpu ? std::max(1, o.gpu->nvlink_domain) : 1});
  r.global_batch = space.global_batch;
  r.axes = space.axes;
  r.allowed = space.allowed;
  r.candidates = space.configs.size();
  for (const std::string& axis : space.axes) {
    std::vector<std::string> vs;
    for (const TrainConfig& c : space.configs)
      if (std::string v = knob(axis).get(c); std::find(vs.begin(), vs.end(), v) == vs.end())
        vs.push_back(std::move(v));
    r.values.emplace_back(axis, std::move(vs));
  }
  r.search_seconds = seconds_since(t0);
  if (const std::int64_t least = least_param_bytes(space);
      static_cast<std::int64_t>(r.limit) < least)
    throw BadInput(fmt::format(
        "--capacity {}{} is below the parameters alone: {} keeps at least {} of weights on the "
        "device, even streaming its blocks (offload params)",
        format_bytes(o.capacity),
        o.margin > 0 ? fmt::format(" less the margin {}", format_bytes(o.margin)) : "",
        o.start.model, format_bytes(least)));

  if (!o.gpu) {  // a GPU of the table is priced by its time model: nothing to measure
    r.calibration = calibrate(space, o.calibration);
    r.calibration.model.transferred = r.calibration.model.model != o.start.model ||
                                      o.calibration.backend != backend_name(o.backend);
    // Measured on another device (the CPU for a CUDA run): what carries over is the shape of the
    // costs, not the CPU's cache effects. A GPU's GEMMs get no slower per FLOP as they grow, so a
    // smaller micro-batch is never predicted faster there (the CPU's curve can fall past its
    // cache).
    if (o.calibration.backend != backend_name(o.backend)) r.calibration.model.rate_never_falls();
  }

  t0 = std::chrono::steady_clock::now();
  const std::vector<AdvisePoint> all =
      evaluate(space, o.backend, r.limit, r.calibration.model, &r.estimates, 0, o.gpu);
  r.frontier = pareto_frontier(all, o.start);
  Evaluator eval(o.backend, r.limit, r.calibration.model, o.gpu);
  std::vector<AdvisePoint> fitting;
  for (const AdvisePoint& p : all)
    if (p.fits) fitting.push_back(p);
  std::sort(fitting.begin(), fitting.end(),
            [&](const auto& a, const auto& b) { return better(a, b, o.start); });
  // The best ones again with every micro-batch; the search's estimate says the same (advise.h).
  std::vector<AdvisePoint> top;
  const std::size_t want = static_cast<std::size_t>(std::max(1, o.confirm));
  for (const AdvisePoint& p : fitting) {
    if (top.size() == want) break;
    AdvisePoint exact = p.exact ? p : eval(p.config, true);
    if (exact.fits) top.push_back(exact);
  }
  if (!top.empty()) r.recommended = top.front();
  r.start = eval(o.start, true);
  r.search_seconds += seconds_since(t0);
  r.estimates += eval.estimates;

  if (!r.recommended) {
    const auto smallest =
        std::min_element(all.begin(), all.end(), [](const auto& a, const auto& b) {
          return a.peak != b.peak ? a.peak < b.peak : a.reserved < b.reserved;
        });
    if (smallest == all.end()) return r;
    r.smallest = eval(smallest->config, true);
    r.changes.push_back(fmt::format(
        "a capacity of at least {} (its peak; {} with the allocator's cache){}",
        format_bytes(r.smallest->peak), format_bytes(r.smallest->reserved),
        o.margin > 0 ? fmt::format(" plus the margin of {}", format_bytes(o.margin)) : ""));
    for (const Knob& k : knobs()) {  // what opening each allow axis alone would reach
      if (k.advise != AdviseRole::allow ||
          std::find(r.allowed.begin(), r.allowed.end(), k.name) != r.allowed.end())
        continue;
      std::optional<AdvisePoint> best;
      for (const std::string& v : k.advise_values(o.start)) {
        TrainConfig c = r.smallest->config;
        if (k.set(c, v) || (o.backend != Backend::cuda && needs_cuda(c))) continue;
        resolve_config(c);
        AdvisePoint p = eval(c, true);
        if (!best || p.peak < best->peak) best = p;
      }
      if (best && best->peak < r.smallest->peak)
        r.changes.push_back(fmt::format("--allow {}: {} {} reaches {}{}", k.name, k.name,
                                        k.get(best->config), format_bytes(best->peak),
                                        best->fits ? " (fits)" : ""));
    }
    return r;
  }

  if (o.confirm > 0) {
    r.confirmed = confirm(top, o);
    const Confirmation* best = nullptr;
    for (const Confirmation& c : r.confirmed) {
      if (c.measured.status == "oom")
        r.bugs.push_back(fmt::format(
            "{} ran out of memory under {} although the memory model predicts {} (limit {})",
            c.predicted.id, format_bytes(o.capacity), format_bytes(c.predicted.peak),
            format_bytes(r.limit)));
      if (c.measured.ok() && c.measured.time &&
          (!best || step_seconds(c.measured, o.calibration.clock) <
                        step_seconds(best->measured, o.calibration.clock)))
        best = &c;
    }
    if (best) {
      r.recommended = best->predicted;
      r.recommended_measured = true;
    }
  }

  // One line per axis (group) turned: the recommendation with it back at the start's value.
  const AdvisePoint& rec = *r.recommended;
  eval(rec.config, true);
  const CostInputs rec_in = eval.last_inputs;
  for (const std::vector<std::string>& group : turned_groups(o.start, rec.config, o.gpus > 1)) {
    TrainConfig without = rec.config;
    for (const std::string& a : group) set_knob(without, knob(a), knob(a).get(o.start));
    try {
      resolve_config(without);
    } catch (const KnobError&) {
      continue;
    }
    const AdvisePoint w = eval(without, false);
    Explanation e;
    e.axes = group;
    e.from = join_values(group, o.start);
    e.to = join_values(group, rec.config);
    e.memory_saved = w.peak - rec.peak;
    e.throughput_cost =
        w.samples_per_s > 0 ? 1 - rec.samples_per_s_per_gpu() / w.samples_per_s_per_gpu() : 0;
    const std::string cost =
        e.throughput_cost >= 0 ? fmt::format("costs {:.1f}% of throughput", 100 * e.throughput_cost)
                               : fmt::format("gains {:.1f}% throughput", -100 * e.throughput_cost);
    e.text = fmt::format("{} {} -> {}: {} {} of peak, {} ({})", fmt::join(group, " × "), e.from,
                         e.to, e.memory_saved >= 0 ? "saves" : "adds",
                         format_bytes(std::abs(e.memory_saved)), cost,
                         o.gpu ? gpu_reason(group, rec, w, rec_in, *o.gpu)
                               : reason(group, rec, rec_in, r.calibration.model));
    r.explanation.push_back(std::move(e));
  }
  return r;
}

nlohmann::json advise_json(const AdviseResult& r) {
  nlohmann::json frontier = nlohmann::json::array();
  for (const AdvisePoint& p : r.frontier) frontier.push_back(point_json(p));
  nlohmann::json rec = nullptr;
  if (r.recommended) {
    rec = point_json(*r.recommended);
    rec["measured"] = r.recommended_measured;
    nlohmann::json ex = nlohmann::json::array();
    for (const Explanation& e : r.explanation)
      ex.push_back({{"axes", e.axes},
                    {"from", e.from},
                    {"to", e.to},
                    {"memory_saved", e.memory_saved},
                    {"throughput_cost", e.throughput_cost},
                    {"text", e.text}});
    rec["explanation"] = ex;
  }
  nlohmann::json confirmed = nlohmann::json::array();
  for (const Confirmation& c : r.confirmed) {
    nlohmann::json j = {{"id", c.predicted.id},
                        {"status", c.measured.status},
                        {"predicted_peak", c.predicted.peak},
                        {"predicted_samples_per_s", c.predicted.samples_per_s},
                        {"predicted_step_s", c.predicted.step_s},
                        {"error", c.measured.error ? nlohmann::json(*c.measured.error) : nullptr}};
    if (c.measured.memory) {
      j["measured_peak"] = c.measured.memory->peak_allocated;
      j["peak_error"] =
          static_cast<double>(c.predicted.peak - c.measured.memory->peak_allocated) /
          static_cast<double>(std::max<std::int64_t>(1, c.measured.memory->peak_allocated));
    }
    if (c.measured.ok() && c.measured.time) {
      const double t = step_seconds(c.measured, r.clock);
      j["measured_samples_per_s"] = static_cast<double>(r.global_batch) / t;
      j["measured_step_s"] = t;
      j["step_error"] = (c.predicted.step_s - t) / t;
    }
    confirmed.push_back(std::move(j));
  }
  nlohmann::json values = nlohmann::json::object();
  for (const auto& [axis, vs] : r.values) values[axis] = vs;
  nlohmann::json cost;
  if (!r.gpu.empty()) {
    const Fabric fabric;
    cost = {{"kind", "time-model"},
            {"gpu", r.gpu},
            {"gpus", r.gpus},
            {"fabric", {{"ib_bytes_per_s", fabric.ib_bw}, {"source", fabric.source}}}};
  } else {
    cost = r.calibration.model.to_json();
    cost["kind"] = "calibration";
    cost["calibration"] = {{"measured", r.calibration.measured},
                           {"cached", r.calibration.cached},
                           {"seconds", r.calibration.seconds},
                           {"warnings", r.calibration.warnings}};
  }
  return {
      {"schema", "memtrade.advise/1"},
      {"backend", r.backend},
      {"clock", r.clock},
      {"gpu", r.gpu.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.gpu)},
      {"gpus", r.gpus},
      {"capacity", r.capacity},
      {"margin", r.margin},
      {"limit", r.limit},
      {"global_batch", r.global_batch},
      {"axes", r.axes},
      {"values", values},
      {"allowed", r.allowed},
      {"held", r.held},
      {"search",
       {{"candidates", r.candidates}, {"estimates", r.estimates}, {"seconds", r.search_seconds}}},
      {"cost_model", cost},
      {"start", point_json(r.start)},
      {"frontier", frontier},
      {"recommended", rec},
      {"nothing_fits",
       r.smallest ? nlohmann::json{{"smallest", point_json(*r.smallest)}, {"changes", r.changes}}
                  : nlohmann::json(nullptr)},
      {"confirmed", confirmed},
      {"bugs", r.bugs}};
}

}  // namespace memtrade
