#include "kernels/gpu_specs.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace memtrade {
namespace {

constexpr double T = 1e12;  // TFLOP/s
constexpr double G = 1e9;   // GB/s

// PCIe x16, one direction (PCI-SIG: 16 GT/s Gen4, 32 GT/s Gen5, 128b/130b): 31.5 and 63 GB/s;
// what a pinned cudaMemcpy reaches is about 80% of it (25 and 50 GB/s, NVIDIA's bandwidthTest).
constexpr double kPcie4 = 25 * G, kPcie5 = 50 * G;

// clang-format off
constexpr std::array<GpuSpec, 9> kGpus = {{
    {"a100-40g", "NVIDIA A100 SXM4 40GB", GpuArch::ampere, 108,
     19.5 * T, 156 * T, 312 * T, 0,
     40, 1555 * G, 4, kPcie4, 300 * G, 8,
     "NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5, TF32 156 (312 sparse), BF16 312 "
     "(624 sparse) TFLOPS; 40GB HBM2 1,555 GB/s; PCIe Gen4; NVLink 600 GB/s (both ways); HGX A100 "
     "8-GPU NVSwitch; A100 whitepaper: 108 SMs"},
    {"a100-80g", "NVIDIA A100 SXM4 80GB", GpuArch::ampere, 108,
     19.5 * T, 156 * T, 312 * T, 0,
     80, 2039 * G, 4, kPcie4, 300 * G, 8,
     "NVIDIA A100 Tensor Core GPU datasheet (2021): as the 40GB; 80GB HBM2e 2,039 GB/s"},
    {"h100", "NVIDIA H100 SXM5 80GB", GpuArch::hopper, 132,
     67 * T, 494.5 * T, 989.5 * T, 1979 * T,
     80, 3350 * G, 5, kPcie5, 450 * G, 8,
     "NVIDIA H100 Tensor Core GPU datasheet (2023), SXM: FP32 67, TF32 989 sparse, BF16 1,979 "
     "sparse, FP8 3,958 sparse TFLOPS (dense = half); 80GB HBM3 3.35 TB/s; PCIe Gen5; NVLink "
     "900 GB/s (both ways); HGX H100 8-GPU NVSwitch; H100 whitepaper: 132 SMs"},
    {"h100-pcie", "NVIDIA H100 PCIe 80GB", GpuArch::hopper, 114,
     51 * T, 378 * T, 756 * T, 1513 * T,
     80, 2000 * G, 5, kPcie5, 300 * G, 2,
     "NVIDIA H100 Tensor Core GPU datasheet (2023), PCIe: FP32 51, TF32 756 sparse, BF16 1,513 "
     "sparse, FP8 3,026 sparse TFLOPS; 80GB HBM2e 2 TB/s; PCIe Gen5; NVLink bridge 600 GB/s "
     "(both ways) between two cards; H100 whitepaper: 114 SMs"},
    {"h200", "NVIDIA H200 SXM 141GB", GpuArch::hopper, 132,
     67 * T, 494.5 * T, 989.5 * T, 1979 * T,
     141, 4800 * G, 5, kPcie5, 450 * G, 8,
     "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM: compute as H100 SXM; 141GB HBM3e "
     "4.8 TB/s; PCIe Gen5; NVLink 900 GB/s (both ways); HGX H200 8-GPU NVSwitch"},
    {"l4", "NVIDIA L4 24GB", GpuArch::ada, 58,
     30.3 * T, 60 * T, 121 * T, 242.5 * T,
     24, 300 * G, 4, kPcie4, 0, 1,
     "NVIDIA L4 Tensor Core GPU datasheet (2023): FP32 30.3, TF32 120 sparse, BF16 242 sparse, "
     "FP8 485 sparse TFLOPS; 24GB GDDR6 300 GB/s; PCIe Gen4 x16; no NVLink; Ada whitepaper: "
     "AD104, 58 SMs"},
    {"l40s", "NVIDIA L40S 48GB", GpuArch::ada, 142,
     91.6 * T, 183 * T, 362 * T, 733 * T,
     48, 864 * G, 4, kPcie4, 0, 1,
     "NVIDIA L40S datasheet (2023): FP32 91.6, TF32 366 sparse, BF16 733 sparse, FP8 1,466 "
     "sparse TFLOPS; 48GB GDDR6 864 GB/s; PCIe Gen4 x16; no NVLink; 142 SMs"},
    {"rtx4090", "NVIDIA GeForce RTX 4090 24GB", GpuArch::ada, 128,
     82.6 * T, 82.6 * T, 165.2 * T, 330.3 * T,
     24, 1008 * G, 4, kPcie4, 0, 1,
     "NVIDIA Ada Lovelace architecture whitepaper (v2.1), Appendix A, RTX 4090: FP32 82.6, TF32 "
     "82.6, BF16 with FP32 accumulate 165.2, FP8 with FP32 accumulate 330.3 TFLOPS (dense); 24GB "
     "GDDR6X 1,008 GB/s; PCIe Gen4; 128 SMs; no NVLink"},
    {"b200", "NVIDIA B200 (HGX B200) 180GB", GpuArch::blackwell, 148,
     75 * T, 1100 * T, 2250 * T, 4500 * T,
     180, 7700 * G, 5, kPcie5, 900 * G, 8,
     "NVIDIA HGX B200 datasheet (2024), 8 GPUs: FP32 600, TF32 18 PF sparse, BF16 36 PF sparse, "
     "FP8 72 PF sparse, 1.4 TB HBM3e, 62 TB/s, NVLink 5 1.8 TB/s per GPU (both ways): one GPU is "
     "an eighth, dense half the sparse; 180GB; PCIe Gen5 host; 148 SMs (Blackwell "
     "whitepaper)"},
}};
// clang-format on

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::string_view gpu_arch_name(GpuArch a) {
  switch (a) {
    case GpuArch::ampere:
      return "ampere";
    case GpuArch::ada:
      return "ada";
    case GpuArch::hopper:
      return "hopper";
    case GpuArch::blackwell:
      return "blackwell";
  }
  return "?";
}

double GpuSpec::peak_flops(DType dtype, bool tf32) const {
  if (dtype == DType::BF16 || dtype == DType::F16) return bf16_flops;
  return tf32 ? tf32_flops : fp32_flops;
}

std::span<const GpuSpec> gpu_specs() {
  return kGpus;
}

const GpuSpec* find_gpu(std::string_view name) {
  const std::string n = lower(name);
  auto it = std::find_if(kGpus.begin(), kGpus.end(), [&](const GpuSpec& g) { return g.name == n; });
  if (it != kGpus.end()) return &*it;
  if (n == "h100-sxm" || n == "h100-80g") return find_gpu("h100");
  return nullptr;
}

std::string gpu_names() {
  std::string out;
  for (const GpuSpec& g : kGpus) out += (out.empty() ? "" : ", ") + std::string(g.name);
  return out;
}

}  // namespace memtrade
