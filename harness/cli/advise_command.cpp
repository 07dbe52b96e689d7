// `memtrade advise` (harness/run/advise.h) and its hidden helper `__bandwidth`: flags, checks
// of the input (one line, exit 2), and printing.
#include <cstdlib>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/cli/command.h"
#include "harness/cli/knob_flags.h"
#include "harness/common/bad_input.h"
#include "harness/run/advise.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cuda_probe.h"
#include "models/config/input_text.h"

namespace memtrade {
namespace {

struct AdviseFlags {
  KnobFlags knobs;
  std::int64_t global_batch = 0;
  std::string allow, hold, margin, calibration, calibrate_on, clock = "wall", gpu;
  int confirm = 0, steps = 8, gpus = 1;
  bool json = false, quiet = false;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// The margin: a size ("512MiB") or a percentage of the capacity ("5%"). Default: none on the
// CPU, where the memory model is exact and the emulated capacity bounds the same allocator;
// 1 GiB on CUDA, for what lives outside the caching allocator on a real card (the CUDA context
// and the libraries' handles: about 0.5 GiB on an H100).
std::size_t margin_bytes(const std::string& text, std::size_t capacity, Backend backend) {
  if (text.empty()) return backend == Backend::cuda ? GiB : 0;
  if (text.back() == '%') {
    char* end = nullptr;
    const double pct = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() - 1 || !(pct >= 0 && pct < 100))
      throw BadInput(fmt::format("--margin: expected a size or a percentage below 100%, got '{}'",
                                 echo(text)));
    return static_cast<std::size_t>(static_cast<double>(capacity) * pct / 100);
  }
  if (text == "0") return 0;
  auto bytes = parse_capacity(text);
  if (!bytes) throw BadInput(fmt::format("--margin: cannot parse '{}' (512MiB, 5%)", echo(text)));
  return *bytes;
}

std::string default_cache() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/memtrade/calibration.json";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.cache/memtrade/calibration.json";
  return "memtrade-calibration.json";
}

// The axes where `c` differs from `start`, as in point ids ("b2 a4 ckfirst0.5 off-optimizer").
std::string turned_text(const TrainConfig& start, const TrainConfig& c) {
  std::string out;
  for (const Knob& k : knobs())
    if (k.get(c) != k.get(start))
      out += fmt::format("{}{}{}", out.empty() ? "" : " ", k.id_prefix, k.get(c));
  return out.empty() ? "(as given)" : out;
}

std::string seconds_text(double s) {
  return s >= 1 ? fmt::format("{:.3g} s", s) : fmt::format("{:.3g} ms", s * 1e3);
}

std::string pct(double x) {
  return fmt::format("{:+.1f}%", 100 * x);
}

// A point's throughput as the docs show it: a language model's tokens/s per GPU (with the MFU
// where a GPU's time model priced it), an MLP's or CNN's samples/s (per GPU with several).
struct Throughput {
  bool tokens = false, mfu = false, per_gpu = false;
  std::int64_t rows = 1;  // tokens per sample

  explicit Throughput(const AdviseResult& r) {
    const auto model = make_model(r.start.config);
    tokens = model->rows_per_sample() > 1 || model->max_seq_len() > 0;
    rows = model->rows_per_sample();
    mfu = r.start.time.has_value();
    per_gpu = tokens || r.gpus > 1;
  }
  std::string header() const {
    return tokens ? "tok/s/GPU" : per_gpu ? "samples/s/GPU" : "samples/s";
  }
  double value(const AdvisePoint& p) const {
    const double v = per_gpu ? p.samples_per_s_per_gpu() : p.samples_per_s;
    return tokens ? v * static_cast<double>(rows) : v;
  }
  // 4 significant digits, whole numbers from 1000 on (12345 tok/s/GPU, not 1.234e+04).
  std::string number(const AdvisePoint& p) const {
    const double v = value(p);
    return v >= 1000 ? fmt::format("{:.0f}", v) : fmt::format("{:.4g}", v);
  }
  std::string text(const AdvisePoint& p) const {
    std::string out = fmt::format("{} {}", number(p), header());
    if (mfu && p.time) out += fmt::format(", MFU {:.1f}%", 100 * p.time->mfu());
    return out;
  }
};

void print_text(const AdviseResult& r, const AdviseOptions& o) {
  const CostModel& cm = r.calibration.model;
  const Throughput tp(r);
  fmt::print("advise {} for {} (limit {}, margin {}){}, {} samples per step, {} memory model\n",
             r.start.id, format_bytes(r.capacity), format_bytes(r.limit), format_bytes(r.margin),
             r.gpu.empty() ? "" : fmt::format(" on {} × {}", r.gpus, r.gpu), r.global_batch,
             r.backend);
  fmt::print("searched {} configurations ({} estimates) in {:.2f} s; turning {}{}\n", r.candidates,
             r.estimates, r.search_seconds, fmt::join(r.axes, ", "),
             r.held.empty() ? "" : fmt::format("; held {}", fmt::join(r.held, ", ")));
  if (!r.gpu.empty())
    fmt::print(
        "cost model: the time model of {} (every op of the dry run priced on the card; "
        "docs/time-model.md)\n",
        r.gpu);
  else
    fmt::print("cost model: measured on {} with {}{} ({} points run, {} cached, {:.0f} s)\n",
               cm.device, cm.model,
               cm.transferred ? "; the throughputs below are predictions of that model" : "",
               r.calibration.measured, r.calibration.cached, r.calibration.seconds);
  for (const std::string& w : r.calibration.warnings) fmt::print("  warning: {}\n", w);
  fmt::print("\nPareto frontier (predicted):\n{:>3} {:>11} {:>13}{} {:>10}  {:<4} {}\n", "#",
             "peak", tp.header(), tp.mfu ? fmt::format(" {:>6}", "MFU") : "", "step", "fits",
             "knobs turned");
  for (std::size_t i = 0; i < r.frontier.size(); ++i) {
    const AdvisePoint& p = r.frontier[i];
    const bool chosen = r.recommended && r.recommended->id == p.id;
    fmt::print("{:>3} {:>11} {:>13}{} {:>10}  {:<4} {}{}\n", i + 1, format_bytes(p.peak),
               tp.number(p), tp.mfu && p.time ? fmt::format(" {:>5.1f}%", 100 * p.time->mfu()) : "",
               seconds_text(p.step_s), p.fits ? "yes" : "no", turned_text(r.start.config, p.config),
               chosen ? "  <- recommended" : "");
  }
  fmt::print("\nstart: {}, {} predicted; {}\n", format_bytes(r.start.peak), tp.text(r.start),
             r.start.fits ? "fits" : "does not fit");
  if (r.recommended) {
    const AdvisePoint& p = *r.recommended;
    fmt::print(
        "recommended{}: {}\n  peak {} of {} limit, {} predicted, {} a step ({} vs the "
        "start)\n",
        r.recommended_measured ? " (best measured)" : "", p.id, format_bytes(p.peak),
        format_bytes(r.limit), tp.text(p), seconds_text(p.step_s),
        pct(p.samples_per_s / r.start.samples_per_s - 1));
    if (p.time) fmt::print("  time model: {}\n", time_model_line(*p.time));
    for (const Explanation& e : r.explanation) fmt::print("  {}\n", e.text);
  } else if (r.smallest) {
    fmt::print(
        "nothing fits {}: the smallest peak reachable is {} ({})\nwhat would have to "
        "change:\n",
        format_bytes(r.limit), format_bytes(r.smallest->peak), r.smallest->id);
    for (const std::string& c : r.changes) fmt::print("  {}\n", c);
  }
  if (!r.confirmed.empty()) {
    fmt::print(
        "\nconfirmed under {} ({} runs):\n{:<7} {:>11} {:>11} {:>8} {:>11} {:>11} {:>8}  {}\n",
        format_bytes(o.capacity), o.calibration.backend, "status", "peak pred", "measured", "error",
        "samples/s", "measured", "error", "point");
    for (const Confirmation& c : r.confirmed) {
      const auto& m = c.measured;
      const bool ok = m.ok() && m.time;
      const double measured =
          ok ? static_cast<double>(r.global_batch) / step_seconds(m, r.clock) : 0.0;
      fmt::print("{:<7} {:>11} {:>11} {:>8} {:>11.4g} {:>11} {:>8}  {}\n", m.status,
                 format_bytes(c.predicted.peak),
                 m.memory ? format_bytes(m.memory->peak_allocated) : "-",
                 m.memory ? pct(static_cast<double>(c.predicted.peak) /
                                    static_cast<double>(m.memory->peak_allocated) -
                                1)
                          : "-",
                 c.predicted.samples_per_s, ok ? fmt::format("{:.4g}", measured) : "-",
                 ok ? pct(c.predicted.samples_per_s / measured - 1) : "-", c.predicted.id);
    }
  }
}

int cmd_advise(CLI::App& cmd, AdviseFlags& f) {
  AdviseOptions o;
  o.gpu = gpu_flag(f.gpu, f.knobs);
  if (f.knobs.capacity.empty() && !o.gpu)
    throw BadInput(
        "advise: --capacity is required (a size like 24GiB or a card like a10g, h100), or --gpu");
  o.capacity = o.gpu && f.knobs.capacity.empty() ? gpu_capacity(*o.gpu)
                                                 : parse_capacity_flag(f.knobs.capacity);
  o.start = to_train_config(f.knobs);
  if (cmd.count("--gpus") > 0) {
    // N GPUs of the card: the start is a layout of them (its --tp, and dp = N / tp unless --dp
    // says), and the search turns tp × dp, sharding and sequence parallelism among them.
    if (!o.gpu) throw BadInput("--gpus prices that many GPUs of the table: it needs --gpu NAME");
    if (f.gpus < 1 || f.gpus > 65536)
      throw BadInput(fmt::format("--gpus: expected 1 to 65536 GPUs, got {}", f.gpus));
    const std::int64_t tp = o.start.tensor_parallel;
    if (cmd.count("--dp") == 0) {
      if (f.gpus % tp != 0)
        throw BadInput(fmt::format("--gpus {} is not divisible by --tp {}", f.gpus, tp));
      o.start.data_parallel = f.gpus / tp;
    } else if (o.start.data_parallel * tp != f.gpus) {
      throw BadInput(
          fmt::format("--gpus {} is not --dp {} × --tp {}", f.gpus, o.start.data_parallel, tp));
    }
    o.gpus = f.gpus;
    try {
      resolve_config(o.start);
    } catch (const KnobError& e) {
      throw BadInput(fmt::format("--gpus {}: the start (dp {} × tp {}): {}", f.gpus,
                                 o.start.data_parallel, tp, e.what()));
    }
  }
  if (cmd.count("--global-batch") > 0) {
    // Samples per optimizer step over every data-parallel rank: each rank's b × a is G / dp.
    const std::int64_t dp = o.start.data_parallel;
    if (f.global_batch < 1) throw BadInput("--global-batch: must be a positive integer");
    if (f.global_batch % dp != 0)
      throw BadInput(fmt::format("--global-batch {} is not divisible by the {} data-parallel ranks",
                                 f.global_batch, dp));
    const std::int64_t per_rank = f.global_batch / dp;
    if (cmd.count("--batch-size") == 0) o.start.batch_size = per_rank;
    if (per_rank % o.start.batch_size != 0)
      throw BadInput(fmt::format("--global-batch {} is not divisible by --batch-size {}{}",
                                 f.global_batch, o.start.batch_size,
                                 dp > 1 ? fmt::format(" × dp {}", dp) : ""));
    const std::int64_t a = per_rank / o.start.batch_size;
    if (cmd.count("--accumulation") > 0 && o.start.accumulation != a)
      throw BadInput(fmt::format("--global-batch {} is not{} --batch-size {} × --accumulation {}",
                                 f.global_batch, dp > 1 ? fmt::format(" dp {} ×", dp) : "",
                                 o.start.batch_size, o.start.accumulation));
    o.start.accumulation = a;
  }
  // The card's backend: the memory model's; the runs happen there when it is usable here, else
  // on the CPU (calibration only; nothing can be confirmed).
  const CudaProbe cuda = probe_cuda();
  const std::string wanted =
      f.knobs.backend == "auto" ? (cuda.usable ? "cuda" : "cpu") : f.knobs.backend;
  o.backend = wanted == "cuda" ? Backend::cuda : Backend::cpu;
  const bool runs_here = o.backend == Backend::cpu || cuda.usable;
  if (f.confirm > 0 && !runs_here)
    throw BadInput(fmt::format("--confirm needs the cuda backend usable here ({})", cuda.detail));
  if (f.confirm < 0) throw BadInput("--confirm: must be >= 0");
  if (f.confirm > 0 && o.gpus > 1)
    throw BadInput("--confirm runs each candidate as one process: not with --gpus (tp × dp ranks)");
  if (f.steps < 1) throw BadInput("--steps: must be >= 1");
  o.margin = margin_bytes(f.margin, o.capacity, o.backend);
  o.allow = split_list(f.allow);
  o.hold = split_list(f.hold);
  o.confirm = f.confirm;
  CalibrationOptions& c = o.calibration;
  c.backend = runs_here ? wanted : "cpu";
  c.device_name = c.backend == "cuda" ? cuda.detail : cpu_device_description(f.knobs.threads);
  c.threads = f.knobs.threads;
  c.steps = f.steps;
  c.clock = f.clock;
  if (f.clock == "cpu" && c.backend != "cpu")
    throw BadInput("--clock cpu: the CPU time of a step measures the cpu backend only");
  c.cache = f.calibration.empty() ? default_cache() : f.calibration;
  c.quiet = f.quiet || f.json;
  c.model = !f.calibrate_on.empty()
                ? f.calibrate_on
                : calibration_model(o.start, o.backend,
                                    c.backend == "cuda" ? Backend::cuda : Backend::cpu);
  if (!f.calibrate_on.empty()) {
    const auto names = model_names();
    if (std::find(names.begin(), names.end(), f.calibrate_on) == names.end())
      throw BadInput(fmt::format("--calibrate-on: unknown model '{}' ({})", echo(f.calibrate_on),
                                 fmt::join(names, ", ")));
  }

  const AdviseResult r = advise(o);
  if (f.json)
    fmt::print("{}\n", advise_json(r).dump(1));
  else
    print_text(r, o);
  for (const std::string& bug : r.bugs) fmt::print(stderr, "memtrade advise: BUG: {}\n", bug);
  if (!r.bugs.empty()) return 1;
  return r.recommended ? 0 : 1;
}

}  // namespace

void register_advise_commands(CLI::App& app, Commands& cmds) {
  auto& f = cmds.keep<AdviseFlags>();
  CLI::App* cmd = app.add_subcommand(
      "advise", "Which knobs to turn for a capacity, with the least throughput lost");
  add_knob_flags(*cmd, f.knobs);
  cmd->add_option("--global-batch", f.global_batch,
                  "Samples per optimizer step, held (default: batch size × accumulation)");
  cmd->add_option("--allow", f.allow,
                  "Also change these axes, which change the training (precision,optimizer)");
  cmd->add_option("--hold", f.hold, "Keep these axes at the given values (comma-separated)");
  cmd->add_option("--margin", f.margin,
                  "Headroom below the capacity: a size or a percentage (default 0 on cpu, 1GiB "
                  "on cuda)");
  cmd->add_option("--confirm", f.confirm, "Run the K best candidates under the capacity");
  cmd->add_option("--steps", f.steps, "Measured steps per calibration or confirming run")
      ->capture_default_str();
  cmd->add_option("--calibration", f.calibration,
                  "Calibration cache file (default ~/.cache/memtrade/calibration.json)");
  cmd->add_option("--calibrate-on", f.calibrate_on,
                  "Measure the cost model on this model (default: the one advised, or a small "
                  "one of its family when the backend is not usable here)");
  cmd->add_option("--clock", f.clock,
                  "The step time measurements count: wall, or cpu (the process's CPU time: "
                  "the cpu backend on a shared machine)")
      ->check(CLI::IsMember({"wall", "cpu"}))
      ->capture_default_str();
  cmd->add_option("--gpu", f.gpu,
                  "Price every point with this card's time model (memtrade devices --table) "
                  "instead of the calibration; the capacity is its memory unless --capacity");
  cmd->add_option("--gpus", f.gpus,
                  "With --gpu: N such GPUs; searches tp × dp = N (tp within the NVLink domain), "
                  "sharding and sequence parallelism beside the single-device knobs");
  cmd->add_flag("--json", f.json, "Print the memtrade.advise/1 document");
  cmd->add_flag("--quiet", f.quiet, "No progress lines");
  cmds.add(cmd, [cmd, &f] { return cmd_advise(*cmd, f); });

  // The child that measures the copy bandwidth for the calibration (a CUDA context stays out of
  // the parent).
  auto& bw = cmds.keep<std::pair<std::string, int>>();
  CLI::App* child = app.add_subcommand("__bandwidth", "");
  child->group("");
  child->add_option("--backend", bw.first)->required();
  child->add_option("--threads", bw.second);
  cmds.add(child, [&bw] {
    DeviceOptions d;
    d.threads = bw.second;
    auto dev = make_device(bw.first, d);
    fmt::print("{}\n", measure_copy_bandwidth(*dev));
    return 0;
  });
}

}  // namespace memtrade
