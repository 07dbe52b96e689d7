#include "kernels/parallel_state.h"
#include "kernels/op_cost.h"

#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {

ParallelState make_parallel_state(Device& device, int tp, int dp, bool sequence_parallel) {
  if (tp < 1 || dp < 1)
    throw std::invalid_argument(fmt::format("parallel state: tp {} × dp {}", tp, dp));
  ParallelState p;
  p.tp = tp;
  p.dp = dp;
  p.sequence_parallel = sequence_parallel && tp > 1;
  const int world = tp * dp;
  if (!device.holds_data()) {  // the memory model: rank meta_rank() of `world`, nothing moves
    const int rank = device.meta_rank();
    if (rank < 0 || rank >= world)
      throw std::invalid_argument(fmt::format("meta rank {} of {} ranks", rank, world));
    p.tp_rank = rank % tp;
    p.dp_rank = rank / tp;
    p.world = make_meta_comm(rank, world);
    // The time model's clock (estimate --gpu) prices both groups' collectives: a tp group's tp
    // consecutive ranks in line on the compute stream (Megatron's row-parallel all-reduces, SP's
    // gathers and reduce-scatters, the vocabulary-parallel loss), a dp group's dp ranks strided
    // over the whole world (tp inside a node) as data parallelism runs them.
    StepClock* clock = device.step_clock();
    p.tp_group = make_meta_comm(p.tp_rank, tp, TimedGroup{clock, tp, true});
    p.dp_group = make_meta_comm(p.dp_rank, dp, TimedGroup{clock, world, false});
    return p;
  }
  p.world = make_comm(device, world);
  const int rank = p.world->rank();
  p.tp_rank = rank % tp;
  p.dp_rank = rank / tp;
  // A group of one rank needs no library (self); a group that is the whole world is the world.
  if (tp == 1) {
    p.tp_group = make_self_comm();
    p.dp_group = p.world;
  } else if (dp == 1) {
    p.tp_group = p.world;
    p.dp_group = make_self_comm();
  } else {  // every rank of the world joins both splits, in the same order
    p.tp_group = p.world->split(p.dp_rank, p.tp_rank);
    p.dp_group = p.world->split(p.tp_rank, p.dp_rank);
  }
  return p;
}

}  // namespace memtrade
