// Subcommands of the grid harness: run, estimate, fit, merge, export, and the hidden __point.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/cli.h"
#include "harness/command.h"
#include "harness/estimate.h"
#include "harness/grid.h"
#include "harness/grid_runner.h"
#include "harness/knob_flags.h"
#include "harness/point_child.h"
#include "harness/results.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cuda_probe.h"
#include "models/model.h"

namespace memtrade {
namespace {

struct RunFlags {
  KnobFlags knobs;
  std::string grid, out, shard, select, timeout, trace, csv;
  bool resume = false, list = false, quiet = false;
  int warmup = -1, steps = -1;
};

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
  std::istringstream in(text);
  double v = 0;
  std::string unit;
  if (in >> v) {
    in >> unit;
    double scale = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : -1;
    if (scale > 0 && v > 0) return v * scale;
  }
  throw BadInput(fmt::format("--timeout: expected a duration like 120s or 5m, got '{}'", text));
}

// The grid a run/estimate/fit works on: the file, or the one point of the knob flags.
Grid grid_for(CLI::App& cmd, RunFlags& f, const std::string& backend) {
  Grid g;
  if (!f.grid.empty()) {
    for (const char* knob :
         {"--model", "--batch-size", "--accumulation", "--precision", "--checkpoint", "--optimizer",
          "--offload", "--zero-grad", "--mode", "--empty-cache", "--input", "--seed", "--lr"})
      if (cmd.count(knob) > 0)
        throw BadInput(
            fmt::format("{} cannot be combined with --grid (put it in the grid file)", knob));
    g = load_grid(f.grid, backend);
  } else {
    TrainConfig cfg = to_train_config(f.knobs);
    g.name = "point";
    g.run.seed = cfg.seed;
    g.points.push_back({point_id(cfg), cfg});
    g.hash = "point-" + g.points.front().id;
  }
  if (cmd.count("--capacity") > 0) {
    g.run.capacity = parse_capacity_flag(f.knobs.capacity);
    g.run.capacity_text = f.knobs.capacity;
  }
  if (f.warmup >= 0) g.run.warmup = f.warmup;
  if (f.steps >= 0) {
    if (f.steps < 1) throw BadInput("--steps: must be >= 1");
    g.run.steps = f.steps;
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
        throw BadInput(fmt::format("--select: no point '{}' in grid '{}'", w, g.name));
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
    for (const auto& p : g.points) fmt::print("{}\n", p.id);
    return 0;
  }
  if (!f.trace.empty() && g.points.size() != 1)
    throw BadInput("--trace records one point: use it with one point (--select ID)");
  GridRunOptions o;
  o.backend = backend;
  o.device_name = device_name;
  o.out = !f.out.empty() ? f.out : fmt::format("out/{}.json", g.name);
  o.resume = f.resume;
  o.threads = f.knobs.threads;
  o.trace_path = f.trace;
  o.quiet = f.quiet;
  o.shard = f.shard;
  int code = run_grid(g, o);
  if (!f.csv.empty()) {
    std::ofstream out(f.csv);
    out << results_csv(load_results(o.out));
  }
  return code;
}

int cmd_point(const std::string& job_path, const std::string& result_path) {
  std::ifstream in(job_path);
  if (!in) throw BadInput("__point: cannot read " + job_path);
  PointJob job = job_from_json(nlohmann::json::parse(in));
  nlohmann::json row = run_point_row(job);
  write_json_atomic(result_path, row);
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

int cmd_estimate(CLI::App& cmd, RunFlags& f, bool json) {
  std::string requested = f.knobs.backend == "auto" ? "cpu" : f.knobs.backend;
  if (requested != "cpu" && requested != "cuda")
    throw BadInput(fmt::format("--backend: unknown value '{}'", requested));
  Grid g = grid_for(cmd, f, requested);
  select_points(g, f);
  Backend b = requested == "cuda" ? Backend::cuda : Backend::cpu;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& p : g.points) {
    MemoryEstimate e = estimate_memory(p.config, b, g.run.capacity);
    nlohmann::json row = estimate_json(e);
    row["id"] = p.id;
    rows.push_back(row);
    if (!json)
      fmt::print("{:>11} {:>11} {:<4} {}\n    {}\n", format_bytes(e.peak_allocated),
                 format_bytes(e.peak_reserved), e.fits ? "fits" : "OOM", p.id,
                 breakdown_line(e.breakdown_at_peak));
  }
  if (json) fmt::print("{}\n", rows.dump(2));
  return 0;
}

int cmd_fit(CLI::App& cmd, RunFlags& f, bool confirm, std::int64_t limit,
            const std::string& json_out) {
  if (f.knobs.capacity.empty()) throw BadInput("fit: --capacity is required (e.g. 24GiB or a10g)");
  std::string requested =
      f.knobs.backend == "auto" ? resolve_backend("auto", f.knobs.threads).first : f.knobs.backend;
  Grid g = grid_for(cmd, f, requested);
  select_points(g, f);
  Backend b = requested == "cuda" ? Backend::cuda : Backend::cpu;
  // One row per knob combination: the batch size axis is what fit searches.
  std::map<std::string, GridPoint> combos;
  for (const auto& p : g.points) {
    TrainConfig c = p.config;
    c.batch_size = 1;
    combos.emplace(point_id(c), GridPoint{point_id(c), c});
  }
  nlohmann::json rows = nlohmann::json::array();
  fmt::print("{:>9} {:>11} {:>9}  {}\n", "max batch", "peak", "confirmed", "knobs (batch 1 id)");
  for (auto& [id, p] : combos) {
    std::int64_t best = largest_fitting_batch(p.config, b, g.run.capacity, limit);
    nlohmann::json row = {{"id", id},
                          {"config", config_json(p.config)},
                          {"max_batch", best},
                          {"capacity", g.run.capacity},
                          {"confirmed", nullptr}};
    std::string peak = "-";
    if (best > 0) {
      TrainConfig c = p.config;
      c.batch_size = best;
      MemoryEstimate e = estimate_memory(c, b, g.run.capacity);
      row["predicted_peak"] = e.peak_allocated;
      peak = format_bytes(e.peak_allocated);
    }
    if (confirm && best > 0) {
      // Run the point at the batch found (must fit) and one above it (must not).
      PointJob job;
      job.backend = requested;
      job.capacity = g.run.capacity;
      job.warmup = 1;
      job.steps = 1;
      job.threads = f.knobs.threads;
      job.point.config = p.config;
      job.point.config.batch_size = best;
      job.point.id = point_id(job.point.config);
      std::string at = run_point_row(job)["status"].get<std::string>();
      std::string above = "-";
      if (best < limit) {
        job.point.config.batch_size = best + 1;
        job.point.id = point_id(job.point.config);
        above = run_point_row(job)["status"].get<std::string>();
      }
      row["confirmed"] = {{"at", at}, {"above", above}};
      row["confirmed_ok"] = at == "ok" && (above == "oom" || above == "-");
    }
    fmt::print("{:>9} {:>11} {:>9}  {}\n", best, peak,
               row["confirmed"].is_null() ? "-" : (row.value("confirmed_ok", false) ? "yes" : "NO"),
               id);
    rows.push_back(row);
  }
  if (!json_out.empty())
    write_json_atomic(json_out, {{"schema", "memtrade.fit/1"}, {"rows", rows}});
  return 0;
}

int cmd_merge(const std::vector<std::string>& inputs, const std::string& out,
              const std::string& grid_path) {
  if (inputs.empty()) throw BadInput("merge: no input files");
  nlohmann::json merged;
  std::map<std::string, std::string> seen;  // id -> file
  // N of the inputs' "shard": "i/N" (0 when unsharded or when the inputs disagree), so that a
  // missing point can be told apart by the shard that should have run it (point k: shard k mod N).
  int shard_count = -1;
  for (const auto& path : inputs) {
    nlohmann::json r = load_results(path);
    int n = 0;
    if (const auto& sh = r["meta"].value("shard", nlohmann::json()); sh.is_string()) {
      try {
        n = parse_shard(sh.get<std::string>()).second;
      } catch (const BadInput&) {
        n = 0;
      }
    }
    shard_count = (shard_count < 0 || shard_count == n) ? n : 0;
    if (merged.is_null()) {
      merged = r;
      merged["points"] = nlohmann::json::array();
      merged["meta"].erase("shard");
    } else {
      for (const char* key : {"grid_hash", "commit", "dirty", "backend"})
        if (r["meta"].value(key, nlohmann::json()) != merged["meta"].value(key, nlohmann::json()))
          throw BadInput(
              fmt::format("merge: {} has {} {} but {} has {} (shards of one grid and "
                          "one build only)",
                          path, key, r["meta"].value(key, nlohmann::json()).dump(), inputs.front(),
                          merged["meta"].value(key, nlohmann::json()).dump()));
    }
    for (const auto& p : r["points"]) {
      std::string id = p["id"].get<std::string>();
      if (auto it = seen.find(id); it != seen.end())
        throw BadInput(fmt::format("merge: point {} is in both {} and {}", id, it->second, path));
      seen[id] = path;
      merged["points"].push_back(p);
    }
  }
  std::vector<std::pair<std::string, std::size_t>> missing;  // id, index in the grid
  if (!grid_path.empty()) {
    Grid g = load_grid(grid_path, merged["meta"].value("backend", "cpu"));
    if (merged["meta"].value("grid_hash", "") != g.hash)
      throw BadInput(fmt::format("merge: the shards are not of grid {} (hash {} vs {})", grid_path,
                                 merged["meta"].value("grid_hash", ""), g.hash));
    // Keep the grid's order, so a merged file reads like a single-machine run.
    std::map<std::string, nlohmann::json> by_id;
    for (auto& p : merged["points"]) by_id[p["id"].get<std::string>()] = p;
    nlohmann::json ordered = nlohmann::json::array();
    for (std::size_t k = 0; k < g.points.size(); ++k) {
      if (auto it = by_id.find(g.points[k].id); it != by_id.end())
        ordered.push_back(it->second);
      else
        missing.emplace_back(g.points[k].id, k);
    }
    merged["points"] = ordered;
  }
  write_json_atomic(out, merged);
  fmt::print("merged {} points from {} files into {}\n", merged["points"].size(), inputs.size(),
             out);
  if (!missing.empty()) {
    fmt::print("missing {} points (not in any shard):\n", missing.size());
    std::set<std::size_t> shards;
    for (const auto& [id, k] : missing) {
      if (shard_count > 0) {
        shards.insert(k % static_cast<std::size_t>(shard_count));
        fmt::print("  {}  (shard {}/{})\n", id, k % static_cast<std::size_t>(shard_count),
                   shard_count);
      } else {
        fmt::print("  {}\n", id);
      }
    }
    if (!shards.empty()) {
      std::vector<std::string> names;
      for (auto i : shards) names.push_back(fmt::format("{}/{}", i, shard_count));
      fmt::print(
          "incomplete shards: {} (rerun each with --shard i/N --resume on its own file, "
          "then merge again)\n",
          fmt::join(names, " "));
    }
    return 1;
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
  run->add_option("--warmup", f.warmup, "Warm-up steps per point (overrides the grid)");
  run->add_option("--steps", f.steps, "Measured steps per point (overrides the grid)");
  run->add_option("--timeout", f.timeout, "Per-point timeout, e.g. 120s (overrides the grid)");
  run->add_option("--trace", f.trace, "Write the allocator trace of one point's last step");
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
  CLI::App* est =
      app.add_subcommand("estimate", "Predict peak memory and its breakdown without running");
  add_knob_flags(*est, ef.knobs);
  est->add_option("--grid", ef.grid, "Grid file (TOML)");
  est->add_option("--select", ef.select, "Only these point ids (comma-separated)");
  est->add_flag("--json", ejson, "JSON output");
  cmds.add(est, [est, &ef, &ejson] { return cmd_estimate(*est, ef, ejson); });

  auto& ff = cmds.keep<RunFlags>();
  auto& fit_opts = cmds.keep<std::tuple<bool, std::int64_t, std::string>>();
  std::get<1>(fit_opts) = 65536;
  CLI::App* fit =
      app.add_subcommand("fit", "Largest batch size that fits a capacity, per knob setting");
  add_knob_flags(*fit, ff.knobs);
  fit->add_option("--grid", ff.grid, "Grid file: one row per knob combination");
  fit->add_flag("--confirm", std::get<0>(fit_opts),
                "Confirm by running the batch found and the next");
  fit->add_option("--max-batch", std::get<1>(fit_opts), "Upper bound of the search")
      ->capture_default_str();
  fit->add_option("--json", std::get<2>(fit_opts), "Write the table as JSON to this file");
  cmds.add(fit, [fit, &ff, &fit_opts] {
    return cmd_fit(*fit, ff, std::get<0>(fit_opts), std::get<1>(fit_opts), std::get<2>(fit_opts));
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
  CLI::App* exp = app.add_subcommand("export", "Write a results file as CSV for spreadsheets");
  exp->add_option("results", export_in, "Results file")->required();
  exp->add_option("-o,--out", export_out, "CSV file (default: stdout)");
  cmds.add(exp, [&export_in, &export_out] {
    std::string csv = results_csv(load_results(export_in));
    if (export_out.empty()) {
      fmt::print("{}", csv);
    } else {
      std::ofstream out(export_out);
      if (!out) throw BadInput("export: cannot write " + export_out);
      out << csv;
    }
    return 0;
  });
}

}  // namespace memtrade
