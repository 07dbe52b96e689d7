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
// Expert parallelism (ep, dividing dp) splits each dp group further, as Megatron-core's expert
// rank generator orders it (megatron/core/parallel_state.py initialize_model_parallel,
// RankGenerator(..., order="tp-ep-dp-pp") with dp = expert data parallel): ep_rank = dp_rank % ep,
// edp_rank = dp_rank / ep.
//   ep group:  the ep consecutive ranks of a dp group (one edp_rank), ordered by ep_rank: the
//              all-to-alls of the MoE layers (models/layers/moe.h);
//   edp group: the dp / ep ranks holding the same experts (one ep_rank), ordered by edp_rank:
//              the expert parameters' gradient reduction and sharding.
// Backends as kernels/comm.h's make_comm: self for one rank, MPI on the CPU, NCCL on CUDA (each
// group its own communicator, split from the world), and on the meta device (the memory model)
// groups that move nothing, made directly for world rank Device::meta_rank().
#pragma once

#include <memory>
#include <vector>

#include "kernels/comm.h"
#include "kernels/device.h"

namespace memtrade {

struct ParallelState {
  int tp = 1, dp = 1;              // group sizes; world = tp · dp
  int tp_rank = 0, dp_rank = 0;    // this rank's place in each
  int ep = 1;                      // expert-parallel ranks, inside the dp group (ep | dp)
  bool sequence_parallel = false;  // under tp > 1: norms and residuals split along the tokens
  // A group that spans the world is the world's communicator itself (shared).
  std::shared_ptr<Comm> world, tp_group, dp_group, ep_group, edp_group;

  int world_size() const { return tp * dp; }
  int world_rank() const { return dp_rank * tp + tp_rank; }
  int ep_rank() const { return dp_rank % ep; }
  int edp() const { return dp / ep; }
  int edp_rank() const { return dp_rank / ep; }
  Comm& tp_comm() const { return *tp_group; }
  Comm& dp_comm() const { return *dp_group; }
  Comm& ep_comm() const { return *ep_group; }
  Comm& edp_comm() const { return *edp_group; }
};

// The tp rank of world rank `rank` (rank = dp_rank · tp + tp_rank), before any group exists.
inline int tp_rank_of(int world_rank, int tp) {
  return world_rank % tp;
}
// The ep rank of world rank `rank`: which experts its model holds (make_model).
inline int ep_rank_of(int world_rank, int tp, int ep) {
  return (world_rank / tp) % ep;
}
// The world ranks of `world_rank`'s ep group, in ep-rank order: the same tp rank and edp rank.
inline std::vector<int> ep_group_of(int world_rank, int tp, int ep) {
  const int first = world_rank / tp / ep * ep;  // the group's ep rank 0, as a dp rank
  std::vector<int> ranks;
  for (int q = 0; q < ep; ++q) ranks.push_back((first + q) * tp + world_rank % tp);
  return ranks;
}

// The groups of this process on `device` for tp × dp ranks, ep of them per expert-parallel group.
// std::invalid_argument for sizes below 1 or an ep that does not divide dp; std::runtime_error
// when the process was launched as another number of ranks.
ParallelState make_parallel_state(Device& device, int tp, int dp, bool sequence_parallel,
                                  int ep = 1);

}  // namespace memtrade
