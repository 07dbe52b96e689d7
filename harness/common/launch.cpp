#include "harness/common/launch.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <thread>

#include <fmt/format.h>

namespace memtrade {

std::vector<std::string> rank_launch_argv(int ranks, const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  const std::string n = std::to_string(ranks);
  if (const char* custom = std::getenv("MEMTRADE_LAUNCHER"); custom != nullptr && *custom) {
    std::istringstream words(custom);
    for (std::string w; words >> w;) {
      for (auto at = w.find("{n}"); at != std::string::npos; at = w.find("{n}"))
        w.replace(at, 3, n);
      out.push_back(w);
    }
  } else if (std::getenv("SLURM_JOB_ID") != nullptr) {
    int cpus = 0;
    if (const char* c = std::getenv("SLURM_CPUS_ON_NODE")) cpus = std::atoi(c);
    out = {"srun",
           "--mpi=pmix",
           "-n",
           n,
           "--overcommit",
           "--cpus-per-task",
           std::to_string(std::max(1, cpus / ranks))};
  } else {
    out = {"mpirun", "-np", n, "--oversubscribe", "--bind-to", "none"};
  }
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::vector<std::pair<std::string, std::string>> rank_env(int ranks, int threads) {
  std::vector<std::pair<std::string, std::string>> env;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int per_rank = threads > 0 ? threads : std::max(1, cores / std::max(1, ranks));
  if (threads > 0 || std::getenv("OMP_NUM_THREADS") == nullptr)
    env.emplace_back("OMP_NUM_THREADS", std::to_string(per_rank));
  if (geteuid() == 0) {
    env.emplace_back("OMPI_ALLOW_RUN_AS_ROOT", "1");
    env.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  return env;
}

std::string rank_launcher() {
  if (const char* step = std::getenv("SLURM_STEP_ID"))
    return fmt::format("srun (job {}, step {})",
                       std::getenv("SLURM_JOB_ID") ? std::getenv("SLURM_JOB_ID") : "?", step);
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) return "mpirun";
  return "";
}

}  // namespace memtrade
