#include <string>

#include <fmt/format.h>

#include "kernels/comm.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_vec.h"
#include "kernels/cuda_probe.h"
#include "kernels/device.h"
#include "memtrade_git.h"

#ifdef MEMTRADE_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace memtrade {

std::vector<std::pair<std::string, std::string>> library_versions() {
  std::vector<std::pair<std::string, std::string>> v;
  std::string commit = MEMTRADE_GIT_COMMIT;
  v.emplace_back("memtrade", fmt::format("{} ({}{})", MEMTRADE_VERSION, commit.substr(0, 12),
                                         MEMTRADE_GIT_DIRTY ? ", dirty" : ""));
#if defined(__clang__)
  v.emplace_back("compiler", fmt::format("clang {}", __clang_version__));
#elif defined(__GNUC__)
  v.emplace_back("compiler", fmt::format("gcc {}", __VERSION__));
#endif
#ifdef MEMTRADE_HAVE_OPENBLAS
  int parallel = openblas_get_parallel();  // 0 sequential, 1 pthreads, 2 OpenMP
  v.emplace_back("OpenBLAS", fmt::format("{} ({})", openblas_get_config(),
                                         parallel == 2   ? "openmp"
                                         : parallel == 1 ? "pthreads"
                                                         : "sequential"));
#else
  v.emplace_back("OpenBLAS", "not built (builtin blocked GEMM)");
#endif
  // Which GEMM and vector loops the CPU ops run: results from two machines compare only with this.
  v.emplace_back("CPU kernels",
                 fmt::format("GEMM {}, vector loops {}",
                             cpu::gemm_path() == cpu::GemmPath::blas
                                 ? std::string("BLAS")
                                 : std::string("memtrade ") + cpu::gemm_path_name(cpu::gemm_path()),
                             cpu::vec::isa_name(cpu::vec::isa())));
#ifdef _OPENMP
  v.emplace_back("OpenMP", fmt::format("{}", _OPENMP));
#endif
  v.emplace_back("fmt", fmt::format("{}.{}.{}", FMT_VERSION / 10000, FMT_VERSION / 100 % 100,
                                    FMT_VERSION % 100));
  for (auto& kv : cuda_library_versions()) v.push_back(kv);
  // Data parallelism's collectives (kernels/comm.h): MPI on the CPU, NCCL on CUDA.
  v.emplace_back("MPI", mpi_library_version());
  v.emplace_back("NCCL", nccl_library_version());
  return v;
}

std::string git_commit() {
  return MEMTRADE_GIT_COMMIT;
}
bool git_dirty() {
  return MEMTRADE_GIT_DIRTY;
}

}  // namespace memtrade
