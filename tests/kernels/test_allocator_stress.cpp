// CachingAllocator under random load, checked op by op against a naive reference model of the
// same policy (linear scans over vectors of blocks): the model predicts the exact pointer each
// request gets, when a segment is created or released, when an OOM happens, and every stat.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "counting_provider.h"
#include "kernels/allocator.h"

namespace memtrade {
namespace {

using testing::CountingProvider;
using testing::ProviderLog;

// The policy, written the slow and obvious way.
class Model {
 public:
  struct Blk {
    std::uintptr_t addr;
    std::size_t size;
    bool alloc = false;
    std::size_t req = 0;
    Category cat = Category::io;
  };
  struct Seg {
    std::size_t size;
    bool small;
    std::vector<Blk> blocks;  // address order, covering the segment
  };
  struct Fit {
    std::uintptr_t seg;
    std::size_t index;
  };

  explicit Model(std::size_t capacity) : capacity_(capacity) {}

  static std::size_t rounded(std::size_t bytes) {
    return std::max<std::size_t>(512, (bytes + 511) / 512 * 512);
  }
  static std::size_t seg_size(std::size_t r) {
    if (r <= MiB) return 2 * MiB;
    if (r < 10 * MiB) return 20 * MiB;
    return (r + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
  }

  std::optional<Fit> best_fit(std::size_t r) const {
    std::optional<Fit> best;
    std::size_t best_size = 0;
    std::uintptr_t best_addr = 0;
    for (const auto& [base, seg] : segs_) {
      if (seg.small != (r <= MiB)) continue;
      for (std::size_t i = 0; i < seg.blocks.size(); ++i) {
        const Blk& b = seg.blocks[i];
        if (b.alloc || b.size < r) continue;
        if (!best || b.size < best_size || (b.size == best_size && b.addr < best_addr)) {
          best = Fit{base, i};
          best_size = b.size;
          best_addr = b.addr;
        }
      }
    }
    return best;
  }

  std::uintptr_t addr_of(Fit f) const { return segs_.at(f.seg).blocks[f.index].addr; }

  bool fits_capacity(std::size_t seg) const {
    return capacity_ == 0 || static_cast<std::size_t>(s.reserved.current) + seg <= capacity_;
  }

  void release_free_segments() {
    for (auto it = segs_.begin(); it != segs_.end();) {
      if (it->second.blocks.size() == 1 && !it->second.blocks[0].alloc) {
        s.reserved.add(-static_cast<std::int64_t>(it->second.size));
        s.segments.add(-1);
        ++s.num_segment_frees;
        it = segs_.erase(it);
      } else {
        ++it;
      }
    }
  }

  Fit add_segment(std::uintptr_t base, std::size_t size, bool small) {
    segs_[base] = Seg{size, small, {Blk{base, size}}};
    s.reserved.add(static_cast<std::int64_t>(size));
    s.segments.add(1);
    ++s.num_segment_allocs;
    return Fit{base, 0};
  }

  // Hands out block `f` for a request; returns the block size given.
  std::size_t place(Fit f, std::size_t bytes, Category c) {
    Seg& seg = segs_.at(f.seg);
    const std::size_t r = rounded(bytes);
    Blk& b = seg.blocks[f.index];
    const std::size_t rem = b.size - r;
    if (seg.small ? rem >= 512 : rem > MiB) {
      b.size = r;
      seg.blocks.insert(seg.blocks.begin() + static_cast<std::ptrdiff_t>(f.index) + 1,
                        Blk{seg.blocks[f.index].addr + r, rem});
    }
    Blk& got = seg.blocks[f.index];
    got.alloc = true;
    got.req = bytes;
    got.cat = c;
    const auto size = static_cast<std::int64_t>(got.size);
    s.by_category[static_cast<std::size_t>(c)] += size;
    const bool peak = s.allocated.current + size > s.allocated.peak;
    s.allocated.add(size);
    if (peak) s.by_category_at_peak = s.by_category;
    s.requested.add(static_cast<std::int64_t>(bytes));
    s.active.add(1);
    ++s.num_allocs;
    return got.size;
  }

  void free(std::uintptr_t p) {
    auto it = std::prev(segs_.upper_bound(p));
    auto& blocks = it->second.blocks;
    auto b = std::find_if(blocks.begin(), blocks.end(), [&](const Blk& x) { return x.addr == p; });
    ASSERT_TRUE(b != blocks.end() && b->alloc);
    const auto size = static_cast<std::int64_t>(b->size);
    s.by_category[static_cast<std::size_t>(b->cat)] -= size;
    s.allocated.add(-size);
    s.requested.add(-static_cast<std::int64_t>(b->req));
    s.active.add(-1);
    ++s.num_frees;
    b->alloc = false;
    if (std::next(b) != blocks.end() && !std::next(b)->alloc) {
      b->size += std::next(b)->size;
      blocks.erase(std::next(b));
    }
    if (b != blocks.begin() && !std::prev(b)->alloc) {
      std::prev(b)->size += b->size;
      blocks.erase(b);
    }
  }

  void reset_peak() {
    for (StatPair* p : {&s.allocated, &s.requested, &s.reserved, &s.active, &s.segments})
      p->peak = p->current;
    s.by_category_at_peak = s.by_category;
  }

  std::vector<CachingAllocator::SegmentInfo> segments() const {
    std::vector<CachingAllocator::SegmentInfo> out;
    for (const auto& [base, seg] : segs_) {
      std::size_t a = 0;
      std::vector<CachingAllocator::BlockInfo> blocks;
      for (const Blk& b : seg.blocks) {
        a += b.alloc ? b.size : 0;
        blocks.push_back({b.addr, b.size, b.alloc ? b.req : 0, b.alloc, b.cat});
      }
      out.push_back({base, seg.size, a, seg.small, std::move(blocks)});
    }
    return out;
  }

  AllocatorStats s;

 private:
  std::size_t capacity_;
  std::map<std::uintptr_t, Seg> segs_;
};

std::string text(const AllocatorStats& s) {
  std::string out;
  for (const StatPair* p : {&s.allocated, &s.requested, &s.reserved, &s.active, &s.segments})
    out += fmt::format("{}/{} ", p->current, p->peak);
  return out + fmt::format("n {} {} {} {} {} {} cat {} at_peak {}", s.num_allocs, s.num_frees,
                           s.num_segment_allocs, s.num_segment_frees, s.num_alloc_retries,
                           s.num_ooms, fmt::join(s.by_category, ","),
                           fmt::join(s.by_category_at_peak, ","));
}

std::string text(const std::vector<CachingAllocator::SegmentInfo>& segs) {
  std::string out;
  for (const auto& g : segs) {
    out += fmt::format("{:#x}:{}:{}:{} [", g.base, g.size, g.allocated, g.small_pool);
    for (const auto& b : g.blocks)  // a free block's category is whatever it last held
      out += fmt::format("{:#x}:{}:{}:{}:{} ", b.addr, b.size, b.requested, b.allocated,
                         b.allocated ? category_name(b.category) : "-");
    out += "] ";
  }
  return out;
}

struct Live {
  unsigned char* ptr;
  std::size_t req;
  std::size_t block;
  unsigned char first, last;
};

void check_no_overlap(std::vector<Live> live) {
  std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.ptr < b.ptr; });
  for (std::size_t i = 1; i < live.size(); ++i)
    ASSERT_LE(live[i - 1].ptr + live[i - 1].block, live[i].ptr) << "blocks overlap";
}

// Replays a trace: every event's "after" figures follow from the previous one.
void check_trace(const std::vector<TraceEvent>& trace) {
  std::int64_t allocated = 0, reserved = 0;
  for (const TraceEvent& e : trace) {
    const auto b = static_cast<std::int64_t>(e.bytes);
    if (e.kind == TraceEvent::Kind::alloc) allocated += b;
    if (e.kind == TraceEvent::Kind::free) allocated -= b;
    if (e.kind == TraceEvent::Kind::segment_alloc) reserved += b;
    if (e.kind == TraceEvent::Kind::segment_free) reserved -= b;
    ASSERT_EQ(e.allocated_after, allocated) << "event " << e.seq;
    ASSERT_EQ(e.reserved_after, reserved) << "event " << e.seq;
  }
}

// Runs `ops` random operations; returns the number of OOMs seen.
int run_stress(std::uint64_t seed, int ops, std::size_t capacity, std::size_t max_live) {
  ProviderLog log;
  int ooms = 0;
  {
    CachingAllocator a(std::make_unique<CountingProvider>(log), capacity);
    a.enable_trace(true);
    Model m(capacity);
    std::mt19937_64 rng(seed);
    auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
    const double log_max = std::log(40.0 * MiB);
    std::vector<Live> live;
    std::uint64_t id = 0;

    for (int op = 0; op < ops; ++op) {
      SCOPED_TRACE(fmt::format("seed {} op {}", seed, op));
      const double r = uniform();
      if (live.empty() || (r < 0.55 && live.size() < max_live)) {
        const auto bytes = static_cast<std::size_t>(std::exp(uniform() * log_max));
        const auto cat = static_cast<Category>(rng() % kNumCategories);
        const std::size_t rs = Model::rounded(bytes);
        std::optional<Model::Fit> fit = m.best_fit(rs);
        bool expect_oom = false;
        if (!fit && !m.fits_capacity(Model::seg_size(rs))) {
          m.release_free_segments();
          ++m.s.num_alloc_retries;
          expect_oom = !m.fits_capacity(Model::seg_size(rs));
        }
        void* p = nullptr;
        try {
          p = a.allocate(bytes, cat);
        } catch (const OutOfMemory& e) {
          EXPECT_TRUE(expect_oom) << "unexpected OOM: " << e.what();
          if (!expect_oom) return ooms;
          ++m.s.num_ooms;
          ++ooms;
          EXPECT_EQ(e.requested(), bytes);
          EXPECT_EQ(e.capacity(), capacity);
          EXPECT_EQ(static_cast<std::int64_t>(e.allocated()), m.s.allocated.current);
          EXPECT_EQ(static_cast<std::int64_t>(e.reserved()), m.s.reserved.current);
        }
        if (p != nullptr) {
          EXPECT_FALSE(expect_oom) << "expected an OOM for " << bytes << " B";
          const auto addr = reinterpret_cast<std::uintptr_t>(p);
          if (fit) {
            EXPECT_EQ(addr, m.addr_of(*fit)) << "best fit chose another block";
          } else {  // a new segment, starting at the returned pointer, fresh from the provider
            EXPECT_EQ(log.live.count(addr), 1u);
            fit = m.add_segment(addr, Model::seg_size(rs), rs <= MiB);
          }
          const std::size_t block = m.place(*fit, bytes, cat);
          EXPECT_EQ(a.block_size(p), block);
          EXPECT_EQ(a.requested_size(p), bytes);
          EXPECT_EQ(a.category_of(p), cat);
          Live l{static_cast<unsigned char*>(p), bytes, block,
                 static_cast<unsigned char>(id & 0xff),
                 static_cast<unsigned char>(((id >> 8) & 0xff) ^ 0x5a)};
          ++id;
          l.ptr[0] = l.first;
          if (bytes > 1) l.ptr[bytes - 1] = l.last;
          live.push_back(l);
        }
      } else if (r < 0.98) {
        const std::size_t k = rng() % live.size();
        const Live l = live[k];
        live[k] = live.back();
        live.pop_back();
        EXPECT_EQ(l.ptr[0], l.first) << "first byte overwritten";
        if (l.req > 1) {
          EXPECT_EQ(l.ptr[l.req - 1], l.last) << "last byte overwritten";
        }
        a.free(l.ptr);
        m.free(reinterpret_cast<std::uintptr_t>(l.ptr));
      } else if (r < 0.99) {
        a.empty_cache();
        m.release_free_segments();
      } else {
        a.reset_peak();
        m.reset_peak();
      }

      // The whole observable state against the model, after every operation.
      EXPECT_EQ(text(a.stats()), text(m.s));
      EXPECT_EQ(text(a.segments()), text(m.segments()));
      EXPECT_GE(a.stats().reserved.current, a.stats().allocated.current);
      EXPECT_EQ(static_cast<std::int64_t>(log.outstanding), a.stats().reserved.current);
      if (capacity != 0) {
        EXPECT_LE(log.outstanding, capacity);
      }
      check_no_overlap(live);
      if (::testing::Test::HasFailure()) return ooms;
    }

    check_trace(a.trace());

    for (const Live& l : live) a.free(l.ptr);
    a.empty_cache();
    EXPECT_EQ(a.stats().allocated.current, 0);
    EXPECT_EQ(a.stats().requested.current, 0);
    EXPECT_EQ(a.stats().reserved.current, 0);
    EXPECT_EQ(a.stats().segments.current, 0);
    EXPECT_EQ(log.outstanding, 0u);
    EXPECT_TRUE(log.live.empty());
  }
  EXPECT_EQ(log.bad_releases, 0);
  return ooms;
}

TEST(AllocatorStress, MatchesReferenceModel) {
  for (std::uint64_t seed : {1u, 2u, 3u}) run_stress(seed, 3000, 0, 48);
}

TEST(AllocatorStress, MatchesReferenceModelUnderCapacity) {
  int ooms = 0;
  for (std::uint64_t seed : {11u, 12u, 13u}) ooms += run_stress(seed, 3000, 160 * MiB, 96);
  EXPECT_GT(ooms, 10) << "the capacity stress should actually hit the capacity";
}

}  // namespace
}  // namespace memtrade
