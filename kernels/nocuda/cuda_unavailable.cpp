// Built instead of kernels/cuda/ when the CUDA backend is not compiled in.
#include <stdexcept>

#include "kernels/cuda_probe.h"
#include "kernels/device.h"

namespace memtrade {

CudaProbe probe_cuda() {
  return {false, "not built: this binary was configured without a CUDA compiler (MEMTRADE_CUDA)"};
}

std::unique_ptr<Device> make_cuda_device(const DeviceOptions&) {
  throw std::runtime_error("CUDA backend not built into this binary");
}

std::vector<std::pair<std::string, std::string>> cuda_library_versions() {
  return {};
}

}  // namespace memtrade
