// The user's own model through the CLI: --model-config FILE (and model_config in a grid) with the
// published config.json files, the point id (the file's name and content hash), refused configs
// as one line and exit code 2, and model overrides on the command line and in grids.
#include <gtest/gtest.h>

#include <sstream>

#include <fmt/format.h>

#include "fixtures/gate_fixtures.h"
#include "harness/cli/cli.h"
#include "models/config/hf_config.h"
#include "models/config/knobs.h"
#include "models/config/sha256.h"
#include "models/model.h"
#include "models/model_desc.h"

namespace memtrade {
namespace {

using namespace memtrade::testing;

std::string fixture(const std::string& name) {
  return std::string(MEMTRADE_SOURCE_DIR) + "/tests/models/fixtures/hf/" + name + ".json";
}

json estimate(const std::string& args) {
  const CliResult r = run_cli("estimate --backend cpu --json " + args);
  EXPECT_EQ(r.rc, 0) << args << ": " << r.err;
  return r.rc == 0 ? json::parse(r.out)["points"][0] : json();
}

TEST(ModelConfig, PublishedConfigsGiveThePublishedCountsAndNamedIds) {
  const std::pair<const char*, std::int64_t> cases[] = {{"Llama-3.2-1B", 1'235'814'400},
                                                        {"Llama-3.2-3B", 3'212'749'824},
                                                        {"Meta-Llama-3-8B", 8'030'261'248},
                                                        {"gpt2", 124'439'808}};
  for (const auto& [name, count] : cases) {
    SCOPED_TRACE(name);
    const json p =
        estimate(fmt::format("--model-config {} --seq-len 16 --batch-size 1", fixture(name)));
    const std::string sha = sha256_hex(read_file(fixture(name)));
    EXPECT_EQ(p["config"]["hyper"]["num_params"], count);
    EXPECT_EQ(p["config"]["hyper"]["model_config"], (json{{"name", name}, {"sha256", sha}}));
    EXPECT_EQ(p["config"]["model_config"], fixture(name));
    EXPECT_EQ(p["id"], fmt::format("hf/b1/a1/fp32/ck0/adam/off-none/zg-set_to_none/train/"
                                   "ec-never/in-pinned/seq16/cfg-{}-{}",
                                   name, sha.substr(0, 8)));
  }
}

TEST(ModelConfig, TwoConfigsNeverShareAnIdOneConfigHasOne) {
  TempDir dir;
  fs::create_directories(dir.path() / "a");
  fs::create_directories(dir.path() / "b");
  fs::create_directories(dir.path() / "c");
  json cfg = json::parse(read_file(fixture("Llama-3.2-1B")));
  write_file(dir.file("a/mine.json"), cfg.dump(2));
  write_file(dir.file("c/mine.json"), cfg.dump(2));  // the same file elsewhere: the same model
  cfg["num_hidden_layers"] = 8;
  write_file(dir.file("b/mine.json"), cfg.dump(2));  // same name, other content
  const json a = estimate("--model-config " + dir.file("a/mine.json") + " --seq-len 8");
  const json b = estimate("--model-config " + dir.file("b/mine.json") + " --seq-len 8");
  const json c = estimate("--model-config " + dir.file("c/mine.json") + " --seq-len 8");
  EXPECT_NE(a["id"], b["id"]);
  EXPECT_EQ(a["id"], c["id"]);
  EXPECT_EQ(b["config"]["hyper"]["n_layer"], 8);
}

TEST(ModelConfig, RefusedConfigsAreOneLineAndExit2) {
  TempDir dir;
  const json llama = json::parse(read_file(fixture("Llama-3.2-1B")));
  auto run = [&](const json& j) {
    write_file(dir.file("c.json"), j.dump());
    return run_cli("estimate --model-config " + dir.file("c.json"));
  };
  auto expect_refused = [&](const CliResult& r, const std::string& what) {
    EXPECT_EQ(r.rc, 2) << what;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_EQ(r.err.rfind("memtrade: --model-config: ", 0), 0u) << r.err;
  };
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "vocab_size", "max_position_embeddings"}) {
    json j = llama;
    j.erase(key);
    expect_refused(run(j), fmt::format("missing key '{}'", key));
  }
  json j = llama;
  j["architectures"] = {"FalconForCausalLM"};
  expect_refused(run(j), "unsupported architecture 'FalconForCausalLM'");
  j = llama;
  j["rope_scaling"]["rope_type"] = "dynamic";
  expect_refused(run(j), "unsupported rope_scaling type 'dynamic'");
  j = llama;
  j["num_key_value_heads"] = 7;  // a shape the layers cannot take
  expect_refused(run(j), "n_head 32 not divisible by n_kv_head 7");
  expect_refused(run_cli("estimate --model-config " + dir.file("missing.json")),
                 "cannot read the file");
  write_file(dir.file("c.json"), "{");
  expect_refused(run_cli("estimate --model-config " + dir.file("c.json")), "not JSON");
  // The model is the file's: --model must stay at its default.
  const CliResult both =
      run_cli("estimate --model gpt-tiny --model-config " + fixture("Meta-Llama-3-8B"));
  EXPECT_EQ(both.rc, 2);
  EXPECT_NE(both.err.find("leave --model at its default (got gpt-tiny)"), std::string::npos)
      << both.err;
  // A sequence longer than the config's positions, as for any model.
  const CliResult longer =
      run_cli("estimate --seq-len 9000 --model-config " + fixture("Meta-Llama-3-8B"));
  EXPECT_EQ(longer.rc, 2);
  EXPECT_NE(longer.err.find("above"), std::string::npos) << longer.err;
}

TEST(ModelConfig, InAGridFile) {
  TempDir dir;
  write_file(dir.file("g.toml"), fmt::format("name = \"cfg\"\n[axes]\nmodel_config = [\"{}\", "
                                             "\"{}\"]\nseq_len = [8]\nbatch_size = [1]\n",
                                             fixture("Llama-3.2-1B"), fixture("gpt2")));
  const CliResult r = run_cli("run --grid " + dir.file("g.toml") + " --list --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json doc = json::parse(r.out);
  ASSERT_EQ(doc["points"].size(), 2u);
  EXPECT_EQ(doc["points"][0]["config"]["hyper"]["family"], "llama");
  EXPECT_EQ(doc["points"][1]["config"]["hyper"]["family"], "gpt");
  EXPECT_NE(doc["points"][0]["id"].get<std::string>().find("/cfg-Llama-3.2-1B-"),
            std::string::npos);
  write_file(dir.file("bad.toml"), "[axes]\nmodel_config = [\"nope.json\"]\n");
  const CliResult bad = run_cli("run --grid " + dir.file("bad.toml") + " --list");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("axes.model_config: nope.json: cannot read the file"), std::string::npos)
      << bad.err;
}

TEST(ModelOverridesCli, FlagsGridsAndErrors) {
  const json p = estimate("--model llama-tiny:n_layer=4,n_kv_head=1 --batch-size 2");
  EXPECT_EQ(p["config"]["model"], "llama-tiny:n_kv_head=1,n_layer=4");
  EXPECT_EQ(p["config"]["hyper"]["n_layer"], 4);
  EXPECT_EQ(p["id"].get<std::string>().rfind("llama-tiny:n_kv_head=1,n_layer=4/b2/", 0), 0u);
  TempDir dir;
  write_file(dir.file("g.toml"),
             "[axes]\nmodel = [\"llama-tiny:n_layer=4\", \"llama-tiny:n_layer=04\", "
             "\"gpt-tiny:n_head=4\"]\n");
  const CliResult r = run_cli("run --grid " + dir.file("g.toml") + " --list");
  ASSERT_EQ(r.rc, 0) << r.err;
  // Two spellings of one configuration are one point.
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  EXPECT_EQ(r.out.rfind("llama-tiny:n_layer=4/", 0), 0u) << r.out;
  const CliResult bad = run_cli("estimate --model llama-tiny:n_layers=4");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  EXPECT_NE(bad.err.find("unknown hyper-parameter 'n_layers'"), std::string::npos) << bad.err;
}

// A llama-tiny-sized LlamaForCausalLM: advise over it takes seconds.
constexpr const char* kTinyLlama = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "intermediate_size": 176, "vocab_size": 256, "max_position_embeddings": 32})";

// The config files read_hf_config reads for one command, run in this process (cli_main).
std::uint64_t config_reads(const std::string& args, int* rc) {
  std::vector<std::string> words = {"memtrade"};
  std::istringstream in(args);
  for (std::string w; in >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  const std::uint64_t before = hf_config_reads();
  ::testing::internal::CaptureStdout();
  *rc = cli_main(static_cast<int>(argv.size()), argv.data());
  (void)::testing::internal::GetCapturedStdout();
  return hf_config_reads() - before;
}

// A model config file is resolved where it enters (the flag, the grid value) and the description
// travels with every config made from it: one read per command, however many points, candidates
// and model builds it makes (before: 11 reads for one estimate, 28,007 for one advise).
TEST(ModelConfig, OneCommandReadsTheFileOnce) {
  TempDir dir;
  const std::string file = dir.file("tiny.json");
  write_file(file, kTinyLlama);
  write_file(dir.file("g.toml"),
             fmt::format("name = \"tiny\"\n[axes]\nmodel_config = [\"{}\"]\nseq_len = [8, 16]\n"
                         "batch_size = [1, 2]\ncheckpoint = [0, 1]\nattention = [\"math\", "
                         "\"flash\"]\n[[where]]\nmodel_config = [\"{}\"]\n",
                         file, file));
  for (const std::string& args :
       {"estimate --backend cpu --json --seq-len 16 --model-config " + file,
        "estimate --backend cuda --json --grid " + dir.file("g.toml"),
        "advise --gpu h100 --global-batch 4 --json --quiet --model-config " + file,
        "advise --gpu h100 --gpus 2 --global-batch 4 --json --quiet --model-config " + file}) {
    SCOPED_TRACE(args);
    int rc = -1;
    EXPECT_EQ(config_reads(args, &rc), 1u);
    EXPECT_EQ(rc, 0);
  }
  // `run` parses its grid twice, for the grid's [run] backend and then for the points: one read
  // each.
  int rc = -1;
  EXPECT_EQ(config_reads("run --grid " + dir.file("g.toml") + " --list --json", &rc), 2u);
  EXPECT_EQ(rc, 0);
}

// A config carries its model's description only while it names that model: a copy given another
// model, or a file whose hash is not the description's, is resolved again.
TEST(ModelConfig, AResolvedModelIsUsedOnlyWhereItDescribesTheConfig) {
  TempDir dir;
  const std::string file = dir.file("tiny.json");
  write_file(file, kTinyLlama);
  TrainConfig c;
  set_knob(c, knob("model_config"), file);
  resolve_config(c);
  ASSERT_TRUE(c.model_desc);
  EXPECT_EQ(c.model_desc->sha256, sha256_hex(kTinyLlama));
  EXPECT_EQ(c.model_config_sha256, c.model_desc->sha256);
  // The file changes: what was read stays the config's model (no second read) ...
  json grown = json::parse(kTinyLlama);
  grown["num_hidden_layers"] = 3;
  write_file(file, grown.dump());
  std::uint64_t before = hf_config_reads();
  EXPECT_EQ(make_model(c)->num_blocks(), 2);
  EXPECT_EQ(hf_config_reads(), before);
  // ... and a config that names another hash is read again and refused, as before.
  TrainConfig other = c;
  other.model_config_sha256 = std::string(64, '0');
  EXPECT_THROW((void)make_model(other), std::invalid_argument);
  EXPECT_EQ(hf_config_reads(), before + 1);
  // A copy given a size-table model by hand builds that model, not the file's.
  TrainConfig plain = c;
  plain.model_config.clear();
  plain.model = "gpt-tiny";
  EXPECT_EQ(make_model(plain)->family(), "gpt");
  EXPECT_EQ(make_model(*resolve_model("llama-tiny:n_layer=3"), plain)->num_blocks(), 3);
}

// The issue's must-show: an 8B config at 4096 tokens on an H100, verdict and breakdown.
TEST(ModelConfig, Llama3_8BOnAnH100) {
  const CliResult r = run_cli("estimate --model-config " + fixture("Meta-Llama-3-8B") +
                              " --seq-len 4096 --precision bf16 --optimizer adamw --checkpoint 1 "
                              "--capacity h100");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("OOM  hf/b8/a1/bf16/ac-torch-cuda/ck1/adamw/"), std::string::npos) << r.out;
  // bf16 is autocast: fp32 weights (8,030,261,248 · 4 B) and their 16-bit casts.
  EXPECT_NE(r.out.find("params 29.92 GiB, casts "), std::string::npos) << r.out;
}

}  // namespace
}  // namespace memtrade
