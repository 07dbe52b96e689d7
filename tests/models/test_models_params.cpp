// Parameter names, shapes, counts, hyper-parameters, FLOPs and the size table.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "models/families/block_model.h"
#include "models/model.h"

namespace memtrade {
namespace {

std::vector<std::string> names_of(const Model& m) {
  std::vector<std::string> out;
  for (const auto& p : m.params()) out.push_back(p.name);
  return out;
}

TEST(ModelParams, Gpt2_124mHasNanoGptCount) {
  auto m = make_model("gpt2-124m");
  // nanoGPT's count with the head tied to wte, wpe included.
  EXPECT_EQ(m->num_params(), 124'439'808);
  EXPECT_EQ(m->num_blocks(), 12);
  EXPECT_EQ(m->rows_per_sample(), 1024);
}

TEST(ModelParams, Gpt2_350mCount) {
  // gpt2-medium: 354,823,168 with tied head and wpe (HF GPT2LMHeadModel's count).
  EXPECT_EQ(make_model("gpt2-350m")->num_params(), 354'823'168);
}

TEST(ModelParams, GptTinyNamesMatchNanoGpt) {
  auto m = make_model("gpt-tiny");
  std::vector<std::string> want = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i) {
    for (const char* s :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"})
      want.push_back(fmt::format("transformer.h.{}.{}", i, s));
  }
  want.push_back("transformer.ln_f.weight");
  want.push_back("transformer.ln_f.bias");
  EXPECT_EQ(names_of(*m), want);
}

TEST(ModelParams, GptShapesBlocksAndInit) {
  auto m = make_model("gpt-tiny");  // C = 64, V = 256, T = 32, 2 layers
  const auto& p = m->params();
  auto find = [&](std::string_view n) -> const ParamSpec& {
    for (const auto& s : p)
      if (s.name == n) return s;
    throw std::runtime_error("missing " + std::string(n));
  };
  EXPECT_EQ(find("transformer.wte.weight").shape, (Shape{256, 64}));
  EXPECT_EQ(find("transformer.wpe.weight").shape, (Shape{32, 64}));
  EXPECT_EQ(find("transformer.h.1.attn.c_attn.weight").shape, (Shape{192, 64}));
  EXPECT_EQ(find("transformer.h.1.attn.c_attn.bias").shape, (Shape{192}));
  EXPECT_EQ(find("transformer.h.0.mlp.c_fc.weight").shape, (Shape{256, 64}));
  EXPECT_EQ(find("transformer.h.0.mlp.c_proj.weight").shape, (Shape{64, 256}));
  EXPECT_EQ(find("transformer.h.1.ln_2.weight").block, 1);
  EXPECT_EQ(find("transformer.wte.weight").block, -1);
  EXPECT_EQ(find("transformer.ln_f.bias").block, -1);
  EXPECT_FLOAT_EQ(find("transformer.h.0.attn.c_attn.weight").init_std, 0.02f);
  EXPECT_FLOAT_EQ(find("transformer.h.0.attn.c_proj.weight").init_std, 0.01f);  // 0.02/√4
  EXPECT_FLOAT_EQ(find("transformer.h.0.mlp.c_proj.weight").init_std, 0.01f);
  EXPECT_EQ(find("transformer.h.0.attn.c_proj.bias").init_std, 0.0f);
  EXPECT_LT(find("transformer.h.0.ln_1.weight").init_std, 0.0f);  // ones
  EXPECT_EQ(m->input_shape(3), (Shape{3, 32}));
  EXPECT_EQ(m->input_dtype(DType::BF16), DType::I32);
  EXPECT_EQ(m->target_shape(3), (Shape{3, 32}));
  for (const auto& s : p) EXPECT_TRUE(s.trainable);
}

TEST(ModelParams, MlpNamesCountAndHyper) {
  auto m = make_model("mlp-tiny");  // 32 -> 64 -> 64 -> 10
  EXPECT_EQ(names_of(*m),
            (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.1.weight",
                                      "layers.1.bias", "layers.2.weight", "layers.2.bias"}));
  EXPECT_EQ(m->params()[0].shape, (Shape{64, 32}));
  EXPECT_EQ(m->params()[4].shape, (Shape{10, 64}));
  EXPECT_EQ(m->num_params(), 32 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10);
  EXPECT_EQ(m->num_blocks(), 2);
  EXPECT_EQ(m->params()[4].block, -1);
  EXPECT_EQ(m->hyper()["hidden"], (std::vector<int>{64, 64}));
  EXPECT_EQ(m->hyper()["layer_sizes"], (std::vector<int>{32, 64, 64, 10}));
  EXPECT_EQ(make_model("mlp-large")->num_blocks(), 4);
}

TEST(ModelParams, CnnNamesBuffersAndShapes) {
  auto m = make_model("cnn-tiny");
  const auto names = names_of(*m);
  std::vector<std::string> want = {"stem.conv.weight",
                                   "stem.bn.weight",
                                   "stem.bn.bias",
                                   "stem.bn.running_mean",
                                   "stem.bn.running_var",
                                   "blocks.0.conv1.weight",
                                   "blocks.0.bn1.weight",
                                   "blocks.0.bn1.bias",
                                   "blocks.0.bn1.running_mean",
                                   "blocks.0.bn1.running_var",
                                   "blocks.0.conv2.weight",
                                   "blocks.0.bn2.weight",
                                   "blocks.0.bn2.bias",
                                   "blocks.0.bn2.running_mean",
                                   "blocks.0.bn2.running_var"};
  ASSERT_GE(names.size(), want.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + want.size()), want);
  EXPECT_NE(std::find(names.begin(), names.end(), "blocks.1.downsample.0.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "blocks.1.downsample.1.running_var"),
            names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "blocks.0.downsample.0.weight"), names.end());
  EXPECT_EQ(names.back(), "head.bias");
  std::int64_t buffers = 0;
  for (const auto& p : m->params()) {
    if (p.name.find("running") != std::string::npos) {
      EXPECT_FALSE(p.trainable) << p.name;
      buffers += shape_numel(p.shape);
    }
    if (p.name == "blocks.1.conv1.weight") {
      EXPECT_EQ(p.shape, (Shape{16, 8, 3, 3}));
    }
    if (p.name == "blocks.1.downsample.0.weight") {
      EXPECT_EQ(p.shape, (Shape{16, 8, 1, 1}));
    }
    if (p.name == "head.weight") {
      EXPECT_EQ(p.shape, (Shape{10, 16}));
    }
  }
  // stem 8·27 + bn 16; block0 2·(8·72) + 2·16; block1 16·72 + 16·144 + 16·8 + 3·32; head 170.
  const std::int64_t trainable = 216 + 16 + 1152 + 32 + 1152 + 2304 + 128 + 96 + 170;
  EXPECT_EQ(m->num_params(), trainable);
  EXPECT_EQ(buffers, 2 * (8 + 8 + 8 + 16 + 16 + 16));
  EXPECT_EQ(m->input_shape(2), (Shape{2, 3, 16, 16}));
}

TEST(ModelParams, SizeTableAndUnknownName) {
  const auto names = model_names();
  for (const char* n : {"gpt-tiny", "gpt-mini", "gpt2-124m", "gpt2-350m", "mlp-tiny", "mlp-small",
                        "mlp-large", "cnn-tiny", "cnn-small"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
    auto m = make_model(n);
    EXPECT_EQ(m->name(), n);
    EXPECT_FALSE(m->hyper().empty());
  }
  EXPECT_EQ(std::find(names.begin(), names.end(), "gpt-test"), names.end());  // hidden
  EXPECT_NO_THROW(make_model("gpt-test"));
  try {
    make_model("gpt-huge");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("gpt-tiny"), std::string::npos) << e.what();
  }
}

TEST(ModelParams, GptFlops) {
  auto m = make_model("gpt2-124m");
  const double B = 4, T = 1024, C = 768, V = 50257, L = 12;
  RunOptions o;
  FlopCount f = m->flops(4, o);
  const double block = 2 * B * T * 12 * C * C + 4 * B * T * T * C;
  EXPECT_DOUBLE_EQ(f.forward, L * block + 2 * B * T * C * V);
  EXPECT_DOUBLE_EQ(f.backward, 2 * f.forward);
  EXPECT_EQ(f.recompute, 0.0);
  o.checkpoint = {Checkpoint::Kind::density, 1.0};
  EXPECT_DOUBLE_EQ(m->flops(4, o).recompute, L * block);
  o.checkpoint = {Checkpoint::Kind::density, 0.5};
  EXPECT_DOUBLE_EQ(m->flops(4, o).recompute, 6 * block);
  o.checkpoint = {Checkpoint::Kind::sqrt, 0.0};
  EXPECT_DOUBLE_EQ(m->flops(4, o).recompute, L * block);
  o.checkpoint = {Checkpoint::Kind::selective, 0.0};
  EXPECT_DOUBLE_EQ(m->flops(4, o).recompute, L * 2 * B * T * T * C);  // the attention core
  o.training = false;
  EXPECT_EQ(m->flops(4, o).backward, 0.0);
}

TEST(ModelParams, MlpAndCnnFlops) {
  RunOptions o;
  EXPECT_DOUBLE_EQ(make_model("mlp-tiny")->flops(2, o).forward,
                   2.0 * 2 * (32 * 64 + 64 * 64 + 64 * 10));
  // cnn-tiny, N = 1: stem 16²·8·27; block0 2 · 16²·8·72; block1 8²·16·72 + 8²·16·144 + 8²·16·8;
  // head 16·10.
  const double want =
      2.0 * (256 * 8 * 27 + 2 * 256 * 8 * 72 + 64 * 16 * 72 + 64 * 16 * 144 + 64 * 16 * 8 + 160);
  EXPECT_DOUBLE_EQ(make_model("cnn-tiny")->flops(1, o).forward, want);
}

}  // namespace
}  // namespace memtrade
