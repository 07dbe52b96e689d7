#include "harness/cli/knob_flags.h"

#include <fmt/format.h>

#include "harness/common/bad_input.h"
#include "kernels/allocator.h"

namespace memtrade {
namespace {

// The row as a CLI11 transformer: accepts any spelling the row accepts, leaves the canonical one.
CLI::Validator knob_validator(const Knob& k) {
  const auto choices = k.choices();
  std::string desc =
      choices.empty() ? k.values_text : fmt::format("{{{}}}", fmt::join(choices, ","));
  return CLI::Validator(
      [&k](std::string& text) -> std::string {
        TrainConfig scratch;
        if (auto problem = k.set(scratch, text)) return *problem;
        text = k.get(scratch);
        return {};
      },
      desc, k.name);
}

}  // namespace

void add_knob_flags(CLI::App& cmd, KnobFlags& f) {
  for (const Knob& k : knobs()) {
    auto [it, fresh] = f.axes.try_emplace(k.name, k.default_text());
    cmd.add_option(k.flag, it->second, k.help)->transform(knob_validator(k))->capture_default_str();
  }
  cmd.add_option("--seed", f.seed, "Data and init seed")->capture_default_str();
  cmd.add_option("--lr", f.lr, "Learning rate (0 = the optimizer's default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--backend", f.backend, "auto | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd.add_option("--capacity", f.capacity,
                 "Emulated device memory: 24GiB, 16GB, or a card (a10g, a100-80g, h100, h200)");
  cmd.add_option("--threads", f.threads, "CPU threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

std::vector<std::string> given_point_flags(const CLI::App& cmd) {
  std::vector<std::string> out;
  for (const Knob& k : knobs())
    if (cmd.count(k.flag) > 0) out.push_back(k.flag);
  for (const char* flag : {"--seed", "--lr"})
    if (cmd.count(flag) > 0) out.emplace_back(flag);
  return out;
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
  for (const auto& [name, text] : f.axes) set_knob(c, knob(name), text);
  c.seed = f.seed;
  c.lr = f.lr;
  resolve_config(c);
  return c;
}

}  // namespace memtrade
