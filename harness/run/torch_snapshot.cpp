// The snapshot's fields are PyTorch's (cited per format below); memtrade has one device, one
// stream and no pending frees, so every block is active_allocated or inactive, every stream 0
// and each free is a free_requested directly followed by its free_completed.
#include "harness/run/torch_snapshot.h"

#include <cstdint>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "harness/common/bad_input.h"

namespace memtrade {

std::optional<SnapshotFormat> snapshot_format_from_name(std::string_view name) {
  if (name == "torch-snapshot") return SnapshotFormat::current;
  if (name == "torch-snapshot-1.13") return SnapshotFormat::torch_1_13;
  return std::nullopt;
}

std::optional<SnapshotAt> snapshot_at_from_name(std::string_view name) {
  if (name == "end") return SnapshotAt::end;
  if (name == "peak") return SnapshotAt::peak;
  return std::nullopt;
}

namespace {

using nlohmann::json;

struct Block {
  std::uint64_t size = 0;
  std::uint64_t requested = 0;
  json frames = json::array();
};

struct Segment {
  std::uint64_t size = 0;
  bool small = false;
  std::map<std::uint64_t, Block> live;  // by address
};

// Frames, innermost first as PyTorch records a stack: the scopes "forward/block 3/attention"
// from the last (the op) to the first (the phase: the trainer's phases are scopes too); the
// phase is added when the scope does not start with it. memtrade has no source lines: the file
// is "memtrade", the line 0 (_memory_viz prints `memtrade:0:attention`).
json frames_of(const std::string& scope, const std::string& phase) {
  json frames = json::array();
  auto frame = [](std::string name) {
    return json{{"filename", "memtrade"}, {"line", 0}, {"name", std::move(name)}};
  };
  std::size_t end = scope.size();
  std::string outermost;
  while (end > 0) {
    const std::size_t slash = scope.rfind('/', end - 1);
    const std::size_t begin = slash == std::string::npos ? 0 : slash + 1;
    outermost = scope.substr(begin, end - begin);
    frames.push_back(frame(outermost));
    end = slash == std::string::npos ? 0 : slash;
  }
  if (!phase.empty() && outermost != phase) frames.push_back(frame(phase));
  return frames;
}

class Replay {
 public:
  explicit Replay(std::string label) : label_(std::move(label)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw BadInput(fmt::format("{}: {}", label_, what));
  }

  void add_segment(std::uint64_t base, std::uint64_t size, bool small) {
    if (size == 0) fail(fmt::format("segment at {:#x} has size 0", base));
    auto next = segments_.lower_bound(base);
    if ((next != segments_.end() && next->first < base + size) ||
        (next != segments_.begin() && base < std::prev(next)->first + std::prev(next)->second.size))
      fail(fmt::format("segment at {:#x} overlaps another", base));
    segments_[base] = Segment{size, small, {}};
  }

  void remove_segment(std::uint64_t base) {
    auto it = segments_.find(base);
    if (it == segments_.end()) fail(fmt::format("segment_free of {:#x}, no segment there", base));
    if (!it->second.live.empty())
      fail(fmt::format("segment_free of {:#x}, which still holds blocks", base));
    segments_.erase(it);
  }

  void alloc(std::uint64_t addr, Block b) {
    auto it = segments_.upper_bound(addr);
    if (it == segments_.begin()) fail(fmt::format("block at {:#x} lies in no segment", addr));
    --it;
    Segment& seg = it->second;
    if (b.size == 0 || addr + b.size > it->first + seg.size)
      fail(fmt::format("block at {:#x} lies in no segment", addr));
    auto next = seg.live.lower_bound(addr);
    if ((next != seg.live.end() && next->first < addr + b.size) ||
        (next != seg.live.begin() && addr < std::prev(next)->first + std::prev(next)->second.size))
      fail(fmt::format("block at {:#x} overlaps a live block", addr));
    seg.live[addr] = std::move(b);
  }

  Block free(std::uint64_t addr) {
    auto it = segments_.upper_bound(addr);
    if (it != segments_.begin()) {
      Segment& seg = std::prev(it)->second;
      auto b = seg.live.find(addr);
      if (b != seg.live.end()) {
        Block out = std::move(b->second);
        seg.live.erase(b);
        return out;
      }
    }
    fail(fmt::format("free of {:#x}, no live block there", addr));
  }

  const std::map<std::uint64_t, Segment>& segments() const { return segments_; }

 private:
  std::string label_;
  std::map<std::uint64_t, Segment> segments_;
};

std::uint64_t u64(const json& j, const char* key, const Replay& r, const std::string& where) {
  auto it = j.find(key);
  // Parsed JSON holds non-negative integers as unsigned; one built in C++ may hold them signed.
  if (it == j.end() || !it->is_number_integer() ||
      (!it->is_number_unsigned() && it->get<std::int64_t>() < 0))
    r.fail(fmt::format("{}: `{}` missing or not a non-negative integer", where, key));
  return it->get<std::uint64_t>();
}

// Segments in address order, blocks in address order (the free space between live blocks is
// one inactive block each: the allocator coalesces free neighbours). Fields of the current
// format: torch/csrc/cuda/memory_snapshot.cpp (segmentInfoToDict, blockInfo) as
// MemoryViz.js and torch/cuda/_memory_viz.py read them; of 1.13: torch/csrc/cuda/Module.cpp's
// snapshot in v1.13.0 (blocks with `history` [{addr, real_size, frames}]).
json segments_json(const Replay& replay, SnapshotFormat format) {
  json out = json::array();
  for (const auto& [base, seg] : replay.segments()) {
    json blocks = json::array();
    std::uint64_t addr = base, allocated = 0, requested = 0;
    auto inactive = [&](std::uint64_t size) {
      json b = {{"size", size}, {"state", "inactive"}};
      if (format == SnapshotFormat::current) {
        b["requested_size"] = 0;
        b["frames"] = json::array();
      }
      blocks.push_back(std::move(b));
    };
    for (const auto& [baddr, b] : seg.live) {
      if (baddr > addr) inactive(baddr - addr);
      json jb = {{"size", b.size}, {"state", "active_allocated"}};
      if (format == SnapshotFormat::current) {
        jb["requested_size"] = b.requested;
        jb["frames"] = b.frames;
      } else {
        jb["history"] =
            json::array({{{"addr", baddr}, {"real_size", b.requested}, {"frames", b.frames}}});
      }
      blocks.push_back(std::move(jb));
      allocated += b.size;
      requested += b.requested;
      addr = baddr + b.size;
    }
    if (addr < base + seg.size) inactive(base + seg.size - addr);
    json s = {{"device", 0},
              {"address", base},
              {"total_size", seg.size},
              {"allocated_size", allocated},
              {"active_size", allocated},
              {"stream", 0},
              {"segment_type", seg.small ? "small" : "large"},
              {"blocks", std::move(blocks)}};
    if (format == SnapshotFormat::current) {
      s["requested_size"] = requested;
      s["frames"] = json::array();
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

json torch_snapshot(const json& trace, SnapshotFormat format, SnapshotAt at,
                    const std::string& label) {
  Replay replay(label);
  if (!trace.is_object() || trace.value("schema", "") != "memtrade.trace/1")
    replay.fail("not a memtrade.trace/1 file (`memtrade run --trace FILE` writes one)");
  const auto events = trace.find("events");
  if (events == trace.end() || !events->is_array()) replay.fail("no `events` list");
  const auto at_start = trace.find("segments_at_start");
  if (at_start == trace.end() || !at_start->is_array())
    replay.fail(
        "the trace has no `segments_at_start` and no addresses (written by a memtrade before "
        "0.4's snapshots): run `memtrade run --trace` again");

  std::int64_t allocated_at_start = 0;
  for (std::size_t i = 0; i < at_start->size(); ++i) {
    const json& s = (*at_start)[i];
    const std::string where = fmt::format("segments_at_start[{}]", i);
    if (!s.is_object()) replay.fail(where + " is not an object");
    const std::uint64_t base = u64(s, "address", replay, where);
    const std::string pool = s.value("pool", "");
    if (pool != "small" && pool != "large") replay.fail(where + ": `pool` is not small or large");
    replay.add_segment(base, u64(s, "size", replay, where), pool == "small");
    if (!s.contains("blocks") || !s["blocks"].is_array()) replay.fail(where + ": no `blocks`");
    for (const json& b : s["blocks"]) {
      if (!b.is_object()) replay.fail(where + ": a block is not an object");
      Block blk{u64(b, "size", replay, where), u64(b, "requested", replay, where), json::array()};
      allocated_at_start += static_cast<std::int64_t>(blk.size);
      replay.alloc(u64(b, "addr", replay, where), std::move(blk));
    }
  }

  // The last event replayed: every one, or the first that reaches the step's peak (none when
  // the step never rises above its start).
  std::size_t count = events->size();
  if (at == SnapshotAt::peak) {
    std::int64_t peak = allocated_at_start;
    count = 0;
    for (std::size_t i = 0; i < events->size(); ++i) {
      const json& e = (*events)[i];
      const std::int64_t a = e.is_object() ? e.value("allocated", std::int64_t{0}) : 0;
      if (a > peak) {
        peak = a;
        count = i + 1;
      }
    }
  }

  // Actions: torch/csrc/cuda/memory_snapshot.cpp's action_to_str; sizes as
  // c10/cuda/CUDACachingAllocator.cpp records them (the size asked for on alloc and frees,
  // the segment's size on segment events); frees carry the frames of their allocation
  // (context_when_allocated), as PyTorch's do.
  json trace_events = json::array();
  for (std::size_t i = 0; i < count; ++i) {
    const json& e = (*events)[i];
    const std::string where = fmt::format("events[{}]", i);
    if (!e.is_object()) replay.fail(where + " is not an object");
    const std::string kind = e.value("kind", "");
    const std::string category = e.value("category", "");
    if (kind == "oom") {
      // A trace is written only for a step that finished: no oom in practice. The device's
      // free bytes are not in the trace, so `device_free` is left out.
      trace_events.push_back({{"action", "oom"},
                              {"addr", 0},
                              {"size", u64(e, "requested", replay, where)},
                              {"stream", 0},
                              {"frames", frames_of(e.value("scope", ""), e.value("phase", ""))}});
      continue;
    }
    if (!e.contains("addr"))
      replay.fail(where + ": no `addr` (a trace written before addresses were recorded)");
    const std::uint64_t addr = u64(e, "addr", replay, where);
    const std::uint64_t bytes = u64(e, "bytes", replay, where);
    if (kind == "segment_alloc" || kind == "segment_free") {
      if (kind == "segment_alloc")
        replay.add_segment(addr, bytes, bytes == 2u * 1024 * 1024);
      else
        replay.remove_segment(addr);
      trace_events.push_back({{"action", kind},
                              {"addr", addr},
                              {"size", bytes},
                              {"stream", 0},
                              {"frames", json::array()}});
    } else if (kind == "alloc") {
      Block b{bytes, u64(e, "requested", replay, where),
              frames_of(e.value("scope", ""), e.value("phase", ""))};
      trace_events.push_back({{"action", "alloc"},
                              {"addr", addr},
                              {"size", b.requested},
                              {"stream", 0},
                              {"frames", b.frames},
                              {"category", category}});
      replay.alloc(addr, std::move(b));
    } else if (kind == "free") {
      const Block b = replay.free(addr);
      for (const char* action : {"free_requested", "free_completed"})
        trace_events.push_back({{"action", action},
                                {"addr", addr},
                                {"size", b.requested},
                                {"stream", 0},
                                {"frames", b.frames},
                                {"category", category}});
    } else {
      replay.fail(fmt::format("{}: unknown kind `{}`", where, kind));
    }
  }

  json segments = segments_json(replay, format);
  if (format == SnapshotFormat::torch_1_13) return segments;
  // Taking a snapshot is itself recorded: `snapshot`, address 0, the active bytes
  // (CUDACachingAllocator.cpp's snapshot(): record_trace(TraceEntry::SNAPSHOT, 0, total_active,
  // ...)). Its category is "unknown", PyTorch's name for memory of no category
  // (torch/cuda/_memory_viz.py's _profile_to_snapshot); MemoryViz.js needs "unknown" among the
  // categories once any event has one: otherwise it pushes it on `snapshot.categores` (sic),
  // which throws.
  std::uint64_t active = 0;
  for (const json& seg : segments) active += seg["active_size"].get<std::uint64_t>();
  trace_events.push_back({{"action", "snapshot"},
                          {"addr", 0},
                          {"size", active},
                          {"stream", 0},
                          {"frames", json::array()},
                          {"category", "unknown"}});
  return json{{"segments", std::move(segments)},
              {"device_traces", json::array({std::move(trace_events)})}};
}

}  // namespace memtrade
