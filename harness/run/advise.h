// `memtrade advise`: which knobs to turn, and how far, for a model on a card, with the least
// throughput lost, keeping the training the same.
//
// The search space is read off the knob table (advise_space.h). Every configuration's peak
// comes from the memory model (estimate_memory, exact on the CPU), its step time from the cost
// model (advise_cost.h), calibrated by measurement on the device at hand (advise_calibrate.h),
// or, for a GPU of the table (--gpu), from that card's time model (harness/run/time_model.h:
// the same dry run timed op by op, every micro-batch), with --gpus N searching the layouts of N
// such GPUs (tp × dp, sharding, sequence parallelism) beside the single-device knobs.
// A configuration fits when its peak fits the limit = capacity − margin: the peak reserved
// without a capacity is within the limit, or, between the allocated and the reserved peak, the
// estimate under the limit (the allocator releasing its cache and retrying) does not run out.
//
// Estimates run the step with min(k, 2) micro-batches: from the second micro-batch on, each
// makes the same device allocations from the same allocator state, so the device peak of k ≥ 2
// micro-batches is the one of 2 (tests/harness/test_advise.cpp checks it over the space). The
// recommended configuration, every confirmed one and the smallest one are estimated again with
// all their micro-batches ("exact").
//
// Output: the memory/throughput Pareto frontier of the space, the recommendation (the fitting
// configuration with the highest predicted throughput; ties go to the one turning fewer axes),
// one explanation per axis turned (the recommendation with that axis back at the start's value:
// what it saves, what it costs), or when nothing fits the smallest peak reachable and what would
// have to change. --confirm K runs the K best fitting candidates as isolated points under the
// emulated capacity and re-ranks them by measured throughput; a candidate that runs out of
// memory there is a bug of the memory model and is reported as one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/common/point_row.h"
#include "harness/run/advise_calibrate.h"
#include "harness/run/advise_space.h"
#include "harness/run/time_model.h"

namespace memtrade {

struct AdviseOptions {
  TrainConfig start;
  Backend backend = Backend::cpu;  // the memory model's, and the card's
  std::size_t capacity = 0;
  std::size_t margin = 0;
  std::vector<std::string> allow, hold;
  int confirm = 0;  // run the top K for real (needs the backend usable here)
  CalibrationOptions calibration;
  // A card of the GPU table: every point priced by its time model, no calibration. `gpus` > 1:
  // search the layouts of that many (ParallelSearch), the start being one of them (tp × dp).
  const GpuSpec* gpu = nullptr;
  int gpus = 1;
};

struct AdvisePoint {
  std::string id;
  TrainConfig config;
  std::int64_t peak = 0, reserved = 0;  // predicted peak allocated / reserved
  bool fits = false;
  bool exact = false;                    // estimated with every micro-batch
  double step_s = 0, samples_per_s = 0;  // predicted (samples_per_s: of every GPU together)
  std::optional<TimeModel> time;         // with a GPU: the time model of the step
  int gpus() const { return static_cast<int>(config.data_parallel * config.tensor_parallel); }
  double samples_per_s_per_gpu() const { return samples_per_s / gpus(); }
};

struct Explanation {
  std::vector<std::string> axes;
  std::string from, to;           // the axes' values at the start and in the recommendation
  std::int64_t memory_saved = 0;  // peak with the start's values of these axes − recommended
  double throughput_cost = 0;     // 1 − recommended throughput / throughput without this turn,
                                  // per GPU (reverting tp or dp alone changes the GPU count)
  std::string text;               // one line
};

struct Confirmation {
  AdvisePoint predicted;
  PointRow measured;
};

struct AdviseResult {
  std::string backend;  // the memory model's
  std::string clock;    // the step time measurements count (CalibrationOptions::clock)
  std::string gpu;      // the time model's card ("" : the calibration priced the points)
  int gpus = 1;
  AdvisePoint start;
  std::int64_t global_batch = 0;
  std::vector<std::string> axes, allowed, held;
  std::vector<std::pair<std::string, std::vector<std::string>>> values;  // per axis turned
  std::size_t capacity = 0, margin = 0, limit = 0;
  std::size_t candidates = 0, estimates = 0;
  double search_seconds = 0;  // enumeration, estimates, predictions, frontier (no calibration)
  Calibration calibration;
  std::vector<AdvisePoint> frontier;  // peak ascending
  std::optional<AdvisePoint> recommended;
  bool recommended_measured = false;  // re-ranked by --confirm's measurements
  std::vector<Explanation> explanation;
  std::optional<AdvisePoint> smallest;  // when nothing fits: the smallest peak reachable
  std::vector<std::string> changes;     // ... and what would have to change
  std::vector<Confirmation> confirmed;
  std::vector<std::string> bugs;  // confirmed candidates that ran out of memory
};

AdviseResult advise(const AdviseOptions& o);

// The search itself: every configuration of `space` with its peak (the memory model, two
// micro-batches) and predicted step time, on `threads` threads (0: one per core); `estimates`
// (if given) counts memory-model runs.
// With a `gpu`, the time model of that card prices every point instead of `cost`, each
// estimated with all its micro-batches.
std::vector<AdvisePoint> evaluate(const AdviseSpace& space, Backend backend, std::size_t limit,
                                  const CostModel& cost, std::size_t* estimates = nullptr,
                                  int threads = 0, const GpuSpec* gpu = nullptr);
// The points no other point beats in both peak and predicted throughput, peak ascending.
std::vector<AdvisePoint> pareto_frontier(std::vector<AdvisePoint> points, const TrainConfig& start);

// The memtrade.advise/1 document (schemas/advise.schema.json).
nlohmann::json advise_json(const AdviseResult& r);

}  // namespace memtrade
