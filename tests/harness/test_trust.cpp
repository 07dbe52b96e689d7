// Whether a two-file compare may give a verdict (issue 29, harness/gate/trust.h): the
// environment guard, drift within a run, a shift that every point shows alike, and an A/A test
// of 20 sequential pairs on this machine that must give no false regression.
#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include "fixtures/gate_fixtures.h"
#include "harness/gate/trust.h"

namespace memtrade {
namespace {

using testing::CliResult;
using testing::json;
using testing::make_results;
using testing::run_cli;
using testing::scale_time;
using testing::TempDir;
using testing::write_file;

CliResult compare(TempDir& dir, const json& base, const json& head, const std::string& flags = "") {
  write_file(dir.file("base.json"), base.dump());
  write_file(dir.file("head.json"), head.dump());
  return run_cli("compare " + dir.file("base.json") + " " + dir.file("head.json") + " " + flags);
}

TEST(Trust, EnvironmentFacts) {
  const json meta = {{"backend", "cpu"},
                     {"device", "cpu (AMD EPYC, 2 threads, 23.5 GiB)"},
                     {"versions",
                      {{"OpenBLAS", "OpenBLAS 0.3.21 DYNAMIC_ARCH Haswell MAX_THREADS=64"},
                       {"memtrade", "0.1.0 (abc)"}}}};
  const auto env = environment_of(meta);
  EXPECT_EQ(env.at("CPU"), "AMD EPYC");
  EXPECT_EQ(env.at("threads"), "2");
  EXPECT_FALSE(env.count("memtrade"));  // the code under test is no environment
  json other = meta;
  other["device"] = "cpu (Intel(R) Xeon(R) Processor, 2 threads, 23.5 GiB)";
  other["versions"]["OpenBLAS"] = "OpenBLAS 0.3.21 DYNAMIC_ARCH SkylakeX MAX_THREADS=64";
  other["versions"]["memtrade"] = "0.2.0 (def)";
  EXPECT_EQ(environment_differences(meta, other),
            (std::vector<std::string>{"CPU 'AMD EPYC' vs 'Intel(R) Xeon(R) Processor'",
                                      "OpenBLAS 'Haswell' vs 'SkylakeX'"}));
  // A fact one side does not record (an older file) is not a difference.
  json older = other;
  older.erase("versions");
  older["device"] = meta["device"];
  EXPECT_TRUE(environment_differences(meta, older).empty());
}

TEST(Trust, ADifferentMachineIsNoVerdict) {
  TempDir dir;
  const json base = make_results(1);
  json head = make_results(2);
  head["meta"]["device"] = "cpu (other CPU, 2 threads, 8 GiB)";
  const CliResult r = compare(dir, base, head);
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("no verdict: BASE and HEAD come from different environments (CPU 'test' vs "
                       "'other CPU')"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(compare(dir, base, head, "--allow-env-change").rc, 0);
  // Memory alone on the CPU (time not gated) is exact on every CPU: judged, with a note.
  write_file(dir.file("t.toml"),
             "[defaults]\nmedian_s = {min_effect = 0.05, alpha = 0.05, gate = false}\n"
             "samples_per_s = {min_effect = 0.05, alpha = 0.05, gate = false}\n");
  const CliResult mem = compare(dir, base, head, "--thresholds " + dir.file("t.toml"));
  EXPECT_EQ(mem.rc, 0) << mem.err;
  EXPECT_NE(mem.err.find("memory is exact on every CPU"), std::string::npos) << mem.err;
  // A GPU's memory is not the same on another card: no verdict even for memory alone.
  json gb = base, gh = head;
  gb["meta"]["backend"] = gh["meta"]["backend"] = "cuda";
  gb["meta"]["device"] = "NVIDIA A100-SXM4-80GB";
  gh["meta"]["device"] = "NVIDIA H100 80GB HBM3";
  EXPECT_EQ(compare(dir, gb, gh, "--thresholds " + dir.file("t.toml")).rc, 2);
}

TEST(Trust, DriftWithinARunIsAnUnstableMachine) {
  TempDir dir;
  const json base = make_results(1);
  json head = make_results(2);
  // One of three points slower in HEAD, most of it in the second half of its run.
  auto& s = head["points"][0]["time"]["samples_s"];
  for (std::size_t i = 0; i < s.size(); ++i)
    s[i] = s[i].get<double>() * (i < s.size() / 2 ? 1.1 : 1.4);
  std::vector<double> v = s.get<std::vector<double>>();
  std::sort(v.begin(), v.end());
  head["points"][0]["time"]["median_s"] = (v[9] + v[10]) / 2;
  const CliResult r = compare(dir, base, head);
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("unstable machine: rerun interleaved (HEAD's run of gpt-tiny/b8/fp32 "
                       "drifts"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(compare(dir, base, head, "--allow-unstable").rc, 0);
  // The same slowdown spread over the whole run: the code's signature, a regression.
  json steady = make_results(2);
  scale_time(steady["points"][0], 1.12);
  EXPECT_EQ(compare(dir, base, steady).rc, 1);
}

TEST(Trust, AShiftEveryPointShowsAlikeIsAnUnstableMachine) {
  TempDir dir;
  const json base = make_results(1);
  json head = make_results(2);
  for (auto& p : head["points"]) scale_time(p, 1.25);  // a slow stretch lifts every step 25%
  const CliResult r = compare(dir, base, head);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.err.find("all 3 timed points moved alike"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("unstable machine: rerun interleaved"), std::string::npos) << r.out;
  // A memory regression is still one.
  head["points"][1]["memory"]["peak_allocated"] = 7'000'000;
  EXPECT_EQ(compare(dir, base, head).rc, 1);
}

// The reproducer, 20 times: two sequential runs of one build, then compare. Before, 1 in
// 5 said "2 regressions"; now each pair is unchanged or "unstable machine" (exit 2), never a
// regression (exit 1).
TEST(Trust, AATwentySequentialPairsGiveNoFalseRegression) {
  TempDir dir;
  const std::string point =
      "run --backend cpu --model gpt-tiny --batch-size 8 --warmup 3 --steps 24 --quiet --out ";
  int unstable = 0;
  for (int pair = 0; pair < 20; ++pair) {
    ASSERT_EQ(run_cli(point + dir.file("a.json")).rc, 0);
    ASSERT_EQ(run_cli(point + dir.file("b.json")).rc, 0);
    const CliResult r = run_cli("compare " + dir.file("a.json") + " " + dir.file("b.json"));
    EXPECT_NE(r.rc, 1) << "pair " << pair << ": a false regression\n" << r.out << r.err;
    EXPECT_TRUE(r.rc == 0 || r.rc == 2) << r.err;
    unstable += r.rc == 2;
  }
  std::printf("A/A: %d of 20 sequential pairs were an unstable machine, 0 regressions\n", unstable);
}

}  // namespace
}  // namespace memtrade
