// CachingAllocator: the PyTorch CUDA caching-allocator policy (see allocator.h) over a RawProvider.
//
// Data structures follow PyTorch's: every segment is a doubly linked list of blocks in address
// order; free blocks sit in one ordered set per pool keyed by (size, address), so best fit is a
// lower_bound; live blocks are found by pointer through a hash map. The hot path (a cached
// alloc/free pair) must not call malloc, so set/map nodes and Block objects are recycled:
// node handles extracted from the containers are kept in spare lists and re-inserted later.
//
// Deliberate choices where PyTorch has no single answer:
//   - by_category_at_peak is copied when `allocated` strictly exceeds its previous peak, so after
//     reset_peak() (peak == current) it only changes once allocation climbs above that level.
//   - a failed allocation leaves every live block and the allocated/requested/active stats as
//     they were; like PyTorch it has already released the cached free segments (reserved may
//     drop) and counted the retry and the OOM.
//   - the OOM message names the segment it tried to obtain ("tried to allocate 20.00 MiB" for a
//     large-pool request, as PyTorch does), followed by the request in bytes.
#include "kernels/allocator.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <limits>
#include <new>

#include <fmt/format.h>

namespace memtrade {

namespace {

// Larger segments are refused without asking the provider (and keep size arithmetic exact).
constexpr std::size_t kMaxSegment = std::size_t{1} << 60;

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // valid while allocated
  Block* prev = nullptr;      // neighbours in the same segment, address order
  Block* next = nullptr;
  bool allocated = false;
  bool small = false;
  Category category = Category::temporaries;
};

// Free-block order: size, then address (PyTorch's BlockComparator without the stream).
struct BySizeAddr {
  using is_transparent = void;
  struct Key {
    std::size_t size;
    std::uintptr_t addr;
  };
  static bool less(std::size_t s1, std::uintptr_t a1, std::size_t s2, std::uintptr_t a2) {
    return s1 != s2 ? s1 < s2 : a1 < a2;
  }
  bool operator()(const Block* a, const Block* b) const {
    return less(a->size, a->addr, b->size, b->addr);
  }
  bool operator()(const Block* a, const Key& k) const {
    return less(a->size, a->addr, k.size, k.addr);
  }
  bool operator()(const Key& k, const Block* b) const {
    return less(k.size, k.addr, b->size, b->addr);
  }
};

using FreeSet = std::set<Block*, BySizeAddr>;
using LiveMap = std::unordered_map<void*, Block*>;

std::size_t round_up(std::size_t n, std::size_t multiple) {
  const std::size_t max = std::numeric_limits<std::size_t>::max() / multiple * multiple;
  if (n > max - (multiple - 1)) return max;  // saturate: such a size can never be served
  return (n + multiple - 1) / multiple * multiple;
}

auto i64(std::size_t n) {
  return static_cast<std::int64_t>(n);
}

}  // namespace

// ---- provider, names -----------------------------------------------------------------------

void* HostProvider::allocate(std::size_t bytes) {
  return ::operator new (bytes, std::align_val_t{4096}, std::nothrow);
}

void HostProvider::release(void* ptr, std::size_t /*bytes*/) noexcept {
  ::operator delete (ptr, std::align_val_t{4096});
}

namespace {
constexpr std::array<std::string_view, kNumCategories> kCategoryNames = {
    "params",      "master",      "casts",     "grads", "optimizer",
    "activations", "temporaries", "workspace", "io"};
}

std::string_view category_name(Category c) {
  return kCategoryNames.at(static_cast<std::size_t>(c));
}

std::optional<Category> category_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kNumCategories; ++i)
    if (kCategoryNames[i] == name) return static_cast<Category>(i);
  return std::nullopt;
}

// ---- the allocator -------------------------------------------------------------------------

struct CachingAllocator::Impl {
  struct Segment {
    std::size_t size;
    bool small;
    Category category;  // of the request that created it (labels segment trace events)
    Block* head;        // the first block; split/merge keep this object at the front
  };

  explicit Impl(CachingAllocator& owner, std::unique_ptr<RawProvider> p)
      : self(owner), provider(std::move(p)) {}

  CachingAllocator& self;
  std::unique_ptr<RawProvider> provider;
  FreeSet small_free, large_free;
  LiveMap live;
  std::map<std::uintptr_t, Segment> segments;  // by base address
  std::deque<Block> block_storage;             // stable addresses; recycled through spare_blocks
  std::vector<Block*> spare_blocks;
  std::vector<FreeSet::node_type> spare_set_nodes;
  std::vector<LiveMap::node_type> spare_live_nodes;
  std::uint64_t seq = 0;

  FreeSet& pool(bool small) { return small ? small_free : large_free; }

  Block* new_block() {
    if (!spare_blocks.empty()) {
      Block* b = spare_blocks.back();
      spare_blocks.pop_back();
      *b = Block{};
      return b;
    }
    return &block_storage.emplace_back();
  }

  void insert_free(Block* b) {
    FreeSet& p = pool(b->small);
    if (spare_set_nodes.empty()) {
      p.insert(b);
      return;
    }
    FreeSet::node_type node = std::move(spare_set_nodes.back());
    spare_set_nodes.pop_back();
    node.value() = b;
    p.insert(std::move(node));
  }

  void erase_free(FreeSet::iterator it, FreeSet& p) { spare_set_nodes.push_back(p.extract(it)); }
  void erase_free(Block* b) {
    FreeSet& p = pool(b->small);
    erase_free(p.find(b), p);
  }

  void insert_live(Block* b) {
    void* key = reinterpret_cast<void*>(b->addr);
    if (spare_live_nodes.empty()) {
      live.emplace(key, b);
      return;
    }
    LiveMap::node_type node = std::move(spare_live_nodes.back());
    spare_live_nodes.pop_back();
    node.key() = key;
    node.mapped() = b;
    live.insert(std::move(node));
  }

  void trace(TraceEvent::Kind kind, std::size_t bytes, std::size_t requested, Category c,
             std::uintptr_t addr) {
    if (!self.trace_on_) return;
    self.trace_.push_back(TraceEvent{kind, seq++, bytes, requested, c, self.phase_,
                                     self.stats_.allocated.current, self.stats_.reserved.current,
                                     addr, self.scope_});
  }

  // A fresh segment holding one free block (not in any free set), or nullptr when the capacity
  // or the provider says no.
  Block* new_segment(std::size_t seg_size, bool small, Category c, std::size_t requested) {
    const std::size_t reserved = static_cast<std::size_t>(self.stats_.reserved.current);
    const std::size_t cap = self.capacity_;
    if (seg_size > kMaxSegment) return nullptr;
    if (cap != 0 && (seg_size > cap || reserved > cap - seg_size)) return nullptr;
    void* mem = provider->allocate(seg_size);
    if (mem == nullptr) return nullptr;
    Block* b = nullptr;
    try {
      b = new_block();
      b->addr = reinterpret_cast<std::uintptr_t>(mem);
      segments.emplace(b->addr, Segment{seg_size, small, c, b});
    } catch (...) {
      if (b != nullptr) spare_blocks.push_back(b);
      provider->release(mem, seg_size);
      throw;
    }
    b->size = seg_size;
    b->small = small;
    AllocatorStats& s = self.stats_;
    s.reserved.add(i64(seg_size));
    s.segments.add(1);
    ++s.num_segment_allocs;
    trace(TraceEvent::Kind::segment_alloc, seg_size, requested, c, b->addr);
    return b;
  }

  void release_segment(Block* head) {
    auto it = segments.find(head->addr);
    const Segment seg = it->second;
    segments.erase(it);
    provider->release(reinterpret_cast<void*>(head->addr), seg.size);
    spare_blocks.push_back(head);
    AllocatorStats& s = self.stats_;
    s.reserved.add(-i64(seg.size));
    s.segments.add(-1);
    ++s.num_segment_frees;
    trace(TraceEvent::Kind::segment_free, seg.size, 0, seg.category, head->addr);
  }

  void release_cached() {
    std::vector<Block*> whole;
    for (FreeSet* p : {&small_free, &large_free}) {
      for (auto it = p->begin(); it != p->end();) {
        Block* b = *it;
        if (b->prev == nullptr && b->next == nullptr) {
          whole.push_back(b);
          auto next = std::next(it);
          erase_free(it, *p);
          it = next;
        } else {
          ++it;
        }
      }
    }
    for (Block* b : whole) release_segment(b);
  }

  [[noreturn]] void out_of_memory(std::size_t bytes, std::size_t rounded, std::size_t seg_size,
                                  Category c) {
    AllocatorStats& s = self.stats_;
    ++s.num_ooms;
    trace(TraceEvent::Kind::oom, rounded, bytes, c, 0);
    const std::size_t cap = self.capacity_;
    std::string msg = fmt::format(
        "out of memory: tried to allocate {} (request {} B, {}); capacity {}, {} allocated, {} "
        "reserved ({} memory)",
        format_bytes(i64(std::min(seg_size, kMaxSegment))), bytes, category_name(c),
        cap == 0 ? std::string("unlimited") : format_bytes(i64(cap)),
        format_bytes(s.allocated.current), format_bytes(s.reserved.current), provider->name());
    throw OutOfMemory(msg, bytes, cap, static_cast<std::size_t>(s.allocated.current),
                      static_cast<std::size_t>(s.reserved.current));
  }

  void* allocate(std::size_t bytes, Category c) {
    if (bytes == 0) throw AllocatorError("CachingAllocator::allocate: size 0 requested");
    const std::size_t rounded = round_size(bytes);
    const bool small = rounded <= kSmallRequest;
    FreeSet& p = pool(small);

    Block* b = nullptr;
    auto it = p.lower_bound(BySizeAddr::Key{rounded, 0});
    if (it != p.end()) {
      b = *it;
      erase_free(it, p);
    } else {
      const std::size_t seg_size = small ? kSmallSegment : segment_size_for(rounded);
      b = new_segment(seg_size, small, c, bytes);
      if (b == nullptr) {
        // PyTorch: free every cached segment, then one more try (counted even if it fails).
        release_cached();
        ++self.stats_.num_alloc_retries;
        b = new_segment(seg_size, small, c, bytes);
        if (b == nullptr) out_of_memory(bytes, rounded, seg_size, c);
      }
    }

    const std::size_t remainder = b->size - rounded;
    if (small ? remainder >= kMinBlock : remainder > kSmallRequest) {
      Block* r = new_block();
      r->addr = b->addr + rounded;
      r->size = remainder;
      r->small = small;
      r->prev = b;
      r->next = b->next;
      if (r->next != nullptr) r->next->prev = r;
      b->next = r;
      b->size = rounded;
      insert_free(r);
    }
    b->allocated = true;
    b->requested = bytes;
    b->category = c;
    insert_live(b);

    AllocatorStats& s = self.stats_;
    s.by_category[static_cast<std::size_t>(c)] += i64(b->size);
    const bool new_peak = s.allocated.current + i64(b->size) > s.allocated.peak;
    s.allocated.add(i64(b->size));
    if (new_peak) s.by_category_at_peak = s.by_category;
    s.requested.add(i64(bytes));
    s.active.add(1);
    ++s.num_allocs;
    trace(TraceEvent::Kind::alloc, b->size, bytes, c, b->addr);
    return reinterpret_cast<void*>(b->addr);
  }

  // Absorb b->next (free, same segment) into b.
  void absorb_next(Block* b) {
    Block* n = b->next;
    erase_free(n);
    b->size += n->size;
    b->next = n->next;
    if (b->next != nullptr) b->next->prev = b;
    spare_blocks.push_back(n);
  }

  void free(void* ptr) {
    if (ptr == nullptr) return;
    auto it = live.find(ptr);
    if (it == live.end())
      throw AllocatorError(fmt::format(
          "CachingAllocator::free: {} is not a live block of this allocator (foreign pointer, "
          "interior pointer or double free)",
          ptr));
    Block* b = it->second;
    spare_live_nodes.push_back(live.extract(it));

    AllocatorStats& s = self.stats_;
    s.by_category[static_cast<std::size_t>(b->category)] -= i64(b->size);
    s.allocated.add(-i64(b->size));
    s.requested.add(-i64(b->requested));
    s.active.add(-1);
    ++s.num_frees;
    trace(TraceEvent::Kind::free, b->size, b->requested, b->category, b->addr);

    b->allocated = false;
    if (b->next != nullptr && !b->next->allocated) absorb_next(b);
    if (b->prev != nullptr && !b->prev->allocated) {
      Block* p = b->prev;
      erase_free(p);  // its key (size) changes
      p->size += b->size;
      p->next = b->next;
      if (p->next != nullptr) p->next->prev = p;
      spare_blocks.push_back(b);
      b = p;
    }
    insert_free(b);
  }

  Block* live_block(const void* ptr, const char* what) const {
    auto it = live.find(const_cast<void*>(ptr));
    if (it == live.end())
      throw AllocatorError(
          fmt::format("CachingAllocator::{}: {} is not a live block of this allocator", what, ptr));
    return it->second;
  }

  void release_all() noexcept {
    for (const auto& [base, seg] : segments)
      provider->release(reinterpret_cast<void*>(base), seg.size);
    segments.clear();
  }
};

CachingAllocator::CachingAllocator(std::unique_ptr<RawProvider> provider, std::size_t capacity)
    : capacity_(capacity) {
  if (!provider) throw std::invalid_argument("CachingAllocator: null provider");
  impl_ = std::make_unique<Impl>(*this, std::move(provider));
}

// Blocks still live at destruction are released with their segments (their owners must not
// outlive the allocator).
CachingAllocator::~CachingAllocator() {
  impl_->release_all();
}

void* CachingAllocator::allocate(std::size_t bytes, Category category) {
  return impl_->allocate(bytes, category);
}

void CachingAllocator::free(void* ptr) {
  impl_->free(ptr);
}

void CachingAllocator::empty_cache() {
  impl_->release_cached();
}

void CachingAllocator::reset_peak() {
  for (StatPair* p :
       {&stats_.allocated, &stats_.requested, &stats_.reserved, &stats_.active, &stats_.segments})
    p->peak = p->current;
  stats_.by_category_at_peak = stats_.by_category;
}

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  return bytes < kMinBlock ? kMinBlock : round_up(bytes, kMinBlock);
}

std::size_t CachingAllocator::segment_size_for(std::size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  if (rounded < kOwnSegmentThreshold) return kLargeSegment;
  return round_up(rounded, kOwnSegmentRound);
}

std::size_t CachingAllocator::requested_size(void* ptr) const {
  return impl_->live_block(ptr, "requested_size")->requested;
}

std::size_t CachingAllocator::block_size(void* ptr) const {
  return impl_->live_block(ptr, "block_size")->size;
}

Category CachingAllocator::category_of(void* ptr) const {
  return impl_->live_block(ptr, "category_of")->category;
}

bool CachingAllocator::owns(const void* ptr) const {
  return impl_->live.count(const_cast<void*>(ptr)) != 0;
}

std::vector<CachingAllocator::SegmentInfo> CachingAllocator::segments() const {
  std::vector<SegmentInfo> out;
  out.reserve(impl_->segments.size());
  for (const auto& [base, seg] : impl_->segments) {
    std::size_t allocated = 0;
    std::vector<BlockInfo> blocks;
    for (const Block* b = seg.head; b != nullptr; b = b->next) {
      if (b->allocated) allocated += b->size;
      blocks.push_back(
          BlockInfo{b->addr, b->size, b->allocated ? b->requested : 0, b->allocated, b->category});
    }
    out.push_back(SegmentInfo{base, seg.size, allocated, seg.small, std::move(blocks)});
  }
  return out;
}

void CachingAllocator::push_scope(std::string_view name) {
  scope_marks_.push_back(scope_.size());
  if (!scope_.empty()) scope_ += '/';
  scope_ += name;
}

void CachingAllocator::pop_scope() {
  if (scope_marks_.empty()) return;
  scope_.resize(scope_marks_.back());
  scope_marks_.pop_back();
}

std::string_view CachingAllocator::provider_name() const {
  return impl_->provider->name();
}

// ---- capacity parsing and formatting -----------------------------------------------------------

namespace {

// Card presets: the nominal memory size of each card, in GiB (what the spec sheet says; the
// driver reports slightly less usable memory, e.g. H200 shows 143771 MiB, about 140.4 GiB).
struct CardPreset {
  std::string_view name;
  std::size_t gib;
};
constexpr std::array<CardPreset, 15> kCardPresets = {{
    {"t4", 16},
    {"v100", 16},
    {"v100-16g", 16},
    {"v100-32g", 32},
    {"a10", 24},
    {"a10g", 24},
    {"l4", 24},
    {"rtx3090", 24},
    {"rtx4090", 24},
    {"l40s", 48},
    {"a100-40g", 40},
    {"a100-80g", 80},
    {"h100", 80},
    {"h100-80g", 80},
    {"h200", 141},
}};

struct Unit {
  std::string_view suffix;  // lower case
  std::size_t bytes;
};
constexpr std::size_t kTiB = 1024 * GiB;
constexpr std::array<Unit, 10> kUnits = {{
    {"b", 1},
    {"kib", KiB},
    {"mib", MiB},
    {"gib", GiB},
    {"tib", kTiB},
    {"kb", 1000},
    {"mb", 1000 * 1000},
    {"gb", 1000 * 1000 * 1000},
    {"tb", std::size_t{1000} * 1000 * 1000 * 1000},
    {"", 1},
}};

std::string lower_trimmed(std::string_view text) {
  std::size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  std::string out(text.substr(b, e - b));
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

bool is_digit(char ch) {
  return ch >= '0' && ch <= '9';
}

}  // namespace

std::optional<std::size_t> parse_capacity(std::string_view text) {
  const std::string s = lower_trimmed(text);
  for (const CardPreset& card : kCardPresets)
    if (card.name == s) return card.gib * GiB;

  // <digits>[.<digits>] [spaces] [unit]; at most 6 fraction digits are significant.
  std::size_t i = 0;
  std::size_t whole = 0;
  bool any_digit = false;
  for (; i < s.size() && is_digit(s[i]); ++i) {
    const std::size_t d = static_cast<std::size_t>(s[i] - '0');
    if (whole > (std::numeric_limits<std::size_t>::max() - d) / 10) return std::nullopt;
    whole = whole * 10 + d;
    any_digit = true;
  }
  std::size_t frac = 0, frac_scale = 1;
  if (i < s.size() && s[i] == '.') {
    ++i;
    for (; i < s.size() && is_digit(s[i]); ++i) {
      any_digit = true;
      if (frac_scale < 1000000) {
        frac = frac * 10 + static_cast<std::size_t>(s[i] - '0');
        frac_scale *= 10;
      }
    }
  }
  if (!any_digit) return std::nullopt;
  while (i < s.size() && s[i] == ' ') ++i;
  const std::string_view suffix = std::string_view(s).substr(i);
  for (const Unit& u : kUnits) {
    if (u.suffix != suffix) continue;
    if (whole > std::numeric_limits<std::size_t>::max() / u.bytes) return std::nullopt;
    const std::size_t whole_bytes = whole * u.bytes;
    // frac < 10^6 and u.bytes <= 2^40, so the product stays below 2^60. Rounds down.
    const std::size_t frac_bytes = frac * u.bytes / frac_scale;
    if (whole_bytes > std::numeric_limits<std::size_t>::max() - frac_bytes) return std::nullopt;
    return whole_bytes + frac_bytes;
  }
  return std::nullopt;
}

std::string format_bytes(std::int64_t bytes) {
  const bool negative = bytes < 0;
  const std::uint64_t mag =
      negative ? ~static_cast<std::uint64_t>(bytes) + 1 : static_cast<std::uint64_t>(bytes);
  const char* sign = negative ? "-" : "";
  if (mag < KiB) return fmt::format("{}{} B", sign, mag);
  constexpr std::array<std::string_view, 5> kNames = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(mag) / KiB;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{}{:.2f} {}", sign, value, kNames[unit]);
}

}  // namespace memtrade
