// Every grid axis as a flag (`--batch-size 8 --precision bf16 ...`), shared by the subcommands
// that take one point: run, estimate, step, fit.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "models/config.h"

namespace memtrade {

struct KnobFlags {
  std::string model = "mlp-tiny";
  std::int64_t batch_size = 8;
  std::int64_t accumulation = 1;
  std::string precision = "fp32";
  std::string checkpoint = "0";
  std::string optimizer = "adam";
  std::string offload = "none";
  std::string zero_grad = "set_to_none";
  std::string mode = "train";
  std::string empty_cache = "never";
  std::string input = "pinned";
  std::uint64_t seed = 0;
  float lr = 0.0f;
  std::string backend = "auto";
  std::string capacity;  // "" = the device's own
  int threads = 0;
};

void add_knob_flags(CLI::App& cmd, KnobFlags& flags);
// Validates every value; throws BadInput naming the flag and the accepted values.
TrainConfig to_train_config(const KnobFlags& flags);
// Emulated capacity in bytes (0 = none); throws BadInput on text like "12XB".
std::size_t parse_capacity_flag(const std::string& text);

}  // namespace memtrade
