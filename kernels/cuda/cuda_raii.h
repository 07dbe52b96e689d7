// RAII owners of CUDA, cuBLASLt and cuDNN handles (move-only; released with the no-throw checks),
// and an NVTX range guard.
#pragma once

#include <nvtx3/nvToolsExt.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace memtrade::cuda {

namespace detail {
// A move-only owner of one handle `H`, destroyed by `Destroy::operator()(H)`.
template <typename H, typename Destroy>
class Owner {
 public:
  Owner() = default;
  explicit Owner(H h) : h_(h) {}
  ~Owner() { reset(); }
  Owner(Owner&& o) noexcept : h_(std::exchange(o.h_, H{})) {}
  Owner& operator=(Owner&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, H{});
    }
    return *this;
  }
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;
  H get() const { return h_; }
  void reset() noexcept {
    if (h_ != H{}) Destroy{}(h_);
    h_ = H{};
  }

 private:
  H h_{};
};

struct DestroyStream {
  void operator()(cudaStream_t s) const noexcept { CUDA_CHECK_NOTHROW(cudaStreamDestroy(s)); }
};
struct DestroyEvent {
  void operator()(cudaEvent_t e) const noexcept { CUDA_CHECK_NOTHROW(cudaEventDestroy(e)); }
};
struct DestroyLt {
  void operator()(cublasLtHandle_t h) const noexcept { CUBLAS_CHECK_NOTHROW(cublasLtDestroy(h)); }
};
struct DestroyCudnn {
  void operator()(cudnnHandle_t h) const noexcept { CUDNN_CHECK_NOTHROW(cudnnDestroy(h)); }
};
struct DestroyTensorDesc {
  void operator()(cudnnTensorDescriptor_t d) const noexcept {
    CUDNN_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(d));
  }
};
struct DestroyFilterDesc {
  void operator()(cudnnFilterDescriptor_t d) const noexcept {
    CUDNN_CHECK_NOTHROW(cudnnDestroyFilterDescriptor(d));
  }
};
struct DestroyConvDesc {
  void operator()(cudnnConvolutionDescriptor_t d) const noexcept {
    CUDNN_CHECK_NOTHROW(cudnnDestroyConvolutionDescriptor(d));
  }
};
}  // namespace detail

// A non-blocking stream: it does not synchronise with the legacy default stream.
class Stream : public detail::Owner<cudaStream_t, detail::DestroyStream> {
 public:
  static Stream create() {
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return Stream(s);
  }

 private:
  using Owner::Owner;
};

// A timing-enabled event.
class EventHandle : public detail::Owner<cudaEvent_t, detail::DestroyEvent> {
 public:
  static EventHandle create() {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    return EventHandle(e);
  }

 private:
  using Owner::Owner;
};

class LtHandle : public detail::Owner<cublasLtHandle_t, detail::DestroyLt> {
 public:
  static LtHandle create() {
    cublasLtHandle_t h = nullptr;
    CUBLAS_CHECK(cublasLtCreate(&h));
    return LtHandle(h);
  }

 private:
  using Owner::Owner;
};

class CudnnHandle : public detail::Owner<cudnnHandle_t, detail::DestroyCudnn> {
 public:
  static CudnnHandle create(cudaStream_t stream) {
    cudnnHandle_t h = nullptr;
    CUDNN_CHECK(cudnnCreate(&h));
    CudnnHandle owner(h);
    CUDNN_CHECK(cudnnSetStream(h, stream));
    return owner;
  }

 private:
  using Owner::Owner;
};

class TensorDesc : public detail::Owner<cudnnTensorDescriptor_t, detail::DestroyTensorDesc> {
 public:
  static TensorDesc create() {
    cudnnTensorDescriptor_t d = nullptr;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    return TensorDesc(d);
  }

 private:
  using Owner::Owner;
};

class FilterDesc : public detail::Owner<cudnnFilterDescriptor_t, detail::DestroyFilterDesc> {
 public:
  static FilterDesc create() {
    cudnnFilterDescriptor_t d = nullptr;
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&d));
    return FilterDesc(d);
  }

 private:
  using Owner::Owner;
};

class ConvDesc : public detail::Owner<cudnnConvolutionDescriptor_t, detail::DestroyConvDesc> {
 public:
  static ConvDesc create() {
    cudnnConvolutionDescriptor_t d = nullptr;
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    return ConvDesc(d);
  }

 private:
  using Owner::Owner;
};

// `NvtxRange r("linear_forward");` — a named range in Nsight Systems for the enclosing scope.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace memtrade::cuda
