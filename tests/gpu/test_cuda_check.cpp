// The check macros need no device: a failed call throws with its library, text and file:line,
// and an allocation failure inside the runtime, cuBLAS or cuDNN throws OutOfMemory so that a
// grid point records "oom" rather than "error". Runs wherever the CUDA backend is built.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#ifdef MEMTRADE_HAVE_CUDA
#include "kernels/cuda/cuda_check.h"
#endif

namespace memtrade {
namespace {

#ifdef MEMTRADE_HAVE_CUDA
cudaError_t returns(cudaError_t e) {
  return e;
}
cublasStatus_t returns(cublasStatus_t s) {
  return s;
}
cudnnStatus_t returns(cudnnStatus_t s) {
  return s;
}

template <typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}
#endif

TEST(CudaCheck, AllocationFailuresAreOutOfMemoryOthersRuntimeErrors) {
#ifndef MEMTRADE_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  EXPECT_THROW(CUDA_CHECK(returns(cudaErrorMemoryAllocation)), OutOfMemory);
  EXPECT_THROW(CUBLAS_CHECK(returns(CUBLAS_STATUS_ALLOC_FAILED)), OutOfMemory);
  EXPECT_THROW(CUDNN_CHECK(returns(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)),
               OutOfMemory);
  // Other failures are plain runtime errors (OutOfMemory derives from runtime_error: check
  // that the type is not it).
  for (const std::string& m :
       {message_of([] { CUDA_CHECK(returns(cudaErrorInvalidValue)); }),
        message_of([] { CUBLAS_CHECK(returns(CUBLAS_STATUS_INVALID_VALUE)); }),
        message_of([] { CUDNN_CHECK(returns(CUDNN_STATUS_BAD_PARAM)); })})
    EXPECT_NE(m.find("error:"), std::string::npos) << m;
  bool oom = false;
  try {
    CUDA_CHECK(returns(cudaErrorInvalidValue));
  } catch (const OutOfMemory&) {
    oom = true;
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(oom);
  const std::string m = message_of([] { CUDA_CHECK(returns(cudaErrorMemoryAllocation)); });
  EXPECT_NE(m.find("CUDA out of memory outside the caching allocator"), std::string::npos) << m;
  EXPECT_NE(m.find("test_cuda_check.cpp:"), std::string::npos) << m;
  EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos) << m;
#endif
}

}  // namespace
}  // namespace memtrade
