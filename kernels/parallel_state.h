// ParallelState: the one object that knows the ranks and their groups (Megatron-core's
// parallel_state, as one value instead of module globals).
//
// World = tensor_parallel × data_parallel ranks, tensor parallelism inside a node and data
// parallelism across (Megatron's default order): world rank = dp_rank · tp + tp_rank, so the tp
// ranks of one model replica are consecutive (one node's GPUs, NVLink), and the ranks holding the
// same slice of the weights (one tp_rank, every dp_rank) form a data-parallel group.
//   tp group: color dp_rank, ordered by tp_rank (the collectives of the parallel layers,
//             models/layers/tensor_parallel.h);
//   dp group: color tp_rank, ordered by dp_rank (gradient reduction and sharding,
//             models/train/param_store.h).
// Backends as kernels/comm.h's make_comm: self for one rank, MPI on the CPU, NCCL on CUDA (each
// group its own communicator, split from the world), and on the meta device (the memory model)
// groups that move nothing, made directly for world rank Device::meta_rank().
#pragma once

#include <memory>

#include "kernels/comm.h"
#include "kernels/device.h"

namespace memtrade {

struct ParallelState {
  int tp = 1, dp = 1;              // group sizes; world = tp · dp
  int tp_rank = 0, dp_rank = 0;    // this rank's place in each
  bool sequence_parallel = false;  // under tp > 1: norms and residuals split along the tokens
  // A group that spans the world is the world's communicator itself (shared).
  std::shared_ptr<Comm> world, tp_group, dp_group;

  int world_size() const { return tp * dp; }
  int world_rank() const { return dp_rank * tp + tp_rank; }
  Comm& tp_comm() const { return *tp_group; }
  Comm& dp_comm() const { return *dp_group; }
};

// The tp rank of world rank `rank` (rank = dp_rank · tp + tp_rank), before any group exists.
inline int tp_rank_of(int world_rank, int tp) {
  return world_rank % tp;
}

// The groups of this process on `device` for tp × dp ranks. std::invalid_argument for sizes below
// 1; std::runtime_error when the process was launched as another number of ranks.
ParallelState make_parallel_state(Device& device, int tp, int dp, bool sequence_parallel);

}  // namespace memtrade
