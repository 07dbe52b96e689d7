"""memtrade's side of the peers: run it, list its points as it resolves them, read its step
dumps and traces. Nothing of memtrade is re-implemented here: ids, defaults, learning rates and
checkpoint plans all come from the binary (`run --list --json`, `knobs --json`, meta.json).
"""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "peers"))
from reports.load import InputError, load_trace  # noqa: E402  (one reader of memtrade.trace/1)

STEP_SCHEMA = "memtrade.step/1"


class BadInput(Exception):
    """Bad user input: one line, exit code 2."""


def run(binary, args, what):
    """Runs `binary args...` (run_output, its stdout dropped)."""
    run_output(binary, args, what)


def knob_flags(model, batch_size, checkpoint, precision, accumulation=1,
               autocast_policy="torch-cuda"):
    return ["--backend", "cpu", "--model", model, "--batch-size", str(batch_size),
            "--checkpoint", str(checkpoint), "--precision", precision,
            "--autocast-policy", autocast_policy,
            "--accumulation", str(accumulation), "--optimizer", "sgd"]


def make_dump(binary, out_dir, flags):
    run(binary, ["step", *flags, "--dump", str(out_dir)], "step --dump")
    return pathlib.Path(out_dir)


def make_trace(binary, out_dir, flags):
    """One measured step (no warm-up) of the point, traced: returns the trace path."""
    out_dir = pathlib.Path(out_dir)
    trace = out_dir / "trace.json"
    run(binary, ["run", *flags, "--warmup", "0", "--steps", "1", "--trace", str(trace),
                 "--out", str(out_dir / "results.json")], "run --trace")
    return trace


def load_meta(dump_dir):
    path = pathlib.Path(dump_dir) / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file (not a `memtrade step --dump` directory?)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise BadInput(f"{path}: cannot read: {e}") from None
    if not isinstance(meta, dict) or meta.get("schema") != STEP_SCHEMA:
        raise BadInput(f"{path}: schema is not {STEP_SCHEMA!r}")
    for key in ("config", "hyper"):
        if not isinstance(meta.get(key), dict):
            raise BadInput(f"{path}: \"{key}\" must be an object")
    return meta


def read_trace(path):
    try:
        doc = load_trace(path)
    except InputError as e:
        raise BadInput(str(e)) from None
    if not isinstance(doc.get("config"), dict) or not isinstance(doc["config"].get("hyper"), dict):
        raise BadInput(f"{path}: \"config\" with \"hyper\" missing (trace from an old memtrade?)")
    return doc


def live_at_end_of_forward(trace, category="activations"):
    """memtrade's `category` bytes live at the end of the traced step's last forward.

    The end of forward is the last point in the event stream where the allocator's phase label
    changes from "forward" to "backward": after the last forward event that a backward event
    follows (with accumulation: the last micro-batch's forward). Live bytes are
    live_at_start[category] plus the step's allocs minus its frees of that category up to there,
    in allocator bytes (`bytes`, rounded as the caching allocator rounds) and in requested bytes
    (`requested`, what the tensors asked for; live_at_start is 0 in both at a step's start, or
    the requested count is reported as None). `activations` is what forward keeps for backward;
    `casts` autocast's 16-bit weight copies.
    Returns {"bytes": int, "requested": int or None, "event": index of that last forward event}.
    """
    events = trace["events"]
    end = None
    for i in range(len(events) - 1):
        if events[i].get("phase") == "forward" and events[i + 1].get("phase") == "backward":
            end = i
    if end is None:
        raise BadInput(f"{trace.get('_path', 'trace')}: no forward->backward phase change "
                       f"(not a training step?)")
    start = int(trace.get("live_at_start", {}).get(category, 0))
    live, requested = start, start
    for e in events[: end + 1]:
        if e.get("category") != category or e["kind"] not in ("alloc", "free"):
            continue
        sign = 1 if e["kind"] == "alloc" else -1
        live += sign * e["bytes"]
        requested += sign * int(e.get("requested", e["bytes"]))
    return {"bytes": live, "requested": requested if start == 0 else None, "event": end}


def checkpoint_plan(resolved, n_blocks):
    """memtrade's checkpoint plan, as it resolved it (`checkpoint_plan` of a dump's meta.json or
    of a point of `run --list --json`): {"selective": bool, "segments": [[begin, end,
    recompute], ...]}, checked to cover the blocks in order."""
    plan = resolved.get("checkpoint_plan")
    segs = plan.get("segments") if isinstance(plan, dict) else None
    if not isinstance(segs, list) or any(len(s) != 3 for s in segs):
        raise BadInput("checkpoint_plan: expected {\"selective\": bool, "
                       "\"segments\": [[begin, end, recompute], ...]} (a memtrade before 0.2?)")
    covered = [b for s in segs for b in range(int(s[0]), int(s[1]))]
    if covered != list(range(n_blocks)):
        raise BadInput(f"checkpoint_plan: segments do not cover blocks 0..{n_blocks - 1} in order")
    return plan


# ---- points as memtrade resolves them ----------------------------------------------------------

def run_output(binary, args, what):
    """stdout of `binary args...`; a failure is BadInput carrying memtrade's own last line."""
    try:
        r = subprocess.run([str(binary), *args], capture_output=True, text=True)
    except OSError as e:
        raise BadInput(f"cannot run {binary}: {e}") from None
    if r.returncode != 0:
        out = r.stderr.strip() or r.stdout.strip() or f"exit code {r.returncode}"
        raise BadInput(f"memtrade {what} failed: {out.splitlines()[-1]}")
    return r.stdout


def knob_table(binary):
    """The knob table (`memtrade knobs --json`): every axis with its flag and default."""
    return json.loads(run_output(binary, ["knobs", "--json"], "knobs --json"))


def list_points(binary, args):
    """`memtrade run ARGS --list --json`: {"grid", "backend", "run", "points": [{"id",
    "config" (every axis, seed, hyper), "resolved" (lr, optimizer_hyper, checkpoint_plan)}]}."""
    return json.loads(run_output(binary, ["run", *args, "--list", "--json"], "run --list --json"))


def flags_of(config, table):
    """The knob flags that select `config` (every axis of the table the config has, + seed)."""
    flags = []
    for k in table:
        if k["name"] in config:
            flags += [k["flag"], str(config[k["name"]])]
    if "seed" in config:
        flags += ["--seed", str(config["seed"])]
    return flags
