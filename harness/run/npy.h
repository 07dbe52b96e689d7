// NumPy .npy files (format version 1.0): a writer for float32 and int32 arrays of any shape
// (shape () is a scalar), and a small reader of the same, for tests and tools.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "kernels/tensor.h"

namespace memtrade {

// Throws std::invalid_argument when values.size() != numel(shape), std::runtime_error when
// the file cannot be written.
void write_npy(const std::filesystem::path& path, std::span<const float> values,
               const Shape& shape);
void write_npy(const std::filesystem::path& path, std::span<const std::int32_t> values,
               const Shape& shape);

struct NpyArray {
  std::string descr;  // "<f4" or "<i4"
  Shape shape;
  std::vector<float> f32;         // when descr == "<f4"
  std::vector<std::int32_t> i32;  // when descr == "<i4"
  std::int64_t numel() const { return shape_numel(shape); }
};
// Reads a little-endian C-order float32 or int32 .npy; throws std::runtime_error otherwise.
NpyArray read_npy(const std::filesystem::path& path);

}  // namespace memtrade
