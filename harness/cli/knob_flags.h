// Every axis of the knob table (models/config/knobs.h) as a flag (`--batch-size 8 --precision bf16
// ...`), plus the per-run settings, shared by the subcommands that take one point: run, estimate,
// step, fit. Each axis flag is a CLI11 option whose validator is the table row: a bad value fails
// at parse time with the row's message (one line, exit 2), a good one is canonicalised.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "kernels/gpu_specs.h"
#include "models/config/knobs.h"

namespace memtrade {

struct KnobFlags {
  std::map<std::string, std::string> axes;  // axis name -> canonical text (defaults until given)
  std::uint64_t seed = 0;
  float lr = 0.0f;
  std::string backend = "auto";
  std::string capacity;  // "" = the device's own
  int threads = 0;
  // The model the --model and --model-config flags resolved while they were parsed: the point
  // starts from it, so that the file is read once (models/model_desc.h).
  std::shared_ptr<const ModelDesc> model_desc;
};

void add_knob_flags(CLI::App& cmd, KnobFlags& flags);
// The point the flags describe (every axis already validated by the parser).
TrainConfig to_train_config(const KnobFlags& flags);
// The flags of `cmd` that describe a point (every axis flag, --seed, --lr) that were given.
std::vector<std::string> given_point_flags(const CLI::App& cmd);
// Emulated capacity in bytes (0 = none: "" where the flag was not given); throws BadInput on
// text like "12XB", and on "" where the flag was given.
std::size_t parse_capacity_flag(const std::string& text, bool given = false);

// `--gpu NAME` (estimate, fit, advise): its row of the GPU table (nullptr for ""); the backend
// becomes CUDA (BadInput where --backend cpu was given, or for a name not in the table).
const GpuSpec* gpu_flag(const std::string& name, KnobFlags& flags);
// The card's memory: the capacity of a --gpu run unless --capacity says otherwise.
std::size_t gpu_capacity(const GpuSpec& gpu);

}  // namespace memtrade
