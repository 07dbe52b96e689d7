// `memtrade history`: add, list, trend and baseline on a scratch SQLite database.
#include <gtest/gtest.h>

#include "fixtures/gate_fixtures.h"
#include "harness/common/bad_input.h"
#include "harness/gate/history.h"

namespace memtrade {
namespace {

using namespace memtrade::testing;

#ifdef MEMTRADE_HAVE_SQLITE

class History : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = dir_.file("history.db");
    first_ = make_results(1, "aaaa1111", "2026-11-27T02:00:00Z");
    second_ = make_results(2, "bbbb2222", "2026-11-28T02:00:00Z");
    second_["points"][0]["memory"]["peak_allocated"] = 10'500'000;
    write_file(dir_.file("first.json"), first_.dump());
    write_file(dir_.file("second.json"), second_.dump());
  }
  TempDir dir_;
  std::string db_;
  json first_, second_;
};

TEST_F(History, AddListTrendBaseline) {
  EXPECT_EQ(history_add(db_, first_, {"main", "ok"}), 1);
  EXPECT_EQ(history_add(db_, second_, {"main", "ok"}), 2);
  json other = make_results(3, "cccc3333", "2026-11-29T02:00:00Z");
  other["meta"]["host"] = "otherhost";  // newest, but another machine
  history_add(db_, other, {"main", "ok"});
  history_add(db_, make_results(4, "dddd4444", "2026-11-30T02:00:00Z"), {"feature", "ok"});

  const auto runs = history_list(db_);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].commit, "aaaa1111");
  EXPECT_EQ(runs[0].points, 3);
  EXPECT_EQ(runs[0].machine, machine_fingerprint(first_["meta"]));
  EXPECT_NE(runs[2].machine, runs[0].machine);
  EXPECT_EQ(runs[0].machine.size(), 16u);

  TrendQuery q;
  q.metric = "peak_allocated";
  q.where = {{"model", "gpt-*"}, {"precision", "fp32"}};
  q.branch = "main";
  q.machine = runs[0].machine;
  const auto rows = history_trend(db_, q);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].commit, "aaaa1111");
  EXPECT_EQ(rows[0].point_id, "gpt-tiny/b8/fp32");
  EXPECT_DOUBLE_EQ(rows[0].value, 10'000'000);
  EXPECT_DOUBLE_EQ(rows[1].value, 10'500'000);
  q.where = {{"hyper.n_layer", "2"}, {"batch_size", "8"}};
  EXPECT_EQ(history_trend(db_, q).size(), 6u);

  BaselineQuery b{"main", runs[0].machine, false};
  auto base = history_baseline(db_, b);
  ASSERT_TRUE(base.has_value());
  EXPECT_EQ((*base)["meta"]["commit"], "bbbb2222");
  EXPECT_EQ((*base)["schema"], "memtrade.results/1");
  ASSERT_EQ((*base)["points"].size(), 3u);
  const json& p0 = (*base)["points"][0];
  EXPECT_EQ(p0["id"], "gpt-tiny/b8/fp32");
  EXPECT_EQ(p0["memory"]["peak_allocated"], 10'500'000);
  EXPECT_EQ(p0["time"]["samples_s"], second_["points"][0]["time"]["samples_s"]);
  EXPECT_EQ(p0["config"], second_["points"][0]["config"]);
  // Any machine: the newest main run is the other host's.
  EXPECT_EQ((*history_baseline(db_, {"main", "", false}))["meta"]["commit"], "cccc3333");
  EXPECT_FALSE(history_baseline(db_, {"release", "", false}).has_value());
  EXPECT_FALSE(history_baseline(dir_.file("none.db"), {"main", "", false}).has_value());
  EXPECT_THROW(history_list(dir_.file("none.db")), BadInput);
  q.metric = "peak_allocated; DROP TABLE runs";
  EXPECT_THROW(history_trend(db_, q), BadInput);
}

TEST_F(History, RegressedRunsAreNotBaselines) {
  history_add(db_, first_, {"main", "ok"});
  history_add(db_, second_, {"main", "regression"});
  const std::string fp = machine_fingerprint(first_["meta"]);
  EXPECT_EQ((*history_baseline(db_, {"main", fp, false}))["meta"]["commit"], "aaaa1111");
  EXPECT_EQ((*history_baseline(db_, {"main", fp, true}))["meta"]["commit"], "bbbb2222");
  history_add(db_, make_results(5, "eeee5555", "2026-11-29T02:00:00Z"), {"main", "accepted"});
  EXPECT_EQ((*history_baseline(db_, {"main", fp, false}))["meta"]["commit"], "eeee5555");
}

TEST_F(History, Cli) {
  const std::string db = " --db " + db_;
  ASSERT_EQ(run_cli("history add " + dir_.file("first.json") + db + " --branch main").rc, 0);
  ASSERT_EQ(run_cli("history add " + dir_.file("second.json") + db + " --branch main").rc, 0);
  const CliResult list = run_cli("history list" + db);
  EXPECT_EQ(list.rc, 0);
  EXPECT_NE(list.out.find("aaaa1111"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("bbbb2222"), std::string::npos) << list.out;

  const CliResult trend = run_cli("history trend" + db +
                                  " --metric peak_allocated --where model=gpt-tiny "
                                  "--where precision=fp32");
  EXPECT_EQ(trend.rc, 0) << trend.err;
  EXPECT_EQ(trend.out,
            "commit,time,point_id,peak_allocated\n"
            "aaaa1111,2026-11-27T02:00:00Z,gpt-tiny/b8/fp32,10000000\n"
            "bbbb2222,2026-11-28T02:00:00Z,gpt-tiny/b8/fp32,10500000\n");
  const CliResult tj = run_cli("history trend" + db + " --metric median_s --format json");
  ASSERT_EQ(tj.rc, 0);
  EXPECT_EQ(json::parse(tj.out).size(), 6u);

  const std::string out = dir_.file("baseline.json");
  const CliResult base = run_cli("history baseline" + db + " --branch main --like " +
                                 dir_.file("first.json") + " --out " + out);
  EXPECT_EQ(base.rc, 0) << base.err;
  EXPECT_EQ(json::parse(read_file(out))["meta"]["commit"], "bbbb2222");
  // The rewritten baseline compares cleanly against what it was made from.
  EXPECT_EQ(run_cli("compare " + out + " " + dir_.file("second.json")).rc, 0);
  EXPECT_EQ(run_cli("history baseline" + db + " --branch nightly --out " + out).rc, 1);
  EXPECT_EQ(run_cli("history trend" + db + " --metric bogus").rc, 2);
  EXPECT_EQ(run_cli("history list --db " + dir_.file("missing.db")).rc, 2);
  write_file(dir_.file("garbage.json"), "{\"schema\":");
  EXPECT_EQ(run_cli("history add " + dir_.file("garbage.json") + db).rc, 2);
}

#else

TEST(History, WithoutSqliteExitsTwo) {
  EXPECT_THROW(history_list("x.db"), BadInput);
  EXPECT_EQ(run_cli("history list --db x.db").rc, 2);
}

#endif

}  // namespace
}  // namespace memtrade
