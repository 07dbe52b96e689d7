// `memtrade advise`: the search space read off the knob table, the estimate with two
// micro-batches that the search relies on, the cost model's fit, and the command end to end
// (the pick fits when run, the frontier is a Pareto front, bad input is one line and exit 2).
#include <gtest/gtest.h>

#include <set>

#include <fmt/format.h>

#include "fixtures/gate_fixtures.h"
#include "harness/common/bad_input.h"
#include "harness/run/advise.h"
#include "harness/run/estimate.h"
#include "kernels/gpu_specs.h"
#include "models/train/saved_tensors.h"

namespace memtrade {
namespace {

using testing::CliResult;
using testing::json;
using testing::run_cli;
using testing::TempDir;

TrainConfig start_of(const std::string& model, std::int64_t batch, std::int64_t accumulation = 1) {
  TrainConfig c;
  c.model = model;
  c.batch_size = batch;
  c.accumulation = accumulation;
  resolve_config(c);
  return c;
}

std::int64_t default_peak(const std::string& model) {
  return estimate_memory(start_of(model, 8), Backend::cpu, 0).peak_allocated;
}

TEST(AdviseKnobs, EveryAdviseValueIsAcceptedAndCheckpointPlansAreDistinct) {
  for (const char* model : {"gpt-tiny", "gpt-mini", "cnn-tiny", "mlp-tiny", "gpt2-124m"}) {
    const TrainConfig start = start_of(model, 12);
    for (const Knob& k : knobs()) {
      if (k.advise == AdviseRole::keep) continue;
      const auto values = k.advise_values(start);
      EXPECT_FALSE(values.empty()) << k.name;
      for (const std::string& v : values) {
        TrainConfig c = start;
        EXPECT_FALSE(k.set(c, v).has_value()) << k.name << "=" << v;
      }
    }
    // batch_size and accumulation: the divisors of the samples per step.
    EXPECT_EQ(knob("batch_size").advise_values(start),
              (std::vector<std::string>{"1", "2", "3", "4", "6", "12"}));
    // No two checkpoint values give the same plan on this model.
    const int n = make_model(start)->num_blocks();
    std::set<std::pair<std::vector<bool>, bool>> plans;
    for (const std::string& v : knob("checkpoint").advise_values(start)) {
      const CheckpointPlan p = CheckpointPlan::make(*Checkpoint::parse(v), n);
      std::vector<bool> shape;
      for (const auto& s : p.segments) {
        shape.push_back(s.recompute);
        shape.resize(shape.size() + static_cast<std::size_t>(s.end - s.begin), false);
      }
      EXPECT_TRUE(plans.insert({shape, p.selective}).second) << model << " " << v;
    }
  }
  // The roles reach the tools (knobs --json).
  for (const auto& row : knobs_json()) {
    const std::string name = row["name"];
    EXPECT_EQ(row["advise"], name == "precision" || name == "optimizer" ? "allow"
                             : name == "model" || name == "mode" || name == "input" ||
                                     name == "seq_len" || name == "autocast_policy" ||
                                     // the GPU count is the user's; advise searches it with
                                     // --gpus (not yet: the GPU time model)
                                     name == "data_parallel" || name == "sharding" ||
                                     name == "tensor_parallel" || name == "sequence_parallel" ||
                                     name == "expert_parallel" || name == "model_config" ||
                                     // which torch.optim code the predicted run uses, and
                                     // whose Llama layers (fused kernels' or HF's eager code)
                                     name == "optimizer_impl" || name == "llama_layers"
                                 ? "keep"
                                 : "turn")
        << name;
  }
}

TEST(AdviseSpace, KeepsTheSamplesPerStepAndOpensAllowedAxesOnly) {
  const TrainConfig start = start_of("gpt-tiny", 8);
  const AdviseSpace s = advise_space(start, {}, {}, Backend::cpu);
  std::set<std::string> ids;
  bool has_start = false;
  for (const TrainConfig& c : s.configs) {
    EXPECT_EQ(samples_per_step(c), 8);
    EXPECT_EQ(c.precision, start.precision);
    EXPECT_EQ(c.optimizer, start.optimizer);
    EXPECT_EQ(c.mode, Mode::train);
    EXPECT_TRUE(ids.insert(point_id(c)).second) << point_id(c);
    has_start |= point_id(c) == point_id(start);
  }
  EXPECT_TRUE(has_start);
  // 4 micro-batch sizes × the checkpoint values × 4 offloads × 2 × 2 × 2 attention kinds.
  const std::size_t ck = knob("checkpoint").advise_values(start).size();
  EXPECT_EQ(s.configs.size(), 4 * ck * 4 * 2 * 2 * 2);

  const AdviseSpace held = advise_space(start, {}, {"offload", "attention"}, Backend::cpu);
  EXPECT_EQ(held.configs.size(), 4 * ck * 2 * 2);
  for (const TrainConfig& c : held.configs) EXPECT_EQ(c.offload, Offload::none);

  const AdviseSpace allowed = advise_space(start, {"precision"}, {}, Backend::cpu);
  std::set<Precision> precisions;
  for (const TrainConfig& c : allowed.configs) precisions.insert(c.precision);
  EXPECT_EQ(precisions.size(), precision_names().size() - 1);  // tf32 needs CUDA
  EXPECT_FALSE(precisions.count(Precision::tf32));
  EXPECT_TRUE(advise_space(start, {"precision"}, {}, Backend::cuda).configs.size() >
              allowed.configs.size());

  // A CNN has no attention: the axis keeps the start's value.
  const AdviseSpace cnn = advise_space(start_of("cnn-tiny", 4), {}, {}, Backend::cpu);
  for (const TrainConfig& c : cnn.configs) EXPECT_EQ(c.attention, AttentionKind::math);

  EXPECT_THROW(advise_space(start, {"model"}, {}, Backend::cpu), BadInput);
  EXPECT_THROW(advise_space(start, {"checkpoint"}, {}, Backend::cpu), BadInput);
  EXPECT_THROW(advise_space(start, {}, {"mode"}, Backend::cpu), BadInput);
  TrainConfig eval = start;
  eval.mode = Mode::eval;
  EXPECT_THROW(advise_space(eval, {}, {}, Backend::cpu), BadInput);
}

TEST(AdviseSpace, PlainConfigAndTurnedGroups) {
  TrainConfig start = start_of("gpt-tiny", 4, 2);
  start.checkpoint = *Checkpoint::parse("1");
  start.offload = Offload::activations;
  start.precision = Precision::bf16;
  const TrainConfig plain = plain_config(start);
  EXPECT_EQ(plain.checkpoint, Checkpoint{});
  EXPECT_EQ(plain.offload, Offload::none);
  EXPECT_EQ(plain.precision, Precision::bf16);  // allow axes stay
  EXPECT_EQ(plain.batch_size, 4);               // the step's shape stays
  EXPECT_EQ(plain.accumulation, 2);

  TrainConfig to = start;
  to.batch_size = 1;
  to.accumulation = 8;
  to.zero_grad = ZeroGrad::zero;
  const auto groups = turned_groups(start, to);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<std::string>{"batch_size", "accumulation"}));
  EXPECT_EQ(groups[1], (std::vector<std::string>{"zero_grad"}));
}

// The search estimates with min(k, 2) micro-batches: the device peak (and whether it fits) must
// be the one of all k, for every configuration of the space.
TEST(AdviseSpace, TwoMicroBatchesGiveTheDevicePeakOfAll) {
  for (const char* model : {"gpt-tiny", "cnn-tiny", "mlp-tiny"}) {
    const AdviseSpace s = advise_space(start_of(model, 12), {"precision"}, {}, Backend::cpu);
    int checked = 0;
    for (const TrainConfig& c : s.configs) {
      if (c.accumulation <= 2 || c.precision == Precision::fp16) continue;
      TrainConfig two = c;
      two.accumulation = 2;
      const MemoryEstimate all = estimate_memory(c, Backend::cpu, 0);
      const MemoryEstimate est = estimate_memory(two, Backend::cpu, 0);
      ASSERT_EQ(est.peak_allocated, all.peak_allocated) << point_id(c);
      ASSERT_EQ(est.peak_reserved, all.peak_reserved) << point_id(c);
      const std::size_t limit = static_cast<std::size_t>(all.peak_allocated) + 4096;
      ASSERT_EQ(estimate_memory(two, Backend::cpu, limit).fits,
                estimate_memory(c, Backend::cpu, limit).fits)
          << point_id(c);
      ++checked;
    }
    EXPECT_GT(checked, 100) << model;
  }
}

TEST(AdviseSearch, ThreadsGiveTheSameResult) {
  const TrainConfig start = start_of("gpt-tiny", 4);
  const AdviseSpace s = advise_space(start, {}, {}, Backend::cpu);
  CostModel cost;
  cost.rate = {{32, 1e9}, {128, 2e9}};
  const std::size_t limit = static_cast<std::size_t>(default_peak("gpt-tiny") / 2);
  std::size_t n1 = 0, n3 = 0;
  const auto one = evaluate(s, Backend::cpu, limit, cost, &n1, 1);
  const auto three = evaluate(s, Backend::cpu, limit, cost, &n3, 3);
  ASSERT_EQ(one.size(), s.configs.size());
  ASSERT_EQ(three.size(), one.size());
  EXPECT_EQ(n1, n3);
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(three[i].id, one[i].id);
    EXPECT_EQ(three[i].peak, one[i].peak);
    EXPECT_EQ(three[i].fits, one[i].fits);
    EXPECT_EQ(three[i].step_s, one[i].step_s);
  }
  // The frontier: peak ascending, throughput rising, and nothing in the space better in both.
  const auto front = pareto_frontier(one, start);
  for (const AdvisePoint& f : front)
    for (const AdvisePoint& p : one)
      EXPECT_FALSE((p.peak <= f.peak && p.samples_per_s > f.samples_per_s * (1 + 1e-9)) ||
                   (p.peak < f.peak && p.samples_per_s >= f.samples_per_s))
          << p.id << " beats " << f.id;
}

// A cost model with known coefficients generates the calibration's timings; the fit must give
// its predictions back.
TEST(AdviseCost, FitRecoversTheCoefficientsThatMadeTheTimings) {
  CostModel truth;
  truth.rate = {{64, 1e9}, {256, 2e9}};
  truth.step_per_param = 1e-8;
  truth.kappa_blocks = 1.3;
  truth.kappa_selective = 0.7;
  truth.terms = {
      {"offload", "activations", 1, 2e-10, 0, 0},  {"offload", "optimizer", 1, 0, 5e-9, 0},
      {"offload", "params", 1, 3e-10, 4e-9, 0},    {"zero_grad", "zero", 1, 0, 1e-9, 0},
      {"empty_cache", "per_step", 1, 0, 0, 1e-11}, {"attention", "flash", 0.9, 0, 0, 0}};
  auto inputs = [](std::int64_t b, std::int64_t a,
                   std::vector<std::pair<std::string, std::string>> v) {
    CostInputs in;
    in.accumulation = a;
    in.rows = 64.0 * static_cast<double>(b);
    in.flops = 1e8 * static_cast<double>(b);
    in.params = 1e6;
    in.reserved = 1e8;
    in.values = std::move(v);
    for (const auto& [axis, value] : in.values) {
      if (value == "activations" || value == "params")
        in.copied_per_micro = 5e6 * static_cast<double>(b);
      if (value == "optimizer" || value == "params") in.copied_per_step = 8e6;
      if (axis == "checkpoint")
        (value == "selective" ? in.flops_selective : in.flops_blocks) =
            3e7 * static_cast<double>(b);
    }
    return in;
  };
  auto measure = [&](std::int64_t b, std::int64_t a,
                     std::vector<std::pair<std::string, std::string>> v) {
    Measured m;
    m.in = inputs(b, a, std::move(v));
    m.seconds = truth.predict(m.in);
    return m;
  };
  CalibrationSet set;
  for (std::int64_t b : {1, 2, 4}) set.curve.push_back(measure(b, 1, {}));
  set.plain1 = measure(4, 1, {});
  set.plain2 = measure(4, 2, {});
  for (const auto& [axis, value] :
       std::vector<std::pair<std::string, std::string>>{{"offload", "activations"},
                                                        {"offload", "optimizer"},
                                                        {"offload", "params"},
                                                        {"zero_grad", "zero"},
                                                        {"empty_cache", "per_step"},
                                                        {"attention", "flash"},
                                                        {"checkpoint", "1"},
                                                        {"checkpoint", "selective"}}) {
    set.values.push_back(
        {axis, value, measure(4, 1, {{axis, value}}),
         value == "params" ? std::optional(measure(4, 2, {{axis, value}})) : std::nullopt});
  }
  const CostModel fit = fit_cost_model(set);
  EXPECT_NEAR(fit.step_per_param, 1e-8, 1e-15);
  EXPECT_NEAR(fit.kappa_blocks, 1.3, 1e-9);
  EXPECT_NEAR(fit.kappa_selective, 0.7, 1e-9);
  EXPECT_NEAR(fit.rate_at(128), 1.5e9, 1e-3 * 1.5e9);
  for (std::int64_t b : {1, 2, 3, 4, 8})
    for (std::int64_t a : {1, 3})
      for (const auto& v : std::vector<std::vector<std::pair<std::string, std::string>>>{
               {},
               {{"offload", "activations"}},
               {{"offload", "params"}, {"attention", "flash"}},
               {{"checkpoint", "0.5"}, {"zero_grad", "zero"}},
               {{"empty_cache", "per_step"}},
               {{"checkpoint", "selective"}, {"offload", "optimizer"}}}) {
        const CostInputs in = inputs(b, a, v);
        EXPECT_NEAR(fit.predict(in), truth.predict(in), 1e-9 * truth.predict(in))
            << "b" << b << " a" << a << " " << (v.empty() ? "" : v[0].second);
      }
}

TEST(AdviseCost, CostInputsSplitRecomputeAndCountCopies) {
  TrainConfig c = start_of("gpt-tiny", 4, 3);
  const auto m = make_model(c);
  c.checkpoint = *Checkpoint::parse("1");
  c.offload = Offload::activations;
  TrainConfig two = c;
  two.accumulation = 2;
  const CostInputs in = cost_inputs(c, *m, estimate_memory(two, Backend::cpu, 0), 2);
  EXPECT_EQ(in.accumulation, 3);
  EXPECT_EQ(in.rows, 4.0 * 32);
  EXPECT_GT(in.flops_blocks, 0);
  EXPECT_EQ(in.flops_selective, 0);
  EXPECT_GT(in.copied_per_micro, 0);
  EXPECT_EQ(in.copied_per_step, 0);
  // Per micro-batch: the same whether counted over two micro-batches or one.
  TrainConfig one = c;
  one.accumulation = 1;
  EXPECT_EQ(cost_inputs(one, *m, estimate_memory(one, Backend::cpu, 0), 1).copied_per_micro,
            in.copied_per_micro);
  c.checkpoint = *Checkpoint::parse("selective");
  c.offload = Offload::optimizer;
  const CostInputs sel = cost_inputs(c, *m, estimate_memory(c, Backend::cpu, 0), 3);
  EXPECT_GT(sel.flops_selective, 0);
  EXPECT_EQ(sel.flops_blocks, 0);
  EXPECT_GT(sel.copied_per_step, 0);
}

// ---- the command, end to end ---------------------------------------------------------------

TEST(AdviseCli, PickFitsWhenRunAndTheFrontierIsPareto) {
  TempDir dir;
  const std::int64_t cap = default_peak("gpt-tiny") / 2;
  CliResult r = run_cli(fmt::format(
      "advise --backend cpu --model gpt-tiny --capacity {}B --confirm 3 --steps 2 --threads 1 "
      "--json --calibration {}",
      cap, dir.file("cal.json")));
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["schema"], "memtrade.advise/1");
  EXPECT_TRUE(j["bugs"].empty());
  const json& rec = j["recommended"];
  ASSERT_TRUE(rec.is_object());
  EXPECT_TRUE(rec["fits"].get<bool>());
  EXPECT_TRUE(rec["exact"].get<bool>());
  EXPECT_LE(rec["predicted_peak"].get<std::int64_t>(), cap);
  EXPECT_EQ(rec["config"]["batch_size"].get<int>() * rec["config"]["accumulation"].get<int>(), 8);
  EXPECT_FALSE(rec["explanation"].empty());
  ASSERT_EQ(j["confirmed"].size(), 3u);
  for (const json& c : j["confirmed"]) {
    EXPECT_EQ(c["status"], "ok") << c["id"];
    EXPECT_EQ(c["measured_peak"], c["predicted_peak"]) << c["id"];  // exact on the CPU
  }
  // Frontier: peak ascending, throughput strictly rising, nothing in the space better in both.
  const json& f = j["frontier"];
  ASSERT_GT(f.size(), 1u);
  for (std::size_t i = 1; i < f.size(); ++i) {
    EXPECT_GE(f[i]["predicted_peak"], f[i - 1]["predicted_peak"]);
    EXPECT_GT(f[i]["predicted_samples_per_s"], f[i - 1]["predicted_samples_per_s"]);
  }
  // No fitting frontier point is predicted faster than the recommendation (unless it was
  // re-ranked by measurement).
  if (!rec["measured"].get<bool>()) {
    for (const json& p : f) {
      if (p["fits"].get<bool>()) {
        EXPECT_LE(p["predicted_samples_per_s"].get<double>(),
                  rec["predicted_samples_per_s"].get<double>() * (1 + 1e-9));
      }
    }
  }

  // The recommended config runs again from its JSON through the knob flags, and fits.
  TrainConfig c = config_from_json(rec["config"]);
  std::string flags;
  for (const Knob& k : knobs()) flags += fmt::format(" {} '{}'", k.flag, k.get(c));  // '' too
  CliResult again =
      run_cli(fmt::format("run --backend cpu{} --capacity {}B --steps 1 --quiet --out {}", flags,
                          cap, dir.file("again.json")));
  EXPECT_EQ(again.rc, 0) << again.err;
  EXPECT_EQ(json::parse(testing::read_file(dir.file("again.json")))["points"][0]["status"], "ok");

  // The calibration is cached: a second advise runs no point.
  CliResult second = run_cli(fmt::format(
      "advise --backend cpu --model gpt-tiny --capacity {}B --steps 2 --threads 1 --json "
      "--calibration {}",
      cap, dir.file("cal.json")));
  ASSERT_EQ(second.rc, 0) << second.err;
  EXPECT_EQ(json::parse(second.out)["cost_model"]["calibration"]["measured"], 0);
}

TEST(AdviseCli, NothingFitsSaysTheSmallestPeakAndExits1) {
  TempDir dir;
  // Above the parameters alone, below anything trainable.
  CliResult r = run_cli(fmt::format(
      "advise --backend cpu --model gpt-tiny --capacity 300KiB --steps 2 --threads 1 --json "
      "--calibration {}",
      dir.file("cal.json")));
  ASSERT_EQ(r.rc, 1) << r.err;
  const json j = json::parse(r.out);
  EXPECT_TRUE(j["recommended"].is_null());
  const json& n = j["nothing_fits"];
  ASSERT_TRUE(n.is_object());
  EXPECT_GT(n["smallest"]["predicted_peak"].get<std::int64_t>(), 300 * 1024);
  EXPECT_FALSE(n["changes"].empty());
}

TEST(AdviseCli, BadInputIsOneLineAndExit2) {
  for (const char* args : {
           "--model gpt-tiny --capacity h9000",  // unknown card
           "--model gpt-tiny --capacity 1KiB",   // below the parameters
           "--model gpt-tiny --capacity 1GiB --global-batch 10 --batch-size 4",  // not divisible
           "--model gpt-tiny --capacity 1GiB --global-batch 8 --batch-size 4 --accumulation 4",
           "--model gpt-tiny",  // no capacity
           "--model gpt-tiny --capacity 1GiB --allow model",
           "--model gpt-tiny --capacity 1GiB --hold mode",
           "--model gpt-tiny --capacity 1GiB --mode eval",
           "--model gpt-tiny --capacity 1GiB --margin 120%",
           "--model gpt-tiny --capacity 1GiB --calibrate-on gpt-huge",
       }) {
    CliResult r = run_cli(std::string("advise --backend cpu ") + args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
}

// ---- on a GPU of the table: the time model prices every point ---------------------------------

// Every flag of a config, as `memtrade run` / `estimate` take them.
std::string flags_of(const TrainConfig& c) {
  std::string flags;
  for (const Knob& k : knobs()) flags += fmt::format(" {} '{}'", k.flag, k.get(c));  // '' too
  return flags;
}

TEST(AdviseGpu, PickFitsTheCardAndItsTimeModelIsEstimates) {
  // gpt-mini, 8 samples a step, on its cuBLAS workspaces (65 MiB on an H100, which no knob
  // moves) and two thirds of the rest of its peak: advise must turn knobs; the pick fits, and its
  // time model is `estimate --gpu` of the same configuration, to the last digit.
  TrainConfig start = start_of("gpt-mini", 8);
  const MemoryEstimate s = estimate_memory(start, Backend::cuda, 0);
  const std::int64_t ws = s.breakdown_at_peak[static_cast<std::size_t>(Category::workspace)];
  const std::int64_t cap = ws + (s.peak_allocated - ws) * 2 / 3;
  CliResult r = run_cli(fmt::format(
      "advise --model gpt-mini --global-batch 8 --gpu h100 --capacity {}B --margin 0 --json", cap));
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["gpu"], "h100");
  EXPECT_EQ(j["gpus"], 1);
  EXPECT_EQ(j["backend"], "cuda");
  EXPECT_EQ(j["cost_model"]["kind"], "time-model");
  const json& rec = j["recommended"];
  ASSERT_TRUE(rec.is_object());
  EXPECT_TRUE(rec["fits"].get<bool>());
  EXPECT_LE(rec["predicted_reserved"].get<std::int64_t>(), cap);
  EXPECT_NE(rec["id"], j["start"]["id"]);  // it had to turn something
  const TrainConfig c = config_from_json(rec["config"]);
  EXPECT_TRUE(estimate_memory(c, Backend::cuda, static_cast<std::size_t>(cap)).fits);
  for (const json& p : j["frontier"]) EXPECT_TRUE(p.contains("time_model")) << p["id"];
  const json& tm = rec["time_model"];
  EXPECT_EQ(tm["gpu"], "h100");
  EXPECT_DOUBLE_EQ(tm["step_s"].get<double>(), rec["predicted_step_s"].get<double>());
  CliResult e = run_cli("estimate --json --gpu h100" + flags_of(c));
  ASSERT_EQ(e.rc, 0) << e.err;
  json est = json::parse(e.out)["points"][0]["time_model"];
  EXPECT_EQ(est, tm);
  // Throughput per GPU, in tokens for a language model, with its MFU.
  EXPECT_GT(tm["tokens_per_s_per_gpu"].get<double>(), 0);
  EXPECT_GT(tm["mfu"].get<double>(), 0);
  EXPECT_LT(tm["mfu"].get<double>(), 1);
  // Every explanation names the card.
  for (const json& x : rec["explanation"])
    EXPECT_NE(x["text"].get<std::string>().find("on h100"), std::string::npos) << x["text"];
}

TEST(AdviseGpu, TheCapacityIsTheCardsMemoryAndTheTextShowsTokensAndMfu) {
  CliResult r = run_cli("advise --model gpt-tiny --gpu a100-40g --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["capacity"].get<std::size_t>(),
            static_cast<std::size_t>(find_gpu("a100-40g")->memory_gib * static_cast<double>(GiB)));
  EXPECT_TRUE(j["start"]["fits"].get<bool>());  // gpt-tiny fits 40 GiB as given
  EXPECT_TRUE(j["recommended"]["fits"].get<bool>());
  CliResult t = run_cli("advise --model gpt-tiny --gpu a100-40g");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("tok/s/GPU"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("MFU"), std::string::npos) << t.out;
  // MLP and CNN keep samples.
  CliResult m = run_cli("advise --model mlp-tiny --gpu a100-40g");
  ASSERT_EQ(m.rc, 0) << m.err;
  EXPECT_EQ(m.out.find("tok/s"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find("samples/s"), std::string::npos) << m.out;
}

TEST(AdviseGpu, GpusSearchesTensorAndDataParallelLayouts) {
  // llama-tiny: 4 heads, 2 KV heads. On 8 GPUs of an 8-GPU NVLink domain, tp 4 and 8 split the
  // KV heads unevenly and are refused by the model: tp 1 × dp 8 and tp 2 × dp 4 remain.
  TrainConfig start = start_of("llama-tiny", 1);
  start.data_parallel = 8;
  resolve_config(start);
  const AdviseSpace space = advise_space(start, {}, {}, Backend::cuda, ParallelSearch{8, 8});
  std::set<std::pair<std::int64_t, std::int64_t>> layouts;
  std::set<std::string> shardings;
  bool sp_on = false;
  for (const TrainConfig& c : space.configs) {
    EXPECT_EQ(c.tensor_parallel * c.data_parallel, 8) << point_id(c);
    EXPECT_EQ(samples_per_step(c), 8) << point_id(c);
    layouts.insert({c.tensor_parallel, c.data_parallel});
    shardings.insert(std::string(sharding_name(c.sharding)));
    if (c.sequence_parallel == SequenceParallel::on) {
      sp_on = true;
      EXPECT_GT(c.tensor_parallel, 1) << point_id(c);
    }
  }
  EXPECT_EQ(layouts, (std::set<std::pair<std::int64_t, std::int64_t>>{{1, 8}, {2, 4}}));
  EXPECT_EQ(shardings.size(), sharding_names().size());
  EXPECT_TRUE(sp_on);
  for (const char* axis : {"data_parallel", "sharding", "tensor_parallel", "sequence_parallel"})
    EXPECT_NE(std::find(space.axes.begin(), space.axes.end(), axis), space.axes.end()) << axis;
  // tp stays inside the NVLink domain: with a domain of 1 only tp 1 remains.
  for (const TrainConfig& c :
       advise_space(start, {}, {}, Backend::cuda, ParallelSearch{8, 1}).configs)
    EXPECT_EQ(c.tensor_parallel, 1);
  // One GPU: the layout rows stay as given.
  TrainConfig one = start_of("llama-tiny", 8);
  for (const TrainConfig& c : advise_space(one, {}, {}, Backend::cuda).configs)
    EXPECT_EQ(c.tensor_parallel * c.data_parallel, 1);

  // End to end: every point on 8 GPUs, priced per GPU.
  CliResult r = run_cli("advise --model llama-tiny --gpu h100 --gpus 8 --global-batch 8 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["gpus"], 8);
  EXPECT_EQ(j["values"]["tensor_parallel"], (json{"1", "2"}));
  EXPECT_EQ(j["values"]["data_parallel"], (json{"8", "4"}));
  for (const json& p : j["frontier"]) EXPECT_EQ(p["time_model"]["gpus"], 8) << p["id"];
  // Explanations compare layouts of the same 8 GPUs: tp and dp revert together.
  const TrainConfig to = config_from_json(j["recommended"]["config"]);
  for (const auto& group : turned_groups(config_from_json(j["start"]["config"]), to, true)) {
    TrainConfig without = to;
    for (const std::string& a : group) set_knob(without, knob(a), knob(a).get(start));
    EXPECT_EQ(without.tensor_parallel * without.data_parallel, 8) << fmt::format("{}", group[0]);
  }
}

TEST(AdviseGpu, BadInputIsOneLineAndExit2) {
  for (const char* args : {
           "--model gpt-tiny --gpu h9000",                             // not in the table
           "--model gpt-tiny --gpu h100 --backend cpu",                // a CUDA card
           "--model gpt-tiny --capacity 1GiB --gpus 8",                // --gpus without --gpu
           "--model gpt-tiny --gpu h100 --gpus 0",                     // no GPUs
           "--model llama-tiny --gpu h100 --gpus 8 --tp 3",            // 8 is not a multiple of 3
           "--model llama-tiny --gpu h100 --gpus 8 --dp 2",            // 2 × tp 1 is not 8
           "--model llama-tiny --gpu h100 --gpus 8 --tp 8",            // the KV heads cannot split
           "--model llama-tiny --gpu h100 --gpus 8 --global-batch 4",  // not a sample per rank
           "--model gpt-tiny --gpu h100 --hold data_parallel",         // kept on one GPU
           "--model gpt-tiny --gpu h100 --gpus 2 --confirm 1",         // one process per run
       }) {
    CliResult r = run_cli(std::string("advise ") + args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
}

// The time model of a tensor-parallel step: its collectives are priced (on the compute stream,
// over NVLink), and its rates are per GPU of the tp × dp ranks with the whole model's FLOPs.
TEST(AdviseGpu, TensorParallelCollectivesArePricedPerGpu) {
  const GpuSpec* h100 = find_gpu("h100");
  TrainConfig one = start_of("llama-tiny", 4);
  TrainConfig two = one;
  two.tensor_parallel = 2;
  resolve_config(two);
  const TimeModel t1 = *estimate_memory(one, Backend::cuda, 0, 1, 0, h100).time;
  const TimeModel t2 = *estimate_memory(two, Backend::cuda, 0, 1, 0, h100).time;
  const auto comm = static_cast<std::size_t>(TimeShare::comm);
  EXPECT_EQ(t1.shares[comm], 0.0);  // one GPU: nothing to communicate
  EXPECT_GT(t2.shares[comm], 0.0);  // tp 2: the row-parallel all-reduces, the vocabulary's
  EXPECT_EQ(t2.gpus, 2);
  EXPECT_EQ(t2.model_flops_per_sample, t1.model_flops_per_sample);  // the whole model's
  EXPECT_EQ(t2.tokens_per_step, t1.tokens_per_step);
  // Per GPU: the step's tokens over 2 GPUs; MFU from those and the whole model's FLOPs.
  EXPECT_DOUBLE_EQ(t2.tokens_per_s_per_gpu(),
                   static_cast<double>(t2.tokens_per_step) / t2.step_s / 2);
  EXPECT_NEAR(t2.mfu(),
              static_cast<double>(t2.samples_per_step) * t2.model_flops_per_sample /
                  (t2.step_s * 2 * t2.peak_flops),
              1e-12);
  // Sequence parallelism's all-gathers and reduce-scatters are priced too (in line: a started
  // collective of a tp group would be waited for by nothing and cost no step time).
  TrainConfig sp = two;
  sp.sequence_parallel = SequenceParallel::on;
  resolve_config(sp);
  const TimeModel t3 = *estimate_memory(sp, Backend::cuda, 0, 1, 0, h100).time;
  EXPECT_GT(t3.shares[comm], 0.0);
}

// A model measured on the CPU and used for CUDA keeps no falling stretch of the CPU's rate curve
// (past its cache, a CPU's per-row time can grow with the micro-batch; a GPU's GEMMs' does not).
TEST(AdviseCost, TransferredRateNeverFallsWithTheMicroBatch) {
  CostModel m;
  m.rate = {{1, 10e9}, {4, 30e9}, {16, 20e9}, {64, 25e9}};
  EXPECT_LT(m.rate_at(16), m.rate_at(4));
  m.rate_never_falls();
  const std::vector<double> want = {10e9, 30e9, 30e9, 30e9};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(m.rate[i].second, want[i]) << i;
  EXPECT_EQ(m.rate_at(32), 30e9);
  EXPECT_EQ(m.rate_at(2), 10e9 + (30e9 - 10e9) * 0.5);  // rising stretches stay as measured
}

}  // namespace
}  // namespace memtrade
