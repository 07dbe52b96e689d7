#include "kernels/parallel_state.h"
#include "kernels/op_cost.h"

#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {

ParallelState make_parallel_state(Device& device, int tp, int dp, bool sequence_parallel, int ep) {
  if (tp < 1 || dp < 1 || ep < 1 || dp % ep != 0)
    throw std::invalid_argument(fmt::format("parallel state: tp {} × dp {}, ep {}", tp, dp, ep));
  ParallelState p;
  p.tp = tp;
  p.dp = dp;
  p.ep = ep;
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
    // The ep group: ep consecutive dp ranks, each tp apart (inside a node while ep·tp fits
    // one); the edp group: dp / ep ranks strided by ep·tp over the world.
    p.ep_group = ep == 1 ? std::shared_ptr<Comm>(make_self_comm())
                         : make_meta_comm(p.ep_rank(), ep, TimedGroup{clock, ep * tp, false});
    p.edp_group = ep == 1 ? p.dp_group
                          : make_meta_comm(p.edp_rank(), p.edp(), TimedGroup{clock, world, false});
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
  // Expert parallelism splits the dp group: every rank of it joins both splits, in this order.
  if (ep == 1) {
    p.ep_group = make_self_comm();
    p.edp_group = p.dp_group;
  } else if (ep == dp) {
    p.ep_group = p.dp_group;
    p.edp_group = make_self_comm();
  } else {
    p.ep_group = p.dp_group->split(p.edp_rank(), p.ep_rank());
    p.edp_group = p.dp_group->split(p.ep_rank(), p.edp_rank());
  }
  return p;
}

}  // namespace memtrade
