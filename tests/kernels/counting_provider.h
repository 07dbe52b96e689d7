// A RawProvider over host memory that keeps a ledger of what the allocator asked for, shared by
// the allocator tests: outstanding bytes, live segments, bad releases, and an optional limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string_view>

#include "kernels/allocator.h"

namespace memtrade::testing {

// Host memory with a ledger, so tests can see what the allocator asked the provider for.
struct ProviderLog {
  std::map<std::uintptr_t, std::size_t> live;
  std::size_t outstanding = 0;
  std::size_t limit = 0;  // 0 = none; otherwise allocate() fails beyond it (a "full GPU")
  int bad_releases = 0;   // release of an unknown pointer or with the wrong size
};

class CountingProvider final : public RawProvider {
 public:
  explicit CountingProvider(ProviderLog& log) : log_(log) {}
  void* allocate(std::size_t bytes) override {
    if (log_.limit != 0 && log_.outstanding + bytes > log_.limit) return nullptr;
    void* p = host_.allocate(bytes);
    if (p != nullptr) {
      log_.live[reinterpret_cast<std::uintptr_t>(p)] = bytes;
      log_.outstanding += bytes;
    }
    return p;
  }
  void release(void* ptr, std::size_t bytes) noexcept override {
    auto it = log_.live.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == log_.live.end() || it->second != bytes) {
      ++log_.bad_releases;
      return;
    }
    log_.outstanding -= bytes;
    log_.live.erase(it);
    host_.release(ptr, bytes);
  }
  std::string_view name() const override { return "counting"; }

 private:
  ProviderLog& log_;
  HostProvider host_;
};

}  // namespace memtrade::testing
