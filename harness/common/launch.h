// Starting the ranks of a data-parallel point: one process per rank, by the site's MPI
// launcher. memtrade never starts ranks itself (no hand-made process groups): mpirun, or srun
// inside a Slurm allocation, starts them and MPI (or NCCL over MPI) connects them.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace memtrade {

// The command line that runs `argv` as `ranks` ranks:
//   MEMTRADE_LAUNCHER set: its words, with {n} replaced by the rank count, then argv
//     ("srun --mpi=pmix -n {n}", "mpirun -np {n} --hostfile hosts");
//   inside a Slurm job (SLURM_JOB_ID): srun --mpi=pmix -n N --overcommit --cpus-per-task C
//     (C: the allocation's CPUs on the node over N, at least 1; PMIx is how Open MPI's ranks
//     find each other when srun starts them; --overcommit lets a job of fewer tasks, an array
//     task of the grid, start them), then argv;
//   else Open MPI's mpirun on this machine: -np N --oversubscribe --bind-to none (ranks share
//     the cores; the OpenMP threads of each decide), then argv.
std::vector<std::string> rank_launch_argv(int ranks, const std::vector<std::string>& argv);
// What the ranks' environment needs: OMP_NUM_THREADS (unless set) = the cores over the ranks,
// at least 1, so that two ranks on two cores run one thread each; as root, Open MPI's consent
// to run (OMPI_ALLOW_RUN_AS_ROOT). `threads` > 0 overrides the per-rank thread count.
std::vector<std::pair<std::string, std::string>> rank_env(int ranks, int threads = 0);
// In a rank: what started it, from its environment: "srun (job J, step S)", "mpirun", or "".
std::string rank_launcher();

}  // namespace memtrade
