// The memory model of a mixture-of-experts model (models/layers/moe.h) is exact given the routing:
// a tiny Mixtral and a tiny Qwen2-MoE run around every knob that changes what is saved or
// recomputed, each point recording its expert histograms (results' moe_routing), and
// `estimate --moe-routing <those results>` predicts each point's measured peak and breakdown
// byte for byte. The histograms depend on the data, so the default (balanced) prediction is not
// always the run's. (The activations an MoE layer saves do not depend on the routing in total,
// Σ n_e = N·k; the per-expert buffers and their allocator rounding do.)
#include <gtest/gtest.h>

#include <map>

#include <fmt/format.h>

#include "fixtures/gate_fixtures.h"
#include "tests/models/fixtures/tiny_moe.h"

namespace memtrade {
namespace {

using testing::kTinyMixtral;  // tests/models/fixtures/tiny_moe.h
using testing::kTinyQwen2Moe;

testing::json estimate_points(const std::string& grid, const std::string& routing) {
  const testing::CliResult r =
      testing::run_cli("estimate --json --grid " + grid + " --moe-routing " + routing);
  EXPECT_EQ(r.rc, 0) << r.err;
  return testing::json::parse(r.out)["points"];
}

// Writes the tiny Mixtral and Qwen2-MoE configs into `dir` and a grid of both at batch 2 ×
// 16 tokens (one warm-up, one measured step), `head` before its [run] table and `axes` after
// its fixed axes ({0}, {1}: the two config files), runs it and returns its results.
testing::json run_moe_grid(testing::TempDir& dir, const std::string& head,
                           const std::string& axes) {
  testing::write_file(dir.file("mixtral.json"), kTinyMixtral);
  testing::write_file(dir.file("qwen2moe.json"), kTinyQwen2Moe);
  const std::string grid = head +
                           "[run]\nbackend = \"cpu\"\nwarmup = 1\nsteps = 1\n[axes]\n"
                           "model_config = [\"{0}\", \"{1}\"]\nbatch_size = [2]\nseq_len = [16]\n" +
                           axes;
  testing::write_file(dir.file("g.toml"), fmt::format(fmt::runtime(grid), dir.file("mixtral.json"),
                                                      dir.file("qwen2moe.json")));
  const testing::CliResult r =
      testing::run_cli("run --grid " + dir.file("g.toml") + " --quiet --out " + dir.file("r.json"));
  EXPECT_EQ(r.rc, 0) << r.err;
  return testing::json::parse(testing::read_file(dir.file("r.json")));
}

TEST(EstimateMoe, PredictedIsMeasuredGivenTheRecordedRouting) {
  testing::TempDir dir;
  const auto results = run_moe_grid(dir, "name = \"moe-exact\"\nmode = \"sweep\"\n",
                                    R"(accumulation = [1, 2]
precision = ["fp32", "bf16", "bf16-pure"]
checkpoint = [0, 1, "selective"]
offload = ["none", "activations"]
mode = ["train", "eval"]
attention = ["math", "flash"]
[baseline]
model_config = "{0}"
precision = "fp32"
)");
  ASSERT_GE(results["points"].size(), 10u);

  std::map<std::string, testing::json> measured, balanced, worst;
  for (const auto& p : estimate_points(dir.file("g.toml"), dir.file("r.json")))
    measured[p["id"]] = p;
  for (const auto& p : estimate_points(dir.file("g.toml"), "balanced")) balanced[p["id"]] = p;
  for (const auto& p : estimate_points(dir.file("g.toml"), "worst")) worst[p["id"]] = p;
  int differs = 0;
  for (const auto& p : results["points"]) {
    const std::string id = p["id"];
    SCOPED_TRACE(id);
    ASSERT_EQ(p["status"], "ok") << p["error"];
    ASSERT_TRUE(p.contains("moe_routing"));
    const auto& e = measured.at(id);
    EXPECT_EQ(e["moe"]["tokens_per_expert"], p["moe_routing"]["tokens_per_expert"]);
    EXPECT_EQ(e["moe"]["routing"], dir.file("r.json"));
    EXPECT_EQ(e["peak_allocated"], p["memory"]["peak_allocated"]);
    EXPECT_EQ(e["breakdown_at_peak"], p["memory"]["breakdown_at_peak"]);
    const auto& saved = e["moe"]["saved_bytes"];
    if (id.find("/train/") != std::string::npos && id.find("/ck0/") != std::string::npos) {
      EXPECT_GT(saved["router"].get<std::int64_t>(), 0);
      EXPECT_GT(saved["dispatch"].get<std::int64_t>(), 0);
      EXPECT_GT(saved["experts"].get<std::int64_t>(), 0);
    }
    // worst: each micro-batch's N = 32 tokens all on experts 0 and 1 (top_k 2) of every layer.
    for (const auto& mb : worst.at(id)["moe"]["tokens_per_expert"])
      for (const auto& layer : mb) {
        std::vector<std::int64_t> want(layer.size(), 0);
        want[0] = want[1] = 32;
        EXPECT_EQ(layer.get<std::vector<std::int64_t>>(), want);
      }
    differs += balanced.at(id)["peak_allocated"] != p["memory"]["peak_allocated"];
  }
  EXPECT_GT(differs, 0) << "the routing never changed a peak: the comparison could not fail";
}

// A run on 2 ranks (mpirun, as `run` launches a multi-rank point) records every rank's histograms
// (tokens_per_expert_by_rank), and `estimate --moe-routing FILE --rank r` predicts rank r's
// measured peak and breakdown byte for byte: its own tokens at ep 1, and under expert
// parallelism (ep 2) every rank's, which decide how many rows r's experts receive. Rank 0's
// histograms alone (the file without that field, as before it existed) miss some rank.
TEST(EstimateMoe, EachRankOfATwoRankRunIsPredictedFromItsFile) {
  testing::TempDir dir;
  const auto results = run_moe_grid(dir, "name = \"moe-ranks\"\n", R"(data_parallel = [2]
expert_parallel = [1, 2]
sharding = ["none", "zero3"]
)");
  ASSERT_EQ(results["points"].size(), 8u);
  // The same file without every rank's histograms.
  testing::json old = results;
  for (auto& p : old["points"]) p["moe_routing"].erase("tokens_per_expert_by_rank");
  testing::write_file(dir.file("old.json"), old.dump());
  int misses = 0;
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, testing::json> by_file, by_old;
    const std::string flags = fmt::format(" --rank {}", rank);
    for (const auto& p : estimate_points(dir.file("g.toml") + flags, dir.file("r.json")))
      by_file[p["id"]] = p;
    for (const auto& p : estimate_points(dir.file("g.toml") + flags, dir.file("old.json")))
      by_old[p["id"]] = p;
    for (const auto& p : results["points"]) {
      const std::string id = p["id"];
      SCOPED_TRACE(fmt::format("{} rank {}", id, rank));
      ASSERT_EQ(p["status"], "ok") << p["error"];
      const auto& by = p["moe_routing"]["tokens_per_expert_by_rank"];
      ASSERT_EQ(by.size(), 2u);
      EXPECT_EQ(by[0], p["moe_routing"]["tokens_per_expert"]);
      const auto& measured = p["memory"]["per_rank"][rank];
      const auto& e = by_file.at(id);
      EXPECT_EQ(e["moe"]["tokens_per_expert"], by[rank]);
      EXPECT_EQ(e["peak_allocated"], measured["peak_allocated"]);
      EXPECT_EQ(e["breakdown_at_peak"], measured["breakdown_at_peak"]);
      const auto& o = by_old.at(id);
      EXPECT_NE(o["moe"]["routing"].get<std::string>().find("one rank's histograms"),
                std::string::npos)
          << o["moe"]["routing"];
      misses += o["peak_allocated"] != measured["peak_allocated"];
    }
  }
  EXPECT_GT(misses, 0) << "rank 0's histograms predicted every rank: the test could not fail";
}

TEST(EstimateMoe, RoutingFileWithoutHistogramsIsBadInput) {
  testing::TempDir dir;
  testing::write_file(dir.file("mixtral.json"), kTinyMixtral);
  testing::write_file(dir.file("r.json"), R"({"schema": "memtrade.results/1", "meta": {},
  "points": []})");
  const testing::CliResult r =
      testing::run_cli("estimate --model-config " + dir.file("mixtral.json") +
                       " --seq-len 16 --batch-size 2 --moe-routing " + dir.file("r.json"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.err.find("no point records moe_routing"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace memtrade
