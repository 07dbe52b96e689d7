// The CPU backend: host memory behind the same CachingAllocator policy as a GPU, synchronous
// "streams", steady-clock events, and the CPU ops (OpenBLAS GEMM, OpenMP loops).
#pragma once

#include <memory>
#include <string>

#include "kernels/device.h"

namespace memtrade {

std::unique_ptr<Device> make_cpu_device(const DeviceOptions& options);
// "cpu (Intel Xeon ..., 2 threads, 23.4 GiB)"
std::string cpu_device_description(int threads);
// Number of threads CPU ops use (OpenMP and OpenBLAS are set to it by make_cpu_device).
int cpu_thread_count();

}  // namespace memtrade
