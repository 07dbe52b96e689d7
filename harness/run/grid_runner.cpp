#include "harness/run/grid_runner.h"
#include "harness/common/launch.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <set>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/common/bad_input.h"
#include "harness/common/output_file.h"
#include "harness/common/process.h"
#include "harness/run/point_child.h"
#include "harness/run/results.h"
#include "kernels/allocator.h"
#include "models/config/input_text.h"

namespace memtrade {
namespace {

std::string fmt_duration(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02.0f}s", static_cast<int>(s / 60), std::fmod(s, 60.0));
  return fmt::format("{}h{:02}m", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
}

std::string short_bytes(const PointRow& p) {
  return p.memory ? format_bytes(p.memory->peak_allocated) : std::string("-");
}

std::string short_time(const PointRow& p) {
  return p.time ? fmt::format("{:.2f} ms", p.time->median_s * 1e3) : std::string("-");
}

// The row for a child that did not hand back its own (crash, timeout, interrupt).
PointRow row_from_outcome(const GridPoint& p, const ChildOutcome& o, double timeout_s) {
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
  void finished(std::size_t done, const PointRow& row) {
    if (quiet_) return;
    if (tty_) fmt::print(stderr, "\r\033[K");
    fmt::print(stderr, "[{}/{}] {:<7} {:>11} {:>10}  {}\n", done, total_, row.status,
               short_bytes(row), short_time(row), row.id);
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

std::string summary_table(const ResultsFile& results) {
  std::string out = fmt::format("{:<8} {:>11} {:>11} {:>8} {:>11} {:>12}  {}\n", "status", "peak",
                                "reserved", "pred", "median", "samples/s", "point");
  for (const PointRow& p : results.points) {
    std::string err = "-";
    if (p.memory && p.memory->predicted_peak && p.memory->peak_allocated > 0)
      err = fmt::format(
          "{:+.1f}%",
          100.0 * static_cast<double>(*p.memory->predicted_peak - p.memory->peak_allocated) /
              static_cast<double>(p.memory->peak_allocated));
    out += fmt::format(
        "{:<8} {:>11} {:>11} {:>8} {:>11} {:>12}  {}\n", p.status, short_bytes(p),
        p.memory ? format_bytes(p.memory->peak_reserved) : std::string("-"), err, short_time(p),
        p.throughput ? fmt::format("{:.1f}", p.throughput->samples_per_s) : std::string("-"), p.id);
  }
  return out;
}

namespace {

// An advisory lock (flock) on `.<out>.lock` beside the results file, held while a run writes it:
// a second run on the same --out is bad input instead of two runs replacing each other's file
// (the first one's points lost). Beside, not on, the file: each write replaces the file itself
// (a new inode). The lock file is removed when the run ends, while still locked; a run that
// opened it just before and then got the lock finds the path gone or another inode there, and
// starts over (the usual protocol for removable lock files).
class OutLock {
 public:
  explicit OutLock(const std::filesystem::path& out) {
    const auto dir = out.parent_path().empty() ? std::filesystem::path(".") : out.parent_path();
    path_ = dir / fmt::format(".{}.lock", out.filename().string());
    for (int attempt = 0; attempt < 100; ++attempt) {
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0) return;  // an unwritable folder: checked before, and the write says so
      if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        release(false);
        // Held by another run; any other failure (a file system without locks: ENOLCK) leaves
        // the run unlocked, as before, rather than refusing it.
        if (err != EWOULDBLOCK) return;
        throw BadInput(fmt::format(
            "--out {}: another memtrade run is writing it (lock {}); wait for "
            "it to end or choose another --out",
            echo(out.string(), kEchoPathMax), echo(path_.filename().string(), kEchoPathMax)));
      }
      struct stat held {
      }, named{};
      if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 &&
          held.st_ino == named.st_ino && held.st_dev == named.st_dev)
        return;        // locked, and it is the file the path names
      release(false);  // removed by the run that held it: lock the path's file anew
    }
  }
  ~OutLock() { release(true); }
  OutLock(const OutLock&) = delete;
  OutLock& operator=(const OutLock&) = delete;

 private:
  void release(bool remove) {
    if (fd_ < 0) return;
    if (remove) ::unlink(path_.c_str());  // while locked: no other run holds this inode
    ::close(fd_);                         // closing releases the lock
    fd_ = -1;
  }
  std::filesystem::path path_;
  int fd_ = -1;
};

// The run's scratch folder (memtrade-<pid> in $TMPDIR: job and result files, the child's
// stderr), removed on every way out of run_grid, exceptions included.
class ScratchDir {
 public:
  ScratchDir()
      : path_(std::filesystem::temp_directory_path() / fmt::format("memtrade-{}", getpid())) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The scratch folders (memtrade-<pid>) of runs that died without cleaning up (kill -9, a node
// lost): removed when another run starts, if their process is gone and they are this user's.
// A pid that lives again (reused) keeps its folder: never another live process's.
void reclaim_stale_work_dirs(const std::filesystem::path& tmp) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(tmp, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("memtrade-") || !entry.is_directory(ec)) continue;
    struct stat st {};
    if (::stat(entry.path().c_str(), &st) != 0 || st.st_uid != getuid()) continue;
    if (names_a_dead_process(std::string_view(name).substr(9)))
      std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace

int run_grid(const Grid& grid, const GridRunOptions& o) {
  const OutLock lock(o.out);
  remove_stale_temporaries(o.out);  // of a run killed mid-write (never ours: we hold the lock)
  ResultsFile results;
  std::set<std::string> done;
  if (o.resume && std::filesystem::exists(o.out)) {
    results = load_results_file(o.out);
    const nlohmann::json hash = results.meta.value("grid_hash", nlohmann::json());
    if (!hash.is_string() || hash.get<std::string>() != grid.hash)
      throw BadInput(fmt::format(
          "{}: --resume with a different grid or run settings (--warmup, --steps, --capacity; "
          "hash {} vs {})",
          echo(o.out.string(), kEchoPathMax), echo(hash.dump()), echo(grid.hash)));
    for (const PointRow& p : results.points) done.insert(p.id);
  } else {
    results.meta = make_meta(o.backend, o.device_name, o.device_memory, &grid, grid.run.capacity);
    if (!o.shard.empty()) results.meta["shard"] = o.shard;
  }
  write_json_atomic(o.out, results.to_json());

  std::vector<const GridPoint*> todo;
  for (const auto& p : grid.points)
    if (!done.count(p.id)) todo.push_back(&p);

  install_interrupt_handlers();
  reclaim_stale_work_dirs(std::filesystem::temp_directory_path());
  const ScratchDir scratch;
  const std::filesystem::path& work = scratch.path();
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
    PointJob job{*p,        o.backend,    grid.run.capacity,    grid.run.warmup, grid.run.steps,
                 o.threads, o.trace_path, o.trace_snapshot_path};
    auto job_file = work / "job.json";
    auto result_file = work / "result.json";
    std::filesystem::remove(result_file);
    write_json_atomic(job_file, job_json(job));
    SpawnOptions so;
    so.timeout_s = grid.run.timeout_s;
    so.stdout_mode = SpawnOptions::Stdout::discard;
    so.stderr_file = work / "stderr.txt";
    so.isolate = true;
    std::vector<std::string> argv{self_executable().string(), "__point",  "--job",
                                  job_file.string(),          "--result", result_file.string()};
    // A data-parallel point: its ranks, under the site's MPI launcher (harness/common/launch.h).
    const int ranks = static_cast<int>(world_size(p->config));  // tp × dp
    if (ranks > 1) {
      argv = rank_launch_argv(ranks, argv);
      so.env = rank_env(ranks, o.threads);
      so.search_path = true;
    }
    ChildOutcome outcome = spawn(argv, so);
    // SIGTERM/SIGINT reach the whole process group (Ctrl-C, scancel, a requeue): the child may
    // die of it before our own handler runs. That is an interruption, not a crashed point, so
    // nothing is recorded and --resume reruns it.
    if (outcome.kind == ChildOutcome::Kind::interrupted || interrupted() ||
        (outcome.kind == ChildOutcome::Kind::signaled &&
         (outcome.signal == SIGTERM || outcome.signal == SIGINT))) {
      code = 130;
      break;
    }
    PointRow row;
    // A failed rank writes its row before it ends the job (mpirun then exits non-zero).
    if (outcome.kind == ChildOutcome::Kind::exited && (outcome.exit_code == 0 || ranks > 1) &&
        std::filesystem::exists(result_file)) {
      try {
        row = PointRow::from_json(read_json_file(result_file));
      } catch (const std::exception& e) {
        row = failed_point(*p, "error", fmt::format("unreadable point result: {}", e.what()));
      }
    } else {
      row = row_from_outcome(*p, outcome, grid.run.timeout_s);
    }
    row.wall_s = outcome.seconds;
    failures |= row.status == "error" || row.status == "timeout";
    results.points.push_back(row);
    try {
      write_json_atomic(o.out, results.to_json());
    } catch (const WriteError& e) {
      // A full disk (or quota, or I/O error): the file keeps every point saved before (the
      // write is atomic), and the point just measured goes to stdout, so nothing is lost. The
      // run stops: the next points could not be saved either. --resume runs what is missing.
      fmt::print("{}\n", row.to_json().dump());
      std::fflush(stdout);
      fmt::print(stderr,
                 "memtrade: {}; the file keeps its {} points as they were, the row of {} is on "
                 "stdout; free space and finish with --resume\n",
                 e.what(), results.points.size() - 1, echo(row.id, kEchoPathMax));
      return 1;
    }
    progress.finished(++finished, row);
  }
  if (!o.quiet) {
    if (code == 130)
      fmt::print(stderr, "interrupted: {} of {} points are in {} (finish with --resume)\n",
                 results.points.size(), grid.points.size(), o.out.string());
    fmt::print("{}", summary_table(results));
    fmt::print("{} points in {} ({}), results: {}\n", results.points.size(),
               fmt_duration(progress.seconds()), o.backend, o.out.string());
  }
  if (code != 0) return code;
  return failures ? 1 : 0;
}

}  // namespace memtrade
