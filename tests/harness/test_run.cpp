// `memtrade run` end to end through the real binary: isolation (OOM, crash, hang become rows),
// atomic results and --resume after an interrupt, shards + merge, bad input, and the smoke grid
// with the memory model's prediction next to every measurement.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <unistd.h>

#include "fixtures/gate_fixtures.h"
#include "harness/run/grid.h"
#include "kernels/cuda_probe.h"

namespace memtrade {
namespace {

using testing::CliResult;
using testing::json;
using testing::read_file;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

json load(const std::string& path) {
  return json::parse(read_file(path));
}

constexpr const char* kTinyGrid = R"(
name = "tiny"
[run]
backend = "cpu"
warmup = 1
steps = 3
[axes]
model = ["mlp-tiny"]
batch_size = [2, 4, 8, 16]
optimizer = ["sgd", "adam"]
)";

TEST(Run, OnePointFromFlagsWritesTheResultsSchema) {
  TempDir dir;
  CliResult r =
      run_cli("run --backend cpu --model mlp-tiny --batch-size 4 --steps 5 --quiet --out " +
              dir.file("r.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = load(dir.file("r.json"));
  EXPECT_EQ(j["schema"], "memtrade.results/1");
  for (const char* k :
       {"commit", "dirty", "time", "host", "backend", "device", "capacity", "versions"})
    EXPECT_TRUE(j["meta"].contains(k)) << k;
  ASSERT_EQ(j["points"].size(), 1u);
  const json& p = j["points"][0];
  EXPECT_EQ(p["status"], "ok");
  EXPECT_EQ(p["config"]["batch_size"], 4);
  EXPECT_TRUE(p["config"].contains("hyper"));
  EXPECT_EQ(p["time"]["samples_s"].size(), 5u);
  EXPECT_GT(p["memory"]["peak_allocated"].get<std::int64_t>(), 0);
  EXPECT_EQ(p["memory"]["predicted_peak"], p["memory"]["peak_allocated"]);
  for (const char* k : {"samples_per_s", "tokens_per_s", "flops_per_step", "tflops"})
    EXPECT_TRUE(p["throughput"].contains(k)) << k;
  EXPECT_TRUE(p["train"]["loss_first"].is_number());
}

TEST(Run, OomIsARowWithTheAllocatorsMessage) {
  TempDir dir;
  CliResult r = run_cli(
      "run --backend cpu --model gpt-tiny --batch-size 512 --capacity 8MiB "
      "--steps 2 --quiet --out " +
      dir.file("r.json"));
  ASSERT_EQ(r.rc, 0) << r.err;  // an OOM is a result, not a failure of the run
  json p = load(dir.file("r.json"))["points"][0];
  EXPECT_EQ(p["status"], "oom");
  EXPECT_NE(p["error"].get<std::string>().find("out of memory"), std::string::npos) << p["error"];
  EXPECT_NE(p["error"].get<std::string>().find("8.00 MiB"), std::string::npos) << p["error"];
}

TEST(Run, CrashAndHangBecomeRowsAndTheGridGoesOn) {
  TempDir dir;
  write_file(dir.file("g.toml"), kTinyGrid);
  setenv("MEMTRADE_FAULT", "crash:/b4/", 1);
  CliResult r =
      run_cli("run --grid " + dir.file("g.toml") + " --quiet --out " + dir.file("c.json"));
  unsetenv("MEMTRADE_FAULT");
  EXPECT_EQ(r.rc, 1);  // an errored point makes the run's exit code 1, after every point ran
  json c = load(dir.file("c.json"));
  ASSERT_EQ(c["points"].size(), 8u);
  int crashed = 0;
  for (const auto& p : c["points"]) {
    if (p["id"].get<std::string>().find("/b4/") != std::string::npos) {
      EXPECT_EQ(p["status"], "error");
      EXPECT_NE(p["error"].get<std::string>().find("signal 11"), std::string::npos) << p["error"];
      ++crashed;
    } else {
      EXPECT_EQ(p["status"], "ok") << p["id"];
    }
  }
  EXPECT_EQ(crashed, 2);

  // Shard 0/4 is points 0 and 4 in grid order: b2/sgd (made to hang) and b8/sgd. The timeout is
  // the healthy point's too: 5 s, because a machine loaded by parallel builds and ctest -j (load 9
  // on 2 cores, seen) took over 1 s of wall time to start and run mlp-tiny's 4 steps.
  setenv("MEMTRADE_FAULT", "hang:/b2/", 1);
  CliResult hung = run_cli("run --grid " + dir.file("g.toml") +
                           " --quiet --timeout 5s --shard 0/4 --out " + dir.file("h.json"));
  unsetenv("MEMTRADE_FAULT");
  EXPECT_EQ(hung.rc, 1);
  json hj = load(dir.file("h.json"));
  ASSERT_EQ(hj["points"].size(), 2u);
  EXPECT_EQ(hj["points"][0]["status"], "timeout");
  EXPECT_EQ(hj["points"][0]["error"], "timed out after 5 s");
  EXPECT_EQ(hj["points"][1]["status"], "ok");
}

TEST(Run, InterruptThenResumeRunsEveryPointExactlyOnce) {
  TempDir dir;
  write_file(dir.file("g.toml"), kTinyGrid);
  const std::string out = dir.file("r.json");
  pid_t pid = fork();
  if (pid == 0) {
    execl(MEMTRADE_BINARY, MEMTRADE_BINARY, "run", "--grid", dir.file("g.toml").c_str(), "--quiet",
          "--steps", "40", "--out", out.c_str(), nullptr);
    _exit(127);
  }
  // Wait for the first finished point, then Ctrl-C the parent.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::size_t done = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    try {
      done = load(out)["points"].size();
    } catch (...) {
      done = 0;  // not written yet (the file is replaced atomically, never half-written)
    }
    if (done >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(done, 1u);
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  json partial = load(out);
  ASSERT_LT(partial["points"].size(), 8u);
  ASSERT_GE(partial["points"].size(), 1u);
  std::map<std::string, json> before;
  for (const auto& p : partial["points"]) before[p["id"]] = p;

  CliResult r =
      run_cli("run --grid " + dir.file("g.toml") + " --quiet --steps 40 --resume --out " + out);
  ASSERT_EQ(r.rc, 0) << r.err;
  json full = load(out);
  ASSERT_EQ(full["points"].size(), 8u);
  std::set<std::string> ids;
  for (const auto& p : full["points"]) {
    EXPECT_TRUE(ids.insert(p["id"]).second) << "repeated " << p["id"];
    EXPECT_EQ(p["status"], "ok");
    if (before.count(p["id"])) {
      EXPECT_EQ(p, before[p["id"]]) << "a finished point was rerun";
    }
  }
  // --resume against another grid is refused.
  write_file(dir.file("other.toml"), "[axes]\nbatch_size = [3]\n");
  EXPECT_EQ(run_cli("run --grid " + dir.file("other.toml") + " --resume --quiet --out " + out).rc,
            2);
}

// A CUDA grid's points are listed (and sharded) without a usable device: a cluster's login
// node plans the shards of GPU jobs. Running it without one is still bad input.
TEST(Run, ListsACudaGridWithoutADevice) {
  const std::string grid = std::string(MEMTRADE_SOURCE_DIR) + "/ci/grids/gpu-check.toml";
  CliResult all = run_cli("run --grid " + grid + " --list");
  ASSERT_EQ(all.rc, 0) << all.err;
  EXPECT_EQ(std::count(all.out.begin(), all.out.end(), '\n'), 10) << all.out;
  EXPECT_NE(all.out.find("gpt2-124m/b8/a1/tf32/"), std::string::npos) << all.out;  // kept on cuda
  CliResult shard = run_cli("run --grid " + grid + " --list --shard 1/3");
  ASSERT_EQ(shard.rc, 0) << shard.err;
  EXPECT_EQ(std::count(shard.out.begin(), shard.out.end(), '\n'), 3) << shard.out;
  if (!probe_cuda().usable) {
    CliResult run = run_cli("run --grid " + grid + " --quiet --out /dev/null");
    EXPECT_EQ(run.rc, 2) << run.out << run.err;
  }
}

TEST(Run, ShardsMergeIntoTheSingleMachineRun) {
  TempDir dir;
  write_file(dir.file("g.toml"), kTinyGrid);
  ASSERT_EQ(
      run_cli("run --grid " + dir.file("g.toml") + " --quiet --out " + dir.file("all.json")).rc, 0);
  std::string shards;
  for (int i = 0; i < 3; ++i) {
    std::string f = dir.file(fmt::format("s{}.json", i));
    ASSERT_EQ(run_cli(fmt::format("run --grid {} --quiet --shard {}/3 --out {}", dir.file("g.toml"),
                                  i, f))
                  .rc,
              0);
    shards += " " + f;
  }
  CliResult m =
      run_cli("merge" + shards + " --grid " + dir.file("g.toml") + " -o " + dir.file("m.json"));
  ASSERT_EQ(m.rc, 0) << m.out << m.err;
  json all = load(dir.file("all.json")), merged = load(dir.file("m.json"));
  ASSERT_EQ(merged["points"].size(), all["points"].size());
  for (std::size_t i = 0; i < all["points"].size(); ++i) {
    EXPECT_EQ(merged["points"][i]["id"], all["points"][i]["id"]);
    EXPECT_EQ(merged["points"][i]["memory"]["peak_allocated"],
              all["points"][i]["memory"]["peak_allocated"]);
    EXPECT_EQ(merged["points"][i]["memory"]["breakdown_at_peak"],
              all["points"][i]["memory"]["breakdown_at_peak"]);
  }
  // A missing shard is named; a shard of another grid is refused.
  CliResult partial = run_cli("merge " + dir.file("s0.json") + " " + dir.file("s1.json") +
                              " --grid " + dir.file("g.toml") + " -o " + dir.file("p.json"));
  EXPECT_EQ(partial.rc, 1);
  EXPECT_NE(partial.out.find("missing 2 points"), std::string::npos) << partial.out;
  write_file(dir.file("o.toml"), "[run]\nbackend = \"cpu\"\n[axes]\nbatch_size = [3]\n");
  ASSERT_EQ(run_cli("run --grid " + dir.file("o.toml") + " --quiet --out " + dir.file("o.json")).rc,
            0);
  EXPECT_EQ(run_cli("merge " + dir.file("s0.json") + " " + dir.file("o.json") + " -o " +
                    dir.file("x.json"))
                .rc,
            2);
}

TEST(Run, BadInputIsOneLineAndExitCode2) {
  TempDir dir;
  write_file(dir.file("bad.toml"), "[axes\n");
  write_file(dir.file("axis.toml"), "[axes]\ncolour = [\"red\"]\n");
  const std::vector<std::string> cases = {
      "run --grid " + dir.file("bad.toml"),
      "run --grid " + dir.file("axis.toml"),
      "run --grid /nonexistent.toml",
      "run --model mlp-tiny --precision fp8",
      "run --model mlp-tiny --batch-size -4",
      "run --model mlp-tiny --capacity 12XB",
      "run --model nope",
      "run --model mlp-tiny --checkpoint 2",
      "run --model mlp-tiny --frobnicate",
      "step --model mlp-tiny --precision tf32 --backend cpu",
      "estimate --model mlp-tiny --optimizer lion",
      "export /nonexistent.json",
  };
  for (const auto& c : cases) {
    CliResult r = run_cli(c);
    EXPECT_EQ(r.rc, 2) << c << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c << ": " << r.err;
    EXPECT_EQ(r.out, "") << c;
  }
}

TEST(Run, ExportWritesCsv) {
  TempDir dir;
  ASSERT_EQ(
      run_cli("run --backend cpu --model mlp-tiny --steps 2 --quiet --out " + dir.file("r.json"))
          .rc,
      0);
  CliResult r = run_cli("export " + dir.file("r.json"));
  ASSERT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind("id,status,model,batch_size", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2);
}

// The smoke grid: every point ok (or the intended OOM), every axis value present, and the memory
// model's prediction within 3% of the measured peak on every point (it is exact on the CPU).
TEST(Run, SmokeGridAndTheMemoryModel) {
  TempDir dir;
  std::string grid = std::string(MEMTRADE_SOURCE_DIR) + "/ci/grids/smoke.toml";
  auto start = std::chrono::steady_clock::now();
  CliResult r =
      run_cli("run --grid " + grid + " --backend cpu --quiet --out " + dir.file("s.json"));
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.rc, 0) << r.err;
  json s = load(dir.file("s.json"));
  std::map<std::string, std::set<std::string>> seen;
  double worst = 0;
  std::string worst_id;
  for (const auto& p : s["points"]) {
    const std::string id = p["id"];
    if (p["config"]["batch_size"] == 4096) {
      EXPECT_EQ(p["status"], "oom") << id;
    } else {
      ASSERT_EQ(p["status"], "ok") << id << ": " << p["error"];
    }
    for (const auto& [axis, value] : p["config"].items())
      seen[axis].insert(value.is_string() ? value.get<std::string>() : value.dump());
    if (p["status"] != "ok") continue;
    double measured = p["memory"]["peak_allocated"].get<double>();
    double predicted = p["memory"]["predicted_peak"].get<double>();
    double err = std::abs(predicted - measured) / measured;
    if (err > worst) worst = err, worst_id = id;
    EXPECT_LE(err, 0.03) << id << ": predicted " << predicted << " measured " << measured;
  }
  Grid g = load_grid(grid, "cpu");
  for (const char* axis : {"model", "accumulation", "precision", "checkpoint", "optimizer",
                           "offload", "zero_grad", "mode", "empty_cache", "input"})
    EXPECT_GE(seen[axis].size(), std::string(axis) == "precision" ? 5u : 2u) << axis;
  std::cout << fmt::format(
      "[ smoke    ] {} points in {:.1f} s; worst estimate error {:.3f}% ({})\n", s["points"].size(),
      wall, worst * 100, worst_id);
}

}  // namespace
}  // namespace memtrade

namespace memtrade {
namespace {

TEST(Fit, LargestBatchIsConfirmedByRunning) {
  TempDir dir;
  CliResult r = run_cli("fit --backend cpu --model gpt-tiny --capacity 16MiB --confirm --json " +
                        dir.file("f.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  json f = load(dir.file("f.json"));
  ASSERT_EQ(f["rows"].size(), 1u);
  const json& row = f["rows"][0];
  std::int64_t best = row["max_batch"];
  EXPECT_GT(best, 8);  // b8 peaks near 4 MiB
  EXPECT_LE(row["predicted_peak"].get<std::int64_t>(), 16 * 1024 * 1024);
  EXPECT_EQ(row["confirmed"]["at"], "ok");
  EXPECT_EQ(row["confirmed"]["above"], "oom");
  EXPECT_TRUE(row["confirmed_ok"].get<bool>());
  EXPECT_EQ(run_cli("fit --model gpt-tiny").rc, 2);  // no --capacity
}

}  // namespace
}  // namespace memtrade
