// A/B in one job: run two memtrade binaries on the same grid, interleaved point by point with
// the order alternating, so that machine drift (thermal, noisy neighbours) hits both sides alike.
// Adaptive resampling (as Pinpoint re-runs its "unknown" results) gives the points whose time
// verdict is inconclusive more samples, instead of leaving them unjudged.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/gate/compare.h"
#include "harness/gate/thresholds.h"

namespace memtrade {

struct AbOptions {
  std::string base_bin, head_bin;
  std::string grid;                   // empty: the one point run_args describe (knob flags)
  int rounds = 1;                     // passes over the grid; samples of all rounds are pooled
  std::string work_dir;               // per-run files; empty: a fresh temporary dir, removed after
  std::vector<std::string> run_args;  // extra flags for every `run` (e.g. --backend cpu)
  std::vector<std::string> select;    // only these point ids (empty: every point)
  int max_extra_rounds = 0;           // resample_inconclusive's budget (0: none)
  // Each run's stderr goes to "<its results file>.err" instead of ours (bisect keeps its own
  // output readable; compare passes the children's messages through to its log).
  bool child_stderr_to_files = false;
};

// Which points were re-run by the extra rounds, and the --steps of each of their extra runs.
struct Resampled {
  std::string point;
  std::vector<std::int64_t> steps;
};

struct AbResults {
  nlohmann::json base, head;  // merged memtrade.results/1 documents
  int extra_rounds = 0;       // extra rounds that ran (resample_inconclusive)
  std::vector<Resampled> resampled;
};

// Lists points with `BIN run --grid FILE --list` (one id per line), then for every round and
// point runs `BIN run --grid FILE --select ID --out FILE` for both binaries, base first on even
// (round + point index) and head first on odd ones. A run that leaves no readable file becomes
// an "error" point. Progress goes to `log`. Throws BadInput when a binary cannot list the grid
// or a selected id is in neither list.
AbResults run_ab(const AbOptions& options, std::FILE* log);

// After run_ab: while some point's time verdict (compare_results under `thresholds`) is
// inconclusive and fewer than options.max_extra_rounds extra rounds ran, runs one more
// interleaved round of only those points, extra round k with --steps 2^k times the steps of a
// point's first run (replacing any --steps of run_args), and pools its samples into `r`. More
// steps per run rather than more runs: a point is inconclusive mostly for having too few steps,
// and doubling reaches the needed count in few rounds. Records what ran in r.extra_rounds and
// r.resampled.
void resample_inconclusive(const AbOptions& options, const Thresholds& thresholds, AbResults& r,
                           std::FILE* log);

// The report's side of resampling: every row of a resampled point notes its extra rounds, and
// one line ("" when none ran) says how many ran and for which points.
void note_resampling(Comparison& c, const AbResults& r);
std::string resampling_summary(const AbResults& r);

// The ids `BIN run [--grid FILE] [run_args without a grid] --list` prints; throws BadInput
// (naming the child's last message) when it fails.
std::vector<std::string> list_points(const AbOptions& options, const std::string& bin);

// One run of one point (`BIN run [--grid FILE] --select ID --out OUT run_args... extra_args...`):
// its results document, or an "error" point when it leaves no readable file.
nlohmann::json run_point(const AbOptions& options, const std::string& bin, const std::string& id,
                         const std::filesystem::path& out,
                         const std::vector<std::string>& extra_args, std::FILE* log);

// Joins per-point results files of one side: points arrays concatenated, meta from the first;
// repeated ids (rounds) pool their time samples and keep the worst status and the largest peaks.
nlohmann::json merge_point_files(const std::vector<nlohmann::json>& docs);

}  // namespace memtrade
