#include "kernels/tensor.h"

#include <stdexcept>

#include <fmt/format.h>

namespace memtrade {

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", s[i]);
  return out + ")";
}

Tensor::Tensor(CachingAllocator& alloc, Shape shape, DType dtype, Category category)
    : alloc_(&alloc), shape_(std::move(shape)), dtype_(dtype), category_(category) {
  for (auto d : shape_)
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(shape_));
  std::size_t bytes = nbytes();
  data_ = alloc_->allocate(bytes == 0 ? dtype_size(dtype_) : bytes, category_);
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    reset();
    alloc_ = std::exchange(o.alloc_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    shape_ = std::move(o.shape_);
    dtype_ = o.dtype_;
    category_ = o.category_;
    owner_ = std::exchange(o.owner_, true);
  }
  return *this;
}

void Tensor::reset() noexcept {
  if (data_ != nullptr && owner_) {
    try {
      alloc_->free(data_);
    } catch (...) {
      // free() only throws for pointers it does not own, which a Tensor never holds.
    }
  }
  data_ = nullptr;
  alloc_ = nullptr;
  owner_ = true;
  shape_.clear();
}

Tensor Tensor::view(Tensor& base, std::int64_t offset, std::int64_t numel) {
  if (!base.defined() || offset < 0 || numel < 0 || offset + numel > base.numel())
    throw std::invalid_argument(fmt::format("view [{}, {}) of a tensor of {} elements", offset,
                                            offset + numel, base.numel()));
  Tensor v;
  v.alloc_ = base.alloc_;
  v.data_ = static_cast<unsigned char*>(base.data_) +
            static_cast<std::size_t>(offset) * dtype_size(base.dtype_);
  v.shape_ = {numel};
  v.dtype_ = base.dtype_;
  v.category_ = base.category_;
  v.owner_ = false;
  return v;
}

void Tensor::reshape(Shape shape) {
  if (shape_numel(shape) != numel())
    throw std::invalid_argument("reshape " + shape_str(shape_) + " -> " + shape_str(shape));
  shape_ = std::move(shape);
}

}  // namespace memtrade
