// A Device that forwards everything to another one: tests override the calls they want to
// watch (profiler ranges) or disturb (stalling a stream before a copy or an event record).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "kernels/device.h"

namespace memtrade::testing {

class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}
  Backend backend() const override { return inner_->backend(); }
  std::string name() const override { return inner_->name(); }
  std::size_t total_memory() const override { return inner_->total_memory(); }
  CachingAllocator& memory() override { return inner_->memory(); }
  CachingAllocator& pinned() override { return inner_->pinned(); }
  Ops& ops() override { return inner_->ops(); }
  void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
            StreamKind stream) override {
    inner_->copy(dst, src, bytes, kind, stream);
  }
  void synchronize() override { inner_->synchronize(); }
  void synchronize(StreamKind s) override { inner_->synchronize(s); }
  std::unique_ptr<Event> make_event() override { return inner_->make_event(); }
  void wait(StreamKind waiter, Event& e) override { inner_->wait(waiter, e); }
  std::optional<std::int64_t> driver_used_bytes() const override {
    return inner_->driver_used_bytes();
  }
  void range_push(const char* name) override { inner_->range_push(name); }
  void range_pop() override { inner_->range_pop(); }

 protected:
  Device& inner() { return *inner_; }

 private:
  std::unique_ptr<Device> inner_;
};

}  // namespace memtrade::testing
