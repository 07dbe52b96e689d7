// PointRow: one point of a results file (schema memtrade.results/1, docs/design.md "Results"),
// typed, with the one JSON reader and writer every part uses: the point child that measures it,
// the OOM/error/timeout paths, run --resume, merge, compare, export, history and A/B runs.
//
// Figures are optional sections exactly as in the file: a point that produced no measurement
// (error, timeout, skipped) has none; an OOM has memory only. Bytes are integers, times
// seconds. Keys this build does not know are kept in `extra` and written back unchanged, so a
// tool of this version passes newer files through without loss.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace memtrade {

inline constexpr const char* kResultsSchema = "memtrade.results/1";

using ByteBreakdown = std::map<std::string, std::int64_t>;  // category -> bytes

// One data-parallel rank's memory (results' memory.per_rank).
struct RankMemory {
  int rank = 0;
  std::int64_t peak_allocated = 0;
  std::int64_t peak_reserved = 0;
  ByteBreakdown breakdown_at_peak;
  std::optional<std::int64_t> predicted_peak;  // the memory model's for this rank
};

struct MemoryFigures {
  // With several ranks: the maximum over them (breakdown_at_peak: that rank's), each in per_rank.
  std::int64_t peak_allocated = 0;
  std::int64_t peak_requested = 0;
  std::int64_t peak_reserved = 0;
  ByteBreakdown breakdown_at_peak;
  std::optional<std::int64_t> predicted_peak;  // the memory model's prediction
  std::optional<ByteBreakdown> predicted_breakdown;
  std::optional<std::int64_t> device_peak;  // driver-level bytes (CUDA)
  std::int64_t host_pinned_peak = 0;
  std::vector<RankMemory> per_rank;  // data parallelism: every rank, in rank order
};

struct TimeFigures {
  std::vector<double> samples_s;  // every measured step
  double median_s = 0, p10_s = 0, p90_s = 0, cv = 0;
  // The process's CPU time per step (median): on the CPU backend the work done, which waiting
  // for a core on a shared machine does not inflate as it does the wall time.
  std::optional<double> cpu_median_s;
};

struct ThroughputFigures {
  double samples_per_s = 0, tokens_per_s = 0, flops_per_step = 0, tflops = 0;
  std::optional<double> mfu;  // where the device's peak rate is known
};

struct TrainFigures {
  double loss_first = 0, loss_last = 0;
  std::int64_t skipped_steps = 0;
  double loss_scale = 1;
};

struct TransferFigures {
  std::int64_t h2d_bytes = 0, d2h_bytes = 0;
};

struct PointRow {
  std::string id;
  nlohmann::json config = nlohmann::json::object();  // config_json(...) + "hyper"
  std::string status = "error";                      // ok | oom | error | timeout | skipped
  std::optional<std::string> error;
  std::optional<MemoryFigures> memory;
  std::optional<TimeFigures> time;
  std::optional<ThroughputFigures> throughput;
  std::optional<TrainFigures> train;
  std::optional<TransferFigures> transfer;
  std::optional<double> wall_s;  // the point's process, start to end (run adds it)
  nlohmann::json extra = nlohmann::json::object();

  // A row without measurement: status oom, error, timeout or skipped, with its message.
  static PointRow failed(std::string id, nlohmann::json config, std::string status,
                         std::string error);
  bool ok() const { return status == "ok"; }

  nlohmann::json to_json() const;
  // Validates while reading; throws BadInput "point ID: problem" (types, unknown status, a
  // measured point without its sections).
  static PointRow from_json(const nlohmann::json& j);
};

const std::vector<std::string>& point_statuses();  // ok, oom, error, timeout, skipped

// A whole results file: meta (commit, host, backend, grid, knobs, ...) and its points.
struct ResultsFile {
  nlohmann::json meta = nlohmann::json::object();
  std::vector<PointRow> points;
  nlohmann::json to_json() const;
  static ResultsFile from_json(const nlohmann::json& doc, const std::string& label);
};

// Reads a JSON file; throws BadInput on unreadable, empty, truncated or garbage content.
nlohmann::json read_json_file(const std::filesystem::path& path);
// Reads and validates a results file (schema, every point, unique ids); throws BadInput
// "FILE: problem".
ResultsFile load_results_file(const std::filesystem::path& path);
// Writes via a temporary file in the same directory + rename(2): readers see the old or the new
// file, never half of one.
void write_json_atomic(const std::filesystem::path& path, const nlohmann::json& j);

}  // namespace memtrade
