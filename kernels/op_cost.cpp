#include "kernels/op_cost.h"

#include <algorithm>
#include <cmath>

namespace memtrade {

double gemm_peak_efficiency(GpuArch arch) {
  switch (arch) {
    case GpuArch::ampere:
      return 0.88;
    case GpuArch::hopper:
      return 0.75;
    case GpuArch::ada:
      return 0.80;
    case GpuArch::blackwell:
      return 0.75;
  }
  return 0.75;
}

FlashEfficiency flash_efficiency(GpuArch arch) {
  switch (arch) {
    case GpuArch::ampere:
      return {0.55, 0.42};
    case GpuArch::ada:
      return {0.55, 0.42};  // assumed: Ampere's kernels, the same tiles
    case GpuArch::hopper:
      return {0.50, 0.40};
    case GpuArch::blackwell:
      return {0.50, 0.40};  // assumed: Hopper's
  }
  return {0.5, 0.4};
}

double gemm_efficiency(const GpuSpec& gpu, std::int64_t batch, std::int64_t m, std::int64_t n,
                       std::int64_t k) {
  if (batch <= 0 || m <= 0 || n <= 0 || k <= 0) return gemm_peak_efficiency(gpu.arch);
  const double mt = std::ceil(static_cast<double>(m) / kGemmTile);
  const double nt = std::ceil(static_cast<double>(n) / kGemmTile);
  const double tiles = mt * nt * static_cast<double>(batch);
  // Tile quantisation: a tile past m or n computes zeros at the full tile's cost.
  const double tile_fill =
      static_cast<double>(m) * static_cast<double>(n) / (mt * nt * kGemmTile * kGemmTile);
  // Wave quantisation: the last wave keeps only tiles mod SMs of the SMs busy.
  const double waves = std::ceil(tiles / gpu.sms);
  const double wave_fill = tiles / (waves * gpu.sms);
  const double kk = static_cast<double>(k);
  return gemm_peak_efficiency(gpu.arch) * tile_fill * wave_fill * kk / (kk + kGemmK0);
}

namespace {
bool one_nvlink_domain(const GpuSpec& gpu, int ranks, int span) {
  return std::max(ranks, span) <= gpu.nvlink_domain && gpu.nvlink_bw > 0;
}
}  // namespace

double collective_seconds(const GpuSpec& gpu, const Fabric& fabric, CollectiveKind kind,
                          double bytes, int ranks, int span) {
  if (ranks <= 1 || bytes <= 0) return 0.0;
  // A ring is as fast as its slowest link: NVLink while every rank is in one NVLink domain, the
  // InfiniBand port once the ring leaves it (and PCIe where there is no NVLink).
  const bool one_domain = one_nvlink_domain(gpu, ranks, span);
  const double link = one_domain ? gpu.nvlink_bw * kNvlinkEfficiency
                                 : std::min(fabric.ib_bw * kIbEfficiency,
                                            gpu.nvlink_bw > 0 ? gpu.nvlink_bw : gpu.host_bw);
  const double hop = one_domain ? kNvlinkHopLatency : kIbHopLatency;
  const double n = ranks;
  const double share = (n - 1) / n;  // of the tensor each rank sends per ring pass
  switch (kind) {
    case CollectiveKind::all_reduce: {
      // Ring: reduce-scatter then all-gather, 2(n-1) steps. Tree (NCCL's double binary tree):
      // up and down a log2(n)-deep tree, each at the full size.
      const double ring = 2 * share * bytes / link + 2 * (n - 1) * hop;
      const double tree = 2 * bytes / link + 2 * std::ceil(std::log2(n)) * hop;
      return std::min(ring, tree);
    }
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all:
      return share * bytes / link + (n - 1) * hop;
    case CollectiveKind::broadcast:
      return bytes / link + std::ceil(std::log2(n)) * hop;
  }
  return 0.0;
}

double collective_latency(const GpuSpec& gpu, int ranks, int span) {
  if (ranks <= 1) return 0.0;
  return (ranks - 1) * (one_nvlink_domain(gpu, ranks, span) ? kNvlinkHopLatency : kIbHopLatency);
}

std::string_view time_share_name(TimeShare s) {
  switch (s) {
    case TimeShare::compute:
      return "compute";
    case TimeShare::memory:
      return "memory";
    case TimeShare::comm:
      return "comm";
    case TimeShare::copy:
      return "copy";
    case TimeShare::host:
      return "host";
    case TimeShare::launch:
      return "launch";
  }
  return "?";
}

StepClock::StepClock(const GpuSpec& gpu, Fabric fabric, int gpus)
    : gpu_(gpu), fabric_(fabric), ranks_(std::max(gpus, 1)) {
  last_.fill(TimeShare::compute);
  last_[copy_lane] = TimeShare::copy;
  last_[comm] = TimeShare::comm;
  last_[host] = TimeShare::host;
}

// Work on `lane` starts when the lane is free and the host has issued it; on the compute
// stream, the wait for the host is charged to what held the host (its own work, or the stream
// it synchronised with).
void StepClock::run(Lane lane, double seconds, TimeShare share) {
  double& c = clock_[lane];
  if (lane != host && clock_[host] > c) {
    if (lane == compute) share_[static_cast<std::size_t>(last_[host])] += clock_[host] - c;
    c = clock_[host];
  }
  c += seconds;
  if (lane == compute) share_[static_cast<std::size_t>(share)] += seconds;
  last_[lane] = share;
}

void StepClock::gemm(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                     DType dtype, bool tf32, double bytes) {
  kernel_runs();
  const double flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) *
                       static_cast<double>(n) * static_cast<double>(k);
  const double tc = flops / (gpu_.peak_flops(dtype, tf32) * gemm_efficiency(gpu_, batch, m, n, k));
  const double tm = bytes / (gpu_.memory_bw * kMemoryEfficiency);
  run(compute, std::max(tc, tm), tc >= tm ? TimeShare::compute : TimeShare::memory);
  run(compute, kKernelGap, TimeShare::launch);
  ++kernels_;
}

void StepClock::flash(double flops, double bytes, DType dtype, bool backward) {
  kernel_runs();
  const FlashEfficiency e = flash_efficiency(gpu_.arch);
  const double tc = flops / (gpu_.peak_flops(dtype, false) * (backward ? e.backward : e.forward));
  const double tm = bytes / (gpu_.memory_bw * kMemoryEfficiency);
  run(compute, std::max(tc, tm), tc >= tm ? TimeShare::compute : TimeShare::memory);
  run(compute, kKernelGap, TimeShare::launch);
  ++kernels_;
}

void StepClock::memory_op(double bytes) {
  kernel_runs();
  run(compute, bytes / (gpu_.memory_bw * kMemoryEfficiency), TimeShare::memory);
  run(compute, kKernelGap, TimeShare::launch);
  ++kernels_;
}

void StepClock::host_op(double bytes) {
  run(host, bytes / kHostUpdateBandwidth, TimeShare::host);
}

void StepClock::copy(CopyKind kind, double bytes, StreamKind stream) {
  const Lane lane = stream == StreamKind::compute ? compute : copy_lane;
  if (kind == CopyKind::device_to_device) {  // read and write device memory
    run(lane, 2 * bytes / (gpu_.memory_bw * kMemoryEfficiency), TimeShare::memory);
    return;
  }
  if (kind == CopyKind::host_to_host) {
    run(host, bytes / kHostUpdateBandwidth, TimeShare::host);
    return;
  }
  // Grads leaving for the host's optimizer (ZeRO-Offload) are the reduced ones.
  if (kind == CopyKind::device_to_host && started_until_ > clock_[lane]) {
    if (lane == compute)
      wait(StreamKind::compute, started_until_, TimeShare::comm);
    else
      clock_[lane] = started_until_;
  }
  run(lane, kCopyLatency + bytes / gpu_.host_bw, TimeShare::copy);
}

double StepClock::collective_s(CollectiveKind kind, double bytes, int ranks, int span) const {
  return collective_seconds(gpu_, fabric_, kind, bytes, ranks, span);
}

void StepClock::collective(CollectiveKind kind, double bytes, int ranks, int span) {
  run(compute, collective_s(kind, bytes, ranks, span), TimeShare::comm);
}

void StepClock::start_collective(CollectiveKind kind, double bytes, int ranks, int span) {
  double t = collective_s(kind, bytes, ranks, span);
  if (kind == CollectiveKind::reduce_scatter) {
    if (scattering_) t -= collective_latency(gpu_, ranks, span);  // the same unit's flat one
    scattering_ = true;
  }
  clock_[comm] = std::max(clock_[comm], clock_[compute]);  // ordered after the grads (an event)
  run(comm, t, TimeShare::comm);
  started_until_ = clock_[comm];
}

void StepClock::wait_collectives() {
  wait(StreamKind::compute, started_until_, TimeShare::comm);
}

void StepClock::prefetched_collective(CollectiveKind kind, double bytes, int ranks, int span) {
  double t = collective_s(kind, bytes, ranks, span);
  if (gathering_) t -= collective_latency(gpu_, ranks, span);  // the same unit's flat gather
  clock_[comm] = std::max(clock_[comm], prefetch_from_) + t;
  last_[comm] = TimeShare::comm;
  wait(StreamKind::compute, clock_[comm], TimeShare::comm);
  gathering_ = true;
}

void StepClock::kernel_runs() {
  if (gathering_) prefetch_from_ = clock_[compute];  // this unit computes: the next may gather
  gathering_ = scattering_ = false;
}

double StepClock::now(StreamKind s) const {
  return std::max(clock_[s == StreamKind::compute ? compute : copy_lane], clock_[host]);
}

void StepClock::wait(StreamKind waiter, double t, TimeShare cause) {
  double& c = clock_[waiter == StreamKind::compute ? compute : copy_lane];
  if (t <= c) return;
  if (waiter == StreamKind::compute) share_[static_cast<std::size_t>(cause)] += t - c;
  c = t;
}

void StepClock::synchronize(StreamKind s) {
  const Lane lane = s == StreamKind::compute ? compute : copy_lane;
  if (clock_[lane] > clock_[host]) {
    clock_[host] = clock_[lane];
    last_[host] = last_[lane];
  }
}

void StepClock::synchronize() {
  for (Lane lane : {compute, copy_lane, comm})
    if (clock_[lane] > clock_[host]) {
      clock_[host] = clock_[lane];
      last_[host] = last_[lane];
    }
}

void StepClock::reset() {
  const double t = *std::max_element(clock_.begin(), clock_.end());
  clock_.fill(t);
  start_ = t;
  prefetch_from_ = t;
  started_until_ = t;
  gathering_ = scattering_ = false;
  share_.fill(0.0);
  kernels_ = 0;
}

double StepClock::elapsed() const {
  return *std::max_element(clock_.begin(), clock_.end()) - start_;
}

std::array<double, kNumTimeShares> StepClock::shares() const {
  std::array<double, kNumTimeShares> s = share_;
  // Work still running when the compute stream is done (a copy, a collective, the host's update)
  // ends the step: the tail is charged to it.
  const auto last = std::max_element(clock_.begin(), clock_.end());
  const double tail = *last - clock_[compute];
  if (tail > 0)
    s[static_cast<std::size_t>(last_[static_cast<std::size_t>(last - clock_.begin())])] += tail;
  return s;
}

}  // namespace memtrade
