// The memory model: predicts a point's peak memory and its breakdown without running it.
//
// It executes the Trainer's step on a *meta device*: the same Model, Trainer and knobs, whose
// allocators (device and pinned host memory) are the real CachingAllocator (same rounding,
// pools, segments, splitting) over a provider that hands out address space without memory,
// and whose ops do no arithmetic but take the same scratch buffers as the backend's ops. No
// values exist (Device::holds_data is false): its cost grows with the number of allocations
// a step makes, not with the parameter count or the batch. Every layer's saved activations, every
// checkpoint/offload decision and every allocator rounding is therefore counted exactly as it
// will happen. For a CUDA target it takes PyTorch's CUDA workspaces where PyTorch's CUDA path
// takes them (kernels/torch_workspace.h), sized for the --gpu's generation (sm90 without one),
// and names what it cannot size (cuDNN's algorithm-dependent workspace) with its bound.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/run/time_model.h"
#include "kernels/allocator.h"
#include "kernels/device.h"
#include "kernels/gpu_specs.h"
#include "models/config/config.h"
#include "models/layers/moe.h"

namespace memtrade {

struct MemoryEstimate {
  std::int64_t peak_allocated = 0;
  std::int64_t peak_reserved = 0;
  std::int64_t host_pinned_peak = 0;
  std::array<std::int64_t, kNumCategories> breakdown_at_peak{};
  // What stays allocated after the measured step, by category: the resident model states (and
  // DDP's buckets), without what a step holds only in flight (activations, gathered weights,
  // grads before their reduction). Data parallelism's formulas count this.
  std::array<std::int64_t, kNumCategories> resident_after_step{};
  // Host<->device bytes the measured step copies, both directions, by the Trainer's phase: the
  // input batches ("io"), the passes (offloaded activations, streamed weights) and the optimizer
  // phase (offloaded optimizer: grads out, weights back). advise's cost model prices them.
  std::int64_t copied_inputs = 0, copied_passes = 0, copied_optimizer = 0;
  bool fits = true;         // within capacity (when one is given)
  std::string oom_message;  // the allocator's message when it does not fit
  double seconds = 0;       // how long the estimate took
  // With a GPU (estimate_memory's `gpu`): the time model of the measured step on it.
  std::optional<TimeModel> time;
  // A mixture-of-experts model (layers/moe.h): the routing used and what its layers saved;
  // null otherwise (moe_json).
  nlohmann::json moe;
  // A CUDA target: PyTorch's workspaces live at the peak by name (their sum is the peak's
  // `workspace`), the generation they are sized for and what is left out, with its bound;
  // null for the CPU.
  nlohmann::json workspace;
};

// `--moe-routing`: "balanced", "worst", or a results file whose point (the one with
// moe_routing, or the one with id `point_id` when several have it) recorded tokens_per_expert.
// Throws BadInput naming the problem.
MoeRouting moe_routing_from(const std::string& spec, const std::string& point_id);
// A run's record (results' moe_routing): the histograms of the last `micro_batches` forwards.
nlohmann::json moe_routing_json(const MoeState& s, std::int64_t micro_batches);

// A MoE model routes by `routing` (the meta device has no data to route by; balanced by
// default).
// `warmup` steps run before the peak is reset, as the harness does; 1 is enough to reach the
// steady state (optimizer state exists from the first step on).
// Data parallelism: the memory of rank `rank` of cfg.data_parallel, its collectives on the meta
// backend (kernels/comm.h) with every buffer they need. Rank 0 is the most loaded: each
// parameter's first part is its largest (ceil(n / N)), so it is what an estimate reports.
// With a `gpu` the same dry run also times the step on it (harness/run/time_model.h), its
// collectives over cfg.data_parallel such GPUs (NVLink within a node, `fabric` across).
MemoryEstimate estimate_memory(const TrainConfig& cfg, Backend backend, std::size_t capacity,
                               int warmup = 1, int rank = 0, const GpuSpec* gpu = nullptr,
                               const Fabric& fabric = {}, const MoeRouting& routing = {});
// What `memtrade fit` searches: the largest batch size in [1, limit] whose estimate fits
// `capacity` (0 when batch 1 does not), by doubling and then bisection, about 2·log2(batch)
// estimates; cfg.batch_size is ignored.
std::int64_t largest_fitting_batch(TrainConfig cfg, Backend backend, std::size_t capacity,
                                   std::int64_t limit);
// The point's figures; `time_model` where e.time is set.
nlohmann::json estimate_json(const MemoryEstimate& e);

}  // namespace memtrade
