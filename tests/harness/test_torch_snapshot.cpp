// The trace -> PyTorch snapshot replay (harness/run/torch_snapshot.h) on a hand-made trace: the
// blocks tile their segments in address order, frames run from the op out to the phase, the
// peak cuts the events, and a trace that does not replay is bad input. Real traces, read by
// torch's own tool: tests/python/test_torch_snapshot.py.
#include <gtest/gtest.h>

#include <string>

#include "harness/common/bad_input.h"
#include "harness/run/torch_snapshot.h"

namespace memtrade {
namespace {

using nlohmann::json;

constexpr std::uint64_t kBase = 0x7f0000000000;  // above 2^32, as host addresses are
constexpr std::uint64_t kSeg = 2 * 1024 * 1024;

json event(const char* kind, std::uint64_t addr, std::uint64_t bytes, std::uint64_t requested,
           std::int64_t allocated, std::int64_t reserved, const char* scope = "") {
  return {{"seq", 0},
          {"kind", kind},
          {"bytes", bytes},
          {"requested", requested},
          {"category", "activations"},
          {"phase", "forward"},
          {"allocated", allocated},
          {"reserved", reserved},
          {"addr", addr},
          {"scope", scope}};
}

// One 2 MiB segment holding a 512-byte parameter at its base; the step allocates 1024 bytes
// after it (the peak), allocates a second segment, frees the 1024 bytes, frees the segment.
json trace() {
  json segs = json::array(
      {{{"address", kBase},
        {"size", kSeg},
        {"pool", "small"},
        {"blocks",
         json::array(
             {{{"addr", kBase}, {"size", 512}, {"requested", 100}, {"category", "params"}}})}}});
  json events = json::array({
      event("alloc", kBase + 512, 1024, 1000, 1536, kSeg, "forward/block 0/attention"),
      event("segment_alloc", kBase + kSeg, kSeg, 0, 1536, 2 * kSeg, "forward/block 0"),
      event("free", kBase + 512, 1024, 1000, 512, 2 * kSeg, "forward/block 0"),
      event("segment_free", kBase + kSeg, kSeg, 0, 512, kSeg),
  });
  return {{"schema", "memtrade.trace/1"},
          {"point", "p"},
          {"config", {{"model", "m"}}},
          {"segments_at_start", segs},
          {"events", events}};
}

TEST(TorchSnapshot, EndStateAndEvents) {
  const json s = torch_snapshot(trace(), SnapshotFormat::current, SnapshotAt::end, "t");
  ASSERT_EQ(s["segments"].size(), 1u);
  const json& seg = s["segments"][0];
  EXPECT_EQ(seg["address"], kBase);
  EXPECT_EQ(seg["total_size"], kSeg);
  EXPECT_EQ(seg["allocated_size"], 512);
  EXPECT_EQ(seg["segment_type"], "small");
  ASSERT_EQ(seg["blocks"].size(), 2u);
  EXPECT_EQ(seg["blocks"][0]["state"], "active_allocated");
  EXPECT_EQ(seg["blocks"][0]["requested_size"], 100);
  EXPECT_EQ(seg["blocks"][0]["frames"], json::array());  // live before the step
  EXPECT_EQ(seg["blocks"][1]["state"], "inactive");
  EXPECT_EQ(seg["blocks"][1]["size"], kSeg - 512);

  const json& ev = s["device_traces"][0];
  std::vector<std::string> actions;
  for (const json& e : ev) actions.push_back(e["action"]);
  EXPECT_EQ(actions, (std::vector<std::string>{"alloc", "segment_alloc", "free_requested",
                                               "free_completed", "segment_free", "snapshot"}));
  EXPECT_EQ(ev[0]["size"], 1000);  // the size asked for, as PyTorch records it
  EXPECT_EQ(ev[0]["category"], "activations");
  json names = json::array();
  for (const json& f : ev[0]["frames"]) names.push_back(f["name"]);
  EXPECT_EQ(names, json::array({"attention", "block 0", "forward"}));
  EXPECT_EQ(ev[3]["frames"], ev[0]["frames"]);  // a free carries its allocation's frames
  EXPECT_EQ(ev[1]["size"], kSeg);
  EXPECT_EQ(ev[5]["size"], 512);  // snapshot: the active bytes
  EXPECT_EQ(ev[5]["category"], "unknown");
}

TEST(TorchSnapshot, PeakCutsTheEvents) {
  const json s = torch_snapshot(trace(), SnapshotFormat::current, SnapshotAt::peak, "t");
  EXPECT_EQ(s["device_traces"][0].size(), 2u);  // the alloc that reached the peak, snapshot
  const json& blocks = s["segments"][0]["blocks"];
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[1]["size"], 1024);
  EXPECT_EQ(blocks[1]["state"], "active_allocated");
  EXPECT_EQ(s["device_traces"][0][1]["size"], 1536);
}

TEST(TorchSnapshot, Torch113IsAListOfSegmentsWithHistory) {
  const json s = torch_snapshot(trace(), SnapshotFormat::torch_1_13, SnapshotAt::peak, "t");
  ASSERT_TRUE(s.is_array());
  const json& b = s[0]["blocks"][1];
  EXPECT_EQ(b["history"][0]["addr"], kBase + 512);
  EXPECT_EQ(b["history"][0]["real_size"], 1000);
  EXPECT_FALSE(b.contains("frames"));
}

TEST(TorchSnapshot, TracesThatDoNotReplayAreBadInput) {
  auto refused = [](json t, const std::string& what) {
    try {
      torch_snapshot(t, SnapshotFormat::current, SnapshotAt::end, "t.json");
      ADD_FAILURE() << "accepted: " << what;
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("t.json: ", 0), 0u) << e.what();
    }
  };
  json t = trace();
  t.erase("segments_at_start");
  refused(t, "segments_at_start");  // an old trace
  t = trace();
  t["events"][0].erase("addr");
  refused(t, "no `addr`");
  t = trace();
  t["events"][2]["addr"] = kBase + 1024;
  refused(t, "no live block there");
  t = trace();
  t["events"][0]["addr"] = kBase + 256;  // inside the parameter
  refused(t, "overlaps a live block");
  t = trace();
  t["events"][0]["addr"] = kBase + 2 * kSeg;
  refused(t, "lies in no segment");
  t = trace();
  t["events"].erase(2);  // no alloc, no free: then free the parameter's segment
  t["events"].erase(0);
  t["events"][1]["addr"] = kBase;
  refused(t, "still holds blocks");
  t = trace();
  t["schema"] = "memtrade.results/1";
  refused(t, "not a memtrade.trace/1");
}

}  // namespace
}  // namespace memtrade
