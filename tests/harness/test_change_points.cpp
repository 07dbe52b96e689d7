// Change points over the history (issue 29): the t distribution against scipy's values, the
// energy statistic against its definition, find_changes on planted and A/A series, and
// `memtrade history changes` on a real history database.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <fmt/format.h>

#include "fixtures/gate_fixtures.h"
#include "harness/common/stats.h"
#include "harness/gate/change_points.h"

namespace memtrade {
namespace {

using testing::CliResult;
using testing::json;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

TEST(StudentT, MatchesScipy) {
  // scipy.stats: 2 * t.sf(t, df), and ttest_ind(x, y) (pooled variance).
  EXPECT_NEAR(student_t_two_sided(2.0, 10), 0.07338803477074039, 1e-12);
  EXPECT_NEAR(student_t_two_sided(-2.0, 10), 0.07338803477074039, 1e-12);
  EXPECT_NEAR(student_t_two_sided(1.0, 1), 0.5, 1e-12);
  EXPECT_NEAR(student_t_two_sided(3.5, 7.5), 0.008948871980079341, 1e-12);
  EXPECT_NEAR(student_t_two_sided(0.1, 40), 0.9208438530452802, 1e-12);
  const std::vector<double> x{1.0, 1.2, 0.9, 1.1, 1.05}, y{1.3, 1.25, 1.4, 1.2};
  EXPECT_NEAR(student_t_test(x, y), 0.01007476980304033, 1e-12);
  EXPECT_EQ(student_t_test(std::vector<double>{2, 2}, std::vector<double>{2, 2, 2}), 1.0);
  EXPECT_EQ(student_t_test(std::vector<double>{2, 2}, std::vector<double>{3, 3}), 0.0);
}

TEST(ChangePoints, EnergyStatisticIsItsDefinition) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> d(1.0, 0.1);
  std::vector<double> s(23);
  for (auto& v : s) v = d(rng);
  const std::vector<double> q = energy_statistic(s, 2, s.size() - 1);
  for (std::size_t tau = 2; tau + 1 < s.size(); ++tau) {
    const double m = static_cast<double>(tau), k = static_cast<double>(s.size() - tau);
    double between = 0, left = 0, right = 0;
    for (std::size_t i = 0; i < tau; ++i)
      for (std::size_t j = tau; j < s.size(); ++j) between += std::abs(s[i] - s[j]);
    for (std::size_t i = 0; i < tau; ++i)
      for (std::size_t j = i + 1; j < tau; ++j) left += std::abs(s[i] - s[j]);
    for (std::size_t i = tau; i < s.size(); ++i)
      for (std::size_t j = i + 1; j < s.size(); ++j) right += std::abs(s[i] - s[j]);
    const double e = 2 * between / (m * k) - left / (m * (m - 1) / 2) - right / (k * (k - 1) / 2);
    EXPECT_NEAR(q[tau - 2], m * k / (m + k) * e, 1e-12) << tau;
  }
}

std::vector<double> noisy(std::size_t n, std::size_t at, double step, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0, 0.02);
  std::vector<double> s;
  for (std::size_t i = 0; i < n; ++i) s.push_back(1e-3 * (1 + (i >= at ? step : 0)) * (1 + d(rng)));
  return s;
}

TEST(ChangePoints, FindsPlantedStepsAndNothingInAA) {
  ChangeOptions o;
  o.min_effect = 0.02;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    SCOPED_TRACE(seed);
    const auto up = find_changes(noisy(60, 40, 0.10, seed), o);
    ASSERT_EQ(up.size(), 1u);
    EXPECT_NEAR(static_cast<double>(up[0].index), 40, 2);
    EXPECT_NEAR(up[0].relative, 0.10, 0.03);
    EXPECT_LT(up[0].p, 0.001);
    EXPECT_TRUE(find_changes(noisy(60, 60, 0.0, 100 + seed), o).empty());
  }
  // Up, then back down: two changes.
  std::vector<double> s = noisy(30, 30, 0, 7), hi = noisy(20, 0, 0.15, 8), lo = noisy(20, 20, 0, 9);
  s.insert(s.end(), hi.begin(), hi.end());
  s.insert(s.end(), lo.begin(), lo.end());
  const auto two = find_changes(s, o);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_GT(two[0].relative, 0);
  EXPECT_LT(two[1].relative, 0);
  // The minimum effect: a clear but small 1.5% step is not reported at 2%, is at 1%.
  const auto small = noisy(200, 100, 0.015, 11);
  EXPECT_TRUE(find_changes(small, o).empty());
  o.min_effect = 0.01;
  EXPECT_EQ(find_changes(small, o).size(), 1u);
}

TEST(ChangePoints, ExactMetricsChangeOnAnyLastingStep) {
  ChangeOptions o;
  o.exact = true;
  std::vector<double> s(30, 1e6);
  EXPECT_TRUE(find_changes(s, o).empty());
  s[10] = 2e6;  // one night: a blip, not a change
  EXPECT_TRUE(find_changes(s, o).empty());
  for (std::size_t i = 20; i < 30; ++i) s[i] = 1e6 + 1;  // one byte more, for good
  auto c = find_changes(s, o);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].index, 20u);
  EXPECT_EQ(c[0].before, 1e6);
  EXPECT_EQ(c[0].after, 1e6 + 1);
  // Persistence: a step in the last run only is not confirmed yet; in the last two it is.
  std::vector<double> late(10, 5.0);
  late[9] = 6.0;
  EXPECT_TRUE(find_changes(late, o).empty());
  late[8] = 6.0;
  ASSERT_EQ(find_changes(late, o).size(), 1u);
  EXPECT_EQ(find_changes(late, o)[0].index, 8u);
}

// A history of 8 nights; the gpt-tiny fp32 point's memory grows 1 MiB from night 7 on.
TEST(HistoryChanges, NamesTheCommitAndFailsWhenARegressionIsRecent) {
  TempDir dir;
  const std::string db = dir.file("h.db");
  auto add_night = [&](int night, bool grown) {
    json r =
        testing::make_results(static_cast<std::uint64_t>(night), fmt::format("commit{}", night),
                              fmt::format("2026-11-{:02}T02:00:00Z", night + 1));
    if (grown) r["points"][0]["memory"]["peak_allocated"] = 10'000'000 + (1 << 20);
    write_file(dir.file("r.json"), r.dump());
    ASSERT_EQ(run_cli("history add " + dir.file("r.json") + " --db " + db).rc, 0);
  };
  for (int night = 0; night < 6; ++night) add_night(night, false);
  CliResult quiet = run_cli("history changes --db " + db + " --metric memory");
  EXPECT_EQ(quiet.rc, 0) << quiet.err;
  EXPECT_NE(quiet.out.find("3 series, 0 changes"), std::string::npos) << quiet.out;
  add_night(6, true);  // one night: not confirmed yet
  EXPECT_EQ(run_cli("history changes --db " + db + " --metric memory").rc, 0);
  add_night(7, true);  // the second: a regression that starts within the last 2 runs
  const CliResult r = run_cli("history changes --db " + db + " --metric memory --json");
  EXPECT_EQ(r.rc, 1) << r.err;
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc["schema"], "memtrade.changes/1");
  ASSERT_EQ(doc["changes"].size(), 1u);
  const json& c = doc["changes"][0];
  EXPECT_EQ(c["point"], "gpt-tiny/b8/fp32");
  EXPECT_EQ(c["commit"], "commit6");
  EXPECT_EQ(c["commit_before"], "commit5");
  EXPECT_EQ(c["direction"], "regression");
  EXPECT_EQ(c["p"], 0.0);
  EXPECT_EQ(c["after"].get<double>() - c["before"].get<double>(), 1 << 20);
  // The night after, the change is history: reported, no longer failing (it alerted once).
  add_night(8, true);
  const CliResult later = run_cli("history changes --db " + db + " --metric memory");
  EXPECT_EQ(later.rc, 0);
  EXPECT_NE(later.out.find("REGRESSION"), std::string::npos);
  EXPECT_NE(later.out.find("commit6"), std::string::npos);
  // Bad input: one line, exit 2.
  for (const std::string& args :
       {std::string("history changes"), "history changes --db " + db + " --metric bogus",
        "history changes --db " + db + " --series x.json",
        "history changes --db " + dir.file("none.db"), "history changes --db " + db + " --max-p 0",
        "history changes --db " + db + " --min-runs 1"}) {
    SCOPED_TRACE(args);
    const CliResult b = run_cli(args);
    EXPECT_EQ(b.rc, 2);
    EXPECT_EQ(std::count(b.err.begin(), b.err.end(), '\n'), 1) << b.err;
  }
}

}  // namespace
}  // namespace memtrade
