#include "harness/run/point_child.h"
#include "kernels/comm.h"

#include <unistd.h>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "harness/common/bad_input.h"
#include "harness/common/output_file.h"
#include "harness/common/pickle.h"
#include "harness/run/estimate.h"
#include "harness/run/point_runner.h"
#include "harness/run/results.h"
#include "harness/run/torch_snapshot.h"
#include "kernels/device.h"
#include "models/families/decoder.h"
#include "models/model.h"

namespace memtrade {
namespace {

// Peak dense rate of the device for this precision, where known (for MFU).
std::optional<double> peak_flops(const Device& dev, Precision p) {
  std::string name = dev.name();
  if (name.find("H200") != std::string::npos || name.find("H100") != std::string::npos)
    return p == Precision::fp32 ? 67e12 : p == Precision::tf32 ? 494.7e12 : 989.4e12;
  if (name.find("A100") != std::string::npos)
    return p == Precision::fp32 ? 19.5e12 : p == Precision::tf32 ? 156e12 : 312e12;
  return std::nullopt;
}

}  // namespace

nlohmann::json job_json(const PointJob& job) {
  // The learning rate is no axis, so the config serialiser leaves it out: the job carries it.
  return {{"config", config_json(job.point.config)},
          {"lr", job.point.config.lr},
          {"backend", job.backend},
          {"capacity", job.capacity},
          {"warmup", job.warmup},
          {"steps", job.steps},
          {"threads", job.threads},
          {"trace", job.trace_path},
          {"trace_snapshot", job.trace_snapshot_path}};
}

PointJob job_from_json(const nlohmann::json& j) {
  PointJob job;
  job.point.config = config_from_json(j.at("config"));
  job.point.config.lr = j.value("lr", 0.0f);
  job.point.id = point_id(job.point.config);
  job.backend = j.at("backend").get<std::string>();
  job.capacity = j.at("capacity").get<std::size_t>();
  job.warmup = j.at("warmup").get<int>();
  job.steps = j.at("steps").get<int>();
  job.threads = j.at("threads").get<int>();
  job.trace_path = j.value("trace", "");
  job.trace_snapshot_path = j.value("trace_snapshot", "");
  return job;
}

namespace {

// Fault injection for the harness's own tests: MEMTRADE_FAULT="crash:ID-SUBSTRING" (SIGSEGV),
// "hang:..." (never returns), "exit:..." (exit 3 without a result), "bad_alloc:..." (host memory
// exhausted outside the allocator, as the step starts) or "bloat:..." (1 MiB more
// device memory held through the run: a planted memory regression) in the point whose id
// contains the substring. Nothing else reads it.
bool fault_requested(const std::string& id, const std::string& want) {
  const char* env = std::getenv("MEMTRADE_FAULT");
  if (env == nullptr) return false;
  std::string spec = env;
  auto colon = spec.find(':');
  std::string match = colon == std::string::npos ? "" : spec.substr(colon + 1);
  return spec.substr(0, colon) == want && id.find(match) != std::string::npos;
}

// The allocator trace of the last measured step (schema memtrade.trace/1), written as JSON
// (--trace) and/or as a PyTorch memory snapshot (--trace-snapshot).
void write_trace(const PointJob& job, const nlohmann::json& config, const PointMeasurement& m) {
  static const char* kinds[] = {"alloc", "free", "segment_alloc", "segment_free", "oom"};
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : m.trace)
    events.push_back({{"seq", e.seq},
                      {"kind", kinds[static_cast<int>(e.kind)]},
                      {"bytes", e.bytes},
                      {"requested", e.requested},
                      {"category", category_name(e.category)},
                      {"phase", e.phase},
                      {"allocated", e.allocated_after},
                      {"reserved", e.reserved_after},
                      {"addr", e.addr},
                      {"scope", e.scope}});
  nlohmann::json segments = nlohmann::json::array();
  for (const auto& s : m.trace_segments_at_start) {
    nlohmann::json blocks = nlohmann::json::array();
    for (const auto& b : s.blocks)
      if (b.allocated)
        blocks.push_back({{"addr", b.addr},
                          {"size", b.size},
                          {"requested", b.requested},
                          {"category", category_name(b.category)}});
    segments.push_back({{"address", s.base},
                        {"size", s.size},
                        {"pool", s.small_pool ? "small" : "large"},
                        {"blocks", std::move(blocks)}});
  }
  const nlohmann::json trace = {{"schema", "memtrade.trace/1"},
                                {"point", job.point.id},
                                {"config", config},
                                {"live_at_start", breakdown_json(m.trace_live_at_start)},
                                {"segments_at_start", std::move(segments)},
                                {"events", std::move(events)}};
  if (!job.trace_path.empty()) write_json_atomic(job.trace_path, trace);
  if (!job.trace_snapshot_path.empty())
    write_file_atomic(job.trace_snapshot_path,
                      to_pickle(torch_snapshot(trace, SnapshotFormat::current, SnapshotAt::end,
                                               job.trace_snapshot_path)));
}

void maybe_inject_fault(const std::string& id) {
  const char* env = std::getenv("MEMTRADE_FAULT");
  if (env == nullptr) return;
  std::string spec = env;
  auto colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  std::string match = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (id.find(match) == std::string::npos) return;
  if (kind == "crash") std::raise(SIGSEGV);
  if (kind == "hang")
    for (;;) pause();
  if (kind == "exit") std::_Exit(3);
}

// An oom row: the allocator's figures up to the failed request, so the row still says how far
// the step got.
void oom_row(PointRow& row, Device& dev, const std::string& message) {
  const AllocatorStats& s = dev.memory().stats();
  row.status = "oom";
  row.error = message;
  MemoryFigures mem;
  mem.peak_allocated = s.allocated.peak;
  mem.peak_requested = s.requested.peak;
  mem.peak_reserved = s.reserved.peak;
  mem.breakdown_at_peak = breakdown_of(s.by_category_at_peak);
  mem.host_pinned_peak = dev.pinned().stats().allocated.peak;
  row.memory = mem;
}

}  // namespace

PointRow run_point_row(const PointJob& job) {
  maybe_inject_fault(job.point.id);
  const TrainConfig& cfg = job.point.config;
  PointRow row = failed_point(job.point, "error", "");
  std::unique_ptr<Device> dev;
  std::unique_ptr<Model> model;
  try {
    DeviceOptions options;
    options.capacity = job.capacity;
    options.threads = job.threads;
    dev = make_device(job.backend, options);
    const int rank = world_size(cfg) > 1 ? launched_rank() : 0;
    model = make_model(cfg, tp_rank_of(rank, static_cast<int>(cfg.tensor_parallel)),
                       ep_rank_of(rank, static_cast<int>(cfg.tensor_parallel),
                                  static_cast<int>(cfg.expert_parallel)));
    row.config["hyper"] = model->hyper();
    if (needs_cuda(cfg) && dev->backend() != Backend::cuda) {
      row.status = "skipped";
      row.error = "precision tf32 needs the cuda backend";
      return row;
    }
  } catch (const std::exception& e) {
    row.error = e.what();
    return row;
  }

  std::optional<MemoryEstimate> predicted;
  try {
    // One rank of several predicts itself (ranks differ where parameters split unevenly).
    predicted = estimate_memory(cfg, dev->backend(), job.capacity, 1,
                                world_size(cfg) > 1 ? launched_rank() : 0);
  } catch (const std::exception&) {
    // The prediction is a cross-check; a failure to predict must not lose the measurement.
  }
  auto add_prediction = [&](MemoryFigures& mem) {
    if (!predicted) return;
    mem.predicted_peak = predicted->peak_allocated;
    mem.predicted_breakdown = breakdown_of(predicted->breakdown_at_peak);
  };

  Tensor bloat;
  if (fault_requested(job.point.id, "bloat"))
    bloat = dev->empty({static_cast<std::int64_t>(MiB / 4)}, DType::I32, Category::temporaries);

  PointRunOptions ro;
  ro.warmup = job.warmup;
  ro.steps = job.steps;
  ro.trace_last_step = !job.trace_path.empty() || !job.trace_snapshot_path.empty();
  if (predicted) ro.predicted_peak = predicted->peak_allocated;
  // A rank that dies mid-run (a crashed node, the OOM killer): the last rank SIGKILLs itself
  // 0.3 s into the run, while the others wait for it in a collective.
  if (fault_requested(job.point.id, "kill_rank") && world_size(cfg) > 1 &&
      launched_rank() == world_size(cfg) - 1)
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::raise(SIGKILL);
    }).detach();
  try {
    if (fault_requested(job.point.id, "bad_alloc")) throw std::bad_alloc();
    PointMeasurement m = run_point(*dev, *model, cfg, ro);
    fill_measurement(row, m);
    // A mixture-of-experts model: the last step's expert histograms (layers/moe.h), which
    // `estimate --moe-routing FILE` replays.
    if (auto* moe = dynamic_cast<MoeRouted*>(model.get()); moe && moe->moe().enabled()) {
      row.extra["moe_routing"] = moe_routing_json(moe->moe(), cfg.accumulation);
      if (!m.moe_by_rank.empty())  // several ranks: each one's ([rank][micro-batch][layer][expert])
        row.extra["moe_routing"]["tokens_per_expert_by_rank"] = m.moe_by_rank;
    }
    add_prediction(*row.memory);
    if (auto peak = peak_flops(*dev, cfg.precision); peak && m.median_s > 0)
      row.throughput->mfu = m.flops_per_step / m.median_s / *peak;
    if (!std::isfinite(m.loss_first) || !std::isfinite(m.loss_last)) {
      row.status = "error";
      row.error = fmt::format("non-finite loss ({} -> {})", m.loss_first, m.loss_last);
      row.train.reset();  // JSON has no NaN: the losses are in the message, the row stays readable
    } else {
      row.status = "ok";
      row.error.reset();
    }
    if (ro.trace_last_step) write_trace(job, row.config, m);
  } catch (const OutOfMemory& e) {
    oom_row(row, *dev, e.what());
    add_prediction(*row.memory);
  } catch (const std::bad_alloc&) {
    // Host memory ran out outside the device allocator (a std::vector, a library's buffer): the
    // same verdict as the allocator's, with what the allocator held when it happened.
    oom_row(row, *dev,
            fmt::format("out of memory: host memory exhausted outside the allocator "
                        "(std::bad_alloc); {} allocated, {} reserved",
                        format_bytes(dev->memory().stats().allocated.current),
                        format_bytes(dev->memory().stats().reserved.current)));
    add_prediction(*row.memory);
  } catch (const std::exception& e) {
    row.status = "error";
    row.error = e.what();
  }
  return row;
}

}  // namespace memtrade
