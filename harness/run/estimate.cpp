#include "harness/run/estimate.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "harness/common/bad_input.h"
#include "harness/common/point_row.h"
#include "harness/run/point_runner.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_cost.h"
#include "kernels/torch_workspace.h"
#include "models/families/decoder.h"
#include "models/model.h"
#include "models/train/trainer.h"

namespace memtrade {
namespace {

// Address space without memory: segments get distinct, aligned, never-touched addresses. The
// CachingAllocator keeps its bookkeeping outside the blocks, so it never dereferences them.
// `base` keeps the device's and the pinned allocator's ranges apart.
class MetaProvider final : public RawProvider {
 public:
  explicit MetaProvider(std::uintptr_t base) : next_(base) {}
  void* allocate(std::size_t bytes) override {
    std::uintptr_t p = next_;
    next_ += (bytes + kAlign - 1) / kAlign * kAlign + kAlign;  // a gap keeps segments apart
    return reinterpret_cast<void*>(p);
  }
  void release(void*, std::size_t) noexcept override {}
  std::string_view name() const override { return "meta"; }

 private:
  static constexpr std::uintptr_t kAlign = 2 * MiB;
  std::uintptr_t next_;
};
// Far from anything mapped, 2^44 B apart.
constexpr std::uintptr_t kMetaDeviceBase = std::uintptr_t{1} << 44;
constexpr std::uintptr_t kMetaPinnedBase = std::uintptr_t{2} << 44;

// An event stamps its stream's time on the time model's clock (when there is one), so that a
// stream waiting for it waits as long as the engine's would.
class MetaEvent final : public Event {
 public:
  explicit MetaEvent(StepClock* clock) : clock_(clock) {}
  void record(StreamKind stream) override {
    stream_ = stream;
    if (clock_) at_ = clock_->now(stream);
  }
  StreamKind stream() const { return stream_; }
  double at() const { return at_; }
  void synchronize() override {}
  double seconds_since(const Event&) const override { return 0.0; }

 private:
  StepClock* clock_;
  StreamKind stream_ = StreamKind::compute;
  double at_ = 0;
};

// The device the memory model runs the step on. Device and pinned host memory are both meta
// (holds_data() is false: the Trainer allocates parameters, batches and host copies but writes
// no values), device ops are the backend's dry run and the host-side ops of the offload modes
// the CPU's, whose scratch lands on the pinned allocator as it would. Nothing costs time or
// memory in proportion to the parameter count or the batch.
class MetaDevice final : public Device {
 public:
  MetaDevice(Backend backend, std::size_t capacity, int rank, StepClock* clock,
             ComputeCapability cc)
      : rank_(rank),
        backend_(backend),
        clock_(clock),
        memory_(std::make_unique<MetaProvider>(kMetaDeviceBase), capacity),
        pinned_(std::make_unique<MetaProvider>(kMetaPinnedBase)),
        ops_(make_dry_run_ops(backend, clock, false, cc)) {}

  Backend backend() const override { return backend_; }
  std::string name() const override { return "meta"; }
  std::size_t total_memory() const override { return 0; }
  CachingAllocator& memory() override { return memory_; }
  CachingAllocator& pinned() override { return pinned_; }
  Ops& ops() override { return *ops_; }
  bool holds_data() const override { return false; }
  int meta_rank() const override { return rank_; }
  StepClock* step_clock() override { return clock_; }
  std::unique_ptr<Ops> make_host_ops() const override {
    return make_dry_run_ops(Backend::cpu, clock_, /*host=*/true);
  }
  void copy(void*, const void*, std::size_t bytes, CopyKind kind, StreamKind stream) override {
    count_transfer(kind, bytes);
    if (clock_) clock_->copy(kind, static_cast<double>(bytes), stream);
    if (kind == CopyKind::device_to_device) return;
    const std::string& phase = memory_.phase();
    (phase == "io"          ? copied_inputs
     : phase == "optimizer" ? copied_optimizer
                            : copied_passes) += static_cast<std::int64_t>(bytes);
  }
  void copy_2d(void* dst, std::size_t, const void* src, std::size_t, std::size_t width,
               std::size_t rows, CopyKind kind, StreamKind stream) override {
    copy(dst, src, width * rows, kind, stream);  // one count, not one call per row
  }
  void synchronize() override {
    if (clock_) clock_->synchronize();
  }
  void synchronize(StreamKind stream) override {
    if (clock_) clock_->synchronize(stream);
  }
  std::unique_ptr<Event> make_event() override { return std::make_unique<MetaEvent>(clock_); }
  void wait(StreamKind waiter, Event& event) override {
    if (!clock_) return;
    const auto& e = static_cast<const MetaEvent&>(event);
    clock_->wait(waiter, e.at(),
                 e.stream() == StreamKind::copy ? TimeShare::copy : TimeShare::compute);
  }

  std::int64_t copied_inputs = 0, copied_passes = 0, copied_optimizer = 0;  // by phase

 private:
  int rank_;
  Backend backend_;
  StepClock* clock_;  // the time model's, or nullptr
  CachingAllocator memory_;
  CachingAllocator pinned_;
  std::unique_ptr<Ops> ops_;
};

// The CUDA target's workspace (MemoryEstimate::workspace): PyTorch's workspaces live at the peak
// by name, and what the model leaves out, each with its bound.
nlohmann::json workspace_json(const DryRunWorkspace& w, ComputeCapability cc) {
  nlohmann::json at_peak = nlohmann::json::object();
  for (const auto& [name, bytes] : w.at_peak) at_peak[name] = bytes;
  nlohmann::json unmodeled = nlohmann::json::array();
  if (w.convolutions > 0)
    unmodeled.push_back(
        {{"name", "cudnn_convolution"},
         {"bound_bytes", nullptr},
         {"why",
          "the workspace of the cuDNN plan chosen for each convolution, allocated for the call "
          "and freed (aten/src/ATen/native/cudnn/Conv_v8.cpp run_conv_plan): "
          "algorithm-dependent, and PyTorch sets no bound"}});
  if (w.embedding_sorts > 0)
    unmodeled.push_back(
        {{"name", "embedding_sort_cub_tiles"},
         {"bound_bytes", w.embedding_cub_bound},
         {"why",
          "cub's radix-sort bins and look-back tiles and unique_by_key's and exclusive_sum's "
          "tile state (EmbeddingBackwardKernel.cu, Embedding.cu): live while fewer of the op's "
          "buffers are (40n B during the sort against the segment buffers and the (n/10 + "
          "min(n, v)) x c fp32 partial sums of its end); the bound is how far they can lift "
          "the op's peak above the modelled one"}});
  return {{"target", fmt::format("sm{}{}", cc.major, cc.minor)},
          {"cublas_bytes", cublas_workspace_bytes(cc)},
          {"cublaslt_bytes", cublaslt_workspace_bytes(cc)},
          {"at_peak", at_peak},
          {"unmodeled", unmodeled}};
}

}  // namespace

MemoryEstimate estimate_memory(const TrainConfig& cfg, Backend backend, std::size_t capacity,
                               int warmup, int rank, const GpuSpec* gpu, const Fabric& fabric,
                               const MoeRouting& routing) {
  auto start = std::chrono::steady_clock::now();
  MemoryEstimate e;
  std::optional<StepClock> clock;
  // One GPU per rank of tp × dp; each group's collectives are timed over its own ranks.
  if (gpu) clock.emplace(*gpu, fabric, static_cast<int>(cfg.tensor_parallel * cfg.data_parallel));
  // PyTorch's CUDA workspaces are sized for the GPU's generation (kernels/torch_workspace.h).
  const ComputeCapability cc = gpu ? compute_capability(gpu->arch) : kDefaultCudaTarget;
  MetaDevice dev(backend, capacity, rank, clock ? &*clock : nullptr, cc);
  auto model = make_model(cfg, tp_rank_of(rank, static_cast<int>(cfg.tensor_parallel)),
                          ep_rank_of(rank, static_cast<int>(cfg.tensor_parallel),
                                     static_cast<int>(cfg.expert_parallel)));
  auto* moe = dynamic_cast<MoeRouted*>(model.get());
  if (moe && !moe->moe().enabled()) moe = nullptr;
  if (moe)
    moe->moe().routing = routing.for_rank(rank, static_cast<int>(cfg.tensor_parallel),
                                          static_cast<int>(cfg.data_parallel),
                                          static_cast<int>(cfg.expert_parallel));
  try {
    Trainer trainer(dev, *model, cfg);
    for (int i = 0; i < warmup; ++i) trainer.step();
    dev.memory().reset_peak();
    dev.pinned().reset_peak();
    dev.copied_inputs = dev.copied_passes = dev.copied_optimizer = 0;
    if (clock) clock->reset();
    trainer.step();
    dev.synchronize();  // the step ends when every stream's work is done
    e.resident_after_step = dev.memory().stats().by_category;
    if (clock) e.time = summarize_time(*clock, cfg, *model);
  } catch (const OutOfMemory& oom) {
    e.fits = false;
    e.oom_message = oom.what();
  }
  const AllocatorStats& s = dev.memory().stats();
  e.peak_allocated = s.allocated.peak;
  e.peak_reserved = s.reserved.peak;
  e.host_pinned_peak = dev.pinned().stats().allocated.peak;
  e.breakdown_at_peak = s.by_category_at_peak;
  if (backend == Backend::cuda) e.workspace = workspace_json(dry_run_workspace(dev.ops()), cc);
  e.copied_inputs = dev.copied_inputs;
  e.copied_passes = dev.copied_passes;
  e.copied_optimizer = dev.copied_optimizer;
  if (moe) {
    const MoeState& st = moe->moe();
    e.moe = moe_routing_json(st, cfg.accumulation);
    e.moe["routing"] = st.routing.source.empty() ? "balanced" : st.routing.source;
    e.moe["saved_bytes"] = {{"router", st.saved.router},
                            {"dispatch", st.saved.dispatch},
                            {"experts", st.saved.experts},
                            {"shared_expert", st.saved.shared}};
  }
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return e;
}

nlohmann::json moe_routing_json(const MoeState& s, std::int64_t micro_batches) {
  return {{"num_experts", s.num_experts},
          {"moe_layers", s.layers},
          {"tokens_per_expert", s.last_step(micro_batches)}};
}

MoeRouting moe_routing_from(const std::string& spec, const std::string& point_id) {
  MoeRouting r;
  r.source = spec;
  if (spec == "balanced") return r;
  if (spec == "worst") {
    r.kind = MoeRouting::Kind::worst;
    return r;
  }
  const ResultsFile file = load_results_file(spec);
  const nlohmann::json* found = nullptr;
  for (const PointRow& p : file.points) {
    if (!p.extra.contains("moe_routing")) continue;
    if (!found || p.id == point_id) found = &p.extra.at("moe_routing");
  }
  if (!found)
    throw BadInput(
        fmt::format("--moe-routing {}: no point records moe_routing (a run of a "
                    "mixture-of-experts model does)",
                    spec));
  // [micro-batch][layer][expert] non-negative counts, not empty, from field `key`.
  auto histograms = [&](const std::string& key, const nlohmann::json& j) {
    MoeRouting::Histograms h;
    try {
      h = j.get<MoeRouting::Histograms>();
    } catch (const nlohmann::json::exception&) {
      throw BadInput(fmt::format(
          "--moe-routing {}: moe_routing.{} must be [micro-batch][layer][expert] counts", spec,
          key));
    }
    if (h.empty())
      throw BadInput(fmt::format("--moe-routing {}: moe_routing.{} is empty", spec, key));
    for (const auto& mb : h)
      for (const auto& layer : mb)
        for (std::int64_t v : layer)
          if (v < 0) throw BadInput(fmt::format("--moe-routing {}: a negative token count", spec));
    return h;
  };
  r.tokens_per_expert =
      histograms("tokens_per_expert", found->value("tokens_per_expert", nlohmann::json()));
  // A multi-rank run (results format 1.x, since expert parallelism) records every rank's.
  if (const auto by = found->find("tokens_per_expert_by_rank"); by != found->end()) {
    if (!by->is_array() || by->empty())
      throw BadInput(fmt::format(
          "--moe-routing {}: moe_routing.tokens_per_expert_by_rank must be one entry per rank",
          spec));
    for (const nlohmann::json& one : *by)
      r.by_world_rank.push_back(histograms("tokens_per_expert_by_rank", one));
  }
  r.kind = MoeRouting::Kind::measured;
  return r;
}

std::int64_t largest_fitting_batch(TrainConfig cfg, Backend backend, std::size_t capacity,
                                   std::int64_t limit) {
  auto fits = [&](std::int64_t batch) {
    cfg.batch_size = batch;
    return estimate_memory(cfg, backend, capacity).fits;
  };
  if (!fits(1)) return 0;
  std::int64_t lo = 1, hi = 2;
  while (hi <= limit && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, limit + 1);
  while (hi - lo > 1) {
    std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

nlohmann::json estimate_json(const MemoryEstimate& e) {
  nlohmann::json b = breakdown_json(e.breakdown_at_peak);
  nlohmann::json j = {{"peak_allocated", e.peak_allocated},
                      {"peak_reserved", e.peak_reserved},
                      {"host_pinned_peak", e.host_pinned_peak},
                      {"breakdown_at_peak", b},
                      {"resident_after_step", breakdown_json(e.resident_after_step)},
                      {"fits", e.fits},
                      {"oom", e.fits ? nlohmann::json(nullptr) : nlohmann::json(e.oom_message)},
                      {"seconds", e.seconds}};
  if (e.time) j["time_model"] = time_model_json(*e.time);
  if (!e.moe.is_null()) j["moe"] = e.moe;
  if (!e.workspace.is_null()) j["workspace"] = e.workspace;
  return j;
}

}  // namespace memtrade
