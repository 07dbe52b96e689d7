// Comm: the collectives of a group of ranks (data parallelism's, later tensor and expert
// parallelism's), on device tensors.
//
// Backends (make_comm):
//   self  one rank: every collective is the identity (no library; dp 1).
//   mpi   Open MPI on CPU tensors, one process per rank, launched by mpirun or srun
//         (kernels/comm_mpi.cpp). 16-bit sums go through a user MPI_Op that adds in fp32 and
//         rounds once, as NCCL's bf16/fp16 all-reduce does per hop.
//   nccl  NCCL on CUDA tensors, one GPU per rank, queued on the device's compute stream; the
//         unique id travels over MPI, as llm.c does it (kernels/cuda/comm_nccl.cpp).
//   meta  rank `rank` of `size` ranks that move no data: the memory model's (harness/run/
//         estimate.cpp). Callers allocate every buffer a collective needs themselves, so the
//         allocation sequence of rank r of N is the real one at any N without N processes.
//
// Uneven parts: reduce_scatter and all_gather take the element count of every rank's part
// (`counts`, one per rank, in rank order, parts contiguous): data parallelism splits each
// parameter into parts of ceil(n / N) elements, the last ones shorter or empty (DeepSpeed
// ZeRO-3's per-parameter partitioning), and MPI's v-collectives take that as it is.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/tensor.h"

namespace memtrade {

enum class CommBackend : std::uint8_t { self, mpi, nccl, meta };

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual CommBackend backend() const = 0;
  virtual std::string name() const = 0;  // "mpi (Open MPI v4.1.4, 2 ranks)", ...
  virtual bool moves_data() const { return true; }

  // Sum over the ranks, in place, on every rank.
  virtual void all_reduce(Tensor& t) = 0;
  // `full` (numel Σ counts) summed over the ranks; this rank's part (counts[rank] elements at
  // Σ counts[<rank]) into `part`.
  virtual void reduce_scatter(const Tensor& full, Tensor& part,
                              std::span<const std::int64_t> counts) = 0;
  // Every rank's `part` into `full`, in rank order.
  virtual void all_gather(const Tensor& part, Tensor& full,
                          std::span<const std::int64_t> counts) = 0;
  // The same where this rank's part already lies in `full` at its offset.
  virtual void all_gather_in_place(Tensor& full, std::span<const std::int64_t> counts) = 0;
  virtual void broadcast(Tensor& t, int root) = 0;
  // send_counts[r] elements of `in` to rank r (in rank order); recv_counts[r] from rank r into
  // `out` (in rank order).
  virtual void all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                          std::span<const std::int64_t> recv_counts) = 0;
  virtual void barrier() = 0;

  // Overlap with the work that follows (DDP's buckets during backward, as torch's Reducer runs
  // them on its process group's stream): start_all_reduce begins the sum of `t` over the ranks
  // and may return before it is done; `t` is neither read nor written until wait_started()
  // returns. Every rank starts the same collectives in the same order. progress() lets started
  // collectives move (MPI moves a nonblocking collective only inside MPI calls); wait_started()
  // returns once every started one is done (CUDA: once the compute stream waits for them).
  // Backends that cannot overlap run the collective at once (the defaults).
  virtual void start_all_reduce(Tensor& t) { all_reduce(t); }
  virtual void progress() {}
  virtual void wait_started() {}

  // The sub-group of the ranks that pass the same `color`, ordered by `key` (MPI_Comm_split):
  // tensor and data parallelism's groups (kernels/parallel_state.h). Every rank of this group
  // calls it. The meta backend cannot know the other ranks' colors and throws
  // std::logic_error (its groups are made directly: make_meta_comm).
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;

  // Host values (losses, step times, peaks, overflow flags): every rank gets the result.
  virtual double all_reduce_sum(double v) = 0;
  virtual double all_reduce_max(double v) = 0;
  // Every rank's `mine` (the same length everywhere), rank after rank.
  virtual std::vector<std::int64_t> all_gather_host(std::span<const std::int64_t> mine) = 0;
};

// The parts of `numel` elements over `ranks` ranks: ceil(numel / ranks) each, the last ones
// shorter or empty. Their sum is numel. even_part is rank `rank`'s alone (O(1), for the meta
// device's thousands of ranks): its first element and its count.
struct Part {
  std::int64_t offset = 0, count = 0;
};
Part even_part(std::int64_t numel, int ranks, int rank);
std::vector<std::int64_t> even_parts(std::int64_t numel, int ranks);
std::int64_t part_offset(std::span<const std::int64_t> counts, int rank);

// One rank: the identity; self_comm() is one for the whole process.
std::unique_ptr<Comm> make_self_comm();
Comm& self_comm();
// Rank `rank` of `size` ranks that move nothing (std::invalid_argument if rank is not in
// [0, size)).
class StepClock;
// With a `clock` (kernels/op_cost.h), each collective charges its time to it: in line on the
// compute stream, or on a stream of its own for start_all_reduce until wait_started.
std::unique_ptr<Comm> make_meta_comm(int rank, int size, StepClock* clock = nullptr);

// MPI: whether this binary was built with it, whether this process was started as one rank of
// several (mpirun's or srun's environment: OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_SIZE), and the
// world communicator (MPI_Init on first use, MPI_Finalize at exit). std::runtime_error where
// MPI is not built in.
bool mpi_built();
bool launched_by_mpi();
std::unique_ptr<Comm> make_mpi_comm();
// Ends MPI if it was started (idempotent): before a rank exits with its own code.
void finalize_mpi();
// This process's rank as its launcher set it (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK,
// SLURM_PROCID), before MPI starts; 0 when not launched as a rank.
int launched_rank();
// Ends every rank of the job now (MPI_Abort): after a rank has written why it failed, so that
// the others, waiting in a collective for it, do not hang until the point's timeout.
[[noreturn]] void abort_ranks(int code);
// The MPI library, "Open MPI v4.1.4, ..." (MPI_Get_library_version's first line), or "not built".
std::string mpi_library_version();

// NCCL on `device` (CUDA), one GPU per rank, the id broadcast over MPI; std::runtime_error where
// it is not built in or the device is not CUDA.
std::unique_ptr<Comm> make_nccl_comm(Device& device);
std::string nccl_library_version();  // "2.27.7", or "not built"

// The collective backend a data-parallel point uses on `device` with `world` ranks: self for 1,
// meta where the device holds no data, MPI on the CPU, NCCL on CUDA.
std::unique_ptr<Comm> make_comm(Device& device, int world);

}  // namespace memtrade
