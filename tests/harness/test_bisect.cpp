// `memtrade bisect` on a scratch repository of 8 commits whose "project" is a shell script
// standing in for memtrade (its `run` writes a real memtrade.results/1 file) and whose build
// copies it into build/: a memory or time regression is planted in the 5th commit. The search
// must name it building at most 4 commits (the good one included), skip a commit that does not
// build, and --check must give git bisect run's exit codes (and work under git bisect run).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "fixtures/gate_fixtures.h"

namespace memtrade {
namespace {

using namespace memtrade::testing;

const char* kPoint = "mlp-tiny/b8/fp32";

// The scratch project's memtrade: @PEAK@ bytes at its peak, step times scaled by @SLOW@.
// Its 20 step times are fixed (10.0 to 11.9 ms), so a time bisect is deterministic.
const char* kFakeSource = R"SH(#!/bin/sh
# A stand-in for memtrade: `run --list` and `run --select ID --out FILE` (other flags ignored).
set -eu
PEAK=@PEAK@
SLOW=@SLOW@
[ "${1:-}" = run ] || exit 2
shift
list=0 select="" out="" steps=20
while [ $# -gt 0 ]; do
  case "$1" in
    --list) list=1 ;;
    --select) shift; select="$1" ;;
    --out) shift; out="$1" ;;
    --steps) shift; steps="$1" ;;
    --grid|--backend) shift ;;
  esac
  shift
done
ids="mlp-tiny/b8/fp32
mlp-tiny/b16/fp32"
if [ "$list" = 1 ]; then echo "$ids"; exit 0; fi
echo "$ids" | grep -qxF -- "$select" || { echo "fake: no point $select" >&2; exit 2; }
samples=$(awk -v n="$steps" -v f="$SLOW" 'BEGIN { for (i = 0; i < n; i++)
  printf "%s%.6g", (i ? "," : ""), (0.0100 + 0.0001 * (i % 20)) * f }')
median=$(awk -v f="$SLOW" 'BEGIN { printf "%.6g", 0.01095 * f }')
cat > "$out" <<EOF
{"schema": "memtrade.results/1",
 "meta": {"backend": "cpu", "commit": "scratch", "device": "cpu (test)", "grid": "scratch",
          "host": "testhost", "time": "2026-12-01T00:00:00Z"},
 "points": [{"id": "$select",
   "config": {"model": "mlp-tiny", "batch_size": 8, "precision": "fp32", "seed": 0},
   "status": "ok", "error": null,
   "memory": {"peak_allocated": $PEAK, "peak_requested": $PEAK, "peak_reserved": 2097152,
              "breakdown_at_peak": {"params": 28672, "activations": $((PEAK - 28672))},
              "predicted_peak": $PEAK, "device_peak": null, "host_pinned_peak": 0},
   "time": {"samples_s": [$samples], "median_s": $median, "p10_s": $median,
            "p90_s": $median, "cv": 0.06},
   "throughput": {"samples_per_s": 730.6, "tokens_per_s": 730.6, "flops_per_step": 325632.0,
                  "tflops": 0.0003, "mfu": null},
   "train": {"loss_first": 2.27, "loss_last": 2.33, "loss_scale": 1.0, "skipped_steps": 0},
   "wall_s": 0.3}]}
EOF
)SH";

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (auto pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
  return s;
}

// stdout of a shell command; fails the test when it fails.
std::string sh(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << cmd;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::size_t lines(const std::string& text) {
  std::size_t n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

enum class Planted { memory, time };

// dir/repo: commits 1..8, the regression from commit 5 on; commit `broken` (0: none) holds a
// file `broken` that makes the build fail (the next commit deletes it). dir/builds.log gets one
// line per build.
class ScratchRepo {
 public:
  explicit ScratchRepo(Planted planted, int broken = 0) {
    const std::string git = "git -C " + repo() +
                            " -c user.name=memtrade -c user.email=memtrade@test "
                            "-c commit.gpgsign=false ";
    sh("git init -q " + repo());
    write_file(dir_.file("grid.toml"), "name = \"scratch\"\n");
    for (int k = 1; k <= 8; ++k) {
      const bool regressed = k >= 5;
      std::string src = replace_all(
          kFakeSource, "@PEAK@",
          std::to_string(10 * 1048576 + (regressed && planted == Planted::memory ? 1048576 : 0)));
      src = replace_all(src, "@SLOW@", regressed && planted == Planted::time ? "1.15" : "1.00");
      write_file(repo() + "/memtrade.sh", src);
      write_file(repo() + "/version.txt", std::to_string(k) + "\n");
      if (k == broken) write_file(repo() + "/broken", "this commit does not build\n");
      if (k == broken + 1 && broken > 0) sh("rm " + repo() + "/broken");
      const std::string subject =
          k == 5 ? "commit 5: keep the activations one step longer" : "commit " + std::to_string(k);
      sh(git + "add -A && " + git + "commit -q -m '" + subject + "'");
      shas_.push_back(sh(git + "rev-parse HEAD"));
    }
  }
  std::string repo() const { return dir_.file("repo"); }
  std::string grid() const { return dir_.file("grid.toml"); }
  std::string builds_log() const { return dir_.file("builds.log"); }
  std::string sha(int k) const { return shas_.at(static_cast<std::size_t>(k - 1)); }
  std::string file(const std::string& name) const { return dir_.file(name); }
  // "Builds" the checkout: copies the script to build/memtrade, one line in builds.log.
  std::string build_flag() const {
    return "--build-cmd '[ ! -e broken ] && mkdir -p build && cp memtrade.sh build/memtrade && "
           "chmod +x build/memtrade && echo built >> \"" +
           builds_log() + "\"'";
  }
  std::size_t builds() const { return lines(read_file(builds_log())); }
  void checkout(int k) const { sh("git -C " + repo() + " checkout -q --detach " + sha(k)); }

 private:
  TempDir dir_;
  std::vector<std::string> shas_;
};

std::string bisect_args(const ScratchRepo& r, const std::string& extra = "") {
  return "bisect --repo " + r.repo() + " --good " + r.sha(1) + " --bad " + r.sha(8) + " --grid " +
         r.grid() + " --select " + kPoint + " " + r.build_flag() + " " + extra;
}

std::string work_dir_of(const std::string& transcript) {
  const auto at = transcript.find("(work dir ");
  if (at == std::string::npos) return "";
  const auto start = at + 10;
  return transcript.substr(start, transcript.find(')', start) - start);
}

TEST(Bisect, NamesTheFifthCommitBuildingAtMostFour) {
  const ScratchRepo r(Planted::memory);
  const CliResult res = run_cli(bisect_args(r));
  std::fputs(res.out.c_str(), stdout);  // the transcript, for the log
  ASSERT_EQ(res.rc, 0) << res.out << res.err;
  EXPECT_NE(res.out.find("first bad commit: " + r.sha(5) +
                         " commit 5: keep the activations one step longer\n"),
            std::string::npos)
      << res.out;
  EXPECT_LE(r.builds(), 4u) << res.out;
  EXPECT_NE(res.out.find("(+1.00 MiB)"), std::string::npos) << res.out;
  EXPECT_EQ(res.err, "");
  // The worktree and the temporary work dir are gone.
  EXPECT_EQ(lines(sh("git -C " + r.repo() + " worktree list") + "\n"), 1u);
  const std::string work = work_dir_of(res.out);
  ASSERT_FALSE(work.empty()) << res.out;
  EXPECT_FALSE(fs::exists(work)) << work;
}

TEST(Bisect, SkipsACommitThatDoesNotBuild) {
  const ScratchRepo r(Planted::memory, /*broken=*/6);
  const CliResult res = run_cli(bisect_args(r, "--work-dir " + r.file("work")));
  ASSERT_EQ(res.rc, 0) << res.out << res.err;
  EXPECT_NE(res.out.find("first bad commit: " + r.sha(5)), std::string::npos) << res.out;
  EXPECT_NE(res.out.find(r.sha(6).substr(0, 10)), std::string::npos) << res.out;
  EXPECT_NE(res.out.find("build failed"), std::string::npos) << res.out;
  EXPECT_NE(res.out.find("skip\n"), std::string::npos) << res.out;
  // A given work dir is kept (its build logs and runs), the worktree in it removed.
  EXPECT_TRUE(fs::exists(r.file("work/build-good.log")));
  EXPECT_FALSE(fs::exists(r.file("work/tree")));
}

// When every commit up to BAD measures good, BAD is measured too: no first bad commit, exit 1.
TEST(Bisect, NoChangeIsExitOne) {
  const ScratchRepo r(Planted::memory);
  const CliResult res =
      run_cli("bisect --repo " + r.repo() + " --good " + r.sha(1) + " --bad " + r.sha(4) +
              " --grid " + r.grid() + " --select " + kPoint + " " + r.build_flag());
  EXPECT_EQ(res.rc, 1) << res.out << res.err;
  EXPECT_NE(res.out.find("no change: every commit up to bad " + r.sha(4).substr(0, 10)),
            std::string::npos)
      << res.out;
  EXPECT_EQ(res.out.find("first bad commit"), std::string::npos) << res.out;
}

TEST(Bisect, TimeRegressionThroughInterleavedRuns) {
  const ScratchRepo r(Planted::time);
  const CliResult res = run_cli(bisect_args(r, "--metric time --rounds 1"));
  ASSERT_EQ(res.rc, 0) << res.out << res.err;
  EXPECT_NE(res.out.find("first bad commit: " + r.sha(5)), std::string::npos) << res.out;
  EXPECT_NE(res.out.find("+15.00%"), std::string::npos) << res.out;
  EXPECT_LE(r.builds(), 4u) << res.out;
}

TEST(Bisect, CheckModeGivesGitBisectRunExitCodes) {
  const ScratchRepo r(Planted::memory);
  const std::string check = "bisect --check --repo " + r.repo() + " --good " + r.sha(1) +
                            " --grid " + r.grid() + " --select " + kPoint + " " + r.build_flag();
  r.checkout(3);
  CliResult res = run_cli(check);
  EXPECT_EQ(res.rc, 0) << res.out << res.err;
  r.checkout(6);
  res = run_cli(check);
  EXPECT_EQ(res.rc, 1) << res.out << res.err;
  EXPECT_NE(res.out.find("(+1.00 MiB)"), std::string::npos) << res.out;
  write_file(r.repo() + "/broken", "");
  res = run_cli(check);
  EXPECT_EQ(res.rc, 125) << res.out << res.err;
  fs::remove(r.repo() + "/broken");
  // The good build was made once and kept for the steps after it; the broken one logs nothing.
  EXPECT_EQ(r.builds(), 1u + 2u);

  // Under git bisect run itself.
  const std::string git = "cd " + r.repo() + " && git ";
  sh(git + "bisect start " + r.sha(8) + " " + r.sha(1) + " >/dev/null");
  const std::string log = sh(git + "bisect run " + MEMTRADE_BINARY + " " + check + " 2>&1");
  sh(git + "bisect reset >/dev/null 2>&1");
  EXPECT_NE(log.find(r.sha(5) + " is the first bad commit"), std::string::npos) << log;
}

// Bad input is exit 2 with one line; under --check it is 128, which stops `git bisect run`
// (2 would mark the commit bad and name a wrong culprit).
TEST(Bisect, BadInputIsExitTwoWithOneLine) {
  const ScratchRepo r(Planted::memory);
  const TempDir not_a_repo;
  const std::string common = " --grid " + r.grid() + " " + r.build_flag();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"unknown sha", "bisect --repo " + r.repo() + " --good deadbeef --bad " + r.sha(8) +
                          " --select " + kPoint + common},
      {"not a repo", "bisect --repo " + not_a_repo.path().string() + " --good " + r.sha(1) +
                         " --bad " + r.sha(8) + " --select " + kPoint + common},
      {"good after bad", "bisect --repo " + r.repo() + " --good " + r.sha(8) + " --bad " +
                             r.sha(1) + " --select " + kPoint + common},
      {"no such point", "bisect --repo " + r.repo() + " --good " + r.sha(1) + " --bad " + r.sha(8) +
                            " --select mlp-tiny/b3/fp32" + common},
      {"check, no such point", "bisect --check --repo " + r.repo() + " --good " + r.sha(1) +
                                   " --select 'odd\nid'" + common},
      {"check, bad metric", "bisect --check --repo " + r.repo() + " --good " + r.sha(1) +
                                " --select " + kPoint + " --metric speed" + common},
      {"bad metric", "bisect --repo " + r.repo() + " --good " + r.sha(1) + " --bad " + r.sha(8) +
                         " --select " + kPoint + " --metric speed" + common},
  };
  for (const auto& [what, args] : cases) {
    const CliResult res = run_cli(args);
    EXPECT_EQ(res.rc, what.rfind("check", 0) == 0 ? 128 : 2) << what << ": " << res.out << res.err;
    EXPECT_EQ(lines(res.err), 1u) << what << ": " << res.err;
    EXPECT_EQ(res.err.rfind("memtrade: ", 0), 0u) << what << ": " << res.err;
  }
}

}  // namespace
}  // namespace memtrade
