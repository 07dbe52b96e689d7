// The memtrade command line: one binary, one subcommand per job (harness/cli/*_commands.cpp).
#pragma once

namespace memtrade {

// Parses argv, runs the subcommand and returns the process exit code: 0 success, 1 failure or
// regression, 2 bad input (one line on stderr), 3 out of memory.
int cli_main(int argc, char** argv);

}  // namespace memtrade
