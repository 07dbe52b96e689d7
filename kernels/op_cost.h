// The time model of one GPU: what each op of a step costs on a card of the GPU table
// (kernels/gpu_specs.h), and a timeline of its streams that adds them up as the engine orders
// them. The memory model's dry run (harness/run/estimate.cpp) knows every op's shapes and dtypes
// without computing anything; its ops, copies, events and collectives drive a StepClock.
//
// One op on the compute stream costs
//     max(FLOPs / (peak(dtype) · efficiency(op, shape)), bytes / (bandwidth · kMemoryEfficiency))
//     + kKernelGap
// where a GEMM's efficiency is a function of its shape (gemm_efficiency: tile and wave
// quantisation and the k loop's fixed cost), flash attention has its own, and element-wise ops
// (0 FLOPs) are bandwidth-bound. Host <-> device copies move at the card's host bandwidth on the
// stream they are issued on; collectives follow a ring (or, cheaper for small messages, a tree)
// over NVLink within a node and InfiniBand across nodes; the optimizer of an offloaded step runs
// on the host at kHostUpdateBandwidth. Streams follow the engine's events: a copy on the copy
// stream overlaps compute until the compute stream waits for its event; DDP's started
// all-reduces and FSDP's reduce-scatters run on a stream of their own until wait_collectives,
// FSDP's all-gathers one unit ahead of the compute that needs them.
//
// Every constant below names its source or measurement. They are the defaults for a card never
// measured; a real GPU run replaces them.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/gpu_specs.h"

namespace memtrade {

// ---- the constants ------------------------------------------------------------------------------
// A large GEMM's fraction of the dense peak, per architecture (cuBLAS, bf16, M = N = K = 8192).
//   ampere 0.88: ~275 TFLOP/s of 312 on A100-SXM (NVIDIA's cuBLAS 11 performance figures; the
//     FlashAttention-2 paper's GEMM baseline reports the same range);
//   hopper 0.75: ~740 of 989 on H100-SXM at its power limit (the FlashAttention-3 paper and
//     NVIDIA's cuBLAS 12 figures: 700-800 TFLOP/s);
//   ada 0.80, blackwell 0.75: assumed as the nearest measured architecture (no published cuBLAS
//     figure at hand); a measurement on the card replaces them.
double gemm_peak_efficiency(GpuArch arch);
// The k loop's fixed cost per output tile (prologue, epilogue, the pipeline's fill), as k
// elements: a tile computes for k / (k + kGemmK0) of its time (CUTLASS's 3-stage mainloop fills
// 2 of its 32-wide k steps before the first MMA and writes the tile after the last).
inline constexpr double kGemmK0 = 64;
// cuBLAS's output tile for large 16-bit GEMMs on these architectures (128 x 128, and 128 x 256
// on Hopper, whose 2-CTA clusters behave as 128 x 128 per SM for the wave count).
inline constexpr double kGemmTile = 128;
// Flash attention forward and backward, fraction of the dense peak on the FLOPs of its GEMMs with
// the causal half skipped (FlashAttention-2 paper, Dao 2023, Figs. 4-6: A100, causal, head dim
// 64-128, 1k-2k tokens: forward 150-190 TFLOP/s of 312, backward 110-150; FlashAttention-3
// paper, Figs. 5-7: H100, cuDNN and FA2/FA3 causal forward 350-600 of 989, backward 300-470).
struct FlashEfficiency {
  double forward, backward;
};
FlashEfficiency flash_efficiency(GpuArch arch);
// Achieved fraction of the memory bandwidth by streaming kernels (element-wise, norms,
// optimizer): ~1.7 of 2.0 TB/s on A100-80GB and ~2.8-3.0 of 3.35 on H100 (STREAM-like copy
// kernels; NVIDIA's babelstream results).
inline constexpr double kMemoryEfficiency = 0.85;
// Gap between two kernels of a stream: launch latency the queue does not hide (~2-4 us per
// kernel in Nsight traces of eager PyTorch at full occupancy).
inline constexpr double kKernelGap = 3e-6;
// Fixed cost of one host <-> device copy (cudaMemcpyAsync of pinned memory: ~10 us to start).
inline constexpr double kCopyLatency = 10e-6;
// Collectives: the bus bandwidth nccl-tests reach, as a fraction of the link's (all_reduce_perf
// on DGX A100: ~230 of 300 GB/s per direction over NVSwitch; on DGX H100 ~360-370 of 450; across
// nodes ~45 of 50 GB/s of NDR), and the per-hop latency (NCCL's Simple protocol: ~5 us per ring
// step in a node, ~10 us across InfiniBand).
inline constexpr double kNvlinkEfficiency = 0.78;
inline constexpr double kIbEfficiency = 0.9;
inline constexpr double kNvlinkHopLatency = 5e-6;
inline constexpr double kIbHopLatency = 10e-6;
// Host-side optimizer of an offloaded step (ZeRO-Offload's CPU Adam): bytes it streams per
// second on a dual-socket server (Ren et al. 2021, ZeRO-Offload, Sec. 5: CPU-Adam updates about
// 1e9 fp32 parameters per ~0.5 s, 28 bytes each read or written: ~50 GB/s).
inline constexpr double kHostUpdateBandwidth = 50e9;

// GEMM efficiency of (batch x) m x n x k on `gpu`: gemm_peak_efficiency x the fraction of the
// tiles' work that is real (tile quantisation) x the fraction of the last wave that is busy
// (wave quantisation over the SMs) x k / (k + kGemmK0).
double gemm_efficiency(const GpuSpec& gpu, std::int64_t batch, std::int64_t m, std::int64_t n,
                       std::int64_t k);

enum class CollectiveKind : unsigned char {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  all_to_all
};
// Seconds of one collective over `ranks` GPUs of `bytes` (the full tensor: the reduced one, the
// gathered one), ring or tree, whichever is cheaper. The group lies within `span` consecutive
// ranks of the world (0: `ranks`): it stays on NVLink while the span fits one NVLink domain
// (ranks are tp × dp with tp inside a node, so a dp group of a tp > 1 layout strides over tp
// ranks: tp 8 × dp 2 puts its two dp ranks in two nodes).
double collective_seconds(const GpuSpec& gpu, const Fabric& fabric, CollectiveKind kind,
                          double bytes, int ranks, int span = 0);
// The hops' part of a reduce-scatter or all-gather: (ranks - 1) x the hop latency. FSDP gathers
// (and reduce-scatters) a unit's parameters as one flat collective, the engine one per parameter:
// the clock charges the hops once per unit.
double collective_latency(const GpuSpec& gpu, int ranks, int span = 0);

// A group of the meta device's ranks whose collectives a clock times: `ranks` GPUs within `span`
// consecutive ranks of the world, and how the engine runs them. Data parallelism's start on a
// stream of their own (DDP's buckets, ZeRO-2/FSDP's reduce-scatters) or are prefetched (FSDP's
// gathers); tensor parallelism's (`in_line`) run on the compute stream where the layer calls
// them: Megatron-core's default, without its optional TP communication overlap
// (tp_comm_overlap, Transformer Engine's userbuffers).
struct TimedGroup {
  StepClock* clock = nullptr;
  int span = 0;  // 0: the group's size
  bool in_line = false;
};
class Comm;
// Rank `rank` of a meta comm of `size` ranks timed as `group` (kernels/comm.cpp, beside
// make_meta_comm, which times a group that is the whole world as data parallelism's).
std::unique_ptr<Comm> make_meta_comm(int rank, int size, const TimedGroup& group);

// Where a step's time goes, by what bounds each piece on the compute stream's critical path.
enum class TimeShare : unsigned char { compute, memory, comm, copy, host, launch };
inline constexpr std::size_t kNumTimeShares = 6;
std::string_view time_share_name(TimeShare s);

// The streams' timeline of one step.
class StepClock {
 public:
  // `gpus`: the world (tp × dp ranks, one GPU each); collectives name their own group.
  StepClock(const GpuSpec& gpu, Fabric fabric, int gpus);
  const GpuSpec& gpu() const { return gpu_; }
  int ranks() const { return ranks_; }

  // ---- compute-stream ops ---------------------------------------------------------------------
  void gemm(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
            bool tf32, double bytes);
  void flash(double flops, double bytes, DType dtype, bool backward);
  void memory_op(double bytes);  // element-wise, norms, optimizer: bandwidth-bound
  void host_op(double bytes);    // the host's ops (offload): at kHostUpdateBandwidth
  void copy(CopyKind kind, double bytes, StreamKind stream);
  // A collective in line on the compute stream (NCCL on the compute stream, as the engine runs
  // every collective but DDP's), over `ranks` GPUs within `span` consecutive ranks (0: ranks).
  void collective(CollectiveKind kind, double bytes, int ranks, int span = 0);
  // DDP's bucket all-reduce and FSDP's reduce-scatter: started on a stream of their own after
  // the compute stream's work so far (the grads they reduce); the compute stream waits for all of
  // them at wait_collectives() (DDP's wait; the optimizer's first read of the grads).
  void start_collective(CollectiveKind kind, double bytes, int ranks, int span = 0);
  void wait_collectives();
  // FSDP's all-gather of a unit's weights: on the collectives' stream, issued one unit ahead (the
  // gather of the next unit may start once this unit computes: FSDP's backward prefetch, and in
  // forward the CPU running ahead of the GPU, FSDP2's implicit prefetch), and the compute stream
  // waits for it before the unit's first op.
  void prefetched_collective(CollectiveKind kind, double bytes, int ranks, int span = 0);

  // ---- stream order ---------------------------------------------------------------------------
  double now(StreamKind s) const;  // when the stream's work so far is done
  void wait(StreamKind waiter, double t, TimeShare cause);
  void synchronize(StreamKind s);  // the host waits for a stream
  void synchronize();              // ... for every stream

  // From now on: the measured step.
  void reset();
  double elapsed() const;  // from reset() to the end of every stream's work
  // Seconds on the compute stream's critical path by share; they sum to elapsed().
  std::array<double, kNumTimeShares> shares() const;
  std::int64_t kernels() const { return kernels_; }

 private:
  enum Lane : unsigned char { compute, copy_lane, comm, host, kLanes };
  void run(Lane lane, double seconds, TimeShare share);
  double collective_s(CollectiveKind kind, double bytes, int ranks, int span) const;

  const GpuSpec& gpu_;
  Fabric fabric_;
  int ranks_;
  std::array<double, kLanes> clock_{};
  std::array<TimeShare, kLanes> last_{};  // what the lane's work last was: the cause of a wait
  std::array<double, kNumTimeShares> share_{};
  double start_ = 0;
  double prefetch_from_ = 0;  // when the next prefetched gather may start
  double started_until_ = 0;  // when the started collectives are done
  // A unit's gathers (reduce-scatters) since the last kernel: one flat collective, one latency.
  bool gathering_ = false, scattering_ = false;
  void kernel_runs();  // the compute stream runs a kernel: a unit's collectives are complete
  std::int64_t kernels_ = 0;
};

}  // namespace memtrade
