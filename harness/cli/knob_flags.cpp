#include "harness/cli/knob_flags.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/common/bad_input.h"
#include "kernels/allocator.h"
#include "models/model.h"

namespace memtrade {
namespace {

template <typename T>
T require(std::optional<T> v, std::string_view flag, const std::string& value,
          const std::vector<std::string>& accepted) {
  if (!v)
    throw BadInput(fmt::format("{}: unknown value '{}' (expected one of: {})", flag, value,
                               fmt::join(accepted, ", ")));
  return *v;
}

}  // namespace

void add_knob_flags(CLI::App& cmd, KnobFlags& f) {
  cmd.add_option("--model", f.model, "Model: " + fmt::format("{}", fmt::join(model_names(), ", ")))
      ->capture_default_str();
  cmd.add_option("--batch-size", f.batch_size, "Samples per micro-batch")->capture_default_str();
  cmd.add_option("--accumulation", f.accumulation, "Micro-batches per optimizer step")
      ->capture_default_str();
  cmd.add_option("--precision", f.precision, "fp32 | tf32 | fp16 | bf16 | fp16-pure | bf16-pure")
      ->capture_default_str();
  cmd.add_option("--checkpoint", f.checkpoint,
                 "Activation checkpointing: density in [0,1], sqrt or selective")
      ->capture_default_str();
  cmd.add_option("--optimizer", f.optimizer,
                 "sgd | sgd-momentum | adam | adamw | adagrad | rmsprop")
      ->capture_default_str();
  cmd.add_option("--offload", f.offload, "none | activations | optimizer | params")
      ->capture_default_str();
  cmd.add_option("--zero-grad", f.zero_grad, "set_to_none | zero")->capture_default_str();
  cmd.add_option("--mode", f.mode, "train | eval")->capture_default_str();
  cmd.add_option("--empty-cache", f.empty_cache, "never | per_step")->capture_default_str();
  cmd.add_option("--input", f.input, "pinned | pageable")->capture_default_str();
  cmd.add_option("--seed", f.seed, "Data and init seed")->capture_default_str();
  cmd.add_option("--lr", f.lr, "Learning rate (0 = the optimizer's default)")
      ->capture_default_str();
  cmd.add_option("--backend", f.backend, "auto | cpu | cuda")->capture_default_str();
  cmd.add_option("--capacity", f.capacity,
                 "Emulated device memory: 24GiB, 16GB, or a card (a10g, a100-80g, h100, h200)");
  cmd.add_option("--threads", f.threads, "CPU threads (0 = all cores)")->capture_default_str();
}

std::size_t parse_capacity_flag(const std::string& text) {
  if (text.empty()) return 0;
  auto bytes = parse_capacity(text);
  if (!bytes || *bytes == 0)
    throw BadInput(fmt::format(
        "--capacity: cannot parse '{}' (expected a size like 24GiB, 512MiB, 16GB, or a card "
        "name like a10g, a100-80g, h100, h200)",
        text));
  return *bytes;
}

TrainConfig to_train_config(const KnobFlags& f) {
  TrainConfig c;
  auto names = model_names();
  if (std::find(names.begin(), names.end(), f.model) == names.end())
    throw BadInput(fmt::format("--model: unknown model '{}' (expected one of: {})", f.model,
                               fmt::join(names, ", ")));
  c.model = f.model;
  if (f.batch_size < 1)
    throw BadInput(fmt::format("--batch-size: must be a positive integer, got {}", f.batch_size));
  if (f.accumulation < 1)
    throw BadInput(
        fmt::format("--accumulation: must be a positive integer, got {}", f.accumulation));
  c.batch_size = f.batch_size;
  c.accumulation = f.accumulation;
  c.precision =
      require(parse_precision(f.precision), "--precision", f.precision, precision_names());
  auto ck = Checkpoint::parse(f.checkpoint);
  if (!ck)
    throw BadInput(fmt::format(
        "--checkpoint: '{}' is not a density in [0, 1], 'sqrt' or 'selective'", f.checkpoint));
  c.checkpoint = *ck;
  c.optimizer =
      require(parse_optimizer(f.optimizer), "--optimizer", f.optimizer, optimizer_names());
  c.offload = require(parse_offload(f.offload), "--offload", f.offload, offload_names());
  c.zero_grad =
      require(parse_zero_grad(f.zero_grad), "--zero-grad", f.zero_grad, {"set_to_none", "zero"});
  c.mode = require(parse_mode(f.mode), "--mode", f.mode, {"train", "eval"});
  c.empty_cache = require(parse_empty_cache(f.empty_cache), "--empty-cache", f.empty_cache,
                          {"never", "per_step"});
  c.input = require(parse_input(f.input), "--input", f.input, {"pinned", "pageable"});
  c.seed = f.seed;
  if (!(f.lr >= 0.0f)) throw BadInput(fmt::format("--lr: must be >= 0, got {}", f.lr));
  c.lr = f.lr;
  if (f.backend != "auto" && f.backend != "cpu" && f.backend != "cuda")
    throw BadInput(
        fmt::format("--backend: unknown value '{}' (expected auto, cpu or cuda)", f.backend));
  if (f.threads < 0) throw BadInput(fmt::format("--threads: must be >= 0, got {}", f.threads));
  return c;
}

}  // namespace memtrade
