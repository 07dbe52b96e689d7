// Child processes: the one fork/exec helper of the harness. A grid point runs in its own
// process so that its crash, OOM, leak or hang never reaches the parent or the next point;
// `compare --base-bin/--head-bin` runs two memtrade builds and reads their output; `report`
// runs the Python reports package. All three go through spawn().
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memtrade {

struct SpawnOptions {
  double timeout_s = 0;  // > 0: SIGKILL the child after this many seconds (outcome timed_out)
  enum class Stdout { inherit, discard, capture } stdout_mode = Stdout::inherit;
  std::optional<std::filesystem::path> stderr_file;      // the child's stderr; else inherited
  std::vector<std::pair<std::string, std::string>> env;  // set in the child only
  bool search_path = false;  // argv[0] is looked up on PATH (execvp); else it is a path
  std::optional<std::filesystem::path> cwd;  // the child's working directory; else ours
  // The point-child contract: the child dies with the parent (PR_SET_PDEATHSIG) and starts
  // with default SIGINT/SIGTERM dispositions; a SIGINT/SIGTERM to the parent (see
  // install_interrupt_handlers) kills the child and the outcome is `interrupted`.
  bool isolate = false;
};

struct ChildOutcome {
  enum class Kind { exited, signaled, timed_out, interrupted } kind = Kind::exited;
  int exit_code = 0;  // exited: its code (127: could not exec, or not enter cwd)
  int signal = 0;     // signaled: the signal
  double seconds = 0;
  std::string stdout_text;  // Stdout::capture
  std::string stderr_tail;  // last lines the child wrote to stderr_file
};

// Runs argv and waits for it. Throws std::runtime_error when the process cannot be created.
ChildOutcome spawn(const std::vector<std::string>& argv, const SpawnOptions& options);

// Installs SIGINT/SIGTERM handlers that only set a flag (checked by spawn and grid loops).
void install_interrupt_handlers();
bool interrupted();

// "Segmentation fault (signal 11)"
std::string describe_signal(int sig);
// Whether `digits` (the pid part of a leftover's name: `memtrade-<pid>`, `.x.json.<pid>.tmp`)
// names a process that is gone: a whole number of at most 9 digits, not this process, and no
// process of that pid visible (one that lives again, reused, keeps its leftover).
bool names_a_dead_process(std::string_view digits);

// Path of the running executable (/proc/self/exe).
std::filesystem::path self_executable();

}  // namespace memtrade
