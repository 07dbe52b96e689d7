// Runs a command in a child process with a timeout, so that a point's crash, OOM, leak or
// hang never reaches the parent or the next point.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace memtrade {

struct ChildOutcome {
  enum class Kind { exited, signaled, timed_out, interrupted } kind = Kind::exited;
  int exit_code = 0;
  int signal = 0;
  double seconds = 0;
  std::string stderr_tail;  // last lines the child wrote to stderr
};

// Spawns argv (argv[0] is a path), waits at most timeout_s seconds (SIGKILL after that). The
// child's stderr goes to `stderr_file`; its stdout to /dev/null. The child is killed if the
// parent dies (PR_SET_PDEATHSIG). If SIGINT/SIGTERM reaches the parent meanwhile, the child is
// killed and the outcome is `interrupted`.
ChildOutcome run_child(const std::vector<std::string>& argv, double timeout_s,
                       const std::filesystem::path& stderr_file);

// Installs SIGINT/SIGTERM handlers that only set a flag (checked by run_child and grid loops).
void install_interrupt_handlers();
bool interrupted();

// "Segmentation fault (signal 11)"
std::string describe_signal(int sig);
// Path of the running executable (/proc/self/exe).
std::filesystem::path self_executable();

}  // namespace memtrade
