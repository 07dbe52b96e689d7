// Subcommands of the grid harness: run, estimate, fit, merge, export, and the hidden __point.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/cli/command.h"
#include "harness/cli/knob_flags.h"
#include "harness/common/bad_input.h"
#include "harness/common/launch.h"
#include "harness/common/output_file.h"
#include "harness/run/estimate.h"
#include "harness/run/fit.h"
#include "harness/run/grid.h"
#include "harness/run/grid_runner.h"
#include "harness/run/merge.h"
#include "harness/run/point_child.h"
#include "harness/run/results.h"
#include "harness/run/step_dump.h"
#include "kernels/comm.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cuda_probe.h"
#include "models/config/input_text.h"
#include "models/model.h"

namespace memtrade {
namespace {

struct RunFlags {
  KnobFlags knobs;
  std::string grid, out, shard, select, timeout, trace, trace_snapshot, csv;
  bool resume = false, list = false, json = false, quiet = false;
  std::optional<int> warmup, steps;  // given: they override the grid's
};

// --warmup / --steps: a whole number in [min, kMaxSteps], range-checked before it is narrowed.
void add_steps_flag(CLI::App& cmd, const std::string& flag, std::optional<int>& target, int min,
                    const std::string& help) {
  cmd.add_option_function<std::string>(
         flag,
         [&target, flag, min](const std::string& text) {
           target = parse_steps_text(text, min);
           if (!target)
             throw CLI::ValidationError(
                 flag, fmt::format("expected an integer in [{}, {}], got '{}'", min, kMaxSteps,
                                   echo(text)));
         },
         help)
      ->type_name("INT");
}

// The same file, whether or not it exists yet (then by its absolute, normalised path).
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  if (std::filesystem::exists(a, ec) && std::filesystem::exists(b, ec))
    return std::filesystem::equivalent(a, b, ec);
  return std::filesystem::weakly_canonical(a, ec) == std::filesystem::weakly_canonical(b, ec);
}

// Refuses a run whose output (--out, --csv, --trace) would overwrite one of its inputs (the grid
// file, a point's model config file) or another of its outputs.
void refuse_overwriting_inputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                               const std::string& grid_path, const Grid& g) {
  std::vector<std::pair<std::string, std::string>> inputs;
  if (!grid_path.empty()) inputs.emplace_back("--grid", grid_path);
  for (const auto& p : g.points)
    if (!p.config.model_config.empty()) inputs.emplace_back("model_config", p.config.model_config);
  for (const auto& [flag, out] : outputs)
    for (const auto& [what, in] : inputs)
      if (!out.empty() && same_file(out, in))
        throw BadInput(fmt::format("{} {} is this run's {} file: refusing to overwrite it", flag,
                                   echo(out, kEchoPathMax), what));
  for (std::size_t i = 0; i < outputs.size(); ++i)
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (!outputs[i].second.empty() && same_file(outputs[i].second, outputs[j].second))
        throw BadInput(fmt::format("{} and {} name one file ({}): give each its own",
                                   outputs[i].first, outputs[j].first,
                                   echo(outputs[i].second, kEchoPathMax)));
}

// Resolves "auto" without creating a device (the parent must not hold a CUDA context).
std::pair<std::string, std::string> resolve_backend(const std::string& requested, int threads) {
  CudaProbe cuda = probe_cuda();
  if (requested == "cuda" || (requested == "auto" && cuda.usable)) {
    if (!cuda.usable) throw BadInput("--backend cuda: CUDA backend unusable: " + cuda.detail);
    return {"cuda", cuda.detail};
  }
  if (requested != "auto" && requested != "cpu")
    throw BadInput(
        fmt::format("--backend: unknown value '{}' (expected auto, cpu or cuda)", requested));
  return {"cpu", cpu_device_description(threads)};
}

double parse_timeout_flag(const std::string& text) {
  if (auto seconds = parse_duration_text(text)) return *seconds;
  throw BadInput(
      fmt::format("--timeout: expected a duration like 120s or 5m (up to {:.0f} s), "
                  "got '{}'",
                  kMaxTimeoutS, echo(text)));
}

// The grid a run/estimate/fit works on: the file, or the one point of the knob flags.
Grid grid_for(CLI::App& cmd, RunFlags& f, const std::string& backend) {
  Grid g;
  if (!f.grid.empty()) {
    for (const std::string& flag : given_point_flags(cmd))
      throw BadInput(
          fmt::format("{} cannot be combined with --grid (put it in the grid file)", flag));
    g = load_grid(f.grid, backend);
  } else {
    TrainConfig cfg = to_train_config(f.knobs);
    g.name = "point";
    g.run.seed = cfg.seed;
    g.points.push_back({point_id(cfg), cfg});
    g.hash = "point-" + g.points.front().id;
    // The learning rate is no axis (not in the id): --resume must not mix two of them.
    if (cfg.lr != 0.0f) g.hash += fmt::format("-lr{}", cfg.lr);
  }
  // The flags that override the grid's run settings join its hash, so that --resume (and merge)
  // refuse a file measured with other ones instead of mixing both. Only when given: the hash of
  // a run without them is unchanged, and older files resume as before.
  if (cmd.count("--capacity") > 0) {
    g.run.capacity = parse_capacity_flag(f.knobs.capacity);
    g.run.capacity_text = f.knobs.capacity;
    g.hash += fmt::format("+capacity{}", g.run.capacity);
  }
  if (f.warmup) {
    g.run.warmup = *f.warmup;
    g.hash += fmt::format("+warmup{}", g.run.warmup);
  }
  if (f.steps) {
    g.run.steps = *f.steps;
    g.hash += fmt::format("+steps{}", g.run.steps);
  }
  if (!f.timeout.empty()) g.run.timeout_s = parse_timeout_flag(f.timeout);
  return g;
}

void select_points(Grid& g, const RunFlags& f) {
  if (!f.select.empty()) {
    std::set<std::string> wanted;
    std::stringstream ss(f.select);
    std::string id;
    while (std::getline(ss, id, ','))
      if (!id.empty()) wanted.insert(id);
    for (const auto& w : wanted)
      if (std::none_of(g.points.begin(), g.points.end(),
                       [&](const GridPoint& p) { return p.id == w; }))
        throw BadInput(fmt::format("--select: no point '{}' in grid '{}'", echo(w), g.name));
    std::erase_if(g.points, [&](const GridPoint& p) { return !wanted.count(p.id); });
  }
  if (!f.shard.empty()) {
    auto [i, n] = parse_shard(f.shard);
    g.points = shard_points(g.points, i, n);
  }
}

int cmd_run(CLI::App& cmd, RunFlags& f) {
  std::string requested = cmd.count("--backend") > 0 || f.grid.empty() ? f.knobs.backend : "";
  if (requested.empty()) {
    // The grid's own [run] backend, read before expansion decides backend-specific excludes.
    requested = load_grid(f.grid, "").run.backend;
  }
  // Listing needs the backend's name (its excludes shape the grid), not a usable device: a
  // CUDA grid's points can be listed (and sharded) on a machine without a GPU.
  auto [backend, device_name] = f.list && (requested == "cuda" || requested == "cpu")
                                    ? std::pair<std::string, std::string>{requested, ""}
                                    : resolve_backend(requested, f.knobs.threads);
  Grid g = grid_for(cmd, f, backend);
  select_points(g, f);
  if (f.list) {
    if (!f.json) {
      for (const auto& p : g.points) fmt::print("{}\n", p.id);
      return 0;
    }
    // What a peer tool needs to run the same points: every axis resolved, defaults filled in.
    nlohmann::json points = nlohmann::json::array();
    for (const auto& p : g.points) {
      const auto model = make_model(p.config);
      points.push_back({{"id", p.id},
                        {"config", config_json(p.config, *model)},
                        {"resolved", resolved_json(p.config, *model)}});
    }
    fmt::print("{}\n", nlohmann::json{{"grid", g.name},
                                      {"backend", backend},
                                      {"run",
                                       {{"warmup", g.run.warmup},
                                        {"steps", g.run.steps},
                                        {"seed", g.run.seed},
                                        {"capacity", g.run.capacity}}},
                                      {"points", points}}
                           .dump(1));
    return 0;
  }
  if (f.json) throw BadInput("--json goes with --list");
  if (!f.trace.empty() && g.points.size() != 1)
    throw BadInput("--trace records one point: use it with one point (--select ID)");
  if (!f.trace_snapshot.empty() && g.points.size() != 1)
    throw BadInput("--trace-snapshot records one point: use it with one point (--select ID)");
  GridRunOptions o;
  o.backend = backend;
  o.device_name = device_name;
  o.out = !f.out.empty() ? f.out : fmt::format("out/{}.json", g.name);
  refuse_overwriting_inputs({{"--out", o.out.string()},
                             {"--csv", f.csv},
                             {"--trace", f.trace},
                             {"--trace-snapshot", f.trace_snapshot}},
                            f.grid, g);
  // Every output is checked before the first point: not after hours of measuring.
  check_output_file("--out", o.out);
  check_output_file("--csv", f.csv);
  check_output_file("--trace", f.trace);
  check_output_file("--trace-snapshot", f.trace_snapshot);
  o.resume = f.resume;
  o.threads = f.knobs.threads;
  o.trace_path = f.trace;
  o.trace_snapshot_path = f.trace_snapshot;
  o.quiet = f.quiet;
  o.shard = f.shard;
  int code = run_grid(g, o);
  if (!f.csv.empty()) write_file_atomic(f.csv, results_csv(load_results_file(o.out)));
  return code;
}

int cmd_point(const std::string& job_path, const std::string& result_path) {
  std::ifstream in(job_path);
  if (!in) throw BadInput("__point: cannot read " + job_path);
  PointJob job = job_from_json(nlohmann::json::parse(in));
  PointRow row = run_point_row(job);
  if (world_size(job.point.config) == 1 || !launched_by_mpi()) {
    write_json_atomic(result_path, row.to_json());
    return 0;
  }
  // One rank of several: rank 0 writes the row (with every rank's memory). A rank that failed
  // writes its own row, naming itself, and ends the job: the others wait for it in a
  // collective and would hang until the point's timeout.
  const int rank = launched_rank();
  if (const std::string by = rank_launcher(); !by.empty()) row.extra["launcher"] = by;
  if (row.status != "ok") {
    row.error = fmt::format("rank {}: {}", rank, row.error.value_or(row.status));
    write_json_atomic(result_path, row.to_json());
    std::fflush(nullptr);
    abort_ranks(1);
  }
  if (rank == 0) write_json_atomic(result_path, row.to_json());
  return 0;
}

std::string breakdown_line(const std::array<std::int64_t, kNumCategories>& b) {
  std::string out;
  for (std::size_t c = 0; c < kNumCategories; ++c)
    if (b[c] > 0)
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ",
                         category_name(static_cast<Category>(c)), format_bytes(b[c]));
  return out;
}

// The MoE line of a text estimate: the routing and what the MoE layers saved.
std::string moe_line(const nlohmann::json& moe) {
  const nlohmann::json& b = moe.at("saved_bytes");
  return fmt::format(
      "moe: routing {}; saved by the MoE layers: router {}, dispatch {}, experts {}, "
      "shared expert {}",
      moe.at("routing").get<std::string>(), format_bytes(b.at("router")),
      format_bytes(b.at("dispatch")), format_bytes(b.at("experts")),
      format_bytes(b.at("shared_expert")));
}

// The CUDA target's workspace line of a text estimate: PyTorch's workspaces live at the peak,
// and what the model leaves out with its bound.
std::string workspace_line(const nlohmann::json& w) {
  std::string out = fmt::format("workspace ({}):", w.at("target").get<std::string>());
  for (const auto& [name, bytes] : w.at("at_peak").items())
    out += fmt::format(" {} {},", name, format_bytes(bytes.get<std::int64_t>()));
  if (w.at("at_peak").empty()) out += " none at the peak,";
  out.pop_back();
  for (const auto& u : w.at("unmodeled"))
    out += fmt::format(
        "; not modelled: {} ({})", u.at("name").get<std::string>(),
        u.at("bound_bytes").is_null()
            ? std::string("no bound")
            : "at most " + format_bytes(u.at("bound_bytes").get<std::int64_t>()) + " at the peak");
  return out;
}

int cmd_estimate(CLI::App& cmd, RunFlags& f, bool json, int rank, const std::string& gpu_name,
                 const std::string& moe_routing) {
  const GpuSpec* gpu = gpu_flag(gpu_name, f.knobs);
  std::string requested = f.knobs.backend == "auto" ? "cpu" : f.knobs.backend;
  Grid g = grid_for(cmd, f, requested);
  if (gpu && cmd.count("--capacity") == 0) g.run.capacity = gpu_capacity(*gpu);
  select_points(g, f);
  Backend b = requested == "cuda" ? Backend::cuda : Backend::cpu;
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : g.points)
    if (rank >= world_size(p.config))
      throw BadInput(fmt::format("--rank {}: {} has {} rank{} (tp × dp)", rank, p.id,
                                 world_size(p.config), world_size(p.config) == 1 ? "" : "s"));
  for (const auto& p : g.points) {
    const MoeRouting routing = moe_routing_from(moe_routing, p.id);
    MemoryEstimate e = estimate_memory(p.config, b, g.run.capacity, 1, rank, gpu, {}, routing);
    nlohmann::json row = estimate_json(e);
    row["id"] = p.id;
    row["config"] = config_json(p.config, *make_model(p.config));
    if (world_size(p.config) > 1) row["rank"] = rank;
    points.push_back(row);
    if (!json) {
      fmt::print("{:>11} {:>11} {:<4} {}\n    {}\n", format_bytes(e.peak_allocated),
                 format_bytes(e.peak_reserved), e.fits ? "fits" : "OOM", p.id,
                 breakdown_line(e.breakdown_at_peak));
      if (world_size(p.config) > 1)
        fmt::print("    per rank: rank {} of {}{}; resident after the step: {}; {:.3f} s\n", rank,
                   world_size(p.config), rank == 0 ? " (the most loaded)" : "",
                   breakdown_line(e.resident_after_step), e.seconds);
      if (e.time) fmt::print("    time: {}\n", time_model_line(*e.time));
      if (!e.moe.is_null()) fmt::print("    {}\n", moe_line(e.moe));
      if (!e.workspace.is_null()) fmt::print("    {}\n", workspace_line(e.workspace));
    }
  }
  if (json)
    fmt::print("{}\n",
               nlohmann::json{{"schema", "memtrade.estimate/1"},
                              {"backend", requested},
                              {"gpu", gpu ? nlohmann::json(gpu->name) : nlohmann::json(nullptr)},
                              {"capacity", g.run.capacity > 0 ? nlohmann::json(g.run.capacity)
                                                              : nlohmann::json(nullptr)},
                              {"points", points}}
                   .dump(2));
  return 0;
}

int cmd_fit(CLI::App& cmd, RunFlags& f, const FitOptions& defaults, const std::string& json_out,
            const std::string& gpu_name) {
  const GpuSpec* gpu = gpu_flag(gpu_name, f.knobs);
  if (f.knobs.capacity.empty() && !gpu)
    throw BadInput("fit: --capacity is required (e.g. 24GiB or a10g), or --gpu");
  std::string requested =
      f.knobs.backend == "auto" ? resolve_backend("auto", f.knobs.threads).first : f.knobs.backend;
  Grid g = grid_for(cmd, f, requested);
  select_points(g, f);
  FitOptions o = defaults;
  o.backend = requested == "cuda" ? Backend::cuda : Backend::cpu;
  o.backend_name = requested;
  o.capacity = g.run.capacity;
  if (gpu && cmd.count("--capacity") == 0) o.capacity = gpu_capacity(*gpu);
  o.gpu = gpu;
  o.threads = f.knobs.threads;
  refuse_overwriting_inputs({{"--json", json_out}}, f.grid, g);
  check_output_file("--json", json_out);
  fmt::print("{:>9} {:>11} {:>9}  {}\n", "max batch", "peak", "confirmed", "knobs (batch 1 id)");
  nlohmann::json rows = nlohmann::json::array();
  for (const FitRow& r : fit_points(g.points, o)) {
    fmt::print("{:>9} {:>11} {:>9}  {}\n", r.max_batch,
               r.predicted_peak >= 0 ? format_bytes(r.predicted_peak) : "-",
               r.confirmed_at.empty() ? "-" : (r.confirmed_ok() ? "yes" : "NO"), r.id);
    if (r.time) fmt::print("{:>9} {}\n", "", time_model_line(*r.time));
    rows.push_back(r.to_json(o.capacity));
  }
  if (!json_out.empty())
    write_json_atomic(json_out, {{"schema", "memtrade.fit/1"}, {"rows", rows}});
  return 0;
}

int cmd_merge(const std::vector<std::string>& inputs, const std::string& out,
              const std::string& grid_path) {
  check_output_file("--out", out);
  MergeOutcome m = merge_shards(inputs, grid_path);
  write_json_atomic(out, m.merged.to_json());
  fmt::print("merged {} points from {} files into {}\n", m.merged.points.size(), inputs.size(),
             out);
  if (m.missing.empty()) return 0;
  fmt::print("missing {} points (not in any shard):\n", m.missing.size());
  for (const auto& line : m.missing_note) fmt::print("{}\n", line);
  if (!m.incomplete_shards.empty())
    fmt::print(
        "incomplete shards: {} (rerun each with --shard i/N --resume on its own file, then merge "
        "again)\n",
        fmt::join(m.incomplete_shards, " "));
  return 1;
}

// `memtrade knobs`: the knob table, as a table for people, JSON for tools (reports/,
// bench/peers/) or Markdown (the knob table of docs/design.md, which make docs regenerates).
int cmd_knobs(const std::string& format) {
  // An empty default (model_config: no file) is shown as "".
  auto default_of = [](const Knob& k) {
    return k.default_text().empty() ? std::string("\"\"") : k.default_text();
  };
  if (format == "json") {
    fmt::print("{}\n", knobs_json().dump(1));
    return 0;
  }
  if (format == "markdown") {
    fmt::print(
        "| axis | flag | id | default | values | what it changes |\n|---|---|---|---|---|---|\n");
    for (const Knob& k : knobs()) {
      const auto choices = k.choices();
      const std::string values =
          choices.empty() ? k.values_text : fmt::format("`{}`", fmt::join(choices, "`, `"));
      const char* rule = k.id_rule == IdRule::always        ? ""
                         : k.id_rule == IdRule::non_default ? " (when not default)"
                                                            : " (where it applies)";
      fmt::print("| `{}` | `{}` | `{}`{} | `{}` | {} | {} |\n", k.name, k.flag,
                 k.id_prefix.empty() ? "value" : k.id_prefix + "…", rule, default_of(k), values,
                 k.help);
    }
    return 0;
  }
  fmt::print("{:<13} {:<15} {:<12} {:<5} {}\n", "axis", "flag", "default", "id", "values");
  for (const Knob& k : knobs()) {
    const auto choices = k.choices();
    fmt::print("{:<13} {:<15} {:<12} {:<5} {}\n", k.name, k.flag, default_of(k),
               k.id_prefix.empty() ? "-" : k.id_prefix,
               choices.empty() ? k.values_text : fmt::format("{}", fmt::join(choices, " | ")));
  }
  return 0;
}

}  // namespace

void register_run_commands(CLI::App& app, Commands& cmds) {
  auto& f = cmds.keep<RunFlags>();
  CLI::App* run = app.add_subcommand(
      "run", "Run a grid (or one point from knob flags), each point in its own process");
  add_knob_flags(*run, f.knobs);
  run->add_option("--grid", f.grid, "Grid file (TOML)");
  run->add_option("--out", f.out, "Results file (default out/<grid name>.json)");
  run->add_flag("--resume", f.resume, "Finish an interrupted results file");
  run->add_option("--shard", f.shard, "Run the deterministic slice i/N (0 <= i < N)");
  run->add_option("--select", f.select, "Run only these point ids (comma-separated)");
  run->add_flag("--list", f.list, "Print the point ids and exit");
  run->add_flag("--json", f.json, "With --list: every point's id and full config as JSON");
  add_steps_flag(*run, "--warmup", f.warmup, 0, "Warm-up steps per point (overrides the grid)");
  add_steps_flag(*run, "--steps", f.steps, 1, "Measured steps per point (overrides the grid)");
  run->add_option("--timeout", f.timeout, "Per-point timeout, e.g. 120s (overrides the grid)");
  run->add_option("--trace", f.trace, "Write the allocator trace of one point's last step");
  run->add_option("--trace-snapshot", f.trace_snapshot,
                  "Write that trace as a PyTorch memory snapshot (pickle; see `memtrade trace`)");
  run->add_option("--csv", f.csv, "Also write the results as CSV");
  run->add_flag("--quiet", f.quiet, "No progress and no table");
  cmds.add(run, [run, &f] { return cmd_run(*run, f); });

  auto& job = cmds.keep<std::pair<std::string, std::string>>();
  CLI::App* point = app.add_subcommand("__point", "");  // hidden: the child of `run`
  point->group("");
  point->add_option("--job", job.first)->required();
  point->add_option("--result", job.second)->required();
  cmds.add(point, [&job] { return cmd_point(job.first, job.second); });

  auto& ef = cmds.keep<RunFlags>();
  auto& ejson = cmds.keep<bool>();
  auto& erank = cmds.keep<int>();
  auto& egpu = cmds.keep<std::string>();
  auto& emoe = cmds.keep<std::string>();
  emoe = "balanced";
  CLI::App* est =
      app.add_subcommand("estimate", "Predict peak memory and its breakdown without running");
  add_knob_flags(*est, ef.knobs);
  est->add_option("--grid", ef.grid, "Grid file (TOML)");
  est->add_option("--select", ef.select, "Only these point ids (comma-separated)");
  est->add_flag("--json", ejson, "JSON output");
  est->add_option("--rank", erank,
                  "Data parallelism: the rank to predict (default 0, the most loaded)")
      ->check(CLI::NonNegativeNumber);
  est->add_option("--gpu", egpu,
                  "Also predict the step time on this GPU (memtrade devices --table); implies "
                  "--backend cuda and, without --capacity, the card's memory");
  est->add_option("--moe-routing", emoe,
                  "Mixture-of-experts: the tokens each expert receives, balanced (N·top_k/E "
                  "each), worst (every token on the same top_k experts) or a results FILE (the "
                  "histogram its run recorded)");
  cmds.add(est, [est, &ef, &ejson, &erank, &egpu, &emoe] {
    return cmd_estimate(*est, ef, ejson, erank, egpu, emoe);
  });

  auto& ff = cmds.keep<RunFlags>();
  auto& fit_opts = cmds.keep<FitOptions>();
  auto& fit_json = cmds.keep<std::string>();
  auto& fit_gpu = cmds.keep<std::string>();
  CLI::App* fit =
      app.add_subcommand("fit", "Largest batch size that fits a capacity, per knob setting");
  add_knob_flags(*fit, ff.knobs);
  fit->add_option("--grid", ff.grid, "Grid file: one row per knob combination");
  fit->add_flag("--confirm", fit_opts.confirm, "Confirm by running the batch found and the next");
  fit->add_option("--max-batch", fit_opts.max_batch, "Upper bound of the search")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  fit->add_option("--json", fit_json, "Write the table as JSON to this file");
  fit->add_option("--gpu", fit_gpu,
                  "Search this GPU's memory (memtrade devices --table) and time the largest "
                  "batch on it; implies --backend cuda");
  cmds.add(fit, [fit, &ff, &fit_opts, &fit_json, &fit_gpu] {
    return cmd_fit(*fit, ff, fit_opts, fit_json, fit_gpu);
  });

  auto& merge_in = cmds.keep<std::vector<std::string>>();
  auto& merge_out = cmds.keep<std::string>();
  auto& merge_grid = cmds.keep<std::string>();
  CLI::App* merge = app.add_subcommand("merge", "Join shard results files of one grid");
  merge->add_option("inputs", merge_in, "Shard results files")->required();
  merge->add_option("-o,--out", merge_out, "Merged results file")->required();
  merge->add_option("--grid", merge_grid, "The grid file: order by it and name missing points");
  cmds.add(merge, [&merge_in, &merge_out, &merge_grid] {
    return cmd_merge(merge_in, merge_out, merge_grid);
  });

  auto& export_in = cmds.keep<std::string>();
  auto& export_out = cmds.keep<std::string>();
  auto& knobs_format = cmds.keep<std::string>();
  knobs_format = "text";
  CLI::App* kn =
      app.add_subcommand("knobs", "The knob table: every axis, its flag, default and values");
  kn->add_flag("--json{json}", knobs_format, "JSON, for tools");
  kn->add_flag("--markdown{markdown}", knobs_format, "Markdown, the table of docs/design.md");
  cmds.add(kn, [&knobs_format] { return cmd_knobs(knobs_format); });

  CLI::App* exp = app.add_subcommand("export", "Write a results file as CSV for spreadsheets");
  exp->add_option("results", export_in, "Results file")->required();
  exp->add_option("-o,--out", export_out, "CSV file (default: stdout)");
  cmds.add(exp, [&export_in, &export_out] {
    if (!export_out.empty() && same_file(export_in, export_out))
      throw BadInput(fmt::format("export: --out {} is the results file: refusing to overwrite it",
                                 echo(export_out, kEchoPathMax)));
    check_output_file("--out", export_out);
    std::string csv = results_csv(load_results_file(export_in));
    if (export_out.empty())
      fmt::print("{}", csv);
    else
      write_file_atomic(export_out, csv);
    return 0;
  });
}

}  // namespace memtrade
