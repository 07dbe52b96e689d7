// CachingAllocator: PyTorch's CUDA caching-allocator policy over any raw memory provider.
//
// Policy (so that figures mean what practitioners expect from torch.cuda.memory_stats):
//   - every request is rounded up to a multiple of 512 B;
//   - requests <= 1 MiB come from the small pool, whose segments are 2 MiB;
//   - requests in (1 MiB, 10 MiB) come from the large pool in 20 MiB segments;
//   - requests >= 10 MiB get their own segment, rounded up to 2 MiB;
//   - a cached free block is reused best-fit (smallest block that fits, then lowest address);
//   - a block is split when the remainder is >= 512 B (small pool) or > 1 MiB (large pool);
//   - freed blocks coalesce with free neighbours in the same segment;
//   - empty_cache() releases every segment with nothing allocated in it;
//   - when the raw provider fails (or `capacity` would be exceeded), cached free segments are
//     released and the request retried once (counted in num_alloc_retries); if that fails too,
//     OutOfMemory is thrown with the request, the capacity and the allocated/reserved bytes.
//
// Not thread-safe: one allocator belongs to one device and is driven from one host thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace memtrade {

// What a block holds. Every allocation carries one; the breakdown at peak is by category.
// `casts`: autocast's 16-bit copies of fp32 weights, made once per forward and kept until the
// backward that uses them (models/train/param_store.h), apart from `params` so that breakdowns show
// what autocast costs over the weights themselves.
enum class Category : std::uint8_t {
  params,
  master,
  casts,
  grads,
  optimizer,
  activations,
  temporaries,
  workspace,
  io,
};
inline constexpr std::size_t kNumCategories = 9;
std::string_view category_name(Category c);
std::optional<Category> category_from_name(std::string_view name);

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::size_t GiB = 1024 * MiB;

// Where segments come from: cudaMalloc, cudaHostAlloc (pinned) or plain host memory.
class RawProvider {
 public:
  virtual ~RawProvider() = default;
  // Returns nullptr when the memory cannot be had (never throws for lack of memory).
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* ptr, std::size_t bytes) noexcept = 0;
  virtual std::string_view name() const = 0;
};

// Host memory from aligned operator new (4 KiB aligned); the CPU backend's "device" memory.
class HostProvider final : public RawProvider {
 public:
  void* allocate(std::size_t bytes) override;
  void release(void* ptr, std::size_t bytes) noexcept override;
  std::string_view name() const override { return "host"; }
};

// Thrown when a request cannot be satisfied even after releasing the cache.
class OutOfMemory : public std::runtime_error {
 public:
  OutOfMemory(const std::string& message, std::size_t requested, std::size_t capacity,
              std::size_t allocated, std::size_t reserved)
      : std::runtime_error(message),
        requested_(requested),
        capacity_(capacity),
        allocated_(allocated),
        reserved_(reserved) {}
  std::size_t requested() const { return requested_; }
  std::size_t capacity() const { return capacity_; }  // 0 = no emulated capacity
  std::size_t allocated() const { return allocated_; }
  std::size_t reserved() const { return reserved_; }

 private:
  std::size_t requested_, capacity_, allocated_, reserved_;
};

// Thrown on misuse: size 0, double free, a pointer this allocator never handed out.
// The allocator's state is unchanged when it is thrown.
class AllocatorError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// A current value and its high-water mark.
struct StatPair {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  void add(std::int64_t delta) {
    current += delta;
    if (current > peak) peak = current;
  }
};

struct AllocatorStats {
  StatPair allocated;  // rounded sizes of live blocks            (torch: allocated_bytes)
  StatPair requested;  // sizes asked for by live allocations     (torch: requested_bytes)
  StatPair reserved;   // bytes of all segments                   (torch: reserved_bytes)
  StatPair active;     // live blocks, count                      (torch: active)
  StatPair segments;   // segments, count                         (torch: segment)
  std::int64_t num_allocs = 0;
  std::int64_t num_frees = 0;
  std::int64_t num_segment_allocs = 0;  // raw provider calls that succeeded
  std::int64_t num_segment_frees = 0;
  std::int64_t num_alloc_retries = 0;  // cache released and request retried
  std::int64_t num_ooms = 0;
  // Allocated bytes per category right now, and at the moment `allocated` last hit its peak.
  std::array<std::int64_t, kNumCategories> by_category{};
  std::array<std::int64_t, kNumCategories> by_category_at_peak{};
};

// One alloc/free as seen by the optional trace (for memory-timeline charts).
struct TraceEvent {
  enum class Kind : std::uint8_t { alloc, free, segment_alloc, segment_free, oom };
  Kind kind;
  std::uint64_t seq;      // monotonically increasing per allocator
  std::size_t bytes;      // rounded block size (segment size for segment events)
  std::size_t requested;  // size asked for (alloc/free/oom)
  Category category;
  std::string phase;  // as set by set_phase() at the time of the event
  std::int64_t allocated_after;
  std::int64_t reserved_after;
  std::uintptr_t addr;  // the block (alloc/free), the segment's base (segment events), 0 (oom)
  std::string scope;    // the scope stack at the event, outermost first, '/'-joined ("" = none)
};

class CachingAllocator {
 public:
  static constexpr std::size_t kMinBlock = 512;
  static constexpr std::size_t kSmallRequest = 1 * MiB;  // <= this: small pool
  static constexpr std::size_t kSmallSegment = 2 * MiB;
  static constexpr std::size_t kLargeSegment = 20 * MiB;
  static constexpr std::size_t kOwnSegmentThreshold = 10 * MiB;  // >= this: own segment
  static constexpr std::size_t kOwnSegmentRound = 2 * MiB;

  // `capacity` = 0 means unlimited (the provider's own limit still applies).
  explicit CachingAllocator(std::unique_ptr<RawProvider> provider, std::size_t capacity = 0);
  ~CachingAllocator();  // releases every segment back to the provider
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Throws AllocatorError for bytes == 0, OutOfMemory when it cannot be satisfied.
  void* allocate(std::size_t bytes, Category category);
  // Throws AllocatorError for a pointer that is not a live block of this allocator.
  void free(void* ptr);
  // Release every segment with nothing allocated in it.
  void empty_cache();

  // Peaks restart from the current values (torch.cuda.reset_peak_memory_stats).
  void reset_peak();
  const AllocatorStats& stats() const { return stats_; }

  void set_capacity(std::size_t bytes) { capacity_ = bytes; }
  std::size_t capacity() const { return capacity_; }

  // Optional event trace; off by default. The phase labels events ("forward", "optimizer", ...).
  void enable_trace(bool on) { trace_on_ = on; }
  void set_phase(std::string_view phase) { phase_ = phase; }
  const std::string& phase() const { return phase_; }
  const std::vector<TraceEvent>& trace() const { return trace_; }
  void clear_trace() { trace_.clear(); }
  // Scopes name where an allocation comes from (phase, layer, op: "forward/block 3/attention");
  // ScopedRange (kernels/device.h) opens one. Kept as one joined string, so that pushing and
  // popping allocate nothing once its capacity has grown. pop_scope() without a scope: no-op.
  void push_scope(std::string_view name);
  void pop_scope();
  const std::string& scope() const { return scope_; }

  // The rounded size a request would get, and the segment size a fresh one would need.
  static std::size_t round_size(std::size_t bytes);
  static std::size_t segment_size_for(std::size_t rounded);

  // Size asked for / rounded block size of a live pointer (AllocatorError if not live).
  std::size_t requested_size(void* ptr) const;
  std::size_t block_size(void* ptr) const;
  Category category_of(void* ptr) const;
  bool owns(const void* ptr) const;  // a live block of this allocator?

  // Snapshot of segments for tests, debugging and the trace's segments at a step's start:
  // (segment base, size, allocated bytes, pool) and every block in address order (free
  // neighbours are always coalesced, so free blocks lie between live ones).
  struct BlockInfo {
    std::uintptr_t addr;
    std::size_t size;
    std::size_t requested;  // 0 when free
    bool allocated;
    Category category;  // of the live block (meaningless when free)
  };
  struct SegmentInfo {
    std::uintptr_t base;
    std::size_t size;
    std::size_t allocated;
    bool small_pool;
    std::vector<BlockInfo> blocks;
  };
  std::vector<SegmentInfo> segments() const;

  std::string_view provider_name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::size_t capacity_;
  AllocatorStats stats_;
  bool trace_on_ = false;
  std::string phase_;
  std::vector<TraceEvent> trace_;
  std::string scope_;                     // the open scopes, '/'-joined
  std::vector<std::size_t> scope_marks_;  // scope_'s length before each open scope
};

// Parses "24GiB", "512MiB", "16GB", "1.5 GiB", "1048576" (bytes) or a card preset name
// ("a10g", "l4", "a100-40g", "a100-80g", "h100", "h200", "rtx4090", "t4", "v100-16g"...).
// Returns nullopt on anything else.
std::optional<std::size_t> parse_capacity(std::string_view text);
// "1.50 GiB", "512.0 MiB", "812 B": human-readable bytes.
std::string format_bytes(std::int64_t bytes);

}  // namespace memtrade
