// make_cpu_ops() and the fp32-access helpers every CPU op file shares.
#include "kernels/cpu/cpu_ops.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/cpu/cpu_vec.h"

namespace memtrade {

std::unique_ptr<Ops> make_cpu_ops() {
  return std::make_unique<cpu::CpuOps>();
}

namespace cpu {

namespace {

// fp16 <-> fp32 with the x86 F16C instructions, 8 values at a time: IEEE round to nearest
// even with subnormals, the same values as dtype.h's software conversion (NaN payloads aside),
// several times faster; chosen at run time, so the binary still runs on CPUs without F16C.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
bool has_f16c() {
  static const bool ok = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return ok;
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const std::uint16_t* s, std::int64_t n,
                                                         float* d) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = f16_to_float(s[i]);
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* s, std::int64_t n,
                                                         std::uint16_t* d) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  for (; i < n; ++i) d[i] = float_to_f16(s[i]);
}
#else
bool has_f16c() {
  return false;
}
void f16_to_f32_f16c(const std::uint16_t*, std::int64_t, float*) {}
void f32_to_f16_f16c(const float*, std::int64_t, std::uint16_t*) {}
#endif

// Serial conversions of one span; the switch is hoisted out of the element loop.
void to_f32_serial(const void* src, DType t, std::int64_t n, float* dst) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      break;
    case DType::BF16:
      vec::bf16_to_f32(static_cast<const std::uint16_t*>(src), dst, n);
      break;
    case DType::F16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      if (has_f16c()) {
        f16_to_f32_f16c(s, n, dst);
        break;
      }
      for (std::int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(s[i]);
      break;
    }
    case DType::I32: {
      const auto* s = static_cast<const std::int32_t*>(src);
      for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      break;
    }
  }
}

void from_f32_serial(const float* src, DType t, std::int64_t n, void* dst) {
  switch (t) {
    case DType::F32:
      std::memmove(dst, src, static_cast<std::size_t>(n) * 4);
      break;
    case DType::BF16:
      vec::f32_to_bf16(src, static_cast<std::uint16_t*>(dst), n);
      break;
    case DType::F16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      if (has_f16c()) {
        f32_to_f16_f16c(src, n, d);
        break;
      }
      for (std::int64_t i = 0; i < n; ++i) d[i] = float_to_f16(src[i]);
      break;
    }
    case DType::I32: {
      auto* d = static_cast<std::int32_t*>(dst);
      for (std::int64_t i = 0; i < n; ++i) d[i] = static_cast<std::int32_t>(src[i]);
      break;
    }
  }
}

const unsigned char* byte_ptr(const void* p, DType t, std::int64_t off) {
  return static_cast<const unsigned char*>(p) + static_cast<std::size_t>(off) * dtype_size(t);
}

}  // namespace

const float* read_f32(const Tensor& t, std::int64_t off, std::int64_t n, float* buf) {
  if (t.dtype() == DType::F32) return t.as<float>() + off;
  to_f32_serial(byte_ptr(t.data(), t.dtype(), off), t.dtype(), n, buf);
  return buf;
}

float* dest_f32(Tensor& t, std::int64_t off, float* buf) {
  return t.dtype() == DType::F32 ? t.as<float>() + off : buf;
}

void write_f32(Tensor& t, std::int64_t off, std::int64_t n, const float* src) {
  if (t.dtype() == DType::F32 && src == t.as<float>() + off) return;
  from_f32_serial(src, t.dtype(), n,
                  const_cast<unsigned char*>(byte_ptr(t.data(), t.dtype(), off)));
}

void round_f32(float* v, std::int64_t n, DType t) {
  if (t == DType::F32) return;
  std::uint16_t half[kChunk];
  for (std::int64_t o = 0; o < n; o += kChunk) {
    const std::int64_t len = std::min(kChunk, n - o);
    from_f32_serial(v + o, t, len, half);
    to_f32_serial(half, t, len, v + o);
  }
}

// In kChunk pieces over the threads for large tensors (inside a parallel region: on this
// thread). These feed or drain GEMMs, which sgemm runs on the same OpenMP threads (it never
// leaves a GEMM to OpenBLAS's own threading, which once made such a region right before it
// cost 50x: cpu_ops_gemm.cpp).
void convert_to_f32(const void* src, DType t, std::int64_t n, float* dst) {
  for_chunks(n, [&](std::int64_t off, std::int64_t len) {
    to_f32_serial(byte_ptr(src, t, off), t, len, dst + off);
  });
}

void convert_from_f32(const float* src, DType t, std::int64_t n, void* dst) {
  for_chunks(n, [&](std::int64_t off, std::int64_t len) {
    from_f32_serial(src + off, t, len, const_cast<unsigned char*>(byte_ptr(dst, t, off)));
  });
}

F32In::F32In(const Tensor& t, CachingAllocator& alloc) {
  if (t.dtype() == DType::F32) {
    p_ = t.as<float>();
    return;
  }
  scratch_ = Tensor(alloc, t.shape(), DType::F32, Category::workspace);
  convert_to_f32(t.data(), t.dtype(), t.numel(), scratch_.as<float>());
  p_ = scratch_.as<float>();
}

F32Out::F32Out(Tensor& t, bool load_existing) : t_(t) {
  if (t.dtype() == DType::F32) {
    p_ = t.as<float>();
    return;
  }
  scratch_ = Tensor(*t.allocator(), t.shape(), DType::F32, Category::workspace);
  p_ = scratch_.as<float>();
  if (load_existing) convert_to_f32(t.data(), t.dtype(), t.numel(), p_);
}

void F32Out::commit() {
  if (scratch_.defined()) convert_from_f32(p_, t_.dtype(), t_.numel(), t_.data());
}

}  // namespace cpu
}  // namespace memtrade
