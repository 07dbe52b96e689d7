// The step dump contract (docs/design.md, "Step dump"): files, shapes, dtypes, names, and numbers
// that agree with the update rule; plus the .npy writer/reader round trip.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/common/bad_input.h"
#include "harness/run/npy.h"
#include "harness/run/step_dump.h"
#include "kernels/device.h"
#include "models/model.h"

namespace memtrade {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() /
              ("memtrade_dump_" + tag + "_" +
               std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
               std::to_string(reinterpret_cast<std::uintptr_t>(this)))) {
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::unique_ptr<Device> cpu() {
  DeviceOptions o;
  o.threads = 2;
  return make_device("cpu", o);
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

TEST(Npy, RoundTripsFloatAndIntArrays) {
  TempDir dir("npy");
  fs::create_directories(dir.path());
  const std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  write_npy(dir.path() / "f.npy", f, Shape{2, 3});
  const NpyArray a = read_npy(dir.path() / "f.npy");
  EXPECT_EQ(a.descr, "<f4");
  EXPECT_EQ(a.shape, (Shape{2, 3}));
  EXPECT_EQ(a.f32, f);

  const std::vector<std::int32_t> i = {7, -1, 42};
  write_npy(dir.path() / "i.npy", i, Shape{3});
  const NpyArray b = read_npy(dir.path() / "i.npy");
  EXPECT_EQ(b.descr, "<i4");
  EXPECT_EQ(b.shape, (Shape{3}));
  EXPECT_EQ(b.i32, i);

  const float s = 2.5f;
  write_npy(dir.path() / "s.npy", std::span<const float>(&s, 1), Shape{});
  const NpyArray c = read_npy(dir.path() / "s.npy");
  EXPECT_TRUE(c.shape.empty());
  ASSERT_EQ(c.f32.size(), 1u);
  EXPECT_EQ(c.f32[0], 2.5f);

  // The header is what numpy writes: magic, version 1.0, a dict, 64-byte aligned data.
  std::ifstream in(dir.path() / "i.npy", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const std::size_t header_len =
      static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  const std::string header = bytes.substr(10, header_len);
  EXPECT_NE(header.find("'descr': '<i4', 'fortran_order': False, 'shape': (3,), }"),
            std::string::npos)
      << header;
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(bytes.size(), 10 + header_len + 3 * 4);

  EXPECT_THROW(write_npy(dir.path() / "bad.npy", f, Shape{4}), std::invalid_argument);
  EXPECT_THROW(read_npy(dir.path() / "missing.npy"), std::runtime_error);
}

struct DumpCase {
  std::string model;
  std::int64_t batch, accumulation;
};
// Readable (and stable) test names in ctest instead of a byte dump.
void PrintTo(const DumpCase& c, std::ostream* os) {
  *os << c.model << " " << c.batch << "x" << c.accumulation;
}

class StepDump : public ::testing::TestWithParam<DumpCase> {};

// SGD: params_after = params - lr · grads, to fp32 rounding.
TEST_P(StepDump, FilesShapesAndSgdUpdate) {
  const DumpCase dc = GetParam();
  auto dev = cpu();
  auto model = make_model(dc.model);
  TrainConfig cfg;
  cfg.model = dc.model;
  cfg.batch_size = dc.batch;
  cfg.accumulation = dc.accumulation;
  cfg.optimizer = OptimizerKind::sgd;
  TempDir dir(dc.model);
  write_step_dump(*dev, *model, cfg, dir.path());

  const nlohmann::json meta = read_json(dir.path() / "meta.json");
  EXPECT_EQ(meta["schema"], "memtrade.step/1");
  EXPECT_EQ(meta["config"]["model"], dc.model);
  EXPECT_EQ(meta["config"]["batch_size"], dc.batch);
  EXPECT_EQ(meta["config"]["accumulation"], dc.accumulation);
  for (const char* knob : {"precision", "checkpoint", "optimizer", "offload", "zero_grad", "mode",
                           "empty_cache", "input"})
    EXPECT_TRUE(meta["config"].contains(knob)) << knob;
  EXPECT_EQ(meta["config"]["optimizer"], "sgd");
  EXPECT_EQ(meta["config"]["precision"], "fp32");
  EXPECT_EQ(meta["hyper"], model->hyper());
  EXPECT_EQ(meta["skipped"], false);
  const float lr = meta["optimizer_hyper"]["lr"].get<float>();
  EXPECT_GT(lr, 0.0f);

  // Names: exactly the trainable parameters, in order.
  std::vector<std::string> names;
  for (const auto& s : model->params())
    if (s.trainable) names.push_back(s.name);
  ASSERT_EQ(meta["params"].get<std::vector<std::string>>(), names);

  const std::int64_t n = dc.batch * dc.accumulation;
  const NpyArray inputs = read_npy(dir.path() / "inputs.npy");
  const NpyArray targets = read_npy(dir.path() / "targets.npy");
  const NpyArray loss = read_npy(dir.path() / "loss.npy");
  EXPECT_EQ(inputs.shape, model->input_shape(n));
  EXPECT_EQ(inputs.shape[0], n);
  EXPECT_EQ(inputs.descr, model->family() == "gpt" ? "<i4" : "<f4");
  EXPECT_EQ(targets.descr, "<i4");
  EXPECT_EQ(targets.shape, model->target_shape(n));
  EXPECT_EQ(loss.descr, "<f4");
  EXPECT_TRUE(loss.shape.empty());
  EXPECT_NEAR(loss.f32.at(0), meta["loss"].get<double>(), 1e-6);
  EXPECT_GT(loss.f32.at(0), 0.0f);

  bool any_grad = false;
  for (const auto& s : model->params()) {
    if (!s.trainable) {
      EXPECT_FALSE(fs::exists(dir.path() / "params" / (s.name + ".npy"))) << s.name;
      continue;
    }
    const NpyArray p = read_npy(dir.path() / "params" / (s.name + ".npy"));
    const NpyArray g = read_npy(dir.path() / "grads" / (s.name + ".npy"));
    const NpyArray a = read_npy(dir.path() / "params_after" / (s.name + ".npy"));
    for (const NpyArray* arr : {&p, &g, &a}) {
      EXPECT_EQ(arr->descr, "<f4") << s.name;
      EXPECT_EQ(arr->shape, s.shape) << s.name;
    }
    for (std::size_t j = 0; j < p.f32.size(); ++j) {
      // fp32 rounding of p - lr·g (one or two roundings, with or without a fused multiply-add).
      const float want = p.f32[j] - lr * g.f32[j];
      const float ulps = 2 * std::max(std::abs(p.f32[j]), std::abs(lr * g.f32[j])) * 0x1p-23f;
      ASSERT_LE(std::abs(a.f32[j] - want), ulps) << s.name << "[" << j << "]";
      any_grad = any_grad || g.f32[j] != 0.0f;
    }
  }
  EXPECT_TRUE(any_grad);
  if (model->family() == "gpt") {  // the tied head is not a second file
    EXPECT_TRUE(fs::exists(dir.path() / "params" / "transformer.wte.weight.npy"));
    EXPECT_FALSE(fs::exists(dir.path() / "params" / "lm_head.weight.npy"));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, StepDump,
                         ::testing::Values(DumpCase{"gpt-tiny", 2, 2}, DumpCase{"mlp-tiny", 4, 1},
                                           DumpCase{"cnn-tiny", 2, 1}),
                         [](const auto& p) {
                           std::string s = p.param.model;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// An overflowing fp16 step is dumped too: grads keep their inf, params do not move.
TEST(StepDump, SkippedFp16StepIsMarked) {
  auto dev = cpu();
  auto model = make_model("mlp-tiny");
  TrainConfig cfg;
  cfg.model = "mlp-tiny";
  cfg.batch_size = 4;
  cfg.precision = Precision::fp16;
  cfg.loss_scale_init = 1e38f;
  TempDir dir("fp16");
  write_step_dump(*dev, *model, cfg, dir.path());
  const nlohmann::json meta = read_json(dir.path() / "meta.json");
  EXPECT_EQ(meta["skipped"], true);
  EXPECT_EQ(meta["config"]["precision"], "fp16");
  bool any_inf = false;
  for (const auto& name : meta["params"]) {
    const std::string n = name.get<std::string>();
    const NpyArray p = read_npy(dir.path() / "params" / (n + ".npy"));
    const NpyArray a = read_npy(dir.path() / "params_after" / (n + ".npy"));
    EXPECT_EQ(p.f32, a.f32) << n;
    for (float g : read_npy(dir.path() / "grads" / (n + ".npy")).f32)
      any_inf = any_inf || !std::isfinite(g);
  }
  EXPECT_TRUE(any_inf);
}

TEST(StepDump, EvalWritesNoGrads) {
  auto dev = cpu();
  auto model = make_model("mlp-tiny");
  TrainConfig cfg;
  cfg.model = "mlp-tiny";
  cfg.mode = Mode::eval;
  TempDir dir("eval");
  write_step_dump(*dev, *model, cfg, dir.path());
  EXPECT_TRUE(fs::exists(dir.path() / "loss.npy"));
  EXPECT_TRUE(fs::exists(dir.path() / "params"));
  EXPECT_FALSE(fs::exists(dir.path() / "grads"));
  EXPECT_EQ(read_json(dir.path() / "meta.json")["config"]["mode"], "eval");
}

// --init: a dump started from another dump's params_after/ has those as its params/, bit for
// bit, in fp32 and with an fp32 master (bf16-o2); what does not fit the model is bad input.
TEST(StepDump, InitStartsFromTheGivenParameters) {
  auto dev = cpu();
  TrainConfig cfg;
  cfg.model = "mlp-tiny";
  cfg.batch_size = 4;
  cfg.optimizer = OptimizerKind::sgd;
  TempDir first("init_a"), second("init_b");
  {
    auto model = make_model("mlp-tiny");
    write_step_dump(*dev, *model, cfg, first.path());
  }
  for (Precision p : {Precision::fp32, Precision::bf16_o2}) {
    cfg.precision = p;
    auto model = make_model("mlp-tiny");
    fs::remove_all(second.path());
    write_step_dump(*dev, *model, cfg, second.path(), first.path() / "params_after");
    const nlohmann::json meta = read_json(second.path() / "meta.json");
    for (const auto& name : meta["params"]) {
      const std::string n = name.get<std::string>();
      EXPECT_EQ(read_npy(second.path() / "params" / (n + ".npy")).f32,
                read_npy(first.path() / "params_after" / (n + ".npy")).f32)
          << n;
    }
  }
  auto refused = [&](const fs::path& init, Precision p, const std::string& what) {
    cfg.precision = p;
    auto model = make_model("mlp-tiny");
    try {
      write_step_dump(*dev, *model, cfg, second.path(), init);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(first.path() / "nowhere", Precision::fp32, "not a folder");
  refused(first.path() / "params_after", Precision::bf16_pure, "16-bit without an fp32 master");
  TempDir partial("init_c");
  fs::create_directories(partial.path());
  for (const auto& e : fs::directory_iterator(first.path() / "params"))
    fs::copy_file(e.path(), partial.path() / e.path().filename());
  const std::string one = read_json(first.path() / "meta.json")["params"][0];
  fs::remove(partial.path() / (one + ".npy"));
  refused(partial.path(), Precision::fp32, "missing " + one + ".npy");
  write_npy(partial.path() / (one + ".npy"), std::vector<float>(3, 0.0f), Shape{3});
  refused(partial.path(), Precision::fp32, one + ".npy is <f4 [3], the parameter float32");
  fs::remove(partial.path() / (one + ".npy"));
  fs::copy_file(first.path() / "params" / (one + ".npy"), partial.path() / (one + ".npy"));
  write_npy(partial.path() / "extra.npy", std::vector<float>(1, 0.0f), Shape{1});
  refused(partial.path(), Precision::fp32, "extra.npy is no parameter of this model");
}

}  // namespace
}  // namespace memtrade
