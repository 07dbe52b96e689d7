// The regression gate's subcommands: `compare` (two results files, or two binaries A/B) and
// `history` (add, list, trend, baseline).
#pragma once

#include <CLI/CLI.hpp>

#include "harness/cli/command.h"

namespace memtrade {

void register_gate_commands(CLI::App& app, Commands& cmds);

}  // namespace memtrade
