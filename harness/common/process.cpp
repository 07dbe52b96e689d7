#include "harness/common/process.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <poll.h>
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

// In the child, after fork: redirections, environment, signal contract, exec. Never returns.
[[noreturn]] void exec_child(std::vector<char*>& args, const SpawnOptions& o, pid_t parent,
                             int stdout_pipe) {
  if (o.isolate) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
  }
  if (o.stderr_file) {
    int err = open(o.stderr_file->c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) dup2(err, STDERR_FILENO);
  }
  if (o.stdout_mode == SpawnOptions::Stdout::discard) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, STDOUT_FILENO);
  } else if (o.stdout_mode == SpawnOptions::Stdout::capture) {
    dup2(stdout_pipe, STDOUT_FILENO);
  }
  for (const auto& [key, value] : o.env) setenv(key.c_str(), value.c_str(), 1);
  if (o.cwd && chdir(o.cwd->c_str()) != 0) _exit(127);
  if (o.search_path)
    execvp(args[0], args.data());
  else
    execv(args[0], args.data());
  _exit(127);
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

bool names_a_dead_process(std::string_view digits) {
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  const pid_t pid = static_cast<pid_t>(std::stol(std::string(digits)));
  return pid != getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;  // else alive, or not ours
}

std::filesystem::path self_executable() {
  return std::filesystem::read_symlink("/proc/self/exe");
}

ChildOutcome spawn(const std::vector<std::string>& argv, const SpawnOptions& o) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int fds[2] = {-1, -1};
  const bool capture = o.stdout_mode == SpawnOptions::Stdout::capture;
  if (capture && pipe(fds) != 0)
    throw std::runtime_error(fmt::format("pipe failed: {}", std::strerror(errno)));
  const pid_t parent = getpid();
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    if (capture) close(fds[0]);
    exec_child(args, o, parent, fds[1]);
  }
  if (capture) {
    close(fds[1]);
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  }

  ChildOutcome out;
  int status = 0;
  const auto deadline = start + std::chrono::duration<double>(o.timeout_s);
  auto sleep = std::chrono::microseconds(200);
  char buf[4096];
  auto drain = [&] {
    if (!capture) return;
    for (;;) {
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n <= 0) break;
      out.stdout_text.append(buf, static_cast<std::size_t>(n));
    }
  };
  for (;;) {
    drain();
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) throw std::runtime_error("waitpid failed");
    const bool late = o.timeout_s > 0 && std::chrono::steady_clock::now() > deadline;
    if (late || (o.isolate && interrupted())) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      out.kind = late ? ChildOutcome::Kind::timed_out : ChildOutcome::Kind::interrupted;
      break;
    }
    if (capture) {
      pollfd p{fds[0], POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::max<long>(1, sleep.count() / 1000)));
    } else {
      std::this_thread::sleep_for(sleep);
    }
    if (sleep < std::chrono::milliseconds(5)) sleep *= 2;  // quick children stay quick
  }
  drain();
  if (capture) close(fds[0]);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (out.kind == ChildOutcome::Kind::exited) {
    if (WIFSIGNALED(status)) {
      out.kind = ChildOutcome::Kind::signaled;
      out.signal = WTERMSIG(status);
    } else if (WIFEXITED(status)) {
      out.exit_code = WEXITSTATUS(status);
    }
  }
  if (o.stderr_file) out.stderr_tail = tail_of(*o.stderr_file, 3);
  return out;
}

}  // namespace memtrade
