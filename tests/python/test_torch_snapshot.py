"""`memtrade trace --format torch-snapshot[-1.13]` and `run --trace-snapshot`: a memtrade trace as
a PyTorch memory snapshot, read by torch's own tool (`python3 -m torch.cuda._memory_viz stats`,
torch 1.13 here) and checked against the trace and the results: the active bytes at the end are
the trace's `allocated`, the segments' bytes its `reserved`, the active bytes at `--at peak` the
results' `peak_allocated`. The current dict format (pytorch.org/memory_viz, MemoryViz.js) is
checked for what that viewer relies on, replaying its events backwards as it does."""
import json
import pathlib
import pickle
import pprint
import subprocess
import sys

import pytest

torch_viz = pytest.importorskip("torch.cuda._memory_viz")

ROOT = pathlib.Path(__file__).resolve().parents[2]

# gpt-mini b8, the default config: its step holds activations well above its weights.
RUN = ["--model", "gpt-mini", "--batch-size", "8", "--backend", "cpu", "--warmup", "1",
       "--steps", "1", "--quiet"]
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom",
           "snapshot"}  # torch/csrc/cuda/memory_snapshot.cpp's action_to_str (no map/unmap here)


def run(binary, *args, ok=0):
    r = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == ok, r.stderr
    return r


@pytest.fixture(scope="module")
def traced(memtrade_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("snapshot")
    run(memtrade_bin, "run", *RUN, "--trace", tmp / "trace.json", "--trace-snapshot",
        tmp / "run.pickle", "--out", tmp / "r.json")
    trace = json.loads((tmp / "trace.json").read_text())
    results = json.loads((tmp / "r.json").read_text())
    snaps = {}
    for fmt in ("torch-snapshot", "torch-snapshot-1.13"):
        for at in ("end", "peak"):
            out = tmp / f"{fmt}-{at}.pickle"
            run(memtrade_bin, "trace", tmp / "trace.json", "--format", fmt, "-o", out, "--at", at)
            snaps[fmt, at] = out
    return {"tmp": tmp, "trace": trace, "point": results["points"][0], "snaps": snaps}


def load(path):
    data = path.read_bytes()
    assert data[:2] == b"\x80\x02"  # protocol 2 (the viewers read protocols <= 4)
    return pickle.loads(data)


def trace_end(trace):
    last = trace["events"][-1]
    return last["allocated"], last["reserved"]


def memviz_stats(path):
    """`python3 -m torch.cuda._memory_viz stats FILE`, torch's own tool, as it prints."""
    r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_torch_1_13_stats_match_the_trace(traced):
    trace, point = traced["trace"], traced["point"]
    allocated, reserved = trace_end(trace)
    assert any(e["kind"] == "free" for e in trace["events"])
    end = traced["snaps"]["torch-snapshot-1.13", "end"]
    stats = torch_viz.stats(load(end))
    assert stats["active_allocated"].value == allocated
    assert stats["total_size"].value == reserved
    assert stats["inactive"].value == reserved - allocated
    assert stats["segments"] == len(load(end)) == sum(
        1 for e in trace["events"] if e["kind"] == "segment_alloc") - sum(
        1 for e in trace["events"] if e["kind"] == "segment_free") + len(trace["segments_at_start"])
    # The command prints exactly those figures (Bytes rounds them for people).
    printed = memviz_stats(end)
    assert printed.strip() == pprint.pformat(stats).strip()
    print(f"\n_memory_viz stats (end):\n{printed}trace: allocated {allocated:,}, "
          f"reserved {reserved:,}")

    at_peak = traced["snaps"]["torch-snapshot-1.13", "peak"]
    peak = torch_viz.stats(load(at_peak))
    assert peak["active_allocated"].value == point["memory"]["peak_allocated"]
    print(f"_memory_viz stats (peak):\n{memviz_stats(at_peak)}"
          f"results: peak_allocated {point['memory']['peak_allocated']:,}")


def test_torch_1_13_segments_flamegraph_names_layers_and_ops(traced):
    """torch 1.13's `segments`: its flamegraph lines (flamegraph.pl itself, which it downloads,
    is left out): the bytes per state add up and the frames name the layer and op."""
    def flamegraph(at):
        snap = load(traced["snaps"]["torch-snapshot-1.13", at])
        lines = torch_viz.segments(snap, format_flamegraph=lambda text: text).splitlines()
        by_state, stacks = {}, set()
        for line in lines:
            stack, size = line.rsplit(" ", 1)
            parts = stack.split(";")  # stream, segment, state, frames outermost first
            by_state[parts[2]] = by_state.get(parts[2], 0) + int(size)
            stacks.add(";".join(parts[3:]))
        return by_state, stacks

    by_state, _ = flamegraph("end")
    allocated, reserved = trace_end(traced["trace"])
    # history holds the size asked for; the rest of an active block is its "<gaps>" line.
    assert by_state["active_allocated"] == allocated
    assert sum(by_state.values()) == reserved
    # At the peak (the loss backward, as in eager PyTorch) the forward's saved activations are
    # live beside the loss backward's (N, V) buffers: phase, layer, op.
    by_state, stacks = flamegraph("peak")
    assert by_state["active_allocated"] == traced["point"]["memory"]["peak_allocated"]
    assert "memtrade:0:forward;memtrade:0:block 0;memtrade:0:attention" in stacks
    assert "memtrade:0:backward;memtrade:0:head;memtrade:0:cross_entropy" in stacks
    assert "<non-python>" in stacks  # blocks live when the step started: no frames


def test_current_format_has_what_memory_viz_reads(traced):
    trace = traced["trace"]
    snap = load(traced["snaps"]["torch-snapshot", "end"])
    assert set(snap) == {"segments", "device_traces"}
    assert len(snap["device_traces"]) == 1
    segments = snap["segments"]
    assert [s["address"] for s in segments] == sorted(s["address"] for s in segments)
    blocks = {}  # as MemoryViz.js's annotate_snapshot places them: by the segment's address
    for s in segments:
        assert s["device"] == 0 and s["stream"] == 0
        assert s["segment_type"] in ("small", "large")
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
        active = [b for b in s["blocks"] if b["state"] == "active_allocated"]
        assert s["allocated_size"] == s["active_size"] == sum(b["size"] for b in active)
        addr = s["address"]
        for b in s["blocks"]:
            assert b["state"] in ("active_allocated", "inactive")
            assert set(b) >= {"size", "requested_size", "state", "frames"}
            if b["state"] == "active_allocated":
                assert 0 < b["requested_size"] <= b["size"]
                blocks[addr] = b["size"]
            addr += b["size"]
    allocated, reserved = trace_end(trace)
    assert sum(blocks.values()) == allocated
    assert sum(s["total_size"] for s in segments) == reserved

    events = snap["device_traces"][0]
    assert all(e["action"] in ACTIONS for e in events)
    assert {e["action"] for e in events} >= {"alloc", "free_requested", "free_completed"}
    for i, e in enumerate(events):
        assert {"action", "addr", "size", "stream", "frames"} <= set(e)
        if e["action"] == "free_requested":  # one pair per free: no pending frees
            assert events[i + 1]["action"] == "free_completed"
            assert events[i + 1]["addr"] == e["addr"]
    assert events[-1]["action"] == "snapshot"
    # MemoryViz.js pushes "unknown" on `categores` (sic) when events have categories but not it.
    categories = {e["category"] for e in events if "category" in e}
    assert "unknown" in categories and "activations" in categories
    # Frames name the op, then the layer, then the phase.
    names = [[f["name"] for f in e["frames"]] for e in events if e["action"] == "alloc"]
    assert ["attention", "block 0", "forward"] in names
    assert ["mlp", "block 0", "forward"] in names
    assert any(n[-1] == "backward" and "block 0" in n for n in names)
    assert all(f["filename"] == "memtrade" and f["line"] == 0
               for e in events for f in e["frames"])

    # MemoryViz.js's segment view replays the events backwards from the snapshot's state: every
    # alloc undone must be live, every segment undone must exist, every block in a segment.
    segs = {s["address"]: s["total_size"] for s in segments}
    live = dict(blocks)
    for e in reversed(events):
        a = e["action"]
        if a == "alloc":
            assert e["addr"] in live
            del live[e["addr"]]
        elif a == "free_completed":
            assert e["addr"] not in live
            live[e["addr"]] = e["size"]
        elif a == "segment_alloc":
            assert segs.pop(e["addr"]) == e["size"]
        elif a == "segment_free":
            segs[e["addr"]] = e["size"]
        for b in live:
            assert any(base <= b < base + size for base, size in segs.items())
    # ... and reaches the step's start: its segments and live blocks.
    start = trace["segments_at_start"]
    assert segs == {s["address"]: s["size"] for s in start}
    assert set(live) == {b["addr"] for s in start for b in s["blocks"]}


def test_run_trace_snapshot_is_the_converted_trace(traced):
    assert traced["tmp"].joinpath("run.pickle").read_bytes() == \
        traced["snaps"]["torch-snapshot", "end"].read_bytes()


def test_peak_snapshot_cuts_the_events_at_the_peak(traced):
    trace, point = traced["trace"], traced["point"]
    snap = load(traced["snaps"]["torch-snapshot", "peak"])
    active = sum(s["active_size"] for s in snap["segments"])
    assert active == point["memory"]["peak_allocated"]
    assert snap["device_traces"][0][-1] == {"action": "snapshot", "addr": 0, "size": active,
                                            "stream": 0, "frames": [], "category": "unknown"}
    assert max(e["allocated"] for e in trace["events"]) == active


def test_old_traces_still_validate_but_do_not_convert(memtrade_bin, traced, tmp_path):
    old = json.loads(json.dumps(traced["trace"]))
    del old["segments_at_start"]
    for e in old["events"]:
        del e["addr"], e["scope"]
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "schemas" / "trace.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(old)
    jsonschema.Draft202012Validator(schema).validate(traced["trace"])
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    r = run(memtrade_bin, "trace", path, "--format", "torch-snapshot", "-o", tmp_path / "s.pickle",
            ok=2)
    assert len(r.stderr.strip().splitlines()) == 1 and "segments_at_start" in r.stderr
    assert not (tmp_path / "s.pickle").exists()


@pytest.mark.parametrize("case", ["not_json", "not_trace", "bad_format", "bad_at", "missing",
                                  "inconsistent"])
def test_bad_input_is_one_line_and_exit_2(memtrade_bin, traced, tmp_path, case):
    good = traced["tmp"] / "trace.json"
    args = [good, "--format", "torch-snapshot"]
    if case == "not_json":
        (tmp_path / "x.json").write_text("{not json")
        args[0] = tmp_path / "x.json"
    elif case == "not_trace":
        (tmp_path / "x.json").write_text('{"schema": "memtrade.results/1"}')
        args[0] = tmp_path / "x.json"
    elif case == "bad_format":
        args[2] = "chrome"
    elif case == "bad_at":
        args += ["--at", "middle"]
    elif case == "missing":
        args[0] = tmp_path / "none.json"
    elif case == "inconsistent":  # a free of a block that was never allocated
        bad = json.loads(good.read_text())
        free = next(e for e in bad["events"] if e["kind"] == "free")
        free["addr"] += 1
        (tmp_path / "x.json").write_text(json.dumps(bad))
        args[0] = tmp_path / "x.json"
    r = run(memtrade_bin, "trace", *args, "-o", tmp_path / "s.pickle", ok=2)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("memtrade: ")
    assert not (tmp_path / "s.pickle").exists()
