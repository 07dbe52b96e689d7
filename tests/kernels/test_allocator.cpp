// CachingAllocator: worked cases pinning PyTorch's caching-allocator semantics, misuse, and the
// capacity / byte-count helpers. The randomized model check is in test_allocator_stress.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>

#include <fmt/format.h>

#include "counting_provider.h"
#include "kernels/allocator.h"

namespace memtrade {
namespace {

using A = CachingAllocator;
using i64_t = std::int64_t;

using testing::CountingProvider;
using testing::ProviderLog;

std::unique_ptr<A> make(ProviderLog& log, std::size_t capacity = 0) {
  return std::make_unique<A>(std::make_unique<CountingProvider>(log), capacity);
}

// Everything observable about the allocator's state, as text (readable diffs on failure).
std::string snapshot(const A& a, bool with_failure_counters = true) {
  const AllocatorStats& s = a.stats();
  std::string out;
  for (const StatPair* p : {&s.allocated, &s.requested, &s.reserved, &s.active, &s.segments})
    out += fmt::format("{}/{} ", p->current, p->peak);
  out += fmt::format("allocs {} frees {} seg+ {} seg- {} ", s.num_allocs, s.num_frees,
                     s.num_segment_allocs, s.num_segment_frees);
  if (with_failure_counters)
    out += fmt::format("retries {} ooms {} ", s.num_alloc_retries, s.num_ooms);
  out += fmt::format("cat {} at_peak {}\n", fmt::join(s.by_category, ","),
                     fmt::join(s.by_category_at_peak, ","));
  for (const auto& seg : a.segments())
    out += fmt::format("seg {:#x} {} {} {}\n", seg.base, seg.size, seg.allocated, seg.small_pool);
  return out;
}

std::uintptr_t addr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

TEST(Allocator, RoundingAndSegmentSizes) {
  EXPECT_EQ(A::round_size(1), 512u);
  EXPECT_EQ(A::round_size(512), 512u);
  EXPECT_EQ(A::round_size(513), 1024u);
  EXPECT_EQ(A::round_size(15'000'000), 15'000'064u);
  EXPECT_EQ(A::segment_size_for(512), 2 * MiB);
  EXPECT_EQ(A::segment_size_for(1 * MiB), 2 * MiB);
  EXPECT_EQ(A::segment_size_for(1 * MiB + 512), 20 * MiB);
  EXPECT_EQ(A::segment_size_for(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(A::segment_size_for(10 * MiB), 10 * MiB);
  EXPECT_EQ(A::segment_size_for(15'000'064), 16 * MiB);
}

TEST(Allocator, OneByteIsA512ByteBlockInA2MiBSegment) {
  ProviderLog log;
  auto a = make(log);
  void* p = a->allocate(1, Category::io);
  const AllocatorStats& s = a->stats();
  EXPECT_EQ(s.allocated.current, 512);
  EXPECT_EQ(s.requested.current, 1);
  EXPECT_EQ(s.reserved.current, i64_t{2 * MiB});
  EXPECT_EQ(s.active.current, 1);
  EXPECT_EQ(a->block_size(p), 512u);
  EXPECT_EQ(a->requested_size(p), 1u);
  EXPECT_EQ(a->category_of(p), Category::io);
  ASSERT_EQ(a->segments().size(), 1u);
  EXPECT_EQ(a->segments()[0].base, addr(p));
  EXPECT_EQ(a->segments()[0].allocated, 512u);
  EXPECT_TRUE(a->segments()[0].small_pool);
  EXPECT_EQ(log.outstanding, 2 * MiB);
  a->free(p);
  EXPECT_EQ(s.allocated.current, 0);
  EXPECT_EQ(s.reserved.current, i64_t{2 * MiB});  // cached, not returned
  EXPECT_EQ(s.allocated.peak, 512);
}

TEST(Allocator, LargePoolRequestSplitsA20MiBSegment) {
  ProviderLog log;
  auto a = make(log);
  void* p = a->allocate(1 * MiB + 1, Category::activations);
  EXPECT_EQ(a->stats().reserved.current, i64_t{20 * MiB});
  EXPECT_EQ(a->stats().allocated.current, i64_t{1 * MiB + 512});
  ASSERT_EQ(a->segments().size(), 1u);
  EXPECT_FALSE(a->segments()[0].small_pool);
  void* q = a->allocate(1 * MiB + 1, Category::activations);
  EXPECT_EQ(addr(q), addr(p) + 1 * MiB + 512);  // the split remainder, same segment
  EXPECT_EQ(a->segments().size(), 1u);
  EXPECT_EQ(a->stats().num_segment_allocs, 1);
  EXPECT_EQ(a->segments()[0].allocated, 2 * (1 * MiB + 512));
  a->free(p);
  a->free(q);
}

TEST(Allocator, OwnSegmentRoundsTo2MiBAndSplitsRemainderAbove1MiB) {
  ProviderLog log;
  auto a = make(log);
  void* p = a->allocate(15'000'000, Category::params);
  EXPECT_EQ(a->stats().reserved.current, i64_t{16 * MiB});
  EXPECT_EQ(a->block_size(p), 15'000'064u);  // remainder 1'777'152 B > 1 MiB: split off
  EXPECT_EQ(a->stats().allocated.current, 15'000'064);
  // The remainder is a large-pool block: a 1.5 MiB request lands in it.
  void* q = a->allocate(3 * MiB / 2, Category::grads);
  EXPECT_EQ(addr(q), addr(p) + 15'000'064);
  EXPECT_EQ(a->stats().num_segment_allocs, 1);
  a->free(q);
  a->free(p);

  // 15 MiB leaves exactly 1 MiB of a 16 MiB segment: not split, the whole block is handed out.
  ProviderLog log2;
  auto b = make(log2);
  void* r = b->allocate(15 * MiB, Category::params);
  EXPECT_EQ(b->block_size(r), 16 * MiB);
  EXPECT_EQ(b->stats().allocated.current, i64_t{16 * MiB});
  EXPECT_EQ(b->stats().requested.current, i64_t{15 * MiB});
  b->free(r);
}

TEST(Allocator, FreedBlockIsReusedWithoutNewSegment) {
  ProviderLog log;
  auto a = make(log);
  for (std::size_t size : {std::size_t{100}, 64 * KiB, 3 * MiB, 12 * MiB}) {
    void* p = a->allocate(size, Category::temporaries);
    const auto segs = a->stats().num_segment_allocs;
    a->free(p);
    void* q = a->allocate(size, Category::temporaries);
    EXPECT_EQ(p, q) << size;
    EXPECT_EQ(a->stats().num_segment_allocs, segs) << size;
    a->free(q);
  }
}

TEST(Allocator, BestFitSmallestThenLowestAddress) {
  ProviderLog log;
  auto a = make(log);
  const Category t = Category::temporaries;
  void* big = a->allocate(8 * KiB, t);
  void* x1 = a->allocate(512, t);
  void* b1 = a->allocate(2 * KiB, t);
  void* x2 = a->allocate(512, t);
  void* b2 = a->allocate(2 * KiB, t);
  void* x3 = a->allocate(512, t);
  a->free(b2);
  a->free(big);
  a->free(b1);
  EXPECT_EQ(a->allocate(1536, t), b1);  // 2 KiB blocks tie on size: lower address wins
  EXPECT_EQ(a->allocate(2 * KiB, t), b2);
  EXPECT_EQ(a->allocate(4 * KiB, t), big);  // 8 KiB beats the ~2 MiB tail
  EXPECT_EQ(a->stats().num_segment_allocs, 1);
  (void)x1, (void)x2, (void)x3;
}

TEST(Allocator, SmallPoolKeepsA512ByteRemainder) {
  ProviderLog log;
  auto a = make(log);
  void* p = a->allocate(1 * MiB, Category::io);
  void* q = a->allocate(1 * MiB - 512, Category::io);
  EXPECT_EQ(a->block_size(q), 1 * MiB - 512);  // the last 512 B stay a free block
  void* r = a->allocate(1, Category::io);
  EXPECT_EQ(addr(r), addr(p) + 2 * MiB - 512);
  EXPECT_EQ(a->stats().num_segment_allocs, 1);
  EXPECT_EQ(a->segments()[0].allocated, 2 * MiB);
}

TEST(Allocator, LargePoolSplitsOnlyWhenRemainderExceeds1MiB) {
  {  // free tail 2 MiB + 512; a 1 MiB + 512 request leaves exactly 1 MiB: no split
    ProviderLog log;
    auto a = make(log);
    a->allocate(9 * MiB, Category::io);
    a->allocate(9 * MiB - 512, Category::io);
    void* p = a->allocate(1 * MiB + 512, Category::io);
    EXPECT_EQ(a->block_size(p), 2 * MiB + 512);
    EXPECT_EQ(a->stats().allocated.current, i64_t{20 * MiB});
    EXPECT_EQ(a->stats().requested.current, i64_t{19 * MiB});
  }
  {  // free tail 2 MiB + 1 KiB: remainder 1 MiB + 512 > 1 MiB: split
    ProviderLog log;
    auto a = make(log);
    a->allocate(9 * MiB, Category::io);
    a->allocate(9 * MiB - 1024, Category::io);
    void* p = a->allocate(1 * MiB + 512, Category::io);
    EXPECT_EQ(a->block_size(p), 1 * MiB + 512);
    EXPECT_EQ(a->segments()[0].allocated, 20 * MiB - 1 * MiB - 512);
  }
}

TEST(Allocator, FreedNeighboursCoalesceInAnyOrder) {
  const std::array<std::array<int, 3>, 6> orders = {
      {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}};
  for (const auto& order : orders) {
    ProviderLog log;
    auto a = make(log);
    std::array<void*, 3> blk{};
    for (auto& b : blk) b = a->allocate(64 * KiB, Category::activations);
    a->allocate(1 * MiB, Category::io);  // fill the rest of the 2 MiB segment
    a->allocate(1 * MiB - 192 * KiB, Category::io);
    ASSERT_EQ(a->segments().size(), 1u);
    for (int i : order) a->free(blk[static_cast<std::size_t>(i)]);
    void* p = a->allocate(192 * KiB, Category::activations);
    EXPECT_EQ(p, blk[0]) << order[0] << order[1] << order[2];
    EXPECT_EQ(a->segments().size(), 1u);
  }
}

TEST(Allocator, EmptyCacheReleasesOnlySegmentsWithNothingAllocated) {
  ProviderLog log;
  auto a = make(log);
  void* keep = a->allocate(1000, Category::params);     // small segment, stays
  void* mixed = a->allocate(2 * MiB, Category::grads);  // large segment, partly live
  void* mixed2 = a->allocate(2 * MiB, Category::grads);
  void* own = a->allocate(17 * MiB, Category::optimizer);  // own segment (16 MiB tail too small)
  void* tmp = a->allocate(4000, Category::temporaries);    // small segment, shares with keep
  a->free(mixed2);
  a->free(own);
  a->free(tmp);
  a->empty_cache();
  EXPECT_EQ(a->stats().num_segment_frees, 1);  // only the own segment was whole and free
  EXPECT_EQ(a->stats().reserved.current, i64_t{22 * MiB});
  EXPECT_EQ(log.outstanding, 22 * MiB);
  a->free(mixed);
  a->empty_cache();
  EXPECT_EQ(a->stats().reserved.current, i64_t{2 * MiB});
  ASSERT_EQ(a->segments().size(), 1u);
  EXPECT_EQ(a->segments()[0].base, addr(keep));
  a->free(keep);
  a->empty_cache();
  EXPECT_EQ(a->stats().reserved.current, 0);
  EXPECT_EQ(a->stats().segments.current, 0);
  EXPECT_EQ(log.outstanding, 0u);
  EXPECT_EQ(log.bad_releases, 0);
}

TEST(Allocator, PeaksSurviveFreesAndResetPeakRestartsThem) {
  ProviderLog log;
  auto a = make(log);
  void* p = a->allocate(1 * MiB, Category::params);
  void* q = a->allocate(1 * MiB, Category::activations);
  a->free(q);
  const AllocatorStats& s = a->stats();
  EXPECT_EQ(s.allocated.current, i64_t{1 * MiB});
  EXPECT_EQ(s.allocated.peak, i64_t{2 * MiB});
  EXPECT_EQ(s.active.peak, 2);
  EXPECT_EQ(s.by_category_at_peak[static_cast<std::size_t>(Category::activations)], i64_t{1 * MiB});
  a->reset_peak();
  EXPECT_EQ(s.allocated.peak, i64_t{1 * MiB});
  EXPECT_EQ(s.active.peak, 1);
  EXPECT_EQ(s.reserved.peak, s.reserved.current);
  EXPECT_EQ(s.by_category_at_peak, s.by_category);
  a->free(p);
  EXPECT_EQ(s.allocated.peak, i64_t{1 * MiB});
}

TEST(Allocator, CategoryBreakdownIsTakenAtThePeak) {
  ProviderLog log;
  auto a = make(log);
  auto at = [&](Category c) { return a->stats().by_category_at_peak[static_cast<std::size_t>(c)]; };
  void* params = a->allocate(1 * MiB, Category::params);
  void* act = a->allocate(3 * MiB, Category::activations);
  a->free(act);
  void* grads = a->allocate(1 * MiB, Category::grads);  // 2 MiB now, below the 4 MiB peak
  EXPECT_EQ(at(Category::params), i64_t{1 * MiB});
  EXPECT_EQ(at(Category::activations), i64_t{3 * MiB});
  EXPECT_EQ(at(Category::grads), 0);
  EXPECT_EQ(a->stats().by_category[static_cast<std::size_t>(Category::grads)], i64_t{1 * MiB});
  void* act2 = a->allocate(4 * MiB, Category::activations);  // 6 MiB: new peak
  EXPECT_EQ(at(Category::grads), i64_t{1 * MiB});
  EXPECT_EQ(at(Category::activations), i64_t{4 * MiB});
  for (void* p : {params, grads, act2}) a->free(p);
}

TEST(Allocator, CapacityOomReportsNumbersAndLeavesStateUnchanged) {
  ProviderLog log;
  auto a = make(log, 24 * MiB);
  a->enable_trace(true);
  void* p = a->allocate(15'000'000, Category::activations);
  const std::string before = snapshot(*a, false);
  try {
    a->allocate(15'000'000, Category::activations);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested(), 15'000'000u);
    EXPECT_EQ(e.capacity(), 24 * MiB);
    EXPECT_EQ(e.allocated(), 15'000'064u);
    EXPECT_EQ(e.reserved(), 16 * MiB);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tried to allocate 16.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("request 15000000 B"), std::string::npos) << msg;
    EXPECT_NE(msg.find("capacity 24.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("14.31 MiB allocated"), std::string::npos) << msg;
    EXPECT_NE(msg.find("16.00 MiB reserved"), std::string::npos) << msg;
  }
  EXPECT_EQ(snapshot(*a, false), before);
  EXPECT_EQ(a->stats().num_ooms, 1);
  EXPECT_EQ(a->stats().num_alloc_retries, 1);  // counted even though nothing could be freed
  ASSERT_FALSE(a->trace().empty());
  EXPECT_EQ(a->trace().back().kind, TraceEvent::Kind::oom);
  EXPECT_EQ(a->trace().back().requested, 15'000'000u);
  a->free(p);
}

TEST(Allocator, RetryAfterReleasingCacheSucceeds) {
  ProviderLog log;
  auto a = make(log, 21 * MiB);
  a->free(a->allocate(1 * MiB + 1, Category::io));  // a cached 20 MiB large-pool segment
  void* p = a->allocate(1, Category::io);           // small pool needs 2 MiB more: 22 > 21 MiB
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(a->stats().num_alloc_retries, 1);
  EXPECT_EQ(a->stats().num_ooms, 0);
  EXPECT_EQ(a->stats().num_segment_frees, 1);
  EXPECT_EQ(a->stats().reserved.current, i64_t{2 * MiB});
  EXPECT_EQ(log.outstanding, 2 * MiB);
  a->free(p);
}

TEST(Allocator, ProviderFailureIsAnOomToo) {
  ProviderLog log;
  log.limit = 30 * MiB;  // the "device" is full before any capacity is reached
  auto a = make(log);
  void* p = a->allocate(20 * MiB, Category::params);
  EXPECT_THROW(a->allocate(12 * MiB, Category::params), OutOfMemory);
  try {
    a->allocate(12 * MiB, Category::params);
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.capacity(), 0u);
    EXPECT_NE(std::string(e.what()).find("capacity unlimited"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a->stats().num_ooms, 2);
  a->free(p);
  // 21 MiB needs a 22 MiB segment: only fits once the cached 20 MiB one is released.
  EXPECT_NE(a->allocate(21 * MiB, Category::params), nullptr);
  EXPECT_EQ(a->stats().num_alloc_retries, 3);
  EXPECT_EQ(a->stats().num_segment_frees, 1);
}

TEST(Allocator, TraceRecordsEventsWithPhase) {
  ProviderLog log;
  auto a = make(log);
  a->free(a->allocate(8, Category::io));
  EXPECT_TRUE(a->trace().empty());  // off by default
  a->empty_cache();
  a->enable_trace(true);
  a->set_phase("forward");
  void* p = a->allocate(1, Category::activations);
  a->set_phase("backward");
  a->free(p);
  a->empty_cache();
  const auto& t = a->trace();
  ASSERT_EQ(t.size(), 4u);
  using K = TraceEvent::Kind;
  EXPECT_EQ(t[0].kind, K::segment_alloc);
  EXPECT_EQ(t[0].bytes, 2 * MiB);
  EXPECT_EQ(t[0].reserved_after, i64_t{2 * MiB});
  EXPECT_EQ(t[1].kind, K::alloc);
  EXPECT_EQ(t[1].bytes, 512u);
  EXPECT_EQ(t[1].requested, 1u);
  EXPECT_EQ(t[1].category, Category::activations);
  EXPECT_EQ(t[1].phase, "forward");
  EXPECT_EQ(t[1].allocated_after, 512);
  EXPECT_EQ(t[2].kind, K::free);
  EXPECT_EQ(t[2].phase, "backward");
  EXPECT_EQ(t[2].allocated_after, 0);
  EXPECT_EQ(t[3].kind, K::segment_free);
  EXPECT_EQ(t[3].reserved_after, 0);
  for (std::size_t i = 1; i < t.size(); ++i) EXPECT_EQ(t[i].seq, t[i - 1].seq + 1);
  a->clear_trace();
  EXPECT_TRUE(a->trace().empty());
}

// What a PyTorch memory snapshot is replayed from (harness/run/torch_snapshot.h): every event's
// address (the block, the segment's base) and the scope stack it happened in.
TEST(Allocator, TraceRecordsAddressesAndScopes) {
  ProviderLog log;
  auto a = make(log);
  EXPECT_EQ(a->scope(), "");
  a->pop_scope();  // nothing open: a no-op
  a->enable_trace(true);
  a->push_scope("block_0");
  a->push_scope("attention");
  void* p = a->allocate(1000, Category::activations);
  a->pop_scope();
  EXPECT_EQ(a->scope(), "block_0");
  void* q = a->allocate(1, Category::temporaries);
  a->pop_scope();
  EXPECT_EQ(a->scope(), "");
  a->free(p);
  a->push_scope("optimizer_step");
  a->free(q);
  a->pop_scope();
  a->empty_cache();
  const auto& t = a->trace();
  ASSERT_EQ(t.size(), 6u);
  using K = TraceEvent::Kind;
  const std::uintptr_t base = addr(p);  // the first block sits at its segment's base
  EXPECT_EQ(t[0].kind, K::segment_alloc);
  EXPECT_EQ(t[0].addr, base);
  EXPECT_EQ(t[0].scope, "block_0/attention");
  EXPECT_EQ(t[1].kind, K::alloc);
  EXPECT_EQ(t[1].addr, base);
  EXPECT_EQ(t[1].scope, "block_0/attention");
  EXPECT_EQ(t[2].addr, base + 1024);  // after p's 1024-byte block
  EXPECT_EQ(t[2].addr, addr(q));
  EXPECT_EQ(t[2].scope, "block_0");
  EXPECT_EQ(t[3].kind, K::free);
  EXPECT_EQ(t[3].addr, base);
  EXPECT_EQ(t[3].scope, "");
  EXPECT_EQ(t[4].addr, addr(q));
  EXPECT_EQ(t[4].scope, "optimizer_step");
  EXPECT_EQ(t[5].kind, K::segment_free);
  EXPECT_EQ(t[5].addr, base);
}

// segments() lists every block in address order, tiling its segment: live blocks with their
// sizes, the free space between them as one (coalesced) free block each.
TEST(Allocator, SegmentsListTheirBlocksInAddressOrder) {
  ProviderLog log;
  auto a = make(log);
  void* p0 = a->allocate(512, Category::params);
  void* p1 = a->allocate(600, Category::grads);
  void* p2 = a->allocate(512, Category::optimizer);
  a->free(p1);
  const auto segs = a->segments();
  ASSERT_EQ(segs.size(), 1u);
  const auto& b = segs[0].blocks;
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].addr, addr(p0));
  EXPECT_TRUE(b[0].allocated);
  EXPECT_EQ(b[0].requested, 512u);
  EXPECT_EQ(b[0].category, Category::params);
  EXPECT_FALSE(b[1].allocated);  // p1's 1024 bytes
  EXPECT_EQ(b[1].size, 1024u);
  EXPECT_EQ(b[1].requested, 0u);
  EXPECT_EQ(b[2].addr, addr(p2));
  EXPECT_EQ(b[2].category, Category::optimizer);
  EXPECT_FALSE(b[3].allocated);  // the rest of the 2 MiB segment
  std::uintptr_t next = segs[0].base;
  for (const auto& blk : b) {
    EXPECT_EQ(blk.addr, next);
    next += blk.size;
  }
  EXPECT_EQ(next, segs[0].base + 2 * MiB);
  a->free(p0);
  a->free(p2);
}

TEST(Allocator, DeviceAndPinnedAllocatorsKeepSeparateStats) {
  A device(std::make_unique<HostProvider>());
  A pinned(std::make_unique<HostProvider>());
  EXPECT_EQ(device.provider_name(), "host");
  void* d = device.allocate(3 * MiB, Category::params);
  void* h = pinned.allocate(1000, Category::io);
  EXPECT_EQ(device.stats().allocated.current, i64_t{3 * MiB});
  EXPECT_EQ(pinned.stats().allocated.current, 1024);
  EXPECT_TRUE(device.owns(d));
  EXPECT_FALSE(pinned.owns(d));
  EXPECT_THROW(pinned.free(d), AllocatorError);
  device.free(d);
  pinned.free(h);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(d) % 4096, 0u);  // HostProvider: 4 KiB aligned
}

TEST(Allocator, MisuseThrowsAndChangesNothing) {
  ProviderLog log;
  auto a = make(log, 64 * MiB);
  void* p = a->allocate(4 * KiB, Category::params);
  void* q = a->allocate(3 * MiB, Category::grads);
  a->free(a->allocate(100, Category::io));
  const std::string before = snapshot(*a);
  const std::string before_nc = snapshot(*a, false);
  int local = 0;
  EXPECT_THROW(a->allocate(0, Category::io), AllocatorError);
  EXPECT_THROW(a->free(&local), AllocatorError);                       // stack address
  EXPECT_THROW(a->free(static_cast<char*>(p) + 512), AllocatorError);  // inside a block
  EXPECT_THROW(a->free(static_cast<char*>(p) + 1), AllocatorError);
  EXPECT_THROW(a->requested_size(&local), AllocatorError);
  EXPECT_THROW(a->block_size(static_cast<char*>(q) + 512), AllocatorError);
  EXPECT_THROW(a->category_of(&local), AllocatorError);
  EXPECT_FALSE(a->owns(static_cast<char*>(p) + 512));
  a->free(nullptr);  // no-op
  EXPECT_EQ(snapshot(*a), before);

  // Beyond capacity / absurd sizes: OutOfMemory; only the failure counters move (no segment is
  // entirely free, so the release-and-retry has nothing to give back).
  EXPECT_THROW(a->allocate(65 * MiB, Category::io), OutOfMemory);
  EXPECT_THROW(a->allocate(~std::size_t{0}, Category::io), OutOfMemory);
  EXPECT_EQ(snapshot(*a, false), before_nc);
  EXPECT_EQ(a->stats().num_ooms, 2);
  EXPECT_EQ(a->stats().num_alloc_retries, 2);

  a->free(p);
  const std::string after_free = snapshot(*a);
  EXPECT_THROW(a->free(p), AllocatorError);  // double free
  EXPECT_EQ(snapshot(*a), after_free);
  a->free(q);
  EXPECT_EQ(log.bad_releases, 0);
}

TEST(Allocator, DestructorReturnsEverySegment) {
  ProviderLog log;
  {
    auto a = make(log);
    a->allocate(100, Category::io);
    a->allocate(5 * MiB, Category::io);
    a->free(a->allocate(30 * MiB, Category::io));
    EXPECT_EQ(log.outstanding, 52 * MiB);
  }
  EXPECT_EQ(log.outstanding, 0u);
  EXPECT_EQ(log.bad_releases, 0);
}

TEST(Allocator, CategoryNamesRoundTrip) {
  for (std::size_t i = 0; i < kNumCategories; ++i) {
    const auto c = static_cast<Category>(i);
    EXPECT_EQ(category_from_name(category_name(c)), c);
  }
  EXPECT_EQ(category_name(Category::optimizer), "optimizer");
  EXPECT_FALSE(category_from_name("weights").has_value());
}

TEST(AllocatorText, ParseCapacity) {
  EXPECT_EQ(parse_capacity("24GiB"), 24 * GiB);
  EXPECT_EQ(parse_capacity("24 GiB"), 24 * GiB);
  EXPECT_EQ(parse_capacity(" 512MiB "), 512 * MiB);
  EXPECT_EQ(parse_capacity("1.5GiB"), 3 * GiB / 2);
  EXPECT_EQ(parse_capacity("16GB"), std::size_t{16'000'000'000});
  EXPECT_EQ(parse_capacity("16gb"), std::size_t{16'000'000'000});
  EXPECT_EQ(parse_capacity("1048576"), 1 * MiB);
  EXPECT_EQ(parse_capacity("1048576 B"), 1 * MiB);
  EXPECT_EQ(parse_capacity("1KiB"), 1 * KiB);
  EXPECT_EQ(parse_capacity("2kB"), 2000u);
  EXPECT_EQ(parse_capacity("0"), 0u);
  EXPECT_EQ(parse_capacity("A10G"), 24 * GiB);
  EXPECT_EQ(parse_capacity("l4"), 24 * GiB);
  EXPECT_EQ(parse_capacity("t4"), 16 * GiB);
  EXPECT_EQ(parse_capacity("v100-32g"), 32 * GiB);
  EXPECT_EQ(parse_capacity("a100-40g"), 40 * GiB);
  EXPECT_EQ(parse_capacity("a100-80g"), 80 * GiB);
  EXPECT_EQ(parse_capacity("H100"), 80 * GiB);
  EXPECT_EQ(parse_capacity("h200"), 141 * GiB);
  EXPECT_EQ(parse_capacity("rtx4090"), 24 * GiB);
  for (const char* bad : {"", "  ", "-1", "-1GiB", "12XB", "GiB", "1.5.2GiB", "abc", "1 2 GiB",
                          "99999999999999999999", "20000000000 GiB", "a100"})
    EXPECT_FALSE(parse_capacity(bad).has_value()) << '"' << bad << '"';
}

TEST(AllocatorText, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(812), "812 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(20 * 1024 * 1024), "20.00 MiB");
  EXPECT_EQ(format_bytes(static_cast<std::int64_t>(5 * GiB / 4)), "1.25 GiB");
  EXPECT_EQ(format_bytes(-1536), "-1.50 KiB");
  EXPECT_EQ(format_bytes(static_cast<std::int64_t>(3 * 1024 * GiB)), "3.00 TiB");
}

}  // namespace
}  // namespace memtrade
