// `memtrade bisect`: the first commit that changed a point's memory or time (the search,
// harness/gate/bisect.h), and `bisect --check`, the same judgement of the current checkout with
// the exit codes of `git bisect run`.
#include <cstdio>

#include "harness/cli/command.h"
#include "harness/common/bad_input.h"
#include "harness/gate/bisect.h"
#include "harness/gate/thresholds.h"
#include "models/config/input_text.h"

namespace memtrade {
namespace {

struct BisectArgs {
  BisectOptions o;
  bool check = false;
  std::string thresholds;
};

int cmd_bisect(BisectArgs& a) {
  if (!a.check) {
    if (!a.thresholds.empty()) a.o.thresholds = Thresholds::load(a.thresholds);
    return bisect(a.o, stdout).kind == BisectOutcome::Kind::found ? 0 : 1;
  }
  // Under `git bisect run`, 1..127 (but 125) marks the commit bad: bad input must stop the
  // bisection instead (128), or a typo would mark every commit bad and name a wrong culprit.
  try {
    if (!a.thresholds.empty()) a.o.thresholds = Thresholds::load(a.thresholds);
    return bisect_check(a.o, stdout);
  } catch (const BadInput& e) {
    std::fprintf(stderr, "memtrade: %s\n", one_line(e.what()).c_str());
    return kBisectCheckBadInput;
  }
}

}  // namespace

void register_bisect_commands(CLI::App& app, Commands& cmds) {
  auto& a = cmds.keep<BisectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bisect",
      "Name the first commit between --good and --bad that changed a point's memory or time: "
      "exit 0 found, 1 none named (no change, or only unbuildable commits left), 2 bad input. "
      "With --check, judge the current checkout for `git bisect run`: 0 good, 1 bad, 125 skip");
  cmd->add_option("--good", a.o.good, "A commit where the point is good (the reference)")
      ->required();
  cmd->add_option("--bad", a.o.bad, "A later commit where it is bad (not with --check)");
  cmd->add_flag("--check", a.check,
                "Judge the current checkout of --repo (built in place) against --good, for "
                "`git bisect run`; the good build is kept in --work-dir for the next step");
  cmd->add_option("--select", a.o.select, "The point id (needed with --grid)");
  cmd->add_option("--grid", a.o.grid, "Grid TOML the point is in (else: the run flags after --)");
  cmd->add_option("--metric", a.o.metric,
                  "memory: any change of peak_allocated is bad; time: an interleaved A/B "
                  "against the good build, a regression of median_s is bad")
      ->check(CLI::IsMember({"memory", "time"}))
      ->capture_default_str();
  cmd->add_option("--repo", a.o.repo, "A folder of the git repository")->capture_default_str();
  cmd->add_option("--work-dir", a.o.work_dir,
                  "Worktree, builds and runs (default: a temporary folder, removed; with --check "
                  "<git common dir>/memtrade-bisect, kept)");
  cmd->add_option(
      "--build-cmd", a.o.build_cmd,
      "Build command, run by /bin/sh -c in the tree (default: " + default_build_command() + ")");
  cmd->add_option("--binary", a.o.binary, "The built binary, relative to the tree")
      ->capture_default_str();
  cmd->add_option("--backend", a.o.backend, "--backend of every run (\"\": the grid's)")
      ->capture_default_str();
  cmd->add_option("--rounds", a.o.rounds, "time: interleaved passes per commit")
      ->capture_default_str();
  cmd->add_option("--max-extra-rounds", a.o.max_extra_rounds,
                  "time: re-run an inconclusive commit, doubling the steps, up to N more rounds")
      ->capture_default_str();
  cmd->add_option("--thresholds", a.thresholds, "time: thresholds TOML (default: built-in)");
  cmd->add_option("run-flags", a.o.run_args,
                  "After --: flags for every `run` (the point's knob flags when there is no "
                  "--grid; --steps, --warmup, --threads, ...)");
  cmds.add(cmd, [&a] { return cmd_bisect(a); });
}

}  // namespace memtrade
