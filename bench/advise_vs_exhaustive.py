#!/usr/bin/python3
"""`memtrade advise` against an exhaustive grid, measured on the CPU: is its pick as good as the
best of running everything?

For each workload and each capacity (75 %, 50 % and 30 % of the default point's peak):
  1. advise --json picks a configuration (its search space: the axes and values it reports);
  2. the exhaustive grid of that space (every configuration, the same samples per step) runs
     once without a capacity; a point fits when its measured reserved peak is within the
     capacity, does not when its allocated peak is above it, and in between it is run again
     under the emulated capacity;
  3. the best fitting points of the grid (the 3 fastest) and advise's pick run side by side,
     interleaved, ROUNDS times under the emulated capacity; each one's throughput is the median
     over the rounds of its median step. The ratio is advise's / the best of the others'.
A noisy shared machine: everything runs with --threads 1 and counts a step's process CPU time
(time.cpu_median_s; advise --clock cpu), which other processes' load does not inflate as it does
the wall time (±5 % against ±20–100 % here), and the final figures come only from the
interleaved rounds. Writes OUT/table.md and OUT/summary.json; exits 1 when a pick does not
fit or reaches less than 95 % of the best.

usage: bench/advise_vs_exhaustive.py --memtrade build/memtrade [--out out/advise-bench]
                                     [--workloads gpt-mini,gpt-small,cnn-small] [--rounds 5] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

# Workloads: name -> (flags of the start point, axes held by both advise and the grid).
# gpt-small runs at sequence 128, cnn-small at 64 samples a step, both with zero_grad and
# empty_cache held, so that their exhaustive grids (320 and 280 points of about a second) run in
# a quarter of an hour. The batch sizes make 30 % of the default peak a question with an answer:
# gpt-small's parameters and gradients alone take 106 MiB (30 % of its peak at 4 × 64 tokens is
# below that), and the allocator rounds cnn-small's 1-10 MiB blocks up to 20 MiB segments (as
# PyTorch's does), so at 8 samples (peak 21 MiB) no capacity below 20 MiB can run it.
WORKLOADS = {
    "gpt-mini": (["--model", "gpt-mini", "--batch-size", "8"], []),
    "gpt-small": (["--model", "gpt-small", "--seq-len", "128", "--batch-size", "8"],
                  ["zero_grad", "empty_cache"]),
    "cnn-small": (["--model", "cnn-small", "--batch-size", "64"], ["zero_grad", "empty_cache"]),
}
FRACTIONS = (0.75, 0.5, 0.3)
THREADS = "1"


def throughput(p: dict, global_batch: int) -> float:
    """Samples per CPU second of a step (time.cpu_median_s)."""
    return global_batch / p["time"]["cpu_median_s"]


def mt(binary: str, *args: str, ok=(0,)) -> str:
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    if r.returncode not in ok:
        sys.exit(f"memtrade {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def grid_toml(name: str, start: dict, values: dict, global_batch: int, warmup: int, steps: int) -> str:
    """The cartesian grid of advise's space: its axes' values, the start's for every other axis,
    [[where]] pairs keeping the samples per step."""
    lines = [f'name = "{name}"', 'mode = "cartesian"', "[run]", 'backend = "cpu"',
             f"warmup = {warmup}", f"steps = {steps}", 'timeout = "600s"', "[axes]"]
    for axis, v in start.items():
        if axis in ("hyper", "seed", "batch_size", "accumulation"):
            continue
        vals = values.get(axis, [v])
        lines.append(f"{axis} = {json.dumps(vals)}")
    bs = sorted({int(b) for b in values.get("batch_size", [start["batch_size"]])})
    lines.append(f"batch_size = {json.dumps(bs)}")
    lines.append(f"accumulation = {json.dumps(sorted({global_batch // b for b in bs}))}")
    for b in bs:
        lines += ["[[where]]", f"batch_size = {b}", f"accumulation = {global_batch // b}"]
    return "\n".join(lines) + "\n"


def run_grid(binary: str, grid: pathlib.Path, out: pathlib.Path, *extra: str) -> list[dict]:
    mt(binary, "run", "--grid", str(grid), "--threads", THREADS, "--quiet", "--out", str(out), *extra,
       ok=(0, 1))
    return json.loads(out.read_text())["points"]


def bench_workload(binary: str, name: str, out: pathlib.Path, rounds: int, cache: pathlib.Path,
                   reuse: bool) -> list[dict]:
    flags, held = WORKLOADS[name]
    est = json.loads(mt(binary, "estimate", "--backend", "cpu", *flags, "--json"))
    default_peak = est["points"][0]["peak_allocated"]
    rows = []
    grid_points: list[dict] | None = None
    for frac in FRACTIONS:
        cap = int(default_peak * frac)
        t0 = time.time()
        adv_args = ["advise", "--backend", "cpu", *flags, "--capacity", f"{cap}B", "--threads", THREADS,
                    "--calibration", str(cache), "--clock", "cpu", "--json"]
        if held:
            adv_args += ["--hold", ",".join(held)]
        adv = json.loads(mt(binary, *adv_args, ok=(0, 1)))
        advise_wall = time.time() - t0
        pick = adv["recommended"]
        if grid_points is None:  # the space is the same at every capacity
            grid = out / f"{name}-grid.toml"
            text = grid_toml(f"exhaustive-{name}", adv["start"]["config"], adv["values"], adv["global_batch"],
                             warmup=1, steps=3)
            done = out / f"{name}-exhaustive.json"
            if reuse and grid.exists() and grid.read_text() == text and done.exists():
                grid_points = json.loads(done.read_text())["points"]  # the same grid, measured before
            else:
                grid.write_text(text)
                t1 = time.time()
                grid_points = run_grid(binary, grid, done)
                print(f"{name}: exhaustive grid of {len(grid_points)} points in {time.time() - t1:.0f} s",
                      file=sys.stderr)
        ok = [p for p in grid_points if p["status"] == "ok"]
        fits = [p for p in ok if p["memory"]["peak_reserved"] <= cap]
        between = [p["id"] for p in ok if p["memory"]["peak_allocated"] <= cap < p["memory"]["peak_reserved"]]
        if between:
            again = run_grid(binary, out / f"{name}-grid.toml", out / f"{name}-between-{frac}.json",
                             "--select", ",".join(between), "--capacity", f"{cap}B")
            ids = {p["id"] for p in again if p["status"] == "ok"}
            fits += [p for p in ok if p["id"] in ids]
        g = adv["global_batch"]
        fits.sort(key=lambda p: -throughput(p, g))
        if not fits:
            rows.append({"workload": name, "fraction": frac, "capacity": cap, "exhaustive": None,
                         "pick": pick and pick["id"], "ratio": None, "search_s": adv["search"]["seconds"]})
            continue
        # Side by side: the grid's three fastest fitting points and advise's pick, interleaved.
        contenders = [p["id"] for p in fits[:3]]
        ids = contenders + ([pick["id"]] if pick and pick["id"] not in contenders else [])
        thr: dict[str, list[float]] = {i: [] for i in ids}
        statuses: dict[str, set] = {i: set() for i in ids}
        final = out / f"{name}-final.toml"
        final.write_text((out / f"{name}-grid.toml").read_text().replace("steps = 3", "steps = 6"))
        for r in range(rounds):
            for p in run_grid(binary, final, out / f"{name}-final-{frac}-{r}.json", "--select", ",".join(ids),
                              "--capacity", f"{cap}B"):
                statuses[p["id"]].add(p["status"])
                if p["status"] == "ok":
                    thr[p["id"]].append(throughput(p, g))
        med = {i: statistics.median(v) if v else 0.0 for i, v in thr.items()}
        best = max(contenders, key=lambda i: med[i])
        pick_thr = med.get(pick["id"], 0.0) if pick else 0.0
        rows.append({
            "workload": name, "fraction": frac, "capacity": cap, "default_peak": default_peak,
            "grid_points": len(grid_points), "fitting": len(fits),
            "exhaustive": best, "exhaustive_samples_per_s": med[best],
            "pick": pick["id"] if pick else None, "pick_samples_per_s": pick_thr,
            "pick_statuses": sorted(statuses.get(pick["id"], [])) if pick else [],
            "pick_predicted_samples_per_s": pick["predicted_samples_per_s"] if pick else None,
            "pick_predicted_peak": pick["predicted_peak"] if pick else None,
            "ratio": pick_thr / med[best] if med[best] else None,
            "search_s": adv["search"]["seconds"], "advise_wall_s": advise_wall,
            "cost_model_error": (pick["predicted_samples_per_s"] / pick_thr - 1) if pick and pick_thr else None,
        })
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def short(point_id: str | None, start: str = "") -> str:
    if not point_id:
        return "–"
    parts = point_id.split("/")
    return " ".join(p for p in parts[1:] if p not in ("fp32", "adam", "train", "in-pinned", "ck0", "off-none",
                                                       "zg-set_to_none", "ec-never"))


def table(rows: list[dict]) -> str:
    out = ["| workload | capacity | exhaustive best (measured) | advise's pick (measured) | ratio | fits | "
           "search |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cap = f"{r['fraction']:.0%} = {r['capacity'] / 2**20:.2f} MiB"
        if r.get("exhaustive") is None:
            out.append(f"| {r['workload']} | {cap} | nothing fits | {short(r['pick'])} | – | – | {r['search_s']:.2f} s |")
            continue
        out.append(f"| {r['workload']} | {cap} | {short(r['exhaustive'])}: {r['exhaustive_samples_per_s']:.1f}/s | "
                   f"{short(r['pick'])}: {r['pick_samples_per_s']:.1f}/s | {r['ratio']:.3f} | "
                   f"{'yes' if r['pick_statuses'] == ['ok'] else ','.join(r['pick_statuses'])} | {r['search_s']:.2f} s |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memtrade", required=True)
    ap.add_argument("--out", default="out/advise-bench")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reuse", action="store_true",
                    help="reuse OUT's exhaustive results of the same grid (its points' measurements)")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for w in a.workloads.split(","):
        if w not in WORKLOADS:
            sys.exit(f"unknown workload {w!r} ({', '.join(WORKLOADS)})")
        rows += bench_workload(a.memtrade, w, out, a.rounds, out / "calibration.json", a.reuse)
        (out / "summary.json").write_text(json.dumps(rows, indent=1))
    (out / "table.md").write_text(table(rows))
    print(table(rows))
    bad = [r for r in rows if r.get("exhaustive") and (r["ratio"] is None or r["ratio"] < 0.95
                                                       or r["pick_statuses"] != ["ok"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
