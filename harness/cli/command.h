// How subcommands plug into the CLI: each module registers its CLI11 subcommand(s) and the
// action to run when that subcommand was given. Actions return the exit code and throw
// BadInput (exit 2) on bad input.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <vector>

namespace memtrade {

struct Command {
  CLI::App* app;
  std::function<int()> action;
};

class Commands {
 public:
  // State the action captures must outlive parsing: allocate it with keep<T>().
  template <typename T>
  T& keep() {
    auto p = std::make_shared<T>();
    T& ref = *p;
    owned_.push_back(std::move(p));
    return ref;
  }
  void add(CLI::App* app, std::function<int()> action) {
    list_.push_back({app, std::move(action)});
  }
  const std::vector<Command>& list() const { return list_; }

 private:
  std::vector<std::shared_ptr<void>> owned_;
  std::vector<Command> list_;
};

// One per module; cli.cpp calls each.
void register_point_commands(CLI::App& app, Commands& cmds);   // devices, step (cli.cpp)
void register_run_commands(CLI::App& app, Commands& cmds);     // run, estimate, fit, merge, export
void register_report_commands(CLI::App& app, Commands& cmds);  // report (reports/, Python)
void register_advise_commands(CLI::App& app, Commands& cmds);  // advise, __bandwidth
void register_bisect_commands(CLI::App& app, Commands& cmds);
// `bisect --check`'s exit on bad input (flags included): git bisect run stops on 128 and up.
inline constexpr int kBisectCheckBadInput = 128;               // bisect (harness/gate/bisect.h)
void register_changes_command(CLI::App& app, Commands& cmds);  // history changes (after gate)
void register_trace_command(CLI::App& app, Commands& cmds);    // trace (PyTorch snapshots)

}  // namespace memtrade
