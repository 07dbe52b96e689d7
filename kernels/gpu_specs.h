// The GPU table: what the time model (kernels/op_cost.h) knows of each card it can predict for,
// every figure from the vendor's datasheet (the `source` of each row names it). `--gpu NAME`
// picks a row; `memtrade devices --table` prints them.
//
// Rates are dense (NVIDIA's datasheets print "with sparsity" figures twice as large; those are
// halved here and the row says so). Bandwidths are in bytes per second, one direction: PCIe
// Gen4 x16 moves 32 GB/s each way (the datasheets' 64 GB/s is both ways), NVLink 4 "900 GB/s"
// is 450 GB/s each way. Memory sizes are the card's nominal size in GiB, as parse_capacity's
// presets (kernels/allocator.h).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "kernels/dtype.h"

namespace memtrade {

enum class GpuArch : unsigned char { ampere, ada, hopper, blackwell };
std::string_view gpu_arch_name(GpuArch a);

struct GpuSpec {
  std::string_view name;       // the --gpu value: "h100", "a100-80g", ...
  std::string_view full_name;  // "NVIDIA H100 SXM5 80GB"
  GpuArch arch;
  int sms;                  // streaming multiprocessors: the GEMM's wave quantisation
  double fp32_flops;        // FP32 on CUDA cores
  double tf32_flops;        // TF32 tensor cores, dense
  double bf16_flops;        // BF16/FP16 tensor cores with FP32 accumulation, dense
  double fp8_flops;         // FP8 tensor cores, dense (0: none)
  double memory_gib;        // device memory, nominal
  double memory_bw;         // device memory bandwidth, B/s
  int pcie_gen;             // host link: PCIe generation, x16
  double host_bw;           // host <-> device, one direction, B/s
  double nvlink_bw;         // NVLink per GPU, one direction, B/s (0: none)
  int nvlink_domain;        // GPUs one NVLink/NVSwitch domain joins (1: none: PCIe only)
  std::string_view source;  // where every figure of the row comes from
  // The dense peak for a GEMM whose operands are `dtype` (F32 with `tf32`: TF32 tensor cores).
  double peak_flops(DType dtype, bool tf32) const;
};

// Between nodes: one 400 Gb/s InfiniBand NDR port per GPU (DGX A100/H100/H200/B200 and their
// HGX reference designs: eight ConnectX-7 (A100: ConnectX-6 HDR 200 Gb/s) for eight GPUs).
// 400 Gb/s is 50 GB/s each way; nccl-tests' cross-node bus bandwidth reaches about 90% of it.
struct Fabric {
  double ib_bw = 50e9;  // B/s per GPU, one direction
  std::string_view source =
      "400 Gb/s InfiniBand NDR per GPU (NVIDIA DGX H100 user guide: 8x ConnectX-7)";
};

std::span<const GpuSpec> gpu_specs();
// The row of `name` (case-insensitive; the names of gpu_specs()); nullptr if none.
const GpuSpec* find_gpu(std::string_view name);
// "a100-40g, a100-80g, h100, ...": for error messages.
std::string gpu_names();

}  // namespace memtrade
