// Element-wise ops (fill, cast, add, scale, GELU, ReLU, SwiGLU, GeGLU, soft-capping) and the small
// launchers other files share (casts, gradient stores, bias adds). Each thread handles 4
// consecutive elements with one vector load per operand (16 B for fp32, 8 B for 16-bit) when every
// pointer is aligned for it — always, for tensors from the caching allocator — and a scalar tail
// covers n % 4.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace memtrade::cuda {
namespace {

template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

template <typename T>
bool vec_aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// out = f(a)
template <typename F, typename TO, typename TA>
__global__ void map1_kernel(TO* out, const TA* a, std::int64_t n, std::int64_t n4, F f) {
  const std::int64_t tid = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = tid; i < n4; i += stride) {
    const Pack4<TA> x = reinterpret_cast<const Pack4<TA>*>(a)[i];
    Pack4<TO> y;
#pragma unroll
    for (int j = 0; j < 4; ++j) y.v[j] = from_f<TO>(f(to_f(x.v[j])));
    reinterpret_cast<Pack4<TO>*>(out)[i] = y;
  }
  for (std::int64_t i = n4 * 4 + tid; i < n; i += stride) out[i] = from_f<TO>(f(to_f(a[i])));
}

// out = f(a, b)
template <typename F, typename TO, typename TA, typename TB>
__global__ void map2_kernel(TO* out, const TA* a, const TB* b, std::int64_t n, std::int64_t n4,
                            F f) {
  const std::int64_t tid = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = tid; i < n4; i += stride) {
    const Pack4<TA> x = reinterpret_cast<const Pack4<TA>*>(a)[i];
    const Pack4<TB> z = reinterpret_cast<const Pack4<TB>*>(b)[i];
    Pack4<TO> y;
#pragma unroll
    for (int j = 0; j < 4; ++j) y.v[j] = from_f<TO>(f(to_f(x.v[j]), to_f(z.v[j])));
    reinterpret_cast<Pack4<TO>*>(out)[i] = y;
  }
  for (std::int64_t i = n4 * 4 + tid; i < n; i += stride)
    out[i] = from_f<TO>(f(to_f(a[i]), to_f(b[i])));
}

template <typename T>
__global__ void fill_kernel(T* out, std::int64_t n, float value) {
  const T v = from_f<T>(value);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    out[i] = v;
}

// dst = src (+ dst when accumulate): parameter-gradient stores across dtypes.
template <typename TO, typename TA>
__global__ void store_grad_kernel(TO* dst, const TA* src, std::int64_t n, bool accumulate) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    dst[i] = from_f<TO>((accumulate ? to_f(dst[i]) : 0.0f) + to_f(src[i]));
}

// out (rows, cols) = (from or out) + bias (cols)
template <typename T>
__global__ void add_row_bias_kernel(T* out, const float* from, AnyIn bias, std::int64_t rows,
                                    std::int64_t cols) {
  const std::int64_t n = rows * cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    out[i] = from_f<T>((from ? from[i] : to_f(out[i])) + bias[i % cols]);
}

constexpr float kGeluScale = 0.7978845608028654f;  // √(2/π)

struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Scale {
  float s;
  __device__ float operator()(float x) const { return x * s; }
};
struct Gelu {
  __device__ float operator()(float x) const {
    return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
  }
};
struct Relu {  // NaN propagates, as in torch.relu (x > 0 ? x : 0 would hide it from the scaler)
  __device__ float operator()(float x) const { return x <= 0.0f ? 0.0f : x; }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct GeluBackward {  // (dout, inp)
  __device__ float operator()(float g, float x) const {
    const float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float local =
        0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    return local * g;
  }
};
struct ReluBackward {  // (dout, out)
  __device__ float operator()(float g, float o) const { return o > 0.0f ? g : 0.0f; }
};

// SwiGLU's gate, silu(g)·u with silu(g) = g·σ(g), in the CPU's order of operations.
__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}
struct SiluMul {  // (gate, up)
  __device__ float operator()(float g, float u) const { return g * sigmoid(g) * u; }
};

// swiglu_backward: two outputs from three inputs. One template for the usual case, every tensor
// of one dtype; AnyIn/AnyOut (a uniform branch per load) for mixed ones, rather than 3⁵
// instantiations.
template <typename T>
__global__ void swiglu_bwd_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                                  std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    // Every input of element i is read before its outputs are written (outputs may alias).
    const float x = to_f(gate[i]), s = sigmoid(x), d = to_f(dout[i]), u = to_f(up[i]);
    dgate[i] = from_f<T>(d * u * (s * (1.0f + x * (1.0f - s))));
    dup[i] = from_f<T>(d * (x * s));
  }
}

__global__ void swiglu_bwd_any_kernel(AnyOut dgate, AnyOut dup, AnyIn dout, AnyIn gate, AnyIn up,
                                      std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const float x = gate[i], s = sigmoid(x), d = dout[i], u = up[i];
    dgate.store(i, d * u * (s * (1.0f + x * (1.0f - s))));
    dup.store(i, d * (x * s));
  }
}

// GeGLU (Gemma2MLP): gelu(g)·u with Gelu's tanh form; backward as swiglu's, one dtype or any.
struct GeluMul {  // (gate, up)
  __device__ float operator()(float g, float u) const { return Gelu{}(g)*u; }
};

template <typename T>
__global__ void geglu_bwd_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                                 std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const float x = to_f(gate[i]), d = to_f(dout[i]), u = to_f(up[i]);
    dgate[i] = from_f<T>(GeluBackward{}(d * u, x));
    dup[i] = from_f<T>(d * Gelu{}(x));
  }
}

__global__ void geglu_bwd_any_kernel(AnyOut dgate, AnyOut dup, AnyIn dout, AnyIn gate, AnyIn up,
                                     std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const float x = gate[i], d = dout[i], u = up[i];
    dgate.store(i, GeluBackward{}(d * u, x));
    dup.store(i, d * Gelu{}(x));
  }
}

struct Softcap {
  float cap;
  __device__ float operator()(float x) const { return cap * tanhf(x / cap); }
};
struct SoftcapBackward {  // (dout, out)
  float cap;
  __device__ float operator()(float g, float o) const {
    const float th = o / cap;
    return g * (1.0f - th * th);
  }
};

// Scores (slices, len, len) in place: element i is row (i / len) % len, column i % len.
template <typename T>
__global__ void softcap_scores_kernel(T* s, T* tanh_out, std::int64_t n, std::int64_t len,
                                      float cap) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const bool masked = i % len > (i / len) % len;
    const float th = masked ? 0.0f : tanhf(to_f(s[i]) / cap);
    tanh_out[i] = from_f<T>(th);
    s[i] = from_f<T>(cap * th);
  }
}

template <typename T>
__global__ void softcap_scores_bwd_kernel(T* ds, const T* tanh_in, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const float th = to_f(tanh_in[i]);
    ds[i] = from_f<T>(to_f(ds[i]) * (1.0f - th * th));
  }
}

template <typename F>
void map1(void* out, DType ot, const void* a, DType at, std::int64_t n, F f, cudaStream_t s,
          std::string_view what) {
  if (n == 0) return;
  dispatch_float(ot, what, [&](auto o) {
    dispatch_float(at, what, [&](auto x) {
      using TO = decltype(o);
      using TA = decltype(x);
      const std::int64_t n4 = vec_aligned<TO>(out) && vec_aligned<TA>(a) ? n / 4 : 0;
      map1_kernel<F, TO, TA><<<grid_for(std::max<std::int64_t>(n4, n - 4 * n4)), kThreads, 0, s>>>(
          static_cast<TO*>(out), static_cast<const TA*>(a), n, n4, f);
      CUDA_CHECK_LAUNCH();
    });
  });
}

template <typename F>
void map2(Tensor& out, const Tensor& a, const Tensor& b, F f, cudaStream_t s,
          std::string_view what) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  dispatch_float(out.dtype(), what, [&](auto o) {
    dispatch_float(a.dtype(), what, [&](auto x) {
      dispatch_float(b.dtype(), what, [&](auto z) {
        using TO = decltype(o);
        using TA = decltype(x);
        using TB = decltype(z);
        const bool vec =
            vec_aligned<TO>(out.data()) && vec_aligned<TA>(a.data()) && vec_aligned<TB>(b.data());
        const std::int64_t n4 = vec ? n / 4 : 0;
        map2_kernel<F, TO, TA, TB>
            <<<grid_for(std::max<std::int64_t>(n4, n - 4 * n4)), kThreads, 0, s>>>(
                static_cast<TO*>(out.data()), static_cast<const TA*>(a.data()),
                static_cast<const TB*>(b.data()), n, n4, f);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace

// ---- launchers
// ------------------------------------------------------------------------------------
void launch_cast(void* dst, DType dt, const void* src, DType st, std::int64_t n, cudaStream_t s) {
  map1(dst, dt, src, st, n, Identity{}, s, "cast");
}

void launch_scale(void* p, DType t, std::int64_t n, float s, cudaStream_t stream) {
  map1(p, t, p, t, n, Scale{s}, stream, "scale");
}

void launch_softcap_scores(void* s, void* tanh_out, DType t, std::int64_t n, std::int64_t len,
                           float cap, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(t, "softcap_scores", [&](auto tag) {
    using T = decltype(tag);
    softcap_scores_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<T*>(s), static_cast<T*>(tanh_out), n, len, cap);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_softcap_scores_backward(void* ds, const void* tanh_in, DType t, std::int64_t n,
                                    cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(t, "softcap_scores_backward", [&](auto tag) {
    using T = decltype(tag);
    softcap_scores_bwd_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<T*>(ds), static_cast<const T*>(tanh_in), n);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_store_grad(void* dst, DType dt, const void* src, DType st, std::int64_t n,
                       bool accumulate, cudaStream_t s) {
  if (n == 0) return;
  dispatch_float(dt, "store_grad", [&](auto o) {
    dispatch_float(st, "store_grad", [&](auto x) {
      using TO = decltype(o);
      using TA = decltype(x);
      store_grad_kernel<TO, TA><<<grid_for(n), kThreads, 0, s>>>(
          static_cast<TO*>(dst), static_cast<const TA*>(src), n, accumulate);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_add_row_bias(void* out, DType ot, const void* bias, DType bt, std::int64_t rows,
                         std::int64_t cols, cudaStream_t s, const float* from) {
  if (rows * cols == 0) return;
  dispatch_float(ot, "bias add", [&](auto o) {
    using T = decltype(o);
    add_row_bias_kernel<T><<<grid_for(rows * cols), kThreads, 0, s>>>(static_cast<T*>(out), from,
                                                                      AnyIn{bias, bt}, rows, cols);
    CUDA_CHECK_LAUNCH();
  });
}

// ---- ops
// ------------------------------------------------------------------------------------------
void CudaOps::fill(Tensor& t, float value) {
  NvtxRange range("fill");
  check_float("fill", "t", t);
  const std::int64_t n = t.numel();
  if (n == 0) return;
  dispatch_float(t.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(t.as<T>(), n, value);
    CUDA_CHECK_LAUNCH();
  });
}

void CudaOps::cast(Tensor& dst, const Tensor& src) {
  NvtxRange range("cast");
  check_float("cast", "dst", dst);
  check_float("cast", "src", src);
  if (dst.numel() != src.numel())
    fail("cast",
         "element counts differ: " + shape_str(dst.shape()) + " vs " + shape_str(src.shape()));
  launch_cast(dst.data(), dst.dtype(), src.data(), src.dtype(), dst.numel(), stream_);
}

void CudaOps::add(Tensor& out, const Tensor& a, const Tensor& b) {
  NvtxRange range("add");
  check_binary("add", out, a, b);
  map2(out, a, b, Add{}, stream_, "add");
}

void CudaOps::add_inplace(Tensor& y, const Tensor& x) {
  NvtxRange range("add_inplace");
  check_binary("add_inplace", y, y, x);
  map2(y, y, x, Add{}, stream_, "add_inplace");
}

void CudaOps::scale(Tensor& t, float s) {
  NvtxRange range("scale");
  check_float("scale", "t", t);
  launch_scale(t.data(), t.dtype(), t.numel(), s, stream_);
}

void CudaOps::gelu_forward(Tensor& out, const Tensor& inp) {
  NvtxRange range("gelu_forward");
  check_unary("gelu_forward", out, inp);
  map1(out.data(), out.dtype(), inp.data(), inp.dtype(), out.numel(), Gelu{}, stream_,
       "gelu_forward");
}

void CudaOps::gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  NvtxRange range("gelu_backward");
  check_binary("gelu_backward", dinp, dout, inp);
  map2(dinp, dout, inp, GeluBackward{}, stream_, "gelu_backward");
}

void CudaOps::relu_forward(Tensor& out, const Tensor& inp) {
  NvtxRange range("relu_forward");
  check_unary("relu_forward", out, inp);
  map1(out.data(), out.dtype(), inp.data(), inp.dtype(), out.numel(), Relu{}, stream_,
       "relu_forward");
}

void CudaOps::relu_backward(Tensor& dinp, const Tensor& dout, const Tensor& out) {
  NvtxRange range("relu_backward");
  check_binary("relu_backward", dinp, dout, out);
  map2(dinp, dout, out, ReluBackward{}, stream_, "relu_backward");
}

void CudaOps::swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  NvtxRange range("swiglu_forward");
  check_binary("swiglu_forward", out, gate, up);
  map2(out, gate, up, SiluMul{}, stream_, "swiglu_forward");
}

void CudaOps::swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                              const Tensor& up) {
  NvtxRange range("swiglu_backward");
  check_swiglu_backward(dgate, dup, dout, gate, up);
  const std::int64_t n = gate.numel();
  if (n == 0) return;
  const DType t = gate.dtype();
  if (dgate.dtype() == t && dup.dtype() == t && dout.dtype() == t && up.dtype() == t) {
    dispatch_float(t, "swiglu_backward", [&](auto tag) {
      using T = decltype(tag);
      swiglu_bwd_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(
          dgate.as<T>(), dup.as<T>(), dout.as<T>(), gate.as<T>(), up.as<T>(), n);
      CUDA_CHECK_LAUNCH();
    });
    return;
  }
  swiglu_bwd_any_kernel<<<grid_for(n), kThreads, 0, stream_>>>(
      AnyOut{dgate.data(), dgate.dtype()}, AnyOut{dup.data(), dup.dtype()},
      AnyIn{dout.data(), dout.dtype()}, AnyIn{gate.data(), gate.dtype()},
      AnyIn{up.data(), up.dtype()}, n);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::geglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  NvtxRange range("geglu_forward");
  check_binary("geglu_forward", out, gate, up);
  map2(out, gate, up, GeluMul{}, stream_, "geglu_forward");
}

void CudaOps::geglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                             const Tensor& up) {
  NvtxRange range("geglu_backward");
  check_swiglu_backward(dgate, dup, dout, gate, up, "geglu_backward");
  const std::int64_t n = gate.numel();
  if (n == 0) return;
  const DType t = gate.dtype();
  if (dgate.dtype() == t && dup.dtype() == t && dout.dtype() == t && up.dtype() == t) {
    dispatch_float(t, "geglu_backward", [&](auto tag) {
      using T = decltype(tag);
      geglu_bwd_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(
          dgate.as<T>(), dup.as<T>(), dout.as<T>(), gate.as<T>(), up.as<T>(), n);
      CUDA_CHECK_LAUNCH();
    });
    return;
  }
  geglu_bwd_any_kernel<<<grid_for(n), kThreads, 0, stream_>>>(
      AnyOut{dgate.data(), dgate.dtype()}, AnyOut{dup.data(), dup.dtype()},
      AnyIn{dout.data(), dout.dtype()}, AnyIn{gate.data(), gate.dtype()},
      AnyIn{up.data(), up.dtype()}, n);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::softcap_forward(Tensor& out, const Tensor& inp, float cap) {
  NvtxRange range("softcap_forward");
  check_unary("softcap_forward", out, inp);
  map1(out.data(), out.dtype(), inp.data(), inp.dtype(), out.numel(), Softcap{cap}, stream_,
       "softcap_forward");
}

void CudaOps::softcap_backward(Tensor& dinp, const Tensor& dout, const Tensor& out, float cap) {
  NvtxRange range("softcap_backward");
  check_binary("softcap_backward", dinp, dout, out);
  map2(dinp, dout, out, SoftcapBackward{cap}, stream_, "softcap_backward");
}

}  // namespace memtrade::cuda
