#include "kernels/device.h"

#include <cstddef>
#include <stdexcept>

#include <fmt/format.h>

#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda_probe.h"

namespace memtrade {

std::string_view backend_name(Backend b) {
  return b == Backend::cpu ? "cpu" : "cuda";
}

int optimizer_state_count(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::sgd:
      return 0;
    case OptimizerKind::sgd_momentum:
      return 1;
    case OptimizerKind::adam:
      return 2;
    case OptimizerKind::adamw:
      return 2;
    case OptimizerKind::adagrad:
      return 1;
    case OptimizerKind::rmsprop:
      return 1;
  }
  return 0;
}

void Device::count_transfer(CopyKind kind, std::size_t bytes) {
  auto b = static_cast<std::int64_t>(bytes);
  switch (kind) {
    case CopyKind::host_to_device:
      transfers_.h2d_bytes += b;
      break;
    case CopyKind::device_to_host:
      transfers_.d2h_bytes += b;
      break;
    case CopyKind::device_to_device:
      transfers_.d2d_bytes += b;
      break;
    case CopyKind::host_to_host:
      break;
  }
}

void Device::copy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                     std::size_t width, std::size_t rows, CopyKind kind, StreamKind stream) {
  for (std::size_t r = 0; r < rows; ++r)
    copy(static_cast<std::byte*>(dst) + r * dpitch, static_cast<const std::byte*>(src) + r * spitch,
         width, kind, stream);
}

std::unique_ptr<Ops> Device::make_host_ops() const {
  return make_cpu_ops();
}

void Device::upload(Tensor& dst, const void* host, std::size_t bytes, StreamKind stream) {
  if (bytes > dst.nbytes())
    throw std::invalid_argument(
        fmt::format("upload of {} B into a {} B tensor", bytes, dst.nbytes()));
  copy(dst.data(), host, bytes, CopyKind::host_to_device, stream);
  synchronize(stream);
}

void Device::download(void* host, const Tensor& src, std::size_t bytes, StreamKind stream) {
  if (bytes > src.nbytes())
    throw std::invalid_argument(
        fmt::format("download of {} B from a {} B tensor", bytes, src.nbytes()));
  copy(host, src.data(), bytes, CopyKind::device_to_host, stream);
  synchronize(stream);
}

std::vector<float> Device::to_host_f32(const Tensor& t) {
  std::vector<unsigned char> raw(t.nbytes());
  download(raw.data(), t, raw.size());
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(raw.data(), t.dtype(), i);
  return out;
}

void Device::from_host_f32(Tensor& t, const std::vector<float>& values) {
  if (values.size() != static_cast<std::size_t>(t.numel()))
    throw std::invalid_argument(
        fmt::format("from_host_f32: {} values for a tensor of {}", values.size(), t.numel()));
  std::vector<unsigned char> raw(t.nbytes());
  for (std::size_t i = 0; i < values.size(); ++i)
    store_from_float(raw.data(), t.dtype(), i, values[i]);
  upload(t, raw.data(), raw.size());
}

std::vector<BackendStatus> probe_backends() {
  std::vector<BackendStatus> out;
  out.push_back({Backend::cpu, true, cpu_device_description(0)});
  CudaProbe cuda = probe_cuda();
  out.push_back({Backend::cuda, cuda.usable, cuda.detail});
  return out;
}

std::unique_ptr<Device> make_device(std::string_view backend, const DeviceOptions& options) {
  if (backend == "cpu") return make_cpu_device(options);
  if (backend == "cuda" || backend == "auto") {
    CudaProbe cuda = probe_cuda();
    if (cuda.usable) return make_cuda_device(options);
    if (backend == "auto") return make_cpu_device(options);
    throw std::runtime_error("CUDA backend unusable: " + cuda.detail);
  }
  throw std::invalid_argument(
      fmt::format("unknown backend '{}' (expected auto, cpu or cuda)", backend));
}

}  // namespace memtrade
