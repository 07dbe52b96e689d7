// One throwing check macro per library (CUDA runtime, cuBLAS/cuBLASLt, cuDNN), each carrying
// file:line and the text of the failed call, plus *_NOTHROW variants for destructors, which
// report to stderr instead (a destructor must not throw, and a failing cudaFree at shutdown
// should not hide the error that caused the shutdown).
//
// An allocation failure inside a library or the driver (cuBLASLt's or cuDNN's own buffers, lazy
// kernel loading at peak memory) throws memtrade::OutOfMemory like the caching allocator does,
// so that a grid point records "oom", not "error". Its sizes are 0: the caller cannot know them.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/allocator.h"

namespace memtrade::cuda::detail {

[[noreturn]] inline void throw_error(const char* lib, const char* what, const char* call,
                                     const char* file, int line) {
  throw std::runtime_error(std::string(lib) + " error: " + what + " in `" + call + "` at " + file +
                           ":" + std::to_string(line));
}

[[noreturn]] inline void throw_oom(const char* lib, const char* what, const char* call,
                                   const char* file, int line) {
  throw OutOfMemory(std::string(lib) + " out of memory outside the caching allocator: " + what +
                        " in `" + call + "` at " + file + ":" + std::to_string(line),
                    0, 0, 0, 0);
}

// Throws OutOfMemory when `oom`, else std::runtime_error.
[[noreturn]] inline void throw_status(bool oom, const char* lib, const char* what, const char* call,
                                      const char* file, int line) {
  if (oom) throw_oom(lib, what, call, file, line);
  throw_error(lib, what, call, file, line);
}

inline void report_error(const char* lib, const char* what, const char* call, const char* file,
                         int line) noexcept {
  std::fprintf(stderr, "memtrade: %s error (ignored in a destructor): %s in `%s` at %s:%d\n", lib,
               what, call, file, line);
}

inline const char* cublas_status_text(cublasStatus_t s) {
  return cublasGetStatusString(s);
}

}  // namespace memtrade::cuda::detail

#define CUDA_CHECK(call)                                                                         \
  do {                                                                                           \
    const cudaError_t memtrade_err_ = (call);                                                    \
    if (memtrade_err_ != cudaSuccess)                                                            \
      ::memtrade::cuda::detail::throw_status(memtrade_err_ == cudaErrorMemoryAllocation, "CUDA", \
                                             cudaGetErrorString(memtrade_err_), #call, __FILE__, \
                                             __LINE__);                                          \
  } while (0)

#define CUBLAS_CHECK(call)                                                                        \
  do {                                                                                            \
    const cublasStatus_t memtrade_st_ = (call);                                                   \
    if (memtrade_st_ != CUBLAS_STATUS_SUCCESS)                                                    \
      ::memtrade::cuda::detail::throw_status(                                                     \
          memtrade_st_ == CUBLAS_STATUS_ALLOC_FAILED, "cuBLAS",                                   \
          ::memtrade::cuda::detail::cublas_status_text(memtrade_st_), #call, __FILE__, __LINE__); \
  } while (0)

#define CUDNN_CHECK(call)                                                                \
  do {                                                                                   \
    const cudnnStatus_t memtrade_st_ = (call);                                           \
    if (memtrade_st_ != CUDNN_STATUS_SUCCESS)                                            \
      ::memtrade::cuda::detail::throw_status(                                            \
          memtrade_st_ == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, "cuDNN", \
          cudnnGetErrorString(memtrade_st_), #call, __FILE__, __LINE__);                 \
  } while (0)

#define CUDA_CHECK_NOTHROW(call)                                                               \
  do {                                                                                         \
    const cudaError_t memtrade_err_ = (call);                                                  \
    if (memtrade_err_ != cudaSuccess)                                                          \
      ::memtrade::cuda::detail::report_error("CUDA", cudaGetErrorString(memtrade_err_), #call, \
                                             __FILE__, __LINE__);                              \
  } while (0)

#define CUBLAS_CHECK_NOTHROW(call)                                                               \
  do {                                                                                           \
    const cublasStatus_t memtrade_st_ = (call);                                                  \
    if (memtrade_st_ != CUBLAS_STATUS_SUCCESS)                                                   \
      ::memtrade::cuda::detail::report_error(                                                    \
          "cuBLAS", ::memtrade::cuda::detail::cublas_status_text(memtrade_st_), #call, __FILE__, \
          __LINE__);                                                                             \
  } while (0)

#define CUDNN_CHECK_NOTHROW(call)                                                               \
  do {                                                                                          \
    const cudnnStatus_t memtrade_st_ = (call);                                                  \
    if (memtrade_st_ != CUDNN_STATUS_SUCCESS)                                                   \
      ::memtrade::cuda::detail::report_error("cuDNN", cudnnGetErrorString(memtrade_st_), #call, \
                                             __FILE__, __LINE__);                               \
  } while (0)

// After every kernel launch: launch-configuration errors surface here, at the launching line.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
