#!/usr/bin/env python3
"""memtrade's grid points in PyTorch eager: the peer that memtrade's numbers are judged against.

    torch_step.py --points RESULTS.json --memtrade BIN --out torch.json [--device cuda|cpu]
    torch_step.py --grid FILE.toml      --memtrade BIN --out torch.json [--device cuda|cpu]
    torch_step.py --model M [any memtrade knob flag ...] --memtrade BIN --out torch.json
    common: [--warmup W] [--steps S] [--timeout SECONDS] [--threads N]

Every point comes from memtrade itself, as it resolves it: `BIN run ... --list --json` gives each
point's id, full config (every axis, the model's hyper-parameters) and what memtrade derives
from it (learning rate and optimizer hyper-parameters, checkpoint plan, loss-scale settings), so
the peer runs exactly memtrade's points without re-implementing any of memtrade's rules. --grid
and the knob flags go to `run --list --json` as they are; --points re-lists each point of a
results file from its config (the knob table of `BIN knobs --json` maps config keys to flags).

The output is a memtrade results file (schema memtrade.results/1) with meta.peer =
"pytorch-eager" and memtrade's point ids, so `memtrade compare torch.json memtrade.json` and the
reports put the two side by side. Each point runs in its own Python process (as memtrade runs
each in its own child), so the CUDA caching allocator's peaks never leak between points.

How each knob maps onto PyTorch eager:
  precision   fp32: plain fp32, TF32 off for matmul and cuDNN; tf32: both on (CUDA only);
              fp16 / bf16: torch.autocast (fp32 weights = the master copy), fp16 with GradScaler
              (memtrade's init scale and growth interval, growth x2, back-off x0.5), on the
              device's own op lists: memtrade's autocast_policy must name that device;
              fp16-o2 / bf16-o2 (16-bit weights, fp32 master) have no eager counterpart;
              fp16-pure / bf16-pure: model.half() / .bfloat16(); fp16-pure keeps memtrade's
              dynamic loss scaling by hand (GradScaler refuses fp16 gradients).
  checkpoint  torch.utils.checkpoint (non-reentrant) on memtrade's resolved plan (its
              segments); selective has no eager equivalent -> skipped.
  offload     activations: torch.autograd.graph.save_on_cpu(pin_memory=True); optimizer and
              params have no eager equivalent -> skipped.
  optimizer_impl  foreach: torch.optim's foreach=True (_multi_tensor_*); forloop: foreach=False;
              fused: fused=True (CUDA only in torch 1.13 -> skipped on the CPU).
  zero_grad   optimizer.zero_grad(set_to_none=...) after every step (grads of set_to_none are
              freed before the next forward; zero keeps them resident, zero-filled).
  mode        eval: model.eval() + torch.no_grad(), forward only, no optimizer.
  empty_cache per_step: torch.cuda.empty_cache() at the end of every step.
  input       pinned: pin_memory() host batches copied with non_blocking=True; pageable: plain.
  accumulation k micro-batches of batch_size, each loss / k, one optimizer step.
Time: CUDA events around each whole step (input copy .. loss read-back .. empty_cache) on the
current stream; perf_counter on the CPU. Memory: peaks of torch.cuda's caching allocator after
reset_peak_memory_stats() at the end of warm-up (null on the CPU); device_peak is the largest
cudaMemGetInfo used-bytes seen after a measured step, as memtrade's.
Exit: 0 all points written (ok/oom/skipped are results), 1 some point errored or timed out,
2 bad input.
"""
import argparse
import datetime
import json
import multiprocessing
import os
import pathlib
import socket
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import memtrade_side  # noqa: E402
import peer_point  # noqa: E402
from memtrade_side import BadInput  # noqa: E402


# ---- points, as memtrade resolves them ------------------------------------------------------

def points_from_results(binary, path):
    """Every point of a results file, re-listed by memtrade from its config."""
    try:
        doc = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: cannot read results: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != "memtrade.results/1":
        raise BadInput(f"{path}: not a memtrade results file (schema memtrade.results/1)")
    table = (doc.get("meta") or {}).get("knobs") or memtrade_side.knob_table(binary)
    points = []
    for p in doc.get("points") or []:
        if not isinstance(p, dict) or not isinstance(p.get("config"), dict):
            raise BadInput(f"{path}: a point has no config")
        flags = memtrade_side.flags_of(p["config"], table)
        listed = memtrade_side.list_points(binary, [*flags, "--backend", "cpu"])["points"][0]
        points.append({**listed, "id": p["id"], "ref": p})
    meta = doc.get("meta") or {}
    return points, {"grid": meta.get("grid"), "grid_hash": meta.get("grid_hash")}


# ---- one point in its own process -----------------------------------------------------------

def _child(spec, conn):
    import torch
    try:
        row = peer_point.run_point(spec)
    except Exception as e:  # noqa: BLE001 - every failure is a result row
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        row = peer_point.failed_row("oom" if peer_point.is_oom(torch, e) else "error",
                                    f"{type(e).__name__}: {msg}")
    conn.send(row)


def run_isolated(spec, timeout):
    """The point in a fresh process (spawned: no CUDA state shared), as memtrade runs each point
    in its own child, so that allocator peaks never leak between points."""
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(spec, send))
    proc.start()
    send.close()
    row = recv.recv() if recv.poll(timeout) else None
    proc.join(5 if row is not None else 0)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if row is not None:
        return row
    if proc.exitcode is None or proc.exitcode == -9:
        return peer_point.failed_row("timeout", f"no result after {timeout:g}s")
    return peer_point.failed_row("error", f"point process exited with {proc.exitcode}")


# ---- the results file ---------------------------------------------------------------------

def probe(device):
    import platform

    import torch
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    if device == "cuda":
        if not torch.cuda.is_available():
            raise BadInput("--device cuda but torch.cuda.is_available() is False")
        versions["cuda"] = torch.version.cuda
        if torch.backends.cudnn.version():
            versions["cudnn"] = str(torch.backends.cudnn.version())
        return (torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory,
                versions)
    return f"cpu ({os.cpu_count()} cores, torch {torch.__version__})", None, versions


def write_results(path, doc):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--points", help="memtrade results file: run exactly its points")
    src.add_argument("--grid", help="grid TOML, listed by `memtrade run --grid FILE --list --json`")
    ap.add_argument("--memtrade", default="build/memtrade", help="memtrade binary")
    ap.add_argument("--out", required=True, help="results file to write")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--warmup", type=int, help="warm-up steps (default: the grid's)")
    ap.add_argument("--steps", type=int,
                    help="measured steps (default: memtrade's sample count, else the grid's)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per point")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    # Anything else is a memtrade knob flag (--model gpt-mini --batch-size 8 ...): passed on.
    args, knob_flags = ap.parse_known_args(argv)
    return args, knob_flags


def main(argv=None):
    args, knob_flags = parse_args(argv)
    try:
        return run_all(args, knob_flags)
    except BadInput as e:
        print(f"torch_step: {e}", file=sys.stderr)
        return 2


def run_all(args, knob_flags):
    binary = args.memtrade
    source = {"grid": "point", "grid_hash": None}
    run = {}
    if args.points:
        if knob_flags:
            raise BadInput(f"--points and knob flags ({' '.join(knob_flags)}) exclude each other")
        points, source = points_from_results(binary, args.points)
    else:
        listed = memtrade_side.list_points(
            binary, [*(["--grid", args.grid] if args.grid else knob_flags),
                     "--backend", args.device])
        points, run = listed["points"], listed["run"]
        for p in points:
            p["ref"] = None
        source["grid"] = listed["grid"]
    if not points:
        raise BadInput("no points to run")
    device_name, capacity, versions = probe(args.device)
    doc = {"schema": "memtrade.results/1",
           "meta": {"commit": None, "dirty": None,
                    "time": datetime.datetime.now(datetime.timezone.utc)
                    .strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "host": socket.gethostname(), "backend": args.device, "device": device_name,
                    "capacity": capacity, "grid": source["grid"], "grid_hash": source["grid_hash"],
                    "memtrade": None, "peer": "pytorch-eager", "versions": versions},
           "points": []}
    warmup = args.warmup if args.warmup is not None else int(run.get("warmup", 2))
    failures = 0
    for n, p in enumerate(points):
        ref = p["ref"]
        steps = args.steps
        if steps is None and ref and (ref.get("time") or {}).get("samples_s"):
            steps = len(ref["time"]["samples_s"])
        if steps is None:
            steps = int(run.get("steps", 8))
        reason = peer_point.skip_reason(p["config"], args.device)
        if reason:
            row = peer_point.failed_row("skipped", reason)
        else:
            spec = {"config": p["config"], "resolved": p["resolved"], "device": args.device,
                    "warmup": warmup, "steps": max(1, steps), "threads": args.threads,
                    "ref": ref}
            row = run_isolated(spec, args.timeout)
        failures += row["status"] in ("error", "timeout")
        doc["points"].append({"id": p["id"], "config": p["config"], **row})
        write_results(args.out, doc)  # as points finish: nothing lost to a crash
        med = (row.get("time") or {}).get("median_s")
        peak = (row.get("memory") or {}).get("peak_allocated")
        print(f"[{n + 1}/{len(points)}] {row['status']:<8} "
              f"{'-' if peak is None else f'{peak / 2**20:.2f} MiB':>12} "
              f"{'-' if med is None else f'{med * 1e3:.2f} ms':>10}  {p['id']}"
              + (f"  ({row['error']})" if row["error"] else ""), file=sys.stderr, flush=True)
    print(f"{len(points)} points ({args.device}, pytorch-eager), results: {args.out}",
          file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
