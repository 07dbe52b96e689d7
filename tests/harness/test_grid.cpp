// Grid files: expansion (cartesian, sweep), filters, ids, shards, and validation messages that
// name the file, the line and the bad key or value.
#include <gtest/gtest.h>

#include <set>

#include "harness/common/bad_input.h"
#include "harness/run/grid.h"

namespace memtrade {
namespace {

std::string error_of(const std::string& text, const std::string& backend = "cpu") {
  try {
    parse_grid(text, "g.toml", backend);
  } catch (const BadInput& e) {
    return e.what();
  }
  return "";
}

TEST(Grid, CartesianExpandsEveryCombinationInAxisOrder) {
  Grid g = parse_grid(R"(
name = "t"
[axes]
model = ["mlp-tiny", "gpt-tiny"]
batch_size = [4, 8]
precision = ["fp32", "bf16"]
)",
                      "g.toml", "cpu");
  ASSERT_EQ(g.points.size(), 8u);
  EXPECT_EQ(g.points[0].id,
            "mlp-tiny/b4/a1/fp32/ck0/adam/off-none/zg-set_to_none/train/ec-never/in-pinned");
  EXPECT_EQ(g.points[1].config.precision, Precision::bf16);
  EXPECT_EQ(g.points[2].config.batch_size, 8);
  EXPECT_EQ(g.points[4].config.model, "gpt-tiny");
  std::set<std::string> ids;
  for (const auto& p : g.points) ids.insert(p.id);
  EXPECT_EQ(ids.size(), 8u);
}

TEST(Grid, SweepVariesOneAxisAtATimeAroundTheBaseline) {
  Grid g = parse_grid(R"(
mode = "sweep"
[axes]
model = ["gpt-tiny", "mlp-tiny"]
batch_size = [4, 8, 16]
checkpoint = [0, 0.5, "sqrt"]
[baseline]
batch_size = 8
)",
                      "g.toml", "cpu");
  // baseline + 1 other model + 2 other batches + 2 other checkpoints
  ASSERT_EQ(g.points.size(), 6u);
  EXPECT_EQ(g.points[0].config.model, "gpt-tiny");
  EXPECT_EQ(g.points[0].config.batch_size, 8);
  for (std::size_t i = 1; i < g.points.size(); ++i) {
    const auto& c = g.points[i].config;
    int changed = (c.model != "gpt-tiny") + (c.batch_size != 8) + (c.checkpoint != Checkpoint{});
    EXPECT_EQ(changed, 1) << g.points[i].id;
  }
}

TEST(Grid, ExcludeAndWhereFilters) {
  const std::string text = R"(
[axes]
precision = ["fp32", "tf32", "bf16"]
optimizer = ["sgd", "adam"]
[[exclude]]
precision = "tf32"
backend = "cpu"
[[where]]
optimizer = "adam"
[[where]]
precision = "bf16"
)";
  Grid cpu = parse_grid(text, "g.toml", "cpu");
  Grid cuda = parse_grid(text, "g.toml", "cuda");
  // where keeps adam (3 precisions) or bf16 (sgd too); exclude drops tf32 on cpu only.
  EXPECT_EQ(cuda.points.size(), 4u);
  EXPECT_EQ(cpu.points.size(), 3u);
  for (const auto& p : cpu.points) EXPECT_NE(p.config.precision, Precision::tf32);
  EXPECT_NE(cpu.hash, cuda.hash);
}

TEST(Grid, DefaultsAndRunSettings) {
  Grid g = parse_grid(R"(
name = "x"
[run]
backend = "cpu"
warmup = 1
steps = 3
seed = 7
capacity = "a10g"
timeout = "2m"
)",
                      "g.toml", "cpu");
  ASSERT_EQ(g.points.size(), 1u);
  EXPECT_EQ(g.points[0].config.model, TrainConfig{}.model);
  EXPECT_EQ(g.points[0].config.seed, 7u);
  EXPECT_EQ(g.run.capacity, 24 * GiB);
  EXPECT_EQ(g.run.timeout_s, 120.0);
  EXPECT_EQ(g.run.steps, 3);
}

TEST(Grid, ConfigJsonRoundTrips) {
  TrainConfig c;
  c.model = "gpt-tiny";
  c.batch_size = 3;
  c.precision = Precision::bf16_pure;
  c.checkpoint = *Checkpoint::parse("selective");
  c.offload = Offload::params;
  c.zero_grad = ZeroGrad::zero;
  TrainConfig back = config_from_json(config_json(c));
  EXPECT_EQ(point_id(back), point_id(c));
  EXPECT_THROW(config_from_json({{"precision", "fp8"}}), KnobError);
}

TEST(Grid, ShardsPartitionThePoints) {
  Grid g = parse_grid("[axes]\nbatch_size = [1, 2, 3, 4, 5, 6, 7]\n", "g.toml", "cpu");
  std::multiset<std::string> all;
  for (int i = 0; i < 3; ++i)
    for (const auto& p : shard_points(g.points, i, 3)) all.insert(p.id);
  EXPECT_EQ(all.size(), 7u);
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), 7u);
  EXPECT_EQ(parse_shard("2/4"), std::make_pair(2, 4));
  EXPECT_THROW(parse_shard("4/4"), BadInput);
  EXPECT_THROW(parse_shard("-1/4"), BadInput);
  EXPECT_THROW(parse_shard("1-4"), BadInput);
}

TEST(Grid, ErrorsNameFileLineAndKey) {
  EXPECT_EQ(error_of("name = \"x\"\n[axes]\nbatch_size = [4, -8]\n"),
            "g.toml:3: axes.batch_size: must be a positive integer, got '-8'");
  EXPECT_NE(
      error_of("[axes]\nprecison = [\"fp32\"]\n").find("g.toml:2: axes: unknown axis 'precison'"),
      std::string::npos);
  EXPECT_NE(error_of("[axes]\nprecision = [\"fp8\"]\n")
                .find("g.toml:2: axes.precision: unknown value 'fp8'"),
            std::string::npos);
  EXPECT_NE(error_of("[axes\nmodel = 1\n").find("g.toml:1: malformed TOML"), std::string::npos);
  EXPECT_NE(error_of("[run]\ncapacity = \"12XB\"\n").find("g.toml:2: run.capacity"),
            std::string::npos);
  EXPECT_NE(error_of("mode = \"random\"\n").find("mode: expected"), std::string::npos);
  EXPECT_NE(error_of("[axes]\nmodel = []\n").find("empty list"), std::string::npos);
  EXPECT_NE(error_of("[axes]\ncheckpoint = [1.5]\n").find("outside [0, 1]"), std::string::npos);
  EXPECT_NE(error_of("[axes]\nmodel = [\"gpt-huge\"]\n").find("unknown value 'gpt-huge'"),
            std::string::npos);
  EXPECT_NE(error_of("colour = 3\n").find("unknown key 'colour'"), std::string::npos);
  EXPECT_NE(error_of("[[exclude]]\nbackend = \"tpu\"\n").find("unknown backend"),
            std::string::npos);
  EXPECT_THROW(load_grid("/nonexistent/grid.toml", "cpu"), BadInput);
}

TEST(Grid, ShippedGridsParse) {
  for (const char* name : {"smoke", "nightly", "docs", "gpu-check"}) {
    std::string path = std::string(MEMTRADE_SOURCE_DIR) + "/ci/grids/" + name + ".toml";
    Grid g = load_grid(path, "cpu");
    EXPECT_GT(g.points.size(), 0u) << name;
  }
}

}  // namespace
}  // namespace memtrade
