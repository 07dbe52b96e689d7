// Runs one grid point in this process: warm-up steps, then measured steps timed with device
// events, with the allocator's peak reset after warm-up so the figures are a steady step's.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/common/point_row.h"
#include "kernels/device.h"
#include "models/config/config.h"
#include "models/model.h"

namespace memtrade {

struct PointRunOptions {
  int warmup = 2;
  int steps = 8;
  bool trace_last_step = false;  // keep the allocator's event trace of the last measured step
  std::optional<std::int64_t> predicted_peak;  // this rank's prediction, for memory.per_rank
};

struct PointMeasurement {
  std::vector<double> samples_s;      // every measured step
  std::vector<double> cpu_samples_s;  // the process's CPU time of every measured step
  double median_s = 0, p10_s = 0, p90_s = 0, cv = 0;
  double loss_first = 0, loss_last = 0;
  std::int64_t skipped_steps = 0;
  float loss_scale = 1;
  AllocatorStats memory;    // device allocator after the measured steps
  AllocatorStats pinned;    // pinned host allocator
  TransferStats transfers;  // during the measured steps
  double samples_per_s = 0, tokens_per_s = 0, flops_per_step = 0;
  std::optional<std::int64_t> device_peak;  // driver-level bytes in use (CUDA), max over steps
  std::vector<TraceEvent> trace;            // when trace_last_step
  // Data parallelism: this process's rank, and every rank's memory (empty with one rank). The
  // step times above are then the slowest rank's, step by step.
  int rank = 0;
  std::vector<RankMemory> per_rank;
  // A mixture-of-experts model on several ranks: every rank's expert histograms of the last
  // measured step, [rank][micro-batch][layer][expert] (empty otherwise).
  std::vector<std::vector<std::vector<std::vector<std::int64_t>>>> moe_by_rank;
  std::array<std::int64_t, kNumCategories> trace_live_at_start{};      // bytes per category then
  std::vector<CachingAllocator::SegmentInfo> trace_segments_at_start;  // and its segments
};

PointMeasurement run_point(Device& dev, Model& model, const TrainConfig& cfg,
                           const PointRunOptions& options);
// The measured sections of a result row (memory, time, throughput, train, transfer).
void fill_measurement(PointRow& row, const PointMeasurement& m);
// Runs, prints a short summary; returns the process exit code.
int run_point_and_print(Device& dev, Model& model, const TrainConfig& cfg,
                        const PointRunOptions& options);

// Bytes per category ({"params": ..., "grads": ..., ...}), the results' breakdown format.
ByteBreakdown breakdown_of(const std::array<std::int64_t, kNumCategories>& bytes);
nlohmann::json breakdown_json(const std::array<std::int64_t, kNumCategories>& bytes);

}  // namespace memtrade
