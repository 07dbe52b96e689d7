// A memtrade.trace/1 file as a PyTorch memory snapshot, the pickle that
// torch.cuda.memory._snapshot() returns, so PyTorch's own viewers read memtrade's step:
//   - torch-snapshot: the current format, a dict {segments, device_traces}, which
//     pytorch.org/memory_viz (torch/utils/viz/MemoryViz.js) and torch.cuda._memory_viz read;
//   - torch-snapshot-1.13: torch 1.13's format, the list of segments whose blocks carry
//     `history`, which torch 1.13's `python3 -m torch.cuda._memory_viz stats|segments` reads.
// The allocator state is replayed from the trace alone: its segments at the step's start, then
// every event's address. Frames are the allocator's scopes (layer, op) and the phase.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace memtrade {

enum class SnapshotFormat { current, torch_1_13 };
std::optional<SnapshotFormat> snapshot_format_from_name(std::string_view name);

// Where the snapshot's state is taken: after the step's last event, or at its peak of
// allocated bytes (the first event that reaches it; the trace is cut there).
enum class SnapshotAt { end, peak };
std::optional<SnapshotAt> snapshot_at_from_name(std::string_view name);

// Throws BadInput "`label`: problem" for a trace that is not memtrade.trace/1, has no
// addresses (written before they were recorded) or whose events do not replay.
nlohmann::json torch_snapshot(const nlohmann::json& trace, SnapshotFormat format, SnapshotAt at,
                              const std::string& label);

}  // namespace memtrade
