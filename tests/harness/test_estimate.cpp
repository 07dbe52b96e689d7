// The memory model for a CUDA target: the backend-neutral allocations of the CPU model plus
// PyTorch's CUDA workspaces (kernels/torch_workspace.h), and none of the CPU's workspace (fp32
// copies of 16-bit GEMM operands, im2col). Runs anywhere: the model's device is address space
// only. And the figures of a covering set of knob settings, held byte for byte to a recorded
// fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "fixtures/gate_fixtures.h"
#include "harness/run/estimate.h"
#include "harness/run/grid.h"
#include "kernels/torch_workspace.h"
#include "models/config/config.h"

namespace memtrade {
namespace {

TrainConfig config(const char* model, Precision p) {
  TrainConfig cfg;
  cfg.model = model;
  cfg.batch_size = 4;
  cfg.precision = p;
  return cfg;
}

constexpr auto kWs = static_cast<std::size_t>(Category::workspace);

// The named workspace of an estimate's `workspace.at_peak`, summed.
std::int64_t named_sum(const MemoryEstimate& e) {
  std::int64_t sum = 0;
  for (const auto& [name, bytes] : e.workspace.at("at_peak").items())
    sum += bytes.get<std::int64_t>();
  return sum;
}

TEST(EstimateCuda, Fp32GptIsTheCpuModelPlusPyTorchsWorkspaces) {
  // gpt-tiny in fp32 has no CPU workspace at all (no 16-bit operand, no convolution), so the
  // CUDA figure is the CPU one shifted by the named blocks, category by category: at its
  // backward peak the main thread's cuBLAS and cuBLASLt (biased linears) workspaces and the
  // autograd thread's cuBLAS one, 32 MiB each on sm90.
  const TrainConfig cfg = config("gpt-tiny", Precision::fp32);
  const MemoryEstimate cpu = estimate_memory(cfg, Backend::cpu, 0);
  const MemoryEstimate cuda = estimate_memory(cfg, Backend::cuda, 0);
  ASSERT_TRUE(cpu.fits);
  ASSERT_TRUE(cuda.fits);
  EXPECT_EQ(cpu.breakdown_at_peak[kWs], 0);
  EXPECT_TRUE(cpu.workspace.is_null());
  const testing::json& at_peak = cuda.workspace.at("at_peak");
  EXPECT_EQ(at_peak, testing::json({{"cublas_main_thread", 32 << 20},
                                    {"cublaslt_main_thread", 1 << 20},
                                    {"cublas_autograd_thread", 32 << 20}}));
  EXPECT_EQ(cuda.breakdown_at_peak[kWs], named_sum(cuda));
  EXPECT_EQ(cuda.peak_allocated, cpu.peak_allocated + named_sum(cuda));
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    if (c == kWs) continue;
    EXPECT_EQ(cuda.breakdown_at_peak[c], cpu.breakdown_at_peak[c])
        << category_name(static_cast<Category>(c));
  }
  EXPECT_EQ(cuda.workspace.at("target"), "sm90");
  EXPECT_TRUE(cuda.workspace.at("unmodeled").empty());  // no convolution, 32 tokens: no sort
}

TEST(EstimateCuda, TheGpusGenerationSizesCublas) {
  // The same point on an A100 (sm80): each cuBLAS workspace is 8,519,680 B instead of 32 MiB.
  const TrainConfig cfg = config("gpt-tiny", Precision::fp32);
  const MemoryEstimate h100 = estimate_memory(cfg, Backend::cuda, 0, 1, 0, find_gpu("h100"));
  const MemoryEstimate a100 = estimate_memory(cfg, Backend::cuda, 0, 1, 0, find_gpu("a100-80g"));
  EXPECT_EQ(a100.workspace.at("target"), "sm80");
  EXPECT_EQ(a100.workspace.at("at_peak").at("cublas_autograd_thread"), 8'519'680);
  EXPECT_EQ(h100.peak_allocated - a100.peak_allocated, 2 * (33'554'432 - 8'519'680));
  EXPECT_EQ(h100.peak_allocated, estimate_memory(cfg, Backend::cuda, 0).peak_allocated);
}

TEST(EstimateCuda, SixteenBitAndConvNeedNoCpuWorkspace) {
  // gpt-tiny with a 64-token vocabulary: at 256 its loss backward, which holds eager's three
  // (N, V) buffers and no GEMM operand, is the peak.
  for (const char* model : {"gpt-tiny:vocab_size=64", "mlp-tiny", "cnn-tiny"}) {
    TrainConfig cfg = config(model, Precision::bf16);
    // The peak in backward, where the workspace is: foreach's temporaries make mlp-tiny's
    // optimizer step its peak.
    cfg.optimizer_impl = OptimizerImpl::fused;
    const MemoryEstimate cpu = estimate_memory(cfg, Backend::cpu, 0);
    const MemoryEstimate cuda = estimate_memory(cfg, Backend::cuda, 0);
    EXPECT_GT(cpu.breakdown_at_peak[kWs], 0) << model << ": the CPU copies 16-bit operands";
    EXPECT_EQ(cuda.breakdown_at_peak[kWs], named_sum(cuda)) << model;
    EXPECT_GT(named_sum(cuda), 0) << model;
    // cuDNN's workspace is named, unbounded, where there are convolutions.
    const testing::json& unmodeled = cuda.workspace.at("unmodeled");
    if (std::string_view(model) == "cnn-tiny") {
      ASSERT_EQ(unmodeled.size(), 1u);
      EXPECT_EQ(unmodeled[0].at("name"), "cudnn_convolution");
      EXPECT_TRUE(unmodeled[0].at("bound_bytes").is_null());
    } else {
      EXPECT_TRUE(unmodeled.empty()) << model;
    }
  }
}

TEST(EstimateCuda, Llama3_8bAt4096TokensHoldsTwoCublasWorkspacesAtItsPeak) {
  // The atlas point (bf16 autocast, AdamW foreach, batch 1, flash): the peak is the optimizer
  // step, where both threads' cuBLAS workspaces are kept and no cuBLASLt one exists (Llama's
  // linears have no bias). Its 4096 tokens take the embedding's sort path in backward, whose
  // cub tiles are named, bounded by 0 B: the sort holds far less than the op's end.
  TrainConfig cfg = config("llama3-8b", Precision::bf16);
  cfg.batch_size = 1;
  cfg.seq_len = 4096;
  cfg.optimizer = OptimizerKind::adamw;
  cfg.attention = AttentionKind::flash;
  for (const auto& [gpu, cublas] :
       {std::pair("h100", 33'554'432), std::pair("a100-80g", 8'519'680)}) {
    const MemoryEstimate e = estimate_memory(cfg, Backend::cuda, 0, 1, 0, find_gpu(gpu));
    SCOPED_TRACE(gpu);
    EXPECT_EQ(e.workspace.at("at_peak"),
              testing::json({{"cublas_main_thread", cublas}, {"cublas_autograd_thread", cublas}}));
    EXPECT_EQ(e.breakdown_at_peak[kWs], 2 * cublas);
    const testing::json& unmodeled = e.workspace.at("unmodeled");
    ASSERT_EQ(unmodeled.size(), 1u);
    EXPECT_EQ(unmodeled[0].at("name"), "embedding_sort_cub_tiles");
    EXPECT_EQ(unmodeled[0].at("bound_bytes"), 0);
  }
}

// Every figure of estimate_json() (peaks, host_pinned_peak, all eight categories at the peak,
// fits, the OOM message) for the knob settings of tests/harness/fixtures/estimate_fixture.json:
// every pair of values of any two knobs, the triples that decide where parameters, grads and
// optimizer state live, OOMs, bigger models, on both targets. The fixture is what `memtrade
// estimate` printed before the meta device stopped doing data work (make_estimate_fixture.py):
// how fast the estimate runs must not change what it says. When autocast came, the fixture's
// fp16/bf16 points were renamed fp16-o2/bf16-o2 (what they are) and the new, empty `casts`
// category added, its numbers untouched: O2 still allocates exactly what fp16/bf16 did. When
// GPT's selective checkpointing became Megatron's (attention core only; the GELU input is kept),
// its 8 GPT selective points were re-recorded. When the optimizer step gained torch.optim's
// temporaries (optimizer_impl, foreach by default: PyTorch's CUDA default), the fixture was
// regenerated with the new axis among the covered pairs: the second deliberate change. When the
// CUDA target took PyTorch's CUDA workspaces (kernels/torch_workspace.h), its 92 CUDA points
// were regenerated (each gains `workspace`); the 59 CPU points stayed byte for byte: the third.
// When backward came to hold what eager autograd holds (the loss backward's three (N, V)
// buffers; the GPT MLP's saved tensors, a linear's saved weight cast and its incoming gradient's
// cast freed once the op's backward has run), the 26 points whose peak that moves (9 CPU, 17
// CUDA; from −263,168 B to +1,048,576 B) were regenerated: the fourth. When an op adding into an
// existing weight gradient came to hold eager's fresh buffer for it (LayerCtx::accumulate_buffer:
// later micro-batches, zero_grad=zero, a tied head), the 50 points it changes (49 peaks, 0 to
// +131,584 B) were regenerated: the fifth. When the MLP's and CNN's first layer came to save the
// staged batch in place (no copy; never offloaded) and the CNN's backward to run and free as
// autograd's nodes do, the 53 mlp/cnn points that move (21 CPU, 32 CUDA; peaks from −760,832 B
// to 0, 11 host_pinned_peak) were regenerated: the sixth. When a linear's caller came to free its
// incoming gradient and saved input before the weight gradient's cast (linear_backward's
// node_done), the 2 mlp-tiny autocast CUDA points that move (−1,536 and −1,024 B): the seventh.
TEST(EstimateFixture, EveryFigureIsAsRecorded) {
  const auto fixture = testing::json::parse(testing::read_file(
      std::string(MEMTRADE_SOURCE_DIR) + "/tests/harness/fixtures/estimate_fixture.json"));
  const auto& points = fixture.at("points");
  ASSERT_GE(points.size(), 150u);
  for (const auto& p : points) {
    const TrainConfig cfg = config_from_json(p.at("config"));
    const std::string id = p.at("id");
    ASSERT_EQ(point_id(cfg), id);  // the config round-trips: the point is the one recorded
    const std::string backend = p.at("backend"), capacity_text = p.at("capacity");
    const std::size_t capacity = capacity_text.empty() ? 0 : parse_capacity(capacity_text).value();
    const MemoryEstimate e =
        estimate_memory(cfg, backend == "cuda" ? Backend::cuda : Backend::cpu, capacity);
    testing::json got = estimate_json(e);
    got.erase("seconds");
    got.erase("resident_after_step");  // added after the fixture (data parallelism's formulas)
    testing::json want = p;
    for (const char* k : {"backend", "capacity", "config", "id"}) want.erase(k);
    EXPECT_EQ(got, want) << backend << " " << id << ": " << testing::json::diff(want, got).dump();
  }
}

// The memory model is exact on the CPU for the Llama family too: every knob around llama-tiny
// (and the tied and mini sizes), in fp32 and under bf16 autocast, runs as a grid, and each
// point's predicted peak and breakdown are its measured ones, byte for byte.
class EstimateLlama : public ::testing::TestWithParam<const char*> {};

TEST_P(EstimateLlama, PredictedIsMeasuredOnEveryKnob) {
  testing::TempDir dir;
  testing::write_file(dir.file("g.toml"), fmt::format(R"(name = "llama-exact"
mode = "sweep"
[run]
backend = "cpu"
warmup = 1
steps = 2
[axes]
model = ["llama-tiny", "llama-tiny:tie_word_embeddings=true", "llama-mini"]
batch_size = [4]
accumulation = [1, 2]
precision = ["fp32", "bf16", "fp16", "bf16-o2", "fp16-o2", "bf16-pure"]
autocast_policy = ["torch-cuda", "torch-cpu"]
checkpoint = [0, 1, "sqrt", "selective"]
optimizer = ["adam", "sgd"]
offload = ["none", "activations", "optimizer", "params"]
zero_grad = ["set_to_none", "zero"]
mode = ["train", "eval"]
seq_len = [0, 16]
attention = ["math", "flash"]
llama_layers = ["liger", "hf-eager"]
[baseline]
model = "llama-tiny"
precision = "{}"
)",
                                                      GetParam()));
  const testing::CliResult r =
      testing::run_cli("run --grid " + dir.file("g.toml") + " --quiet --out " + dir.file("r.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto results = testing::json::parse(testing::read_file(dir.file("r.json")));
  ASSERT_GE(results["points"].size(), 20u);
  for (const auto& p : results["points"]) {
    SCOPED_TRACE(p["id"].get<std::string>());
    ASSERT_EQ(p["status"], "ok") << p["error"];
    EXPECT_EQ(p["memory"]["predicted_peak"], p["memory"]["peak_allocated"]);
    EXPECT_EQ(p["memory"]["predicted_breakdown"], p["memory"]["breakdown_at_peak"]);
  }
}

INSTANTIATE_TEST_SUITE_P(Baselines, EstimateLlama, ::testing::Values("fp32", "bf16"));

}  // namespace
}  // namespace memtrade

namespace memtrade {
namespace {

// A tiny Gemma 2 (models/config/hf_config.h): four (1 + w) norms per layer, GeGLU, the embedding
// scale, a query_pre_attn_scalar other than head_dim and both soft-caps, whose attention tanh is
// a saved (B, NH, T, T) tensor of its own. The memory model is exact for it too: every knob in
// fp32 and under bf16 autocast, predicted peak and breakdown equal to the measured ones. Math
// attention only: flash with soft-capping is refused (below).
constexpr const char* kTinyGemma2 = R"({"architectures": ["Gemma2ForCausalLM"],
  "model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 256,
  "max_position_embeddings": 32, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 5.0,
  "final_logit_softcapping": 3.0, "sliding_window": 32})";

class EstimateGemma2 : public ::testing::TestWithParam<const char*> {};

TEST_P(EstimateGemma2, PredictedIsMeasuredOnEveryKnob) {
  testing::TempDir dir;
  testing::write_file(dir.file("gemma2-tiny.json"), kTinyGemma2);
  testing::write_file(dir.file("g.toml"), fmt::format(R"(name = "gemma2-exact"
mode = "sweep"
[run]
backend = "cpu"
warmup = 1
steps = 2
[axes]
model_config = ["{}"]
batch_size = [4]
accumulation = [1, 2]
precision = ["fp32", "bf16", "fp16", "bf16-o2", "fp16-o2", "bf16-pure"]
autocast_policy = ["torch-cuda", "torch-cpu"]
checkpoint = [0, 1, "sqrt", "selective"]
optimizer = ["adam", "sgd"]
offload = ["none", "activations", "optimizer", "params"]
zero_grad = ["set_to_none", "zero"]
mode = ["train", "eval"]
seq_len = [0, 16]
llama_layers = ["liger", "hf-eager"]
[baseline]
precision = "{}"
)",
                                                      dir.file("gemma2-tiny.json"), GetParam()));
  const testing::CliResult r =
      testing::run_cli("run --grid " + dir.file("g.toml") + " --quiet --out " + dir.file("r.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto results = testing::json::parse(testing::read_file(dir.file("r.json")));
  // The baseline and each other value of each axis (the policy axis has none for fp32).
  ASSERT_GE(results["points"].size(), 17u);
  for (const auto& p : results["points"]) {
    SCOPED_TRACE(p["id"].get<std::string>());
    ASSERT_EQ(p["status"], "ok") << p["error"];
    EXPECT_EQ(p["config"]["hyper"]["architecture"], "Gemma2ForCausalLM");
    EXPECT_EQ(p["memory"]["predicted_peak"], p["memory"]["peak_allocated"]);
    EXPECT_EQ(p["memory"]["predicted_breakdown"], p["memory"]["breakdown_at_peak"]);
  }
}

INSTANTIATE_TEST_SUITE_P(Baselines, EstimateGemma2, ::testing::Values("fp32", "bf16"));

// What memtrade cannot model of Gemma 2 is one line and exit 2: flash attention with soft-capped
// scores (FlashAttention-2 has a softcap, memtrade's flash op has none) and tensor parallelism.
TEST(EstimateGemma2Refusals, FlashAndTensorParallelism) {
  testing::TempDir dir;
  testing::write_file(dir.file("gemma2-tiny.json"), kTinyGemma2);
  const std::string base =
      "estimate --seq-len 16 --batch-size 1 --model-config " + dir.file("gemma2-tiny.json");
  const testing::CliResult ok = testing::run_cli(base);
  EXPECT_EQ(ok.rc, 0) << ok.err;
  for (const auto& [flags, says] :
       {std::pair{" --attention flash", "flash attention with attn_logit_softcapping"},
        std::pair{" --tp 2", "tensor parallelism of Gemma 2"}}) {
    const testing::CliResult r = testing::run_cli(base + flags);
    EXPECT_EQ(r.rc, 2) << flags << ": " << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << flags << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  // advise turns the attention kind: for Gemma 2 flash is a refused combination it skips.
  const testing::CliResult advise = testing::run_cli(
      "advise --seq-len 16 --capacity 1GiB --model-config " + dir.file("gemma2-tiny.json"));
  EXPECT_EQ(advise.rc, 0) << advise.err;
}

}  // namespace
}  // namespace memtrade
