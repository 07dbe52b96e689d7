// 2-D convolution (NCHW) on cuDNN's legacy API: cudnnConvolutionForward / BackwardData /
// BackwardFilter, each with the algorithm cuDNN's heuristics rank first (cudnnGet*_v7, which
// runs nothing and allocates nothing) among those whose workspace is within kConvWorkspaceLimit;
// the ranked list is cached per shape. The workspace comes from the output's allocator
// (Category::workspace) for the duration of the call. A candidate whose workspace cannot be
// allocated, or that cuDNN refuses at run time (a heuristic entry is no guarantee), gives way to
// the next one, and the one that ran moves to the front of the cached list, as PyTorch's
// AlgoIterator::try_all does: a failing allocation costs the allocator a release of its whole
// cache and an OOM event, so it must not repeat on every call. Once demoted, a shape stays on the
// smaller workspace for the rest of the run.
//
// Descriptors are built only when cuDNN is called: cuDNN rejects 0-sized dimensions, while an
// empty batch, channel or kernel is a valid (zero or bias-only) result here as on the CPU. The
// legacy descriptors also cap a tensor at 2^31 − 1 elements; larger ones fail with a clear
// message rather than cuDNN's NOT_SUPPORTED.
//
// fp32 runs with FMA math (no TF32) unless tf32 is on; fp16/bf16 with tensor-op math and fp32
// accumulation. cuDNN wants x, w and y of one dtype: the activations' dtype is used and the
// other operands are cast through scratch (Category::workspace); a parameter gradient of
// another dtype is computed fresh and then added in fp32 (launch_store_grad). The bias add and
// the bias gradient are own kernels (launch_channel_*).
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <exception>
#include <optional>
#include <utility>

#include "kernels/cuda/cuda_ops.h"

namespace memtrade::cuda {
namespace {

constexpr std::size_t kConvWorkspaceLimit = 1 * GiB;

// After the shared checks (kernels/op_checks.h): cuDNN's dimensions are ints.
const ConvDims& check_cudnn_range(std::string_view op, const ConvDims& d) {
  for (std::int64_t v : {d.n, d.ci, d.h, d.w, d.co, d.kh, d.kw})
    if (v > INT_MAX) fail(op, fmt::format("dimension {} exceeds cuDNN's int range", v));
  return d;
}

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDNN_DATA_FLOAT;
    case DType::F16:
      return CUDNN_DATA_HALF;
    case DType::BF16:
      return CUDNN_DATA_BFLOAT16;
    case DType::I32:
      break;
  }
  throw std::invalid_argument("conv2d: i32 tensors are not supported");
}

int as_int(std::int64_t v) {
  return static_cast<int>(v);
}

}  // namespace

struct CudaOps::ConvDescs {
  ConvDims d;
  DType dtype;
  bool tf32;
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;

  ConvDescs(std::string_view op, const ConvDims& dims, DType t, bool use_tf32)
      : d(dims),
        dtype(t),
        tf32(use_tf32),
        x(TensorDesc::create()),
        y(TensorDesc::create()),
        w(FilterDesc::create()),
        conv(ConvDesc::create()) {
    // cudnnSetTensor4dDescriptor returns NOT_SUPPORTED above INT_MAX elements (checked against
    // cuDNN 9.19: 2^31 − 1 elements pass, 2^31 do not), whatever the dtype.
    for (const auto& [name, n] :
         {std::pair{"inp", d.n * d.ci * d.h * d.w}, std::pair{"out", d.n * d.co * d.oh * d.ow}})
      if (n > INT_MAX)
        fail(op, fmt::format("{} has {} elements; cuDNN's convolution takes at most 2^31 - 1 per "
                             "tensor (use a smaller batch)",
                             name, n));
    const cudnnDataType_t ct = cudnn_type(t);
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.get(), CUDNN_TENSOR_NCHW, ct, as_int(d.n),
                                           as_int(d.ci), as_int(d.h), as_int(d.w)));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(y.get(), CUDNN_TENSOR_NCHW, ct, as_int(d.n),
                                           as_int(d.co), as_int(d.oh), as_int(d.ow)));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), ct, CUDNN_TENSOR_NCHW, as_int(d.co),
                                           as_int(d.ci), as_int(d.kh), as_int(d.kw)));
    // fp32 accumulation for every dtype (16-bit: cuDNN's "pseudo half" configuration).
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv.get(), as_int(d.pad), as_int(d.pad),
                                                as_int(d.stride), as_int(d.stride), 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), requested_math()));
  }

  // FMA math keeps fp32 exact (CUDNN_DEFAULT_MATH would allow TF32 on Ampere and later).
  cudnnMathType_t requested_math() const {
    if (dtype == DType::F32) return tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    return CUDNN_TENSOR_OP_MATH;
  }

  ConvKey key(int dir) const {
    return {d.n,  d.ci, d.h,      d.w,   d.co,
            d.kh, d.kw, d.stride, d.pad, static_cast<std::int64_t>(dtype),
            tf32, dir};
  }
};

namespace {

// Keeps the usable results of a cudnnGet*_v7 query, best first, with math that never lowers
// the requested precision: exact fp32 takes FMA math only, and no entry may use
// TENSOR_OP_MATH_ALLOW_CONVERSION (fp32 data down-converted to fp16: fp16 precision in a run
// labelled fp32/tf32). Should that leave nothing, the listed algorithms run with the requested
// math, which the descriptor carried when cuDNN listed them; one that then refuses is skipped
// at run time (conv_run).
template <typename Perf>
std::vector<ConvChoice> usable(const std::vector<Perf>& perf, int count, cudnnMathType_t requested,
                               bool exact_f32) {
  std::vector<ConvChoice> all, kept;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > kConvWorkspaceLimit) continue;
    const ConvChoice c{static_cast<int>(perf[i].algo), perf[i].mathType, perf[i].memory};
    all.push_back(c);
    const bool ok =
        exact_f32 ? c.math == CUDNN_FMA_MATH : c.math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    if (ok) kept.push_back(c);
  }
  if (!kept.empty()) return kept;
  for (ConvChoice& c : all) c.math = requested;
  return all;
}

// Runs a cudnnGet*_v7 query with room for every entry cuDNN may return (it can list an algorithm
// once per math type, more than *_ALGO_COUNT entries in all).
template <typename Perf, typename MaxCount, typename Query>
std::vector<ConvChoice> query_candidates(cudnnHandle_t h, MaxCount max_count, Query query,
                                         cudnnMathType_t requested, bool exact_f32) {
  int most = 0;
  CUDNN_CHECK(max_count(h, &most));
  std::vector<Perf> perf(static_cast<std::size_t>(std::max(most, 1)));
  int count = 0;
  CUDNN_CHECK(query(static_cast<int>(perf.size()), &count, perf.data()));
  return usable(perf, std::min(count, static_cast<int>(perf.size())), requested, exact_f32);
}

}  // namespace

std::vector<ConvChoice>& CudaOps::conv_candidates(const ConvDescs& d, int dir) {
  const ConvKey key = d.key(dir);
  if (auto it = conv_algos_.find(key); it != conv_algos_.end()) return it->second;
  cudnnHandle_t h = cudnn();
  const bool exact = d.dtype == DType::F32 && !d.tf32;
  const cudnnMathType_t math = d.requested_math();
  std::vector<ConvChoice> found;
  if (dir == 0) {
    found = query_candidates<cudnnConvolutionFwdAlgoPerf_t>(
        h, cudnnGetConvolutionForwardAlgorithmMaxCount,
        [&](int n, int* count, cudnnConvolutionFwdAlgoPerf_t* perf) {
          return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(),
                                                        d.y.get(), n, count, perf);
        },
        math, exact);
  } else if (dir == 1) {
    found = query_candidates<cudnnConvolutionBwdDataAlgoPerf_t>(
        h, cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
        [&](int n, int* count, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
          return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.get(), d.y.get(), d.conv.get(),
                                                             d.x.get(), n, count, perf);
        },
        math, exact);
  } else {
    found = query_candidates<cudnnConvolutionBwdFilterAlgoPerf_t>(
        h, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
        [&](int n, int* count, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
          return cudnnGetConvolutionBackwardFilterAlgorithm_v7(
              h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), n, count, perf);
        },
        math, exact);
  }
  if (found.empty())
    throw std::runtime_error(fmt::format(
        "cuDNN has no convolution algorithm (direction {}) for x ({}, {}, {}, {}), w ({}, {}, {}, "
        "{}), stride {}, pad {}, {}",
        dir, d.d.n, d.d.ci, d.d.h, d.d.w, d.d.co, d.d.ci, d.d.kh, d.d.kw, d.d.stride, d.d.pad,
        dtype_name(d.dtype)));
  return conv_algos_.emplace(key, std::move(found)).first->second;
}

void CudaOps::conv_run(const ConvDescs& d, int dir, const void* in0, const void* in1, void* out,
                       float beta, CachingAllocator& alloc) {
  std::vector<ConvChoice>& cands = conv_candidates(d, dir);
  // cuDNN's status rather than an exception, so that a refused algorithm can be skipped.
  auto run = [&](const ConvChoice& c) -> cudnnStatus_t {
    Tensor ws;
    if (c.bytes > 0)  // may throw OutOfMemory
      ws = Tensor(alloc, {static_cast<std::int64_t>((c.bytes + 3) / 4)}, DType::I32,
                  Category::workspace);
    CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), c.math));
    const float alpha = 1.0f;
    cudnnHandle_t h = cudnn();
    if (dir == 0)
      return cudnnConvolutionForward(h, &alpha, d.x.get(), in0, d.w.get(), in1, d.conv.get(),
                                     static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws.data(),
                                     c.bytes, &beta, d.y.get(), out);
    if (dir == 1)
      return cudnnConvolutionBackwardData(h, &alpha, d.w.get(), in0, d.y.get(), in1, d.conv.get(),
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
                                          ws.data(), c.bytes, &beta, d.x.get(), out);
    return cudnnConvolutionBackwardFilter(h, &alpha, d.x.get(), in0, d.y.get(), in1, d.conv.get(),
                                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
                                          ws.data(), c.bytes, &beta, d.w.get(), out);
  };
  // In rank order. After an OutOfMemory only candidates with a strictly smaller workspace are
  // tried (a larger one would fail the same way).
  std::size_t too_big = SIZE_MAX;  // a workspace of this many bytes did not fit
  std::exception_ptr oom;
  cudnnStatus_t refused = CUDNN_STATUS_SUCCESS;
  for (std::size_t i = 0; i < cands.size();) {
    const ConvChoice c = cands[i];
    if (c.bytes >= too_big) {
      ++i;
      continue;
    }
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    try {
      st = run(c);
    } catch (const OutOfMemory&) {
      oom = std::current_exception();
      too_big = c.bytes;
      ++i;
      continue;
    }
    if (st == CUDNN_STATUS_SUCCESS) {
      const auto at = cands.begin() + static_cast<std::ptrdiff_t>(i);
      std::rotate(cands.begin(), at, at + 1);  // what ran is tried first next time
      return;
    }
    // BAD_PARAM / NOT_SUPPORTED (any cuDNN 9 sub-code) are refusals checked on the host before
    // anything is enqueued: drop the algorithm for this shape for good. Anything else (internal
    // or execution failure) may be a real fault and is thrown.
    const int category = CUDNN_STATUS_CATEGORY(static_cast<int>(st));
    if (category != CUDNN_STATUS_BAD_PARAM && category != CUDNN_STATUS_NOT_SUPPORTED)
      detail::throw_error("cuDNN", cudnnGetErrorString(st), "convolution", __FILE__, __LINE__);
    static_cast<void>(cudaGetLastError());  // as PyTorch: a refusal may leave a launch error
    refused = st;
    cands.erase(cands.begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (cands.empty()) conv_algos_.erase(d.key(dir));  // ask the heuristics again next time
  // Out of memory stays the allocator's OutOfMemory, which callers report as such.
  if (oom) std::rethrow_exception(oom);
  throw std::runtime_error(fmt::format(
      "cuDNN refused every convolution algorithm (direction {}) for x ({}, {}, {}, {}), w ({}, {}, "
      "{}, {}), stride {}, pad {}, {}; last: {}",
      dir, d.d.n, d.d.ci, d.d.h, d.d.w, d.d.co, d.d.ci, d.d.kh, d.d.kw, d.d.stride, d.d.pad,
      dtype_name(d.dtype), cudnnGetErrorString(refused)));
}

void CudaOps::conv2d_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                             const Tensor* bias, int stride, int pad) {
  NvtxRange range("conv2d_forward");
  constexpr std::string_view op = "conv2d_forward";
  const ConvDims dims =
      check_cudnn_range(op, check_conv_forward(out, inp, weight, bias, stride, pad));
  if (out.numel() == 0) return;
  const DType dt = inp.dtype();
  CachingAllocator& alloc = *out.allocator();
  AsDTypeOut y(out, dt, false, stream_);
  if (inp.numel() > 0 && weight.numel() > 0) {
    const ConvDescs d(op, dims, dt, tf32_);
    AsDType w(weight, dt, alloc, stream_);
    conv_run(d, 0, inp.data(), w.data(), y.data(), 0.0f, alloc);
  } else {  // no input channel or an empty kernel: every output is a sum of nothing
    CUDA_CHECK(cudaMemsetAsync(y.data(), 0, static_cast<std::size_t>(out.numel()) * dtype_size(dt),
                               stream_));
  }
  y.commit();
  if (bias)
    launch_channel_bias_add(out.data(), out.dtype(), bias->data(), bias->dtype(), dims.n, dims.co,
                            dims.oh * dims.ow, stream_);
}

void CudaOps::conv2d_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                              const Tensor& inp, const Tensor& weight, int stride, int pad,
                              bool accumulate) {
  NvtxRange range("conv2d_backward");
  constexpr std::string_view op = "conv2d_backward";
  const ConvDims dims = check_cudnn_range(
      op, check_conv_backward(dinp, dweight, dbias, dout, inp, weight, stride, pad));
  if (dbias)  // Σ over images and pixels per output channel
    launch_channel_sum(dbias->data(), dbias->dtype(), dout.data(), dout.dtype(), dims.n, dims.co,
                       dims.oh * dims.ow, accumulate, stream_);
  if (!dinp && !dweight) return;
  const DType dt = dout.dtype();
  CachingAllocator& alloc = *(dinp ? dinp : dweight)->allocator();
  const bool empty = dout.numel() == 0 || inp.numel() == 0;
  std::optional<ConvDescs> d;  // only where cuDNN is called: every tensor non-empty
  if (!empty && weight.numel() > 0) d.emplace(op, dims, dt, tf32_);
  if (dweight && weight.numel() > 0) {  // dweight (Co, Ci, KH, KW) (+)= filter gradient
    AsDType x(inp, dt, alloc, stream_);
    if (dweight->dtype() == dt) {
      if (empty) {
        if (!accumulate)
          CUDA_CHECK(cudaMemsetAsync(dweight->data(), 0, dweight->nbytes(), stream_));
      } else {
        conv_run(*d, 2, x.data(), dout.data(), dweight->data(), accumulate ? 1.0f : 0.0f, alloc);
      }
    } else {
      Tensor fresh(alloc, weight.shape(), dt, Category::workspace);
      if (empty) {
        CUDA_CHECK(cudaMemsetAsync(fresh.data(), 0, fresh.nbytes(), stream_));
      } else {
        conv_run(*d, 2, x.data(), dout.data(), fresh.data(), 0.0f, alloc);
      }
      launch_store_grad(dweight->data(), dweight->dtype(), fresh.data(), dt, weight.numel(),
                        accumulate, stream_);
    }
  }
  if (dinp && inp.numel() > 0) {  // dinp (N, Ci, H, W) = data gradient
    AsDType w(weight, dt, alloc, stream_);
    AsDTypeOut dx(*dinp, dt, false, stream_);
    if (empty || weight.numel() == 0) {
      CUDA_CHECK(cudaMemsetAsync(
          dx.data(), 0, static_cast<std::size_t>(dinp->numel()) * dtype_size(dt), stream_));
    } else {
      conv_run(*d, 1, w.data(), dout.data(), dx.data(), 0.0f, alloc);
    }
    dx.commit();
  }
}

}  // namespace memtrade::cuda
