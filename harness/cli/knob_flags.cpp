#include "harness/cli/knob_flags.h"

#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "harness/common/bad_input.h"
#include "kernels/allocator.h"
#include "models/config/input_text.h"

namespace memtrade {
namespace {

// The row as a CLI11 transformer: accepts any spelling the row accepts, leaves the canonical one
// (and the model it resolved, in f.model_desc).
CLI::Validator knob_validator(const Knob& k, KnobFlags& f) {
  const auto choices = k.choices();
  std::string desc =
      choices.empty() ? k.values_text : fmt::format("{{{}}}", fmt::join(choices, ","));
  return CLI::Validator(
      [&k, &f](std::string& text) -> std::string {
        TrainConfig scratch;
        scratch.model_desc = f.model_desc;
        if (auto problem = k.set(scratch, text)) return *problem;
        text = k.get(scratch);
        f.model_desc = scratch.model_desc;
        return {};
      },
      desc, k.name);
}

// A number flag read whole by `parse` (nullopt: not one), its message naming what it expects;
// the text is echoed bounded, never a range bound of 309 digits.
template <typename T>
CLI::Option* number_flag(CLI::App& cmd, const std::string& flag, T& target,
                         std::optional<T> (*parse)(std::string_view), std::string expects,
                         const std::string& help) {
  return cmd
      .add_option_function<std::string>(
          flag,
          [&target, parse, flag, expects](const std::string& text) {
            auto v = parse(text);
            if (!v)
              throw CLI::ValidationError(flag,
                                         fmt::format("expected {}, got '{}'", expects, echo(text)));
            target = *v;
          },
          help)
      ->default_str(fmt::format("{}", target))
      ->type_name(std::is_floating_point_v<T> ? "FLOAT" : "UINT");
}

template <typename T>
std::optional<T> whole(std::string_view text) {
  T v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// A learning rate: finite, >= 0, and one a float holds (the Trainer's lr is a float).
std::optional<float> parse_lr(std::string_view text) {
  auto v = whole<double>(text);
  if (!v || !std::isfinite(*v) || *v < 0 || *v > std::numeric_limits<float>::max())
    return std::nullopt;
  return static_cast<float>(*v);
}

// A seed: 0 to 2^64 - 1, no sign (from_chars of an unsigned refuses "-1", which CLI11 wrapped).
std::optional<std::uint64_t> parse_seed(std::string_view text) {
  return whole<std::uint64_t>(text);
}

// CPU threads: 0 (all cores) up to 4096, more than any machine has cores.
std::optional<int> parse_threads(std::string_view text) {
  auto v = whole<int>(text);
  if (!v || *v < 0 || *v > 4096) return std::nullopt;
  return v;
}

}  // namespace

void add_knob_flags(CLI::App& cmd, KnobFlags& f) {
  for (const Knob& k : knobs()) {
    auto [it, fresh] = f.axes.try_emplace(k.name, k.default_text());
    cmd.add_option(k.flag, it->second, k.help)
        ->transform(knob_validator(k, f))
        ->capture_default_str();
  }
  number_flag(cmd, "--seed", f.seed, parse_seed, "an integer in [0, 2^64 - 1]",
              "Data and init seed");
  number_flag(cmd, "--lr", f.lr, parse_lr, "a number >= 0 that a float holds (up to 3.4e38)",
              "Learning rate (0 = the optimizer's default)");
  cmd.add_option("--backend", f.backend, "auto | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd.add_option("--capacity", f.capacity,
                 "Emulated device memory: 24GiB, 16GB, or a card (a10g, a100-80g, h100, h200)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              (void)parse_capacity_flag(text, /*given=*/true);
            } catch (const BadInput& e) {
              return std::string(e.what()).substr(std::string("--capacity: ").size());
            }
            return {};
          },
          "SIZE"));
  number_flag(cmd, "--threads", f.threads, parse_threads, "an integer in [0, 4096]",
              "CPU threads (0 = all cores)");
}

std::vector<std::string> given_point_flags(const CLI::App& cmd) {
  std::vector<std::string> out;
  for (const Knob& k : knobs())
    if (cmd.count(k.flag) > 0) out.push_back(k.flag);
  for (const char* flag : {"--seed", "--lr"})
    if (cmd.count(flag) > 0) out.emplace_back(flag);
  return out;
}

std::size_t parse_capacity_flag(const std::string& text, bool given) {
  if (text.empty() && !given) return 0;
  auto bytes = parse_capacity(text);
  if (!bytes || *bytes == 0)
    throw BadInput(fmt::format(
        "--capacity: cannot parse '{}' (expected a size like 24GiB, 512MiB, 16GB, or a card "
        "name like a10g, a100-80g, h100, h200)",
        echo(text)));
  return *bytes;
}

TrainConfig to_train_config(const KnobFlags& f) {
  TrainConfig c;
  c.model_desc = f.model_desc;
  for (const auto& [name, text] : f.axes) set_knob(c, knob(name), text);
  c.seed = f.seed;
  c.lr = f.lr;
  resolve_config(c);
  return c;
}

const GpuSpec* gpu_flag(const std::string& name, KnobFlags& flags) {
  if (name.empty()) return nullptr;
  const GpuSpec* gpu = find_gpu(name);
  if (!gpu)
    throw BadInput(fmt::format("--gpu: no GPU '{}' in the table (memtrade devices --table): {}",
                               echo(name), gpu_names()));
  if (flags.backend == "cpu") throw BadInput("--gpu times a CUDA step: it needs --backend cuda");
  flags.backend = "cuda";
  return gpu;
}

std::size_t gpu_capacity(const GpuSpec& gpu) {
  return static_cast<std::size_t>(gpu.memory_gib * static_cast<double>(GiB));
}

}  // namespace memtrade
