// Tensor: an owning, move-only, contiguous row-major array in one allocator's memory.
//
// Ownership is explicit on purpose: a tensor's bytes are released back to its allocator exactly
// when the Tensor is destroyed or reset(), so the allocation sequence (and hence peak memory) is
// a deterministic function of the model and its knobs, the same on every backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/dtype.h"

namespace memtrade {

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "(4, 64, 128)"

class Tensor {
 public:
  Tensor() = default;
  // Allocates numel(shape)·size(dtype) bytes (at least 1 element's worth) from `alloc`.
  Tensor(CachingAllocator& alloc, Shape shape, DType dtype, Category category);
  ~Tensor() { reset(); }
  Tensor(Tensor&& o) noexcept { *this = std::move(o); }
  Tensor& operator=(Tensor&& o) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  void reset() noexcept;  // frees the bytes; the tensor becomes undefined
  bool defined() const { return data_ != nullptr; }
  explicit operator bool() const { return defined(); }

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  Category category() const { return category_; }
  CachingAllocator* allocator() const { return alloc_; }

  // Same bytes, new shape of the same numel (no copy).
  void reshape(Shape shape);

  // A view of `numel` elements of `base` from element `offset` on, shape (numel): the same bytes,
  // not owned (reset() forgets them, the base frees them), the base's allocator, dtype and
  // category, so that what is made for it (optimizer state) comes from where the base lives.
  // The base must outlive it. Data parallelism updates a rank's part of a parameter through one.
  static Tensor view(Tensor& base, std::int64_t offset, std::int64_t numel);
  bool is_view() const { return defined() && !owner_; }

 private:
  CachingAllocator* alloc_ = nullptr;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
  Category category_ = Category::temporaries;
  bool owner_ = true;  // false for a view
};

}  // namespace memtrade
