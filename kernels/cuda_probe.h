// Entry points of the CUDA backend that the rest of the code may call whether or not it was
// built; without CUDA (kernels/nocuda/) they report the backend as unusable.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace memtrade {

class Device;
struct DeviceOptions;

struct CudaProbe {
  bool usable = false;
  std::string detail;  // "NVIDIA H200 (sm_90, 139.8 GiB)" or the runtime's reason
};
CudaProbe probe_cuda();
// Only call when probe_cuda().usable.
std::unique_ptr<Device> make_cuda_device(const DeviceOptions& options);
// ("CUDA runtime", "13.0"), ("cuBLAS", ...), ("cuDNN", ...); empty without CUDA.
std::vector<std::pair<std::string, std::string>> cuda_library_versions();

}  // namespace memtrade
