#include "harness/run/grid_runner.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <unistd.h>

#include "harness/common/bad_input.h"
#include "harness/common/isolate.h"
#include "harness/run/point_child.h"
#include "harness/run/results.h"
#include "kernels/allocator.h"

namespace memtrade {
namespace {

std::string fmt_duration(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02.0f}s", static_cast<int>(s / 60), std::fmod(s, 60.0));
  return fmt::format("{}h{:02}m", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
}

std::string short_bytes(const nlohmann::json& v) {
  return v.is_number() ? format_bytes(v.get<std::int64_t>()) : std::string("-");
}

nlohmann::json get(const nlohmann::json& p, const char* a, const char* b) {
  if (!p.contains(a) || !p[a].is_object() || !p[a].contains(b)) return nullptr;
  return p[a][b];
}

// The row for a child that did not hand back its own (crash, timeout, interrupt).
nlohmann::json row_from_outcome(const GridPoint& p, const ChildOutcome& o, double timeout_s) {
  switch (o.kind) {
    case ChildOutcome::Kind::timed_out:
      return failed_point(p, "timeout", fmt::format("timed out after {:.0f} s", timeout_s));
    case ChildOutcome::Kind::signaled:
      return failed_point(p, "error",
                          fmt::format("crashed: {}{}{}", describe_signal(o.signal),
                                      o.stderr_tail.empty() ? "" : ": ", o.stderr_tail));
    default:
      return failed_point(
          p, "error",
          fmt::format("point process exited with code {} and no result{}{}", o.exit_code,
                      o.stderr_tail.empty() ? "" : ": ", o.stderr_tail));
  }
}

class Progress {
 public:
  Progress(std::size_t total, bool quiet)
      : total_(total),
        quiet_(quiet),
        tty_(isatty(STDERR_FILENO) != 0),
        start_(std::chrono::steady_clock::now()) {}

  void starting(std::size_t done, const std::string& id) {
    if (quiet_ || !tty_) return;
    double elapsed = seconds();
    std::string eta =
        done > 0
            ? fmt_duration(elapsed / static_cast<double>(done) * static_cast<double>(total_ - done))
            : "?";
    int width = 24;
    int filled = total_ ? static_cast<int>(width * done / total_) : width;
    fmt::print(stderr, "\r\033[K[{}{}] {}/{} ETA {}  {}", std::string(filled, '#'),
               std::string(width - filled, '.'), done, total_, eta, id);
    std::fflush(stderr);
  }
  void finished(std::size_t done, const nlohmann::json& row) {
    if (quiet_) return;
    if (tty_) fmt::print(stderr, "\r\033[K");
    auto median = get(row, "time", "median_s");
    fmt::print(stderr, "[{}/{}] {:<7} {:>11} {:>10}  {}\n", done, total_,
               row["status"].get<std::string>(), short_bytes(get(row, "memory", "peak_allocated")),
               median.is_number() ? fmt::format("{:.2f} ms", median.get<double>() * 1e3) : "-",
               row["id"].get<std::string>());
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::size_t total_;
  bool quiet_, tty_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

std::string summary_table(const nlohmann::json& results) {
  std::string out = fmt::format("{:<8} {:>11} {:>11} {:>8} {:>11} {:>12}  {}\n", "status", "peak",
                                "reserved", "pred", "median", "samples/s", "point");
  for (const auto& p : results["points"]) {
    auto peak = get(p, "memory", "peak_allocated");
    auto pred = get(p, "memory", "predicted_peak");
    std::string err = "-";
    if (peak.is_number() && pred.is_number() && peak.get<double>() > 0)
      err = fmt::format("{:+.1f}%",
                        100.0 * (pred.get<double>() - peak.get<double>()) / peak.get<double>());
    auto median = get(p, "time", "median_s");
    auto sps = get(p, "throughput", "samples_per_s");
    out +=
        fmt::format("{:<8} {:>11} {:>11} {:>8} {:>11} {:>12}  {}\n", p["status"].get<std::string>(),
                    short_bytes(peak), short_bytes(get(p, "memory", "peak_reserved")), err,
                    median.is_number() ? fmt::format("{:.2f} ms", median.get<double>() * 1e3) : "-",
                    sps.is_number() ? fmt::format("{:.1f}", sps.get<double>()) : "-",
                    p["id"].get<std::string>());
  }
  return out;
}

int run_grid(const Grid& grid, const GridRunOptions& o) {
  nlohmann::json results;
  std::set<std::string> done;
  if (o.resume && std::filesystem::exists(o.out)) {
    results = load_results(o.out);
    auto hash = results["meta"].value("grid_hash", nlohmann::json()).is_string()
                    ? results["meta"]["grid_hash"].get<std::string>()
                    : std::string();
    if (hash != grid.hash)
      throw BadInput(fmt::format("{}: --resume with a different grid (hash {} vs {})",
                                 o.out.string(), hash, grid.hash));
    for (const auto& p : results["points"]) done.insert(p["id"].get<std::string>());
  } else {
    results = {{"schema", kResultsSchema}, {"meta", nullptr}, {"points", nlohmann::json::array()}};
    results["meta"] =
        make_meta(o.backend, o.device_name, o.device_memory, &grid, grid.run.capacity);
    if (!o.shard.empty()) results["meta"]["shard"] = o.shard;
  }
  write_json_atomic(o.out, results);

  std::vector<const GridPoint*> todo;
  for (const auto& p : grid.points)
    if (!done.count(p.id)) todo.push_back(&p);

  install_interrupt_handlers();
  auto work = std::filesystem::temp_directory_path() / fmt::format("memtrade-{}", getpid());
  std::filesystem::create_directories(work);
  Progress progress(grid.points.size(), o.quiet);
  std::size_t finished = done.size();
  bool failures = false;
  int code = 0;
  for (const GridPoint* p : todo) {
    if (interrupted()) {
      code = 130;
      break;
    }
    progress.starting(finished, p->id);
    PointJob job{*p,        o.backend,   grid.run.capacity, grid.run.warmup, grid.run.steps,
                 o.threads, o.trace_path};
    auto job_file = work / "job.json";
    auto result_file = work / "result.json";
    std::filesystem::remove(result_file);
    write_json_atomic(job_file, job_json(job));
    ChildOutcome outcome = run_child({self_executable().string(), "__point", "--job",
                                      job_file.string(), "--result", result_file.string()},
                                     grid.run.timeout_s, work / "stderr.txt");
    // SIGTERM/SIGINT reach the whole process group (Ctrl-C, scancel, a requeue): the child may
    // die of it before our own handler runs. That is an interruption, not a crashed point, so
    // nothing is recorded and --resume reruns it.
    if (outcome.kind == ChildOutcome::Kind::interrupted || interrupted() ||
        (outcome.kind == ChildOutcome::Kind::signaled &&
         (outcome.signal == SIGTERM || outcome.signal == SIGINT))) {
      code = 130;
      break;
    }
    nlohmann::json row;
    if (outcome.kind == ChildOutcome::Kind::exited && outcome.exit_code == 0 &&
        std::filesystem::exists(result_file)) {
      try {
        std::ifstream in(result_file);
        row = nlohmann::json::parse(in);
      } catch (const std::exception& e) {
        row = failed_point(*p, "error", fmt::format("unreadable point result: {}", e.what()));
      }
    } else {
      row = row_from_outcome(*p, outcome, grid.run.timeout_s);
    }
    row["wall_s"] = outcome.seconds;
    std::string status = row["status"].get<std::string>();
    failures |= status == "error" || status == "timeout";
    results["points"].push_back(row);
    write_json_atomic(o.out, results);
    progress.finished(++finished, row);
  }
  std::filesystem::remove_all(work);
  if (!o.quiet) {
    if (code == 130)
      fmt::print(stderr, "interrupted: {} of {} points are in {} (finish with --resume)\n",
                 results["points"].size(), grid.points.size(), o.out.string());
    fmt::print("{}", summary_table(results));
    fmt::print("{} points in {} ({}), results: {}\n", results["points"].size(),
               fmt_duration(progress.seconds()), o.backend, o.out.string());
  }
  if (code != 0) return code;
  return failures ? 1 : 0;
}

}  // namespace memtrade
