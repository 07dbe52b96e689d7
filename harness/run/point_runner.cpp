#include "harness/run/point_runner.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include <time.h>

#include <fmt/format.h>

#include "harness/common/stats.h"
#include "harness/run/grid.h"
#include "models/families/decoder.h"
#include "models/train/trainer.h"

namespace memtrade {

ByteBreakdown breakdown_of(const std::array<std::int64_t, kNumCategories>& bytes) {
  ByteBreakdown b;
  for (std::size_t c = 0; c < kNumCategories; ++c)
    b[std::string(category_name(static_cast<Category>(c)))] = bytes[c];
  return b;
}

nlohmann::json breakdown_json(const std::array<std::int64_t, kNumCategories>& bytes) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [category, n] : breakdown_of(bytes)) j[category] = n;
  return j;
}

namespace {

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Every rank's expert histograms of the last step's `micro_batches` forwards, [rank][micro-batch]
// [layer][expert]: each rank routes its own tokens, and under expert parallelism the ranks of an
// ep group decide together what each one's experts receive (a collective: every rank calls it).
std::vector<MoeRouting::Histograms> every_rank_histograms(Comm& comm, const MoeState& s,
                                                          std::int64_t micro_batches) {
  const auto layers = static_cast<std::size_t>(s.layers);
  const auto experts = static_cast<std::size_t>(s.num_experts);
  const MoeRouting::Histograms last = s.last_step(micro_batches);
  std::vector<std::int64_t> mine;
  for (const auto& mb : last)
    for (const auto& layer : mb) mine.insert(mine.end(), layer.begin(), layer.end());
  const std::vector<std::int64_t> all = comm.all_gather_host(mine);
  const std::size_t mbs = last.size();
  std::vector<MoeRouting::Histograms> out(static_cast<std::size_t>(comm.size()));
  auto v = all.begin();
  for (auto& rank : out) {
    rank.assign(mbs, std::vector<std::vector<std::int64_t>>(layers));
    for (auto& mb : rank)
      for (auto& layer : mb) {
        layer.assign(v, v + static_cast<std::ptrdiff_t>(experts));
        v += static_cast<std::ptrdiff_t>(experts);
      }
  }
  return out;
}

}  // namespace

PointMeasurement run_point(Device& dev, Model& model, const TrainConfig& cfg,
                           const PointRunOptions& options) {
  PointMeasurement m;
  Trainer trainer(dev, model, cfg);
  for (int i = 0; i < options.warmup; ++i) trainer.step();
  dev.synchronize();
  dev.memory().reset_peak();
  dev.pinned().reset_peak();
  dev.reset_transfers();

  auto start = dev.make_event();
  auto stop = dev.make_event();
  for (int i = 0; i < options.steps; ++i) {
    bool trace = options.trace_last_step && i + 1 == options.steps;
    if (trace) {
      dev.memory().clear_trace();
      dev.memory().enable_trace(true);
      m.trace_live_at_start = dev.memory().stats().by_category;
      m.trace_segments_at_start = dev.memory().segments();
    }
    const double cpu0 = process_cpu_seconds();
    start->record(StreamKind::compute);
    StepResult r = trainer.step();
    stop->record(StreamKind::compute);
    stop->synchronize();
    m.samples_s.push_back(stop->seconds_since(*start));
    m.cpu_samples_s.push_back(process_cpu_seconds() - cpu0);
    if (trace) {
      dev.memory().enable_trace(false);
      m.trace = dev.memory().trace();
    }
    if (auto used = dev.driver_used_bytes())
      m.device_peak = std::max<std::int64_t>(m.device_peak.value_or(0), *used);
    if (i == 0) m.loss_first = r.loss;
    m.loss_last = r.loss;
    m.skipped_steps += r.skipped ? 1 : 0;
    m.loss_scale = r.loss_scale;
  }
  m.memory = dev.memory().stats();
  m.pinned = dev.pinned().stats();
  m.transfers = dev.transfers();
  Comm& comm = *trainer.parallel().world;  // every rank: tp × dp
  m.rank = comm.rank();
  if (comm.size() > 1 && comm.moves_data()) {
    // A step takes as long as its slowest rank (each ends with the same collectives).
    for (double& s : m.samples_s) s = comm.all_reduce_max(s);
    std::vector<std::int64_t> mine{m.memory.allocated.peak, m.memory.reserved.peak,
                                   options.predicted_peak.value_or(-1)};
    mine.insert(mine.end(), m.memory.by_category_at_peak.begin(),
                m.memory.by_category_at_peak.end());
    const std::vector<std::int64_t> all = comm.all_gather_host(mine);
    for (int r = 0; r < comm.size(); ++r) {
      const std::int64_t* v = all.data() + static_cast<std::size_t>(r) * mine.size();
      std::array<std::int64_t, kNumCategories> cats{};
      std::copy(v + 3, v + 3 + kNumCategories, cats.begin());
      m.per_rank.push_back(
          RankMemory{r, v[0], v[1], breakdown_of(cats),
                     v[2] >= 0 ? std::optional<std::int64_t>(v[2]) : std::nullopt});
    }
    if (auto* moe = dynamic_cast<MoeRouted*>(&model); moe && moe->moe().enabled())
      m.moe_by_rank = every_rank_histograms(comm, moe->moe(), cfg.accumulation);
  }
  m.median_s = quantile(m.samples_s, 0.5);
  m.p10_s = quantile(m.samples_s, 0.1);
  m.p90_s = quantile(m.samples_s, 0.9);
  m.cv = coefficient_of_variation(m.samples_s);
  if (m.median_s > 0) {
    m.samples_per_s = static_cast<double>(trainer.samples_per_step()) / m.median_s;
    m.tokens_per_s = static_cast<double>(trainer.tokens_per_step()) / m.median_s;
  }
  const RunOptions ro = RunOptions::from(cfg);
  FlopCount f = model.flops(cfg.batch_size, ro);
  m.flops_per_step = (ro.training ? f.total() : f.forward) * static_cast<double>(cfg.accumulation);
  return m;
}

void fill_measurement(PointRow& row, const PointMeasurement& m) {
  MemoryFigures mem;
  mem.peak_allocated = m.memory.allocated.peak;
  mem.peak_requested = m.memory.requested.peak;
  mem.peak_reserved = m.memory.reserved.peak;
  mem.breakdown_at_peak = breakdown_of(m.memory.by_category_at_peak);
  mem.per_rank = m.per_rank;
  for (const RankMemory& r : m.per_rank) {  // the most loaded rank's figures
    if (r.peak_allocated > mem.peak_allocated ||
        (r.rank == 0 && r.peak_allocated == mem.peak_allocated)) {
      mem.peak_allocated = r.peak_allocated;
      mem.breakdown_at_peak = r.breakdown_at_peak;
    }
    mem.peak_reserved = std::max(mem.peak_reserved, r.peak_reserved);
  }
  mem.device_peak = m.device_peak;
  mem.host_pinned_peak = m.pinned.allocated.peak;
  row.memory = mem;
  row.time =
      TimeFigures{m.samples_s,
                  m.median_s,
                  m.p10_s,
                  m.p90_s,
                  m.cv,
                  m.cpu_samples_s.empty() ? std::nullopt
                                          : std::optional<double>(quantile(m.cpu_samples_s, 0.5))};
  row.throughput =
      ThroughputFigures{m.samples_per_s, m.tokens_per_s, m.flops_per_step,
                        m.median_s > 0 ? m.flops_per_step / m.median_s / 1e12 : 0.0, std::nullopt};
  row.train = TrainFigures{m.loss_first, m.loss_last, m.skipped_steps, m.loss_scale};
  row.transfer = TransferFigures{m.transfers.h2d_bytes, m.transfers.d2h_bytes};
}

int run_point_and_print(Device& dev, Model& model, const TrainConfig& cfg,
                        const PointRunOptions& options) {
  PointMeasurement m = run_point(dev, model, cfg, options);
  if (m.rank != 0) return std::isfinite(m.loss_last) ? 0 : 1;  // rank 0 speaks for the ranks
  fmt::print("{} on {}\n", model.name(), dev.name());
  if (!m.per_rank.empty()) {  // every parallel dimension the ranks split over
    std::string split = fmt::format("dp {}", cfg.data_parallel);
    if (cfg.tensor_parallel > 1)
      split = fmt::format(
          "tp {}{} × {}", cfg.tensor_parallel,
          cfg.sequence_parallel == SequenceParallel::on ? " (sequence parallel)" : "", split);
    if (cfg.expert_parallel > 1) split += fmt::format(", ep {}", cfg.expert_parallel);
    fmt::print("  ranks        {} ({}, sharding {})\n", m.per_rank.size(), split,
               sharding_name(cfg.sharding));
  }
  fmt::print("  config       batch {} x {}, {}, checkpoint {}, {}, offload {}, {}\n",
             cfg.batch_size, cfg.accumulation, precision_name(cfg.precision), cfg.checkpoint.str(),
             optimizer_name(cfg.optimizer), offload_name(cfg.offload), mode_name(cfg.mode));
  fmt::print("  loss         {:.4f} -> {:.4f} ({} skipped)\n", m.loss_first, m.loss_last,
             m.skipped_steps);
  fmt::print("  peak memory  {} allocated, {} reserved, {} pinned host\n",
             format_bytes(m.memory.allocated.peak), format_bytes(m.memory.reserved.peak),
             format_bytes(m.pinned.allocated.peak));
  for (std::size_t c = 0; c < kNumCategories; ++c)
    if (m.memory.by_category_at_peak[c] > 0)
      fmt::print("    {:<12} {}\n", category_name(static_cast<Category>(c)),
                 format_bytes(m.memory.by_category_at_peak[c]));
  for (const RankMemory& r : m.per_rank) {
    fmt::print("  rank {:<7} {} allocated, {} reserved:", r.rank, format_bytes(r.peak_allocated),
               format_bytes(r.peak_reserved));
    for (const auto& [cat, bytes] : r.breakdown_at_peak)
      if (bytes > 0) fmt::print(" {} {}", cat, format_bytes(bytes));
    fmt::print("\n");
  }
  fmt::print("  step time    median {:.3f} ms (p10 {:.3f}, p90 {:.3f}, cv {:.1f}%) over {} steps\n",
             m.median_s * 1e3, m.p10_s * 1e3, m.p90_s * 1e3, m.cv * 100, m.samples_s.size());
  fmt::print("  throughput   {:.1f} samples/s, {:.0f} tokens/s, {:.2f} GFLOP/s\n", m.samples_per_s,
             m.tokens_per_s, m.median_s > 0 ? m.flops_per_step / m.median_s / 1e9 : 0.0);
  if (std::isfinite(m.loss_first) && std::isfinite(m.loss_last)) return 0;
  // The figures above are measured and kept; the exit code and this line say the math failed.
  fmt::print(stderr, "memtrade: non-finite loss ({} -> {}): the step diverged\n", m.loss_first,
             m.loss_last);
  return 1;
}

}  // namespace memtrade
