// Element types and their host-side conversions.
//
// Tensors are stored in one of these types; CPU arithmetic is always fp32 (16-bit types are a
// storage format there), so conversions are explicit and round-to-nearest-even like the GPU's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace memtrade {

enum class DType : std::uint8_t { F32, F16, BF16, I32 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::I32:
      return 4;
    case DType::F16:
      return 2;
    case DType::BF16:
      return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::I32:
      return "i32";
  }
  return "?";
}

// Machine epsilon, the ulp at 1.0 (twice the unit roundoff: one rounding errs by at most
// eps/2·|x|), used in tolerances `tol + |ref|·eps(dtype)`.
constexpr float dtype_eps(DType t) {
  switch (t) {
    case DType::F32:
      return 1.0f / (1 << 23);
    case DType::F16:
      return 1.0f / (1 << 10);
    case DType::BF16:
      return 1.0f / (1 << 7);
    case DType::I32:
      return 0.0f;
  }
  return 0.0f;
}

namespace detail {
inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace detail

// bf16: the top 16 bits of an fp32, rounded to nearest even; NaN stays NaN.
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = detail::bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_to_float(std::uint16_t h) {
  return detail::float_of(static_cast<std::uint32_t>(h) << 16);
}

// IEEE binary16, round to nearest even, overflow to inf, subnormals kept.
inline std::uint16_t float_to_f16(float f) {
  std::uint32_t x = detail::bits_of(f);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (abs < 0x38800000u) {  // below 2^-14: subnormal or zero
    // Scale so that the subnormal quantum 2^-24 becomes 1.0 and round as an integer.
    float a = detail::float_of(abs) * 16777216.0f;  // 2^24
    std::uint32_t r = static_cast<std::uint32_t>(a);
    float frac = a - static_cast<float>(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t mant = abs & 0x7fffffu;
  std::uint32_t exp = (abs >> 23) - 127 + 15;
  std::uint32_t h = (exp << 10) | (mant >> 13);
  std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: fine
  return static_cast<std::uint16_t>(sign | h);
}
inline float f16_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return detail::float_of(sign | 0x7f800000u | (mant << 13));
  return detail::float_of(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

// Read element i of a buffer of dtype t as fp32, and write it back (I32 is converted by value).
inline float load_as_float(const void* p, DType t, std::size_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::F16:
      return f16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::BF16:
      return bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::I32:
      return static_cast<float>(static_cast<const std::int32_t*>(p)[i]);
  }
  return 0.0f;
}
inline void store_from_float(void* p, DType t, std::size_t i, float v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::F16:
      static_cast<std::uint16_t*>(p)[i] = float_to_f16(v);
      break;
    case DType::BF16:
      static_cast<std::uint16_t*>(p)[i] = float_to_bf16(v);
      break;
    case DType::I32:
      static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v);
      break;
  }
}

}  // namespace memtrade
