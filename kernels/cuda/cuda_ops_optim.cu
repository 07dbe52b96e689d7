// Loss-scale unscaling with the inf/nan check, and the fused optimizer step with torch.optim's
// formulas: the element arithmetic of kernels/optimizer_math.h, shared with the CPU backend and
// rounded as it is, operation by operation (the host update of offload=optimizer and
// offload=params must equal this one bit for bit). One element-wise kernel for one parameter,
// and one multi-tensor kernel (PyTorch's multi_tensor_apply pattern) that updates many
// parameters per launch — the tensor pointers and a block -> (tensor, chunk) table travel by
// value in the kernel's parameters, so there is no device-side metadata whose lifetime could
// race the launch.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/optimizer_math.h"

namespace memtrade::cuda {
namespace {

// Where the inf/nan flag lives in the small scratch (sum_to_host uses the first few KiB).
constexpr std::size_t kFlagOffset = 32 * KiB;

template <typename T>
__global__ void unscale_kernel(T* g, std::int64_t n, float inv_scale, bool write, int* flag) {
  bool bad = false;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const float x = to_f(g[i]);
    // Checked before (an inf times 0 would hide) and after (a finite value may overflow).
    const float v = rn::mul(x, inv_scale);  // as the CPU's: no FMA can form here, but one rule
    if (!isfinite(x) || !isfinite(v)) bad = true;
    if (write) g[i] = from_f<T>(v);  // x·1 == x: a check-only call writes nothing
  }
  if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) *flag = 1;
}

// One element: w and the stored g in fp32, the states read and written through s0/s1 (null for
// kinds without them).
__device__ __forceinline__ float update_element(const OptimizerScalars& a, float w, float g,
                                                AnyOut s0, AnyOut s1, std::int64_t j) {
  float m0 = s0.p ? s0.load(j) : 0.0f, m1 = s1.p ? s1.load(j) : 0.0f;
  w = dispatch_optimizer(
      a.kind, [&](auto kind) { return optimizer_element<decltype(kind)::value>(a, w, g, m0, m1); });
  if (s0.p) s0.store(j, m0);
  if (s1.p) s1.store(j, m1);
  return w;
}

template <typename TP, typename TG>
__global__ void optimizer_kernel(TP* param, const TG* grad, AnyOut s0, AnyOut s1, std::int64_t n,
                                 OptimizerScalars a) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += stride)
    param[j] = from_f<TP>(update_element(a, to_f(param[j]), to_f(grad[j]), s0, s1, j));
}

// Multi-tensor launch metadata, passed by value (well under the 4 KiB kernel-parameter limit):
// up to kMultiTensors parameters of one (param, grad) dtype pair, and for each of up to
// kMultiBlocks blocks the tensor and the kMultiChunk-element chunk it updates.
constexpr int kMultiTensors = 24;
constexpr int kMultiBlocks = 320;
constexpr std::int64_t kMultiChunk = 65536;

struct MultiArgs {
  void* param[kMultiTensors];
  const void* grad[kMultiTensors];
  void* s0[kMultiTensors];
  void* s1[kMultiTensors];
  std::int64_t n[kMultiTensors];
  DType s0_t[kMultiTensors];
  DType s1_t[kMultiTensors];
  std::uint8_t block_tensor[kMultiBlocks];
  std::int32_t block_chunk[kMultiBlocks];
};
static_assert(sizeof(MultiArgs) + sizeof(OptimizerScalars) < 4000,
              "kernel parameters are limited to 4 KiB");

template <typename TP, typename TG>
__global__ void optimizer_multi_kernel(MultiArgs m, OptimizerScalars a) {
  const int t = m.block_tensor[blockIdx.x];
  const std::int64_t begin = static_cast<std::int64_t>(m.block_chunk[blockIdx.x]) * kMultiChunk;
  const std::int64_t end = begin + kMultiChunk < m.n[t] ? begin + kMultiChunk : m.n[t];
  TP* param = static_cast<TP*>(m.param[t]);
  const TG* grad = static_cast<const TG*>(m.grad[t]);
  const AnyOut s0{m.s0[t], m.s0_t[t]}, s1{m.s1[t], m.s1_t[t]};
  for (std::int64_t j = begin + threadIdx.x; j < end; j += blockDim.x)
    param[j] = from_f<TP>(update_element(a, to_f(param[j]), to_f(grad[j]), s0, s1, j));
}

}  // namespace

bool CudaOps::unscale_and_check(std::span<Tensor* const> grads, float inv_scale) {
  NvtxRange range("unscale_and_check");
  for (Tensor* g : grads)
    if (g) check_float("unscale_and_check", "grad", *g);
  auto* flag = reinterpret_cast<int*>(static_cast<unsigned char*>(small_scratch()) + kFlagOffset);
  CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream_));
  const bool write = inv_scale != 1.0f;
  for (Tensor* g : grads) {
    if (!g || g->numel() == 0) continue;
    dispatch_float(g->dtype(), "unscale_and_check", [&](auto tag) {
      using T = decltype(tag);
      unscale_kernel<T><<<grid_for(g->numel()), kThreads, 0, stream_>>>(g->as<T>(), g->numel(),
                                                                        inv_scale, write, flag);
      CUDA_CHECK_LAUNCH();
    });
  }
  int host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, flag, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host != 0;
}

void CudaOps::optimizer_update(const OptimizerHyper& h, Tensor& param, const Tensor& grad,
                               Tensor* state0, Tensor* state1) {
  NvtxRange range("optimizer_update");
  check_optimizer_update(h, param, grad, state0, state1);
  const std::int64_t n = param.numel();
  if (n == 0) return;
  const int nstate = optimizer_state_count(h.kind);
  const OptimizerScalars a = optimizer_scalars(h);
  const AnyOut s0 =
      nstate >= 1 ? AnyOut{state0->data(), state0->dtype()} : AnyOut{nullptr, DType::F32};
  const AnyOut s1 =
      nstate >= 2 ? AnyOut{state1->data(), state1->dtype()} : AnyOut{nullptr, DType::F32};
  dispatch_float(param.dtype(), "optimizer_update", [&](auto p) {
    dispatch_float(grad.dtype(), "optimizer_update", [&](auto g) {
      using TP = decltype(p);
      using TG = decltype(g);
      optimizer_kernel<TP, TG>
          <<<grid_for(n), kThreads, 0, stream_>>>(param.as<TP>(), grad.as<TG>(), s0, s1, n, a);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaOps::optimizer_update_many(const OptimizerHyper& h, std::span<const OptimizerSlot> slots) {
  NvtxRange range("optimizer_update_many");
  for (const OptimizerSlot& s : slots)
    check_optimizer_update(h, *s.param, *s.grad, s.state0, s.state1);
  const int nstate = optimizer_state_count(h.kind);
  const OptimizerScalars a = optimizer_scalars(h);
  // One launch per (param, grad) dtype pair and per kMultiTensors / kMultiBlocks of metadata.
  for (DType pt : {DType::F32, DType::F16, DType::BF16}) {
    for (DType gt : {DType::F32, DType::F16, DType::BF16}) {
      MultiArgs m{};
      int tensors = 0, blocks = 0;
      auto launch = [&] {
        if (blocks == 0) return;
        dispatch_float(pt, "optimizer_update", [&](auto p) {
          dispatch_float(gt, "optimizer_update", [&](auto g) {
            optimizer_multi_kernel<decltype(p), decltype(g)>
                <<<static_cast<unsigned>(blocks), kThreads, 0, stream_>>>(m, a);
            CUDA_CHECK_LAUNCH();
          });
        });
        m = MultiArgs{};
        tensors = blocks = 0;
      };
      for (const OptimizerSlot& s : slots) {
        if (s.param->dtype() != pt || s.grad->dtype() != gt || s.param->numel() == 0) continue;
        const std::int64_t n = s.param->numel();
        const std::int64_t chunks = (n + kMultiChunk - 1) / kMultiChunk;
        for (std::int64_t c = 0; c < chunks; ++c) {
          // A tensor's chunks may straddle launches; it then takes a slot in each.
          if (c == 0 || blocks == 0) {
            if (tensors == kMultiTensors) launch();
            m.param[tensors] = s.param->data();
            m.grad[tensors] = s.grad->data();
            m.s0[tensors] = nstate >= 1 ? s.state0->data() : nullptr;
            m.s1[tensors] = nstate >= 2 ? s.state1->data() : nullptr;
            m.s0_t[tensors] = nstate >= 1 ? s.state0->dtype() : DType::F32;
            m.s1_t[tensors] = nstate >= 2 ? s.state1->dtype() : DType::F32;
            m.n[tensors] = n;
            ++tensors;
          }
          m.block_tensor[blocks] = static_cast<std::uint8_t>(tensors - 1);
          m.block_chunk[blocks] = static_cast<std::int32_t>(c);
          if (++blocks == kMultiBlocks) launch();
        }
      }
      launch();
    }
  }
}

}  // namespace memtrade::cuda
