"""memtrade vs PyTorch eager on the CPU, training steps measured side by side (`make peer`).

For each point, memtrade (`memtrade run`) and PyTorch eager (torch_step.py on the very point
memtrade just ran: same config, learning rate, batch and threads) alternate for several rounds
in one job, the order flipping every round, so that drift on this shared machine hits both
alike; the ratio of the pooled median step times is reported. The table names the CPU model and
the OpenBLAS core type, since a ratio belongs to a microarchitecture. Both sides run with the
same threads and OpenMP wait policy (passive unless OMP_WAIT_POLICY says otherwise).

    compare_cpu.py [--memtrade BIN] [--points gpt-mini:8,...] [--rounds 3] [--steps 15]
                   [--threads 2] [--json OUT]

A point is MODEL:BATCH or MODEL:BATCH:PRECISION (default fp32; Adam throughout).
"""
import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_POINTS = "gpt-tiny:8,gpt-mini:8,gpt-small:4,mlp-small:64,cnn-small:32"


def cpu_model():
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def openblas_line(binary):
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    return next((l.split(None, 1)[1] for l in out.splitlines() if l.startswith("OpenBLAS")),
                "OpenBLAS: not linked")


def run_memtrade(binary, point, threads, steps, out):
    model, batch, precision = point
    subprocess.run([binary, "run", "--backend", "cpu", "--model", model, "--batch-size", batch,
                    "--precision", precision, "--optimizer", "adam", "--threads", str(threads),
                    "--warmup", "3", "--steps", str(steps), "--quiet", "--out", str(out)],
                   check=True, capture_output=True, text=True)
    return json.loads(out.read_text())["points"][0]["time"]["samples_s"]


def run_torch(binary, results, threads, steps, out):
    # The same OpenMP wait policy as memtrade's (passive): spinning waits on a shared machine
    # measure the neighbours, not the engine (a gpt-tiny step: 5 ms alone, 270 ms spinning).
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    subprocess.run([sys.executable, str(HERE / "torch_step.py"), "--points", str(results),
                    "--memtrade", binary, "--device", "cpu", "--threads", str(threads),
                    "--warmup", "3", "--steps", str(steps), "--out", str(out)],
                   check=True, capture_output=True, text=True, env=env)
    row = json.loads(out.read_text())["points"][0]
    if row["status"] != "ok":
        raise RuntimeError(f"PyTorch point {row['id']}: {row['status']}: {row['error']}")
    return row["time"]["samples_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memtrade", default="build/memtrade")
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the table as JSON")
    args = ap.parse_args()

    points = []
    for item in args.points.split(","):
        f = item.split(":")
        if len(f) not in (2, 3):
            print(f"compare_cpu: --points {item!r}: expected MODEL:BATCH[:PRECISION]",
                  file=sys.stderr)
            return 2
        points.append((f[0], f[1], f[2] if len(f) == 3 else "fp32"))

    print(f"CPU: {cpu_model()}, {args.threads} threads; OpenBLAS: {openblas_line(args.memtrade)}")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        for point in points:
            mt, pt = [], []
            for r in range(args.rounds):
                results = tmp / f"mt-{r}.json"
                sides = [("memtrade", lambda: mt.extend(
                              run_memtrade(args.memtrade, point, args.threads, args.steps,
                                           results))),
                         ("torch", lambda: pt.extend(
                             run_torch(args.memtrade, results, args.threads, args.steps,
                                       tmp / f"pt-{r}.json")))]
                if not results.exists():  # torch runs memtrade's point: memtrade goes first once
                    sides[0][1]()
                    sides = sides[1:]
                for _, run in (sides if r % 2 == 0 else sides[::-1]):
                    run()
            m, p = statistics.median(mt), statistics.median(pt)
            rows.append({"model": point[0], "batch": int(point[1]), "precision": point[2],
                         "memtrade_s": m, "torch_s": p, "ratio": p / m,
                         "samples": [len(mt), len(pt)]})
            print(f"  {point[0]:<10} b{point[1]:<4} {point[2]:<5} memtrade {m * 1e3:9.2f} ms  "
                  f"torch {p * 1e3:9.2f} ms  torch/memtrade {p / m:5.2f}", flush=True)
    print(f"\n{'model':<10} {'batch':>5} {'prec':<5} {'memtrade ms':>12} {'torch ms':>10} "
          f"{'torch/memtrade':>15}")
    for r in rows:
        print(f"{r['model']:<10} {r['batch']:>5} {r['precision']:<5} {r['memtrade_s'] * 1e3:>12.2f} "
              f"{r['torch_s'] * 1e3:>10.2f} {r['ratio']:>15.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "threads": args.threads,
                                                       "openblas": openblas_line(args.memtrade),
                                                       "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
