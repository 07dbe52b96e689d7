#include "harness/common/isolate.h"

#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

namespace memtrade {
namespace {

// The one piece of process-wide state: what a signal handler may touch.
volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_interrupt(int) {
  g_interrupted = 1;
}

std::string tail_of(const std::filesystem::path& file, std::size_t max_lines) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(line);
  std::string out;
  std::size_t start = lines.size() > max_lines ? lines.size() - max_lines : 0;
  for (std::size_t i = start; i < lines.size(); ++i) out += (out.empty() ? "" : " | ") + lines[i];
  return out;
}

}  // namespace

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() {
  return g_interrupted != 0;
}

std::string describe_signal(int sig) {
  const char* name = strsignal(sig);
  return fmt::format("{} (signal {})", name ? name : "unknown signal", sig);
}

std::filesystem::path self_executable() {
  return std::filesystem::read_symlink("/proc/self/exe");
}

ChildOutcome run_child(const std::vector<std::string>& argv, double timeout_s,
                       const std::filesystem::path& stderr_file) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t parent = getpid();
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    // Child: die with the parent; default signal dispositions; stderr to the file.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    int err = open(stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int null = open("/dev/null", O_WRONLY);
    if (err >= 0) dup2(err, STDERR_FILENO);
    if (null >= 0) dup2(null, STDOUT_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }

  ChildOutcome out;
  int status = 0;
  auto deadline = start + std::chrono::duration<double>(timeout_s);
  auto sleep = std::chrono::microseconds(200);
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) throw std::runtime_error("waitpid failed");
    bool late = std::chrono::steady_clock::now() > deadline;
    if (late || interrupted()) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      out.kind = late ? ChildOutcome::Kind::timed_out : ChildOutcome::Kind::interrupted;
      break;
    }
    std::this_thread::sleep_for(sleep);
    if (sleep < std::chrono::milliseconds(5)) sleep *= 2;  // quick points stay quick
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (out.kind == ChildOutcome::Kind::exited) {
    if (WIFSIGNALED(status)) {
      out.kind = ChildOutcome::Kind::signaled;
      out.signal = WTERMSIG(status);
    } else if (WIFEXITED(status)) {
      out.exit_code = WEXITSTATUS(status);
    }
  }
  out.stderr_tail = tail_of(stderr_file, 3);
  return out;
}

}  // namespace memtrade
