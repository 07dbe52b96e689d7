// `memtrade compare` on files: verdicts, exit codes through the real CLI, each reporter parsed
// back as a contract, Google Benchmark input, and the A/B driver with a fake binary.
#include <gtest/gtest.h>

#include <cstdlib>

#include "fixtures/gate_fixtures.h"
#include "harness/common/bad_input.h"
#include "harness/gate/compare.h"
#include "harness/gate/compare_ab.h"
#include "harness/gate/compare_report.h"

namespace memtrade {
namespace {

using namespace memtrade::testing;

const CompareRow* find_row(const Comparison& c, const std::string& point, const std::string& m) {
  for (const auto& r : c.rows)
    if (r.point == point && r.metric == m) return &r;
  return nullptr;
}

Comparison compare_docs(const json& base, const json& head, const Thresholds& t = Thresholds()) {
  return compare_results(results_from_json(base, "base"), results_from_json(head, "head"), t);
}

std::size_t occurrences(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = hay.find(needle); pos != std::string::npos; pos = hay.find(needle, pos + 1)) ++n;
  return n;
}

class CompareFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = make_results(1);
    head_ = make_results(2);  // same distribution, fresh noise
    write_file(dir_.file("base.json"), base_.dump());
  }
  int cli(const json& head, const std::string& extra = "") {
    write_file(dir_.file("head.json"), head.dump());
    last_ =
        run_cli("compare " + dir_.file("base.json") + " " + dir_.file("head.json") + " " + extra);
    return last_.rc;
  }
  TempDir dir_;
  json base_, head_;
  CliResult last_;
};

TEST_F(CompareFiles, SameFileIsClean) {
  EXPECT_EQ(cli(base_), 0) << last_.out << last_.err;
  const Comparison c = compare_docs(base_, base_);
  EXPECT_EQ(c.exit_code(), 0);
  EXPECT_EQ(c.count(Verdict::regression) + c.count(Verdict::improvement), 0u);
  // 3 points x (peak_allocated, peak_reserved, median_s, samples_per_s)
  EXPECT_EQ(c.rows.size(), 12u);
}

TEST_F(CompareFiles, FreshNoiseIsClean) {
  EXPECT_EQ(cli(head_), 0) << last_.out << last_.err;
}

TEST_F(CompareFiles, PeakRaisedTwoPercentIsRegression) {
  json head = base_;
  head["points"][1]["memory"]["peak_allocated"] = 6'120'000;
  EXPECT_EQ(cli(head), 1) << last_.out;
  EXPECT_NE(last_.out.find("gpt-tiny/b8/fp16 peak_allocated"), std::string::npos) << last_.out;
  const Comparison c = compare_docs(base_, head);
  const CompareRow* r = find_row(c, "gpt-tiny/b8/fp16", "peak_allocated");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->verdict, Verdict::regression);
  EXPECT_NEAR(r->change, 0.02, 1e-12);
  // Lower by the same margin is an improvement, and one byte over an exact gate still counts.
  head["points"][1]["memory"]["peak_allocated"] = 5'000'000;
  EXPECT_EQ(find_row(compare_docs(base_, head), "gpt-tiny/b8/fp16", "peak_allocated")->verdict,
            Verdict::improvement);
  head["points"][1]["memory"]["peak_allocated"] = 6'000'001;
  EXPECT_EQ(compare_docs(base_, head).exit_code(), 1);
}

TEST_F(CompareFiles, ThresholdOverrideMatchesGlobOnConfig) {
  json head = base_;
  head["points"][1]["memory"]["peak_allocated"] = 6'120'000;  // fp16 point +2%
  write_file(dir_.file("t.toml"), R"(
[defaults]
peak_allocated = {rel = 0.0, abs = 0}
[[override]]
match = {precision = "fp16", model = "gpt-*"}
peak_allocated = {rel = 0.03}
)");
  EXPECT_EQ(cli(head, "--thresholds " + dir_.file("t.toml")), 0) << last_.out << last_.err;
  head["points"][0]["memory"]["peak_allocated"] = 10'200'000;  // fp32 point +2%: not overridden
  EXPECT_EQ(cli(head, "--thresholds " + dir_.file("t.toml")), 1) << last_.out;
}

TEST_F(CompareFiles, SlowerSamplesAreRegression) {
  json head = head_;
  scale_time(head["points"][2], 1.3);
  EXPECT_EQ(cli(head), 1) << last_.out;
  const Comparison c = compare_docs(base_, head);
  for (const char* m : {"median_s", "samples_per_s"}) {
    const CompareRow* r = find_row(c, "mlp-tiny/b8/fp32", m);
    ASSERT_NE(r, nullptr) << m;
    EXPECT_EQ(r->verdict, Verdict::regression) << m;
    ASSERT_TRUE(r->p_adj.has_value());
    EXPECT_LT(*r->p_adj, 0.05);
  }
  // Faster is an improvement, not a failure.
  json faster = head_;
  scale_time(faster["points"][2], 0.7);
  const Comparison f = compare_docs(base_, faster);
  EXPECT_EQ(find_row(f, "mlp-tiny/b8/fp32", "median_s")->verdict, Verdict::improvement);
  EXPECT_EQ(f.exit_code(), 0);
}

TEST_F(CompareFiles, UngatedTimeIsShownButPasses) {
  json head = head_;
  scale_time(head["points"][2], 1.3);
  write_file(dir_.file("t.toml"), R"(
[defaults]
median_s = {min_effect = 0.05, alpha = 0.05, gate = false}
samples_per_s = {min_effect = 0.05, alpha = 0.05, gate = false}
)");
  EXPECT_EQ(cli(head, "--thresholds " + dir_.file("t.toml")), 0) << last_.out << last_.err;
  EXPECT_NE(last_.out.find("not gated"), std::string::npos) << last_.out;
}

TEST_F(CompareFiles, OkToOomIsRegressionAndBack) {
  json head = head_;
  head["points"][0]["status"] = "oom";
  head["points"][0]["error"] = "out of memory";
  head["points"][0]["memory"] = nullptr;
  head["points"][0]["time"] = nullptr;
  EXPECT_EQ(cli(head), 1) << last_.out;
  const Comparison back = compare_docs(head, base_);
  EXPECT_EQ(find_row(back, "gpt-tiny/b8/fp32", "status")->verdict, Verdict::improvement);
  EXPECT_EQ(back.exit_code(), 0);
}

TEST_F(CompareFiles, AddedAndRemovedPointsListed) {
  json head = head_;
  head["points"][2]["id"] = "mlp-tiny/b16/fp32";
  const Comparison c = compare_docs(base_, head);
  EXPECT_EQ(c.added, std::vector<std::string>{"mlp-tiny/b16/fp32"});
  EXPECT_EQ(c.removed, std::vector<std::string>{"mlp-tiny/b8/fp32"});
  EXPECT_EQ(c.matched, 2u);
  EXPECT_EQ(c.exit_code(), 1);  // a base point HEAD lost fails the gate
  GateRules allow;
  allow.allow_removed = true;
  EXPECT_EQ(compare_results(results_from_json(base_, "base"), results_from_json(head, "head"),
                            Thresholds(), allow)
                .exit_code(),
            0);
}

// The gate never passes on what it did not see (issue: it passed on 3 of 27 points and on 0).
TEST_F(CompareFiles, MissingPointFailsNamingItAndEmptyHeadIsBadInput) {
  json head = head_;
  head["points"].erase(1);
  EXPECT_EQ(cli(head), 1) << last_.out << last_.err;
  EXPECT_NE(last_.out.find("missing       gpt-tiny/b8/fp16"), std::string::npos) << last_.out;
  EXPECT_NE(last_.out.find("FAIL"), std::string::npos) << last_.out;
  EXPECT_EQ(cli(head, "--allow-removed"), 0) << last_.out << last_.err;
  EXPECT_NE(last_.out.find("removed       gpt-tiny/b8/fp16"), std::string::npos) << last_.out;

  json empty = head_;
  empty["points"] = json::array();
  EXPECT_EQ(cli(empty), 2);
  EXPECT_NE(last_.err.find("nothing to judge"), std::string::npos) << last_.err;
  EXPECT_EQ(std::count(last_.err.begin(), last_.err.end(), '\n'), 1) << last_.err;
  EXPECT_EQ(cli(empty, "--allow-removed"), 2);  // allowing removals does not make 0 points pass

  json renamed_all = head_;  // every id changed: nothing matches
  for (auto& p : renamed_all["points"]) p["id"] = p["id"].get<std::string>() + "/new";
  EXPECT_EQ(cli(renamed_all), 2) << last_.out;
  EXPECT_EQ(cli(base_), 0);
}

TEST_F(CompareFiles, RenamesJudgeTheOldPointAgainstTheNewId) {
  json head = head_;
  head["points"][1]["id"] = "gpt-tiny/b8/fp16-o2";
  EXPECT_EQ(cli(head), 1) << last_.out;  // a rename undeclared: the old id is missing
  EXPECT_EQ(cli(head, "--rename gpt-tiny/b8/fp16=gpt-tiny/b8/fp16-o2"), 0) << last_.out;
  EXPECT_NE(last_.out.find("renamed       gpt-tiny/b8/fp16 -> gpt-tiny/b8/fp16-o2"),
            std::string::npos)
      << last_.out;
  // The renamed point is judged: a regression under its new id still fails.
  head["points"][1]["memory"]["peak_allocated"] = 7'000'000;
  EXPECT_EQ(cli(head, "--rename gpt-tiny/b8/fp16=gpt-tiny/b8/fp16-o2"), 1) << last_.out;
  EXPECT_NE(last_.out.find("gpt-tiny/b8/fp16-o2 peak_allocated"), std::string::npos) << last_.out;
  // The same through a map file; a rename of a point BASE does not have is bad input.
  write_file(dir_.file("map.json"), R"({"gpt-tiny/b8/fp16": "gpt-tiny/b8/fp16-o2"})");
  EXPECT_EQ(cli(head, "--rename-map " + dir_.file("map.json")), 1);
  EXPECT_EQ(cli(head, "--rename no/such/id=x"), 2);
  EXPECT_EQ(cli(head, "--rename nonsense"), 2);
}

TEST_F(CompareFiles, FewSamplesInconclusiveAndOptionallyFatal) {
  json base = base_, head = head_;
  for (json* d : {&base, &head})
    for (auto& p : (*d)["points"]) p["time"]["samples_s"] = {0.02, 0.021, 0.019};
  write_file(dir_.file("base.json"), base.dump());
  EXPECT_EQ(cli(head), 0) << last_.out;
  EXPECT_NE(last_.out.find("inconclusive"), std::string::npos);
  EXPECT_EQ(cli(head, "--fail-on-inconclusive"), 1);
}

TEST_F(CompareFiles, BadInputExitsTwoWithOneLine) {
  write_file(dir_.file("garbage.json"), "this is not json {");
  std::string truncated = base_.dump();
  truncated.resize(truncated.size() / 2);
  write_file(dir_.file("trunc.json"), truncated);
  write_file(dir_.file("schema.json"), R"({"schema": "memtrade.results/9", "points": []})");
  write_file(dir_.file("bad.toml"), "[defaults\nmedian_s = 3\n");
  write_file(dir_.file("typo.toml"), "[defaults]\nmedian_s = {min_efect = 0.1}\n");
  const std::string base = dir_.file("base.json");
  for (const std::string& args :
       {base + " " + dir_.file("garbage.json"), dir_.file("trunc.json") + " " + base,
        base + " " + dir_.file("schema.json"), base + " " + dir_.file("missing.json"),
        base + " " + base + " --thresholds " + dir_.file("bad.toml"),
        base + " " + base + " --thresholds " + dir_.file("typo.toml"),
        base + " " + base + " --format yaml"}) {
    const CliResult r = run_cli("compare " + args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.out << r.err;
    EXPECT_EQ(occurrences(r.err, "\n"), 1u) << r.err;
  }
  EXPECT_THROW(load_results(dir_.file("trunc.json")), BadInput);
}

TEST_F(CompareFiles, JsonReporterContract) {
  json head = head_;
  head["points"][1]["memory"]["peak_allocated"] = 6'120'000;
  ASSERT_EQ(cli(head, "--format json --output " + dir_.file("c.json")), 1);
  const json doc = json::parse(read_file(dir_.file("c.json")));
  EXPECT_EQ(doc["schema"], "memtrade.compare/1");
  EXPECT_EQ(doc["summary"]["regressions"], 1);
  EXPECT_EQ(doc["summary"]["exit_code"], 1);
  ASSERT_EQ(doc["results"].size(), 12u);
  int regressions = 0;
  for (const auto& r : doc["results"]) {
    for (const char* k : {"point", "metric", "base", "head", "change", "p", "p_adj", "verdict"})
      EXPECT_TRUE(r.contains(k)) << k;
    if (r["verdict"] == "regression") {
      ++regressions;
      EXPECT_EQ(r["point"], "gpt-tiny/b8/fp16");
      EXPECT_EQ(r["metric"], "peak_allocated");
      EXPECT_EQ(r["base"], 6'000'000);
      EXPECT_EQ(r["head"], 6'120'000);
      EXPECT_NEAR(r["change"].get<double>(), 0.02, 1e-12);
    }
    if (r["metric"] == "median_s") {
      EXPECT_TRUE(r["p"].is_number());
    }
  }
  EXPECT_EQ(regressions, 1);
}

TEST_F(CompareFiles, JunitReporterContract) {
  json head = head_;
  scale_time(head["points"][2], 1.3);
  for (auto& p : head["points"]) p["time"]["samples_s"] = json::array({0.1, 0.1});  // inconclusive
  head["points"][0]["memory"]["peak_allocated"] = 20'000'000;
  const Comparison c = compare_docs(base_, head);
  const std::string xml = report_junit(c);
  EXPECT_EQ(occurrences(xml, "<testcase "), c.rows.size());
  EXPECT_EQ(occurrences(xml, "</testcase>"), c.rows.size());
  EXPECT_EQ(occurrences(xml, "<failure "), 1u);
  EXPECT_EQ(occurrences(xml, "<skipped "), c.count(Verdict::inconclusive));
  EXPECT_GT(c.count(Verdict::inconclusive), 0u);
  EXPECT_NE(xml.find("tests=\"" + std::to_string(c.rows.size()) + "\" failures=\"1\""),
            std::string::npos);
  const auto fail = xml.find("<failure ");
  const auto tc = xml.rfind("<testcase ", fail);
  EXPECT_NE(
      xml.substr(tc, fail - tc).find("classname=\"gpt-tiny/b8/fp32\" name=\"peak_allocated\""),
      std::string::npos);
  EXPECT_EQ(xml.rfind("<?xml", 0), 0u);
}

TEST_F(CompareFiles, MarkdownReporterContract) {
  json head = head_;
  head["points"][0]["memory"]["peak_allocated"] = 10'200'000;
  head["points"][2]["id"] = "mlp-tiny/b16/fp32";
  const std::string md = report_markdown(compare_docs(base_, head));
  const auto reg = md.find("### Regressions (1)");
  ASSERT_NE(reg, std::string::npos) << md;
  EXPECT_NE(md.find("| `gpt-tiny/b8/fp32` | peak_allocated | 9.54 MiB | 9.73 MiB | +2.00%"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("FAIL: 1 regression"), std::string::npos) << md;
  EXPECT_NE(md.find("- added (not judged): `mlp-tiny/b16/fp32`"), std::string::npos) << md;
  EXPECT_NE(md.find("### Missing from head (failure)\n\n- `mlp-tiny/b8/fp32`"), std::string::npos)
      << md;
  const std::string clean = report_markdown(compare_docs(base_, base_));
  EXPECT_NE(clean.find("PASS"), std::string::npos);
  EXPECT_EQ(clean.find("### Regressions"), std::string::npos);
}

TEST_F(CompareFiles, TextReporterColorsOnlyWhenAsked) {
  json head = head_;
  head["points"][0]["memory"]["peak_allocated"] = 10'200'000;
  const Comparison c = compare_docs(base_, head);
  EXPECT_EQ(report_text(c, false).find("\033["), std::string::npos);
  EXPECT_NE(report_text(c, true).find("\033[31m"), std::string::npos);
  EXPECT_NE(report_text(c, false).find("regression"), std::string::npos);
  // Through the CLI stdout is a file, not a TTY: no escapes.
  EXPECT_EQ(cli(head), 1);
  EXPECT_EQ(last_.out.find("\033["), std::string::npos);
}

json gbench(double real_ns, double bytes_per_second, int reps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  json benchmarks = json::array();
  const auto times = step_samples(rng, reps, real_ns, 0.02);
  for (int i = 0; i < reps; ++i)
    benchmarks.push_back(
        {{"name", "BM_Gemm/256"},
         {"run_name", "BM_Gemm/256"},
         {"run_type", "iteration"},
         {"repetitions", reps},
         {"repetition_index", i},
         {"iterations", 1000},
         {"real_time", times[static_cast<std::size_t>(i)]},
         {"cpu_time", times[static_cast<std::size_t>(i)]},
         {"time_unit", "ns"},
         {"bytes_per_second", bytes_per_second * real_ns / times[static_cast<std::size_t>(i)]}});
  benchmarks.push_back({{"name", "BM_Gemm/256_mean"},
                        {"run_name", "BM_Gemm/256"},
                        {"run_type", "aggregate"},
                        {"aggregate_name", "mean"},
                        {"real_time", real_ns},
                        {"time_unit", "ns"}});
  return {{"context", {{"date", "2026-11-29"}, {"num_cpus", 2}}}, {"benchmarks", benchmarks}};
}

TEST(CompareGbench, RepetitionsAreSamplesAndUnitsConverted) {
  const ResultSet rs = results_from_json(gbench(1500, 1e9, 10, 1), "gb");
  ASSERT_EQ(rs.points.size(), 1u);
  EXPECT_EQ(rs.format, "gbench");
  const auto& m = rs.points[0].metrics;
  ASSERT_TRUE(m.contains("real_time") && m.contains("cpu_time") && m.contains("bytes_per_second"));
  EXPECT_EQ(m.at("real_time").samples.size(), 10u);
  EXPECT_NEAR(m.at("real_time").value, 1.5e-6, 1e-7);
  EXPECT_FALSE(m.contains("iterations"));

  TempDir dir;
  write_file(dir.file("a.json"), gbench(1500, 1e9, 10, 1).dump());
  write_file(dir.file("b.json"), gbench(1500, 1e9, 10, 2).dump());
  write_file(dir.file("c.json"), gbench(2000, 1e9 * 1500 / 2000, 10, 3).dump());
  EXPECT_EQ(run_cli("compare " + dir.file("a.json") + " " + dir.file("b.json")).rc, 0);
  const CliResult slow = run_cli("compare " + dir.file("a.json") + " " + dir.file("c.json"));
  EXPECT_EQ(slow.rc, 1) << slow.out;
  // A rate counter is higher-is-better: it dropped, so it regressed too.
  EXPECT_NE(slow.out.find("BM_Gemm/256 bytes_per_second"), std::string::npos) << slow.out;
}

// ---- A/B with a fake binary ---------------------------------------------------------------------

// A fake "memtrade" in dir/NAME/ with canned per-point results from `doc`.
std::string fake_binary(const TempDir& dir, const std::string& name, const json& doc) {
  const fs::path d = dir.path() / name;
  fs::create_directories(d / "points");
  fs::copy_file(fs::path(MEMTRADE_SOURCE_DIR) / "tests/harness/fixtures/fake_memtrade.sh",
                d / "memtrade");
  std::string ids;
  for (std::size_t i = 0; i < doc["points"].size(); ++i) {
    ids += doc["points"][i]["id"].get<std::string>() + "\n";
    json one = doc;
    one["points"] = json::array({doc["points"][i]});
    write_file((d / "points" / (std::to_string(i + 1) + ".json")).string(), one.dump());
  }
  write_file((d / "ids.txt").string(), ids);
  return (d / "memtrade").string();
}

AbOptions ab_options(const std::string& base_bin, const std::string& head_bin,
                     const std::string& grid, int rounds = 1, const std::string& work_dir = "") {
  AbOptions o;
  o.base_bin = base_bin;
  o.head_bin = head_bin;
  o.grid = grid;
  o.rounds = rounds;
  o.work_dir = work_dir;
  return o;
}

// The same gate rules hold for Google Benchmark inputs: a lost benchmark fails, none is bad input.
TEST(CompareGbench, MissingBenchmarkFailsAndNoneIsBadInput) {
  json two = gbench(1500, 1e9, 10, 1);
  json other = gbench(900, 1e9, 10, 4);
  for (auto& b : other["benchmarks"]) {
    b["name"] = "BM_Gemm/128";
    b["run_name"] = "BM_Gemm/128";
  }
  for (const auto& b : other["benchmarks"]) two["benchmarks"].push_back(b);
  json one = gbench(1500, 1e9, 10, 2);
  json none = one;
  none["benchmarks"] = json::array();
  TempDir dir;
  write_file(dir.file("two.json"), two.dump());
  write_file(dir.file("one.json"), one.dump());
  write_file(dir.file("none.json"), none.dump());
  const CliResult lost = run_cli("compare " + dir.file("two.json") + " " + dir.file("one.json"));
  EXPECT_EQ(lost.rc, 1) << lost.out;
  EXPECT_NE(lost.out.find("missing       BM_Gemm/128"), std::string::npos) << lost.out;
  EXPECT_EQ(
      run_cli("compare " + dir.file("two.json") + " " + dir.file("one.json") + " --allow-removed")
          .rc,
      0);
  EXPECT_EQ(run_cli("compare " + dir.file("two.json") + " " + dir.file("none.json")).rc, 2);
}

TEST(CompareAb, InterleavesAlternatesAndMerges) {
  TempDir dir;
  json head_doc = make_results(2);
  scale_time(head_doc["points"][1], 1.3);
  const std::string old_bin = fake_binary(dir, "old", make_results(1));
  const std::string new_bin = fake_binary(dir, "new", head_doc);
  write_file(dir.file("grid.toml"), "name = \"smoke\"\n");
  const std::string log = dir.file("calls.log");
  setenv("FAKE_MEMTRADE_LOG", log.c_str(), 1);

  const AbOptions o = ab_options(old_bin, new_bin, dir.file("grid.toml"), 2, dir.file("work"));
  const AbResults r = run_ab(o, nullptr);
  EXPECT_EQ(r.base["points"].size(), 3u);
  EXPECT_EQ(r.head["points"].size(), 3u);
  // Two rounds pool 2 x 20 samples per point.
  EXPECT_EQ(r.head["points"][0]["time"]["samples_s"].size(), 40u);
  EXPECT_EQ(r.base["meta"]["commit"], "c0ffee");
  const std::string calls = read_file(log);
  const std::string p0 = "gpt-tiny/b8/fp32", p1 = "gpt-tiny/b8/fp16";
  const std::string p2 = "mlp-tiny/b8/fp32";
  // Point by point, the order flipping with the point index and again with the round.
  const std::string expected = "old " + p0 + "\nnew " + p0 + "\nnew " + p1 + "\nold " + p1 +
                               "\nold " + p2 + "\nnew " + p2 + "\n" +  // round 1
                               "new " + p0 + "\nold " + p0 + "\nold " + p1 + "\nnew " + p1 +
                               "\nnew " + p2 + "\nold " + p2 + "\n";  // round 2
  EXPECT_EQ(calls, expected);
  EXPECT_EQ(occurrences(calls, "\n"), 12u);

  // Through the CLI: the slowed point regresses.
  const CliResult cli = run_cli("compare --base-bin " + old_bin + " --head-bin " + new_bin +
                                " --grid " + dir.file("grid.toml") + " --format json");
  unsetenv("FAKE_MEMTRADE_LOG");
  EXPECT_EQ(cli.rc, 1) << cli.out << cli.err;
  const json doc = json::parse(cli.out);
  for (const auto& row : doc["results"])
    if (row["verdict"] == "regression") {
      EXPECT_EQ(row["point"], p1);
    }
  EXPECT_GE(doc["summary"]["regressions"].get<int>(), 1);
}

TEST(CompareAb, CrashedRunBecomesErrorPoint) {
  TempDir dir;
  const json base_doc = make_results(1);
  const std::string old_bin = fake_binary(dir, "old", base_doc);
  const std::string new_bin = fake_binary(dir, "new", base_doc);
  fs::remove(dir.path() / "new" / "points" / "2.json");  // the head binary "crashes" on point 2
  write_file(dir.file("grid.toml"), "name = \"smoke\"\n");
  const AbResults r = run_ab(ab_options(old_bin, new_bin, dir.file("grid.toml")), nullptr);
  EXPECT_EQ(r.head["points"][1]["status"], "error");
  const Comparison c =
      compare_results(results_from_json(r.base, "b"), results_from_json(r.head, "h"), Thresholds());
  EXPECT_EQ(c.exit_code(), 1);
  EXPECT_THROW(run_ab(ab_options(old_bin, dir.file("nope"), dir.file("grid.toml")), nullptr),
               BadInput);
}

// Adaptive resampling: a point with too few samples is inconclusive after the first pass; an
// extra round of only that point, with twice its steps, pools enough samples for a verdict.
TEST(CompareAb, ExtraRoundsResolveInconclusivePoints) {
  TempDir dir;
  json base_doc = make_results(1), head_doc = make_results(2);
  for (json* doc : {&base_doc, &head_doc}) {
    auto& samples = (*doc)["points"][1]["time"]["samples_s"];
    samples.erase(samples.begin() + 3, samples.end());  // 3 steps: fewer than min_samples 5
  }
  scale_time(head_doc["points"][1], 1.3);
  const std::string old_bin = fake_binary(dir, "old", base_doc);
  const std::string new_bin = fake_binary(dir, "new", head_doc);
  write_file(dir.file("grid.toml"), "name = \"smoke\"\n");
  const std::string log = dir.file("calls.log");
  setenv("FAKE_MEMTRADE_LOG", log.c_str(), 1);
  const std::string p1 = "gpt-tiny/b8/fp16";

  AbOptions o = ab_options(old_bin, new_bin, dir.file("grid.toml"));
  o.max_extra_rounds = 3;
  AbResults r = run_ab(o, nullptr);
  const CompareRow* before = find_row(compare_docs(r.base, r.head), p1, "median_s");
  ASSERT_NE(before, nullptr);
  EXPECT_EQ(before->verdict, Verdict::inconclusive);
  const std::size_t first_pass = occurrences(read_file(log), "\n");
  EXPECT_EQ(first_pass, 6u);

  resample_inconclusive(o, Thresholds(), r, nullptr);
  EXPECT_EQ(r.extra_rounds, 1);  // 6 vs 6 samples suffice: no second round
  ASSERT_EQ(r.resampled.size(), 1u);
  EXPECT_EQ(r.resampled[0].point, p1);
  EXPECT_EQ(r.resampled[0].steps, std::vector<std::int64_t>{6});
  EXPECT_EQ(r.head["points"][1]["time"]["samples_s"].size(), 6u);
  Comparison c = compare_docs(r.base, r.head);
  note_resampling(c, r);
  const CompareRow* after = find_row(c, p1, "median_s");
  ASSERT_NE(after, nullptr);
  EXPECT_EQ(after->verdict, Verdict::regression) << after->note;
  EXPECT_NE(after->note.find("1 extra round (steps 6)"), std::string::npos) << after->note;
  // Only that point ran again, both binaries, head first (the alternation goes on), 2x steps.
  const std::string calls = read_file(log);
  EXPECT_TRUE(calls.ends_with("new " + p1 + " --steps 6\nold " + p1 + " --steps 6\n")) << calls;
  EXPECT_EQ(occurrences(calls, "\n"), first_pass + 2);
  EXPECT_EQ(resampling_summary(r),
            "resampled: 1 extra round for 1 inconclusive point: " + p1 + " (steps 6)\n");

  // Through the CLI: without the flag today's verdict (inconclusive, exit 0); with it, the
  // regression, and the report says what ran again.
  const std::string ab = "compare --base-bin " + old_bin + " --head-bin " + new_bin + " --grid " +
                         dir.file("grid.toml");
  const CliResult plain = run_cli(ab);
  EXPECT_EQ(plain.rc, 0) << plain.out << plain.err;
  EXPECT_EQ(plain.out.find("resampled"), std::string::npos) << plain.out;
  const CliResult text = run_cli(ab + " --max-extra-rounds 2");
  EXPECT_EQ(text.rc, 1) << text.out << text.err;
  EXPECT_NE(text.out.find("resampled: 1 extra round for 1 inconclusive point: " + p1),
            std::string::npos)
      << text.out;
  const CliResult js = run_cli(ab + " --max-extra-rounds 2 --format json");
  unsetenv("FAKE_MEMTRADE_LOG");
  EXPECT_EQ(js.rc, 1) << js.out << js.err;
  const json doc = json::parse(js.out);
  bool seen = false;
  for (const auto& row : doc["results"])
    if (row["point"] == p1 && row["metric"] == "median_s") {
      seen = true;
      EXPECT_EQ(row["verdict"], "regression");
      EXPECT_NE(row["note"].get<std::string>().find("1 extra round"), std::string::npos);
    }
  EXPECT_TRUE(seen);
  EXPECT_EQ(run_cli(ab + " --max-extra-rounds -1").rc, 2);
}

}  // namespace
}  // namespace memtrade
