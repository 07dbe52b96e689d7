#include "harness/run/step_dump.h"

#include <fstream>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "harness/common/bad_input.h"
#include "harness/run/npy.h"
#include "models/config/input_text.h"
#include "models/config/knobs.h"
#include "models/train/optimizer.h"
#include "models/train/saved_tensors.h"
#include "models/train/trainer.h"

namespace memtrade {

nlohmann::json optimizer_hyper_json(const OptimizerHyper& h) {
  return nlohmann::json{{"kind", optimizer_name(h.kind)},
                        {"lr", h.lr},
                        {"weight_decay", h.weight_decay},
                        {"momentum", h.momentum},
                        {"dampening", h.dampening},
                        {"nesterov", h.nesterov},
                        {"beta1", h.beta1},
                        {"beta2", h.beta2},
                        {"eps", h.eps},
                        {"alpha", h.alpha},
                        {"lr_decay", h.lr_decay},
                        {"initial_accumulator_value", h.initial_accumulator_value}};
}

nlohmann::json resolved_json(const TrainConfig& cfg, const Model& model) {
  const OptimizerHyper h = default_hyper(cfg.optimizer, model.family(), cfg.lr);
  const CheckpointPlan plan = cfg.mode == Mode::train
                                  ? CheckpointPlan::make(cfg.checkpoint, model.num_blocks())
                                  : CheckpointPlan::none(model.num_blocks());
  nlohmann::json segments = nlohmann::json::array();
  for (const auto& seg : plan.segments) segments.push_back({seg.begin, seg.end, seg.recompute});
  return {{"lr", h.lr},
          {"optimizer_hyper", optimizer_hyper_json(h)},
          {"checkpoint_plan", {{"selective", plan.selective}, {"segments", segments}}},
          {"loss_scale_init", cfg.loss_scale_init},
          {"loss_scale_growth_interval", cfg.loss_scale_growth_interval}};
}

namespace {

// --init DIR: every trainable parameter from DIR/<name>.npy, strictly (as load_state_dict).
void load_init(Trainer& trainer, const std::vector<ParamSpec>& specs,
               const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const std::string shown = echo(dir.string(), kEchoPathMax);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw BadInput(fmt::format("--init {}: not a folder", shown));
  std::set<std::string> expected;
  for (const ParamSpec& s : specs)
    if (s.trainable) expected.insert(s.name + ".npy");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.ends_with(".npy") && !expected.count(f))
      throw BadInput(fmt::format("--init {}: {} is no parameter of this model", shown, echo(f)));
  }
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    const ParamSpec& s = specs[static_cast<std::size_t>(i)];
    if (!s.trainable) continue;
    const fs::path file = dir / (s.name + ".npy");
    if (!fs::exists(file, ec))
      throw BadInput(fmt::format("--init {}: missing {}.npy", shown, echo(s.name)));
    NpyArray a;
    try {
      a = read_npy(file);
    } catch (const std::exception& e) {
      throw BadInput(fmt::format("--init {}: {}", shown, echo(e.what(), 200)));
    }
    if (a.descr != "<f4" || a.shape != s.shape)
      throw BadInput(fmt::format("--init {}: {}.npy is {} {}, the parameter float32 {}", shown,
                                 echo(s.name), a.descr, nlohmann::json(a.shape).dump(),
                                 nlohmann::json(s.shape).dump()));
    try {
      trainer.set_param_f32(i, a.f32);
    } catch (const std::invalid_argument& e) {
      throw BadInput(fmt::format("--init: {}", e.what()));
    }
  }
}

}  // namespace

bool write_step_dump(Device& dev, Model& model, const TrainConfig& cfg,
                     const std::filesystem::path& dir, const std::filesystem::path& init) {
  namespace fs = std::filesystem;
  const bool train = cfg.mode == Mode::train;
  Trainer trainer(dev, model, cfg);
  const bool writer = trainer.comm().rank() == 0;
  if (writer) {
    fs::create_directories(dir / "params");
    if (train) {
      fs::create_directories(dir / "grads");
      fs::create_directories(dir / "params_after");
    }
  }
  // Only rank 0 writes; every rank computes (the gathers behind param_f32 are collectives).
  auto npy = [writer](const fs::path& path, const auto& values, const Shape& shape) {
    if (writer) write_npy(path, values, shape);
  };

  trainer.set_capture_grads(true);
  const auto& specs = model.params();
  if (!init.empty()) load_init(trainer, specs, init);
  nlohmann::json names = nlohmann::json::array();
  nlohmann::json shapes = nlohmann::json::object();
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    const ParamSpec& s = specs[static_cast<std::size_t>(i)];
    if (!s.trainable) continue;
    names.push_back(s.name);
    shapes[s.name] = s.shape;
    npy(dir / "params" / (s.name + ".npy"), trainer.param_f32(i), s.shape);
  }

  const StepResult r = trainer.step();

  const std::int64_t samples = trainer.samples_per_step();
  const Shape in_shape = model.input_shape(samples);
  std::vector<float> inputs = trainer.last_inputs();
  std::vector<std::int32_t> targets = trainer.last_targets();
  // Several ranks: the step's global batch is contiguous from sample 0
  // (models/train/data_parallel.h), and the samples are a function of their index, so rank 0 makes
  // the whole batch again.
  if (trainer.comm().size() > 1 && dev.holds_data())
    model.make_batch(cfg.seed, 0, samples, inputs, targets);
  if (model.input_dtype(compute_dtype(cfg.precision)) == DType::I32) {
    std::vector<std::int32_t> tokens(inputs.begin(), inputs.end());
    npy(dir / "inputs.npy", tokens, in_shape);
  } else {
    npy(dir / "inputs.npy", inputs, in_shape);
  }
  npy(dir / "targets.npy", targets, model.target_shape(samples));
  const float loss = static_cast<float>(r.loss);
  npy(dir / "loss.npy", std::span<const float>(&loss, 1), Shape{});

  if (train) {
    for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
      const ParamSpec& s = specs[static_cast<std::size_t>(i)];
      if (!s.trainable) continue;
      std::vector<float> g = trainer.grad_f32(i);
      if (g.empty()) g.assign(static_cast<std::size_t>(shape_numel(s.shape)), 0.0f);  // unused
      npy(dir / "grads" / (s.name + ".npy"), g, s.shape);
      npy(dir / "params_after" / (s.name + ".npy"), trainer.param_f32(i), s.shape);
    }
  }
  if (!writer) return false;

  nlohmann::json meta;
  meta["schema"] = "memtrade.step/1";
  // The one config serialiser (models/config/knobs.h), plus what memtrade resolved from it (the
  // effective learning rate, the checkpoint plan, ...), so that a peer (bench/peers/) redoes
  // exactly this step without re-implementing memtrade's rules.
  meta["config"] = config_json(cfg);
  const nlohmann::json resolved = resolved_json(cfg, model);
  for (const auto& [key, value] : resolved.items()) meta[key] = value;
  meta["hyper"] = model.hyper();
  meta["params"] = names;
  meta["shapes"] = shapes;
  meta["loss"] = r.loss;
  meta["loss_scale"] = r.loss_scale;
  meta["skipped"] = r.skipped;
  meta["samples"] = samples;
  meta["tokens"] = trainer.tokens_per_step();
  meta["device"] = dev.name();
  meta["backend"] = backend_name(dev.backend());
  std::ofstream out(dir / "meta.json", std::ios::trunc);
  if (!out) throw std::runtime_error(fmt::format("cannot write {}", (dir / "meta.json").string()));
  out << meta.dump(2) << '\n';
  if (!out) throw std::runtime_error(fmt::format("error writing {}", (dir / "meta.json").string()));
  return true;
}

}  // namespace memtrade
