// bf16 / f16 conversions of kernels/dtype.h: rounding to nearest even, subnormals, inf/nan,
// f16 overflow, and exact round trips of every 16-bit pattern.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/cpu_ops_impl.h"
#include "kernels/dtype.h"

namespace memtrade {
namespace {

float f(std::uint32_t bits) {
  return detail::float_of(bits);
}

TEST(DType, SizesNamesEps) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_name(DType::BF16), "bf16");
  EXPECT_FLOAT_EQ(dtype_eps(DType::BF16), 1.0f / 128);
  EXPECT_FLOAT_EQ(dtype_eps(DType::F16), 1.0f / 1024);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(f(0x3f808000)), 0x3f80);  // 1 + 2^-8: tie, down to even
  EXPECT_EQ(float_to_bf16(f(0x3f818000)), 0x3f82);  // 1 + 3·2^-8: tie, up to even
  EXPECT_EQ(float_to_bf16(f(0x3f808001)), 0x3f81);  // just above the tie
  EXPECT_EQ(float_to_bf16(f(0x3f807fff)), 0x3f80);  // just below
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
}

TEST(DType, Bf16SpecialValues) {
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits must not become inf.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f(0x7f800001)))));
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  // fp32 subnormals keep bf16's 8-bit exponent: representable, rounded in the mantissa.
  EXPECT_EQ(float_to_bf16(f(0x00010000)), 0x0001);
  EXPECT_EQ(bf16_to_float(0x0001), f(0x00010000));
}

TEST(DType, F16RoundsToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, to even
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, to even
  EXPECT_EQ(float_to_f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);  // max finite
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);  // below the midpoint to 65536
}

TEST(DType, F16OverflowsToInfAt65520) {
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(float_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(f16_to_float(0x7c00)));
}

TEST(DType, F16Subnormals) {
  const float q = std::ldexp(1.0f, -24);  // smallest f16 subnormal
  EXPECT_EQ(float_to_f16(q), 0x0001);
  EXPECT_EQ(float_to_f16(0.5f * q), 0x0000);      // tie between 0 and q: to even (0)
  EXPECT_EQ(float_to_f16(1.5f * q), 0x0002);      // tie between q and 2q: to even (2q)
  EXPECT_EQ(float_to_f16(0.50001f * q), 0x0001);  // above the tie
  EXPECT_EQ(float_to_f16(-q), 0x8001);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_f16(1023.5f * q), 0x0400);            // rounds up into the normals
  EXPECT_EQ(float_to_f16(1023.25f * q), 0x03ff);           // largest subnormal
  EXPECT_EQ(f16_to_float(0x03ff), 1023.0f * q);
  EXPECT_EQ(float_to_f16(1e-30f), 0x0000);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
}

TEST(DType, EveryPatternRoundTrips) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float fb = bf16_to_float(b), fh = f16_to_float(b);
    if (std::isnan(fb)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(fb))));
    } else {
      ASSERT_EQ(float_to_bf16(fb), b) << "bf16 " << h;
    }
    if (std::isnan(fh)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(fh))));
    } else {
      ASSERT_EQ(float_to_f16(fh), b) << "f16 " << h;
    }
  }
}

TEST(DType, LoadStoreByDtype) {
  unsigned char buf[16];
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I32}) {
    store_from_float(buf, t, 1, 3.0f);
    EXPECT_EQ(load_as_float(buf, t, 1), 3.0f) << dtype_name(t);
  }
}

}  // namespace
// The bulk conversions of the CPU backend (F16C vectors where the CPU has them, in chunks of 8
// with a scalar tail) give exactly dtype.h's values: every one of the 65536 fp16 patterns, and
// fp32 values around every rounding boundary, subnormals, overflow and infinities.
TEST(DtypeBulk, F16ConversionsEqualTheScalarOnes) {
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> wide(all.size());
  cpu::convert_to_f32(all.data(), DType::F16, static_cast<std::int64_t>(all.size()), wide.data());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const float want = f16_to_float(all[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(wide[i])) << i;
    } else {
      EXPECT_EQ(detail::bits_of(wide[i]), detail::bits_of(want)) << i;
    }
  }
  std::vector<float> xs;
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) xs.push_back(detail::float_of(bits(rng)));
  for (float v : wide)  // each fp16 value, and the midpoints and neighbours around it
    for (float d : {0.0f, 1.0f, -1.0f}) xs.push_back(std::nextafter(v, v + d));
  for (std::size_t i = 0; i + 1 < wide.size(); ++i) xs.push_back(0.5f * (wide[i] + wide[i + 1]));
  for (float v : {65504.0f, 65519.99f, 65520.0f, 1e9f, 6e-8f, 3e-8f, 1e-45f})
    for (float sgn : {1.0f, -1.0f}) xs.push_back(sgn * v);
  std::vector<std::uint16_t> narrow(xs.size());
  cpu::convert_from_f32(xs.data(), DType::F16, static_cast<std::int64_t>(xs.size()), narrow.data());
  int bad = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (std::isnan(xs[i])) {
      bad += !std::isnan(f16_to_float(narrow[i]));
      continue;
    }
    if (narrow[i] != float_to_f16(xs[i]) && ++bad <= 5)
      ADD_FAILURE() << xs[i] << ": bulk " << narrow[i] << ", scalar " << float_to_f16(xs[i]);
  }
  EXPECT_EQ(bad, 0) << "of " << xs.size();
}

}  // namespace memtrade
