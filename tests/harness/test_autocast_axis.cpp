// The autocast_policy axis through every consumer of the knob table (models/config/knobs.h): its
// flag, grid files, point ids (in the id of an autocast precision even at its default, in no
// other), the config JSON both ways, the knob table's JSON and the CSV export; and the memory model
// exact on autocast points under both policies.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "fixtures/gate_fixtures.h"
#include "harness/common/bad_input.h"
#include "harness/run/estimate.h"
#include "harness/run/grid.h"
#include "harness/run/point_runner.h"
#include "kernels/device.h"
#include "models/config/knobs.h"
#include "models/model.h"

namespace memtrade {
namespace {

using testing::CliResult;
using testing::json;
using testing::read_file;
using testing::run_cli;
using testing::TempDir;

TrainConfig with(Precision p, autocast::Policy policy = autocast::Policy::torch_cuda) {
  TrainConfig c;
  c.model = "gpt-tiny";
  c.precision = p;
  c.autocast_policy = policy;
  return c;
}

TEST(AutocastAxis, TheRow) {
  const Knob& k = knob("autocast_policy");
  EXPECT_EQ(k.flag, "--autocast-policy");
  EXPECT_EQ(k.id_prefix, "ac-");
  EXPECT_EQ(k.id_rule, IdRule::when_applies);
  EXPECT_EQ(k.default_text(), "torch-cuda");
  EXPECT_EQ(k.choices(), (std::vector<std::string>{"torch-cuda", "torch-cpu"}));
  for (Precision p : {Precision::fp16, Precision::bf16}) EXPECT_TRUE(k.applies(with(p)));
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::fp16_o2, Precision::bf16_o2,
                      Precision::fp16_pure, Precision::bf16_pure})
    EXPECT_FALSE(k.applies(with(p))) << precision_name(p);
  // Right after precision in the table, so that ids read ".../bf16/ac-torch-cuda/ck0/...".
  const auto names = knob_names();
  const auto at = std::find(names.begin(), names.end(), "autocast_policy");
  ASSERT_NE(at, names.end());
  EXPECT_EQ(*(at - 1), "precision");
  const json row = [] {
    for (const json& r : knobs_json())
      if (r["name"] == "autocast_policy") return r;
    return json();
  }();
  EXPECT_EQ(row["id_rule"], "when_applies");
  EXPECT_EQ(row["default"], "torch-cuda");
  EXPECT_EQ(row["values"], "torch-cuda | torch-cpu");
}

TEST(AutocastAxis, PointIds) {
  EXPECT_EQ(point_id(with(Precision::bf16)),
            "gpt-tiny/b8/a1/bf16/ac-torch-cuda/ck0/adam/off-none/zg-set_to_none/train/"
            "ec-never/in-pinned");
  EXPECT_NE(
      point_id(with(Precision::fp16, autocast::Policy::torch_cpu)).find("/fp16/ac-torch-cpu/"),
      std::string::npos);
  // Elsewhere the axis means nothing: no field, and the policy does not tell two points apart.
  for (Precision p : {Precision::fp32, Precision::bf16_o2, Precision::bf16_pure}) {
    EXPECT_EQ(point_id(with(p)).find("ac-"), std::string::npos) << precision_name(p);
    EXPECT_EQ(point_id(with(p)), point_id(with(p, autocast::Policy::torch_cpu)));
  }
  EXPECT_EQ(point_id(with(Precision::bf16_o2)),
            "gpt-tiny/b8/a1/bf16-o2/ck0/adam/off-none/zg-set_to_none/train/ec-never/in-pinned");
}

TEST(AutocastAxis, ConfigJsonBothWays) {
  const TrainConfig c = with(Precision::bf16, autocast::Policy::torch_cpu);
  const json j = config_json(c);
  EXPECT_EQ(j["autocast_policy"], "torch-cpu");
  const TrainConfig back = config_from_json(j);
  EXPECT_EQ(back.autocast_policy, autocast::Policy::torch_cpu);
  EXPECT_EQ(point_id(back), point_id(c));
  json old = j;  // a file written before the axis existed: the default
  old.erase("autocast_policy");
  EXPECT_EQ(config_from_json(old).autocast_policy, autocast::Policy::torch_cuda);
  EXPECT_THROW(config_from_json({{"autocast_policy", "torch-tpu"}}), KnobError);
  EXPECT_THROW(config_from_json({{"autocast_policy", 1}}), KnobError);
}

TEST(AutocastAxis, GridFiles) {
  const Grid g = parse_grid(R"(
[axes]
model = ["mlp-tiny"]
precision = ["fp32", "bf16", "bf16-o2"]
autocast_policy = ["torch-cuda", "torch-cpu"]
)",
                            "g.toml", "cpu");
  std::set<std::string> ids;
  for (const auto& p : g.points) ids.insert(p.id);
  // fp32 and bf16-o2 once each (the policy does not apply), bf16 once per policy.
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(g.points.size(), 4u);
  int autocast = 0;
  for (const auto& p : g.points)
    if (p.config.precision == Precision::bf16) {
      ++autocast;
      EXPECT_NE(p.id.find("/bf16/ac-" +
                          std::string(autocast::policy_name(p.config.autocast_policy)) + "/"),
                std::string::npos);
    }
  EXPECT_EQ(autocast, 2);
  EXPECT_THROW(parse_grid("[axes]\nautocast_policy = [\"cuda\"]\n", "g.toml", "cpu"), BadInput);
}

TEST(AutocastAxis, FlagListJsonAndCsv) {
  TempDir dir;
  CliResult r = run_cli(
      "run --backend cpu --model mlp-tiny --precision bf16 --autocast-policy torch-cpu --list "
      "--json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json listed = json::parse(r.out);
  ASSERT_EQ(listed["points"].size(), 1u);
  EXPECT_EQ(listed["points"][0]["config"]["autocast_policy"], "torch-cpu");
  EXPECT_NE(listed["points"][0]["id"].get<std::string>().find("/bf16/ac-torch-cpu/"),
            std::string::npos);

  CliResult bad = run_cli("run --backend cpu --model mlp-tiny --autocast-policy cuda --list");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("expected one of: torch-cuda, torch-cpu"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;

  ASSERT_EQ(run_cli("run --backend cpu --model mlp-tiny --precision fp16 --autocast-policy "
                    "torch-cpu --steps 1 --warmup 0 --quiet --out " +
                    dir.file("r.json"))
                .rc,
            0);
  CliResult csv = run_cli("export " + dir.file("r.json"));
  ASSERT_EQ(csv.rc, 0) << csv.err;
  const std::string header = csv.out.substr(0, csv.out.find('\n'));
  EXPECT_NE(header.find(",autocast_policy,"), std::string::npos) << header;
  EXPECT_NE(csv.out.find(",torch-cpu,"), std::string::npos) << csv.out;
}

// The memory model runs the same layers on the meta device: exact under autocast too, casts
// and their lifetimes included, for both policies and every checkpoint and offload mode.
TEST(AutocastAxis, MemoryModelIsExact) {
  int points = 0;
  for (const char* model : {"gpt-tiny", "mlp-tiny", "cnn-tiny"})
    for (Precision p : {Precision::bf16, Precision::fp16})
      for (auto policy : {autocast::Policy::torch_cuda, autocast::Policy::torch_cpu})
        for (const char* ck : {"0", "0.5", "sqrt", "selective"})
          for (Offload off : {Offload::none, Offload::activations, Offload::params}) {
            TrainConfig cfg = with(p, policy);
            cfg.model = model;
            cfg.batch_size = 4;
            cfg.checkpoint = *Checkpoint::parse(ck);
            cfg.offload = off;
            cfg.zero_grad = off == Offload::params ? ZeroGrad::zero : ZeroGrad::set_to_none;
            SCOPED_TRACE(point_id(cfg));
            const MemoryEstimate e = estimate_memory(cfg, Backend::cpu, 0);
            auto dev = make_device("cpu", DeviceOptions{0, 2});
            auto m = make_model(model);
            const PointMeasurement got =
                run_point(*dev, *m, cfg, PointRunOptions{1, 1, false, std::nullopt});
            ASSERT_EQ(e.peak_allocated, got.memory.allocated.peak);
            EXPECT_EQ(e.breakdown_at_peak, got.memory.by_category_at_peak);
            EXPECT_EQ(e.host_pinned_peak, got.pinned.allocated.peak);
            ++points;
          }
  EXPECT_EQ(points, 3 * 2 * 2 * 4 * 3);
}

}  // namespace
}  // namespace memtrade
