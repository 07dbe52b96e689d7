// `memtrade bisect`: the first commit between a good and a bad one where a point's memory or
// time changed, as `git bisect` finds it but with memtrade's own measurement and judgement.
//
// Every commit is built in one git worktree (so each build is incremental, and ccache, where
// installed, shares objects with every other checkout), then measured:
//   memory  one run of the point; the CPU's peak_allocated is exact, so any change from the
//           good commit's, of any size and either sign, is bad (as is a point that fails);
//   time    an interleaved A/B against the good build (run_ab), judged by compare's rank test:
//           a regression is bad, unchanged or faster is good, inconclusive is skipped.
// A commit that does not build is skipped and a neighbour tried, as git bisect does.
//
// The search is a binary search over `git rev-list --first-parent --ancestry-path GOOD..BAD`,
// trusting BAD as git does (measured only when every commit before it is good). The check mode
// judges the current checkout alone, with git bisect run's exit codes.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "harness/gate/thresholds.h"

namespace memtrade {

struct BisectOptions {
  std::string repo = ".";  // any folder inside the repository
  std::string good, bad;   // revisions; check mode has no bad
  std::string metric = "memory";
  std::string grid;    // empty: the point is the knob flags of run_args
  std::string select;  // the point id (needed with a grid)
  // Empty: a temporary folder, removed at the end; check mode: <git common dir>/memtrade-bisect,
  // kept between steps (the good build and its measurement are made once).
  std::string work_dir;
  std::string build_cmd;  // empty: default_build_command(); run by /bin/sh -c in the tree
  std::string binary = "build/memtrade";  // the built binary, relative to the tree
  std::string backend = "cpu";
  std::vector<std::string> run_args;  // knob flags without a grid; any other `run` flags
  int rounds = 3;                     // time: interleaved passes per step
  int max_extra_rounds = 0;           // time: resampling of an inconclusive step
  Thresholds thresholds;              // time: the gate's rule for median_s
};

// cmake configure (once per tree) and build of the memtrade target, Release, CUDA off (a
// bisect on the CPU; --build-cmd for any other), with ccache as compiler launcher where it is
// on PATH (older commits' CMakeLists may not look for it themselves).
std::string default_build_command();

struct BisectOutcome {
  enum class Kind { found, no_change, ambiguous } kind = Kind::found;
  std::string sha, subject;           // found: the first bad commit
  std::vector<std::string> suspects;  // ambiguous: skipped commits it could be, then the bad one
};

// The search, with a transcript on `out` (one line per step, then "first bad commit: SHA
// SUBJECT"). Throws BadInput on bad input: not a repository, an unknown revision, GOOD not an
// ancestor of BAD, the point not in the grid, the good commit not building or not running it.
BisectOutcome bisect(const BisectOptions& options, std::FILE* out);

// git bisect run's contract for the current checkout of options.repo, built in place: 0 good,
// 1 bad, 125 skip (it does not build, or the time verdict is inconclusive). Throws BadInput
// like bisect().
int bisect_check(const BisectOptions& options, std::FILE* out);

}  // namespace memtrade
