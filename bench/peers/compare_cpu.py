"""memtrade vs PyTorch eager on the CPU, training steps measured side by side (`make peer`).

For each point, memtrade (`memtrade run`) and PyTorch eager (torch_step.py on the very point
memtrade just ran: same config, learning rate, batch and threads) alternate for several rounds
in one job, the order flipping every round, so that drift on this shared machine hits both
alike; the ratio of the pooled median step times is reported. The table names the CPU model and
the OpenBLAS core type, since a ratio belongs to a microarchitecture. Both sides run with the
same threads and OpenMP wait policy (passive unless OMP_WAIT_POLICY says otherwise).

With --cpu, the table adds CPU time per step (every thread): the work each engine does, which on
a machine shared with others is steadier than the wall clock (a thread waiting for a core costs
wall time, not CPU time). Both engines' steps include making their batch (peer_point.py makes
PyTorch's inside the timed step, as memtrade's Trainer::stage does). PyTorch's CPU time is
measured around each step (time.process_time, as its wall time); memtrade's as the difference in the children's CPU time (getrusage) between the round's run and a
one-step run of the same point, over the extra steps.

    compare_cpu.py [--memtrade BIN] [--points gpt-mini:8,...] [--rounds 3] [--steps 15]
                   [--threads 2] [--cpu] [--isa native|avx2] [--json OUT]

--isa avx2 emulates a CPU without AVX-512 on both sides: memtrade's vector loops and GEMM
(MEMTRADE_ISA=avx2: its AVX2 loops and AVX2 GEMM), PyTorch's own kernels and oneDNN's
(ATEN_CPU_CAPABILITY=avx2, DNNL_MAX_CPU_ISA=AVX2), and PyTorch's bf16 GEMMs and convolutions on
ATen's native kernels, where a real AVX2 CPU runs them (bench/peers/cpu_isa.py). The table names
what each side ran: memtrade's `--version` line for its CPU kernels, and oneDNN's ISA cap.

A point is MODEL:BATCH or MODEL:BATCH:PRECISION (default fp32; Adam throughout; bf16 is
torch.autocast with PyTorch's CPU op lists on both sides:
memtrade's torch-cpu autocast policy).
"""
import argparse
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cpu_isa  # noqa: E402

DEFAULT_POINTS = "gpt-tiny:8,gpt-mini:8,gpt-small:4,mlp-small:64,cnn-small:32,gpt-mini:8:bf16"


def cpu_model():
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def version_lines(binary, env):
    """memtrade --version under env, as {library: version} ("OpenBLAS", "CPU kernels", ...)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                         env=dict(os.environ, **env)).stdout
    names = ("OpenBLAS", "CPU kernels")  # the two-word name first, so it is not split
    lines = {}
    for line in out.splitlines():
        name = next((n for n in names if line.startswith(n)), None)
        if name:
            lines[name] = line[len(name):].strip()
    return lines


# What each side's CPU kernels may use, per --isa: cpu_isa.ENV (memtrade's, PyTorch's).
ISA_ENV = cpu_isa.ENV


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_per_step(run, steps):
    # The one-step run repeats start-up, data set-up and warm-up: only the extra steps remain.
    """CPU seconds per step of run(steps): run(steps) minus run(1), over steps - 1."""
    t0 = children_cpu_s()
    run(steps)
    t1 = children_cpu_s()
    run(1)
    t2 = children_cpu_s()
    return ((t1 - t0) - (t2 - t1)) / (steps - 1)


def run_memtrade(binary, point, threads, steps, out, env):
    model, batch, precision = point
    # A 16-bit point is torch.autocast as it runs on the CPU: memtrade's torch-cpu policy.
    policy = ["--autocast-policy", "torch-cpu"] if precision in ("fp16", "bf16") else []
    subprocess.run([binary, "run", "--backend", "cpu", "--model", model, "--batch-size", batch,
                    "--precision", precision, *policy, "--optimizer", "adam", "--threads",
                    str(threads), "--warmup", "3", "--steps", str(steps), "--quiet", "--out",
                    str(out)], check=True, capture_output=True, text=True,
                   env=dict(os.environ, **env))
    return json.loads(out.read_text())["points"][0]["time"]["samples_s"]


def run_torch(binary, results, threads, steps, out, isa_env):
    # The same OpenMP wait policy as memtrade's (passive): spinning waits on a shared machine
    # measure the neighbours, not the engine (a gpt-tiny step: 5 ms alone, 270 ms spinning).
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"),
               **isa_env)
    proc = subprocess.run([sys.executable, str(HERE / "torch_step.py"), "--points", str(results),
                           "--memtrade", binary, "--device", "cpu", "--threads", str(threads),
                           "--warmup", "3", "--steps", str(steps), "--out", str(out)],
                          capture_output=True, text=True, env=env)  # a failed point: its row
    if not out.exists():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"torch_step.py exited {proc.returncode}: {tail}")
    row = json.loads(out.read_text())["points"][0]
    if row["status"] != "ok":
        raise RuntimeError(f"PyTorch point {row['id']}: {row['status']}: {row['error']}")
    return row["time"]["samples_s"], row["time"].get("cpu_samples_s", [])


def measure(args, point, results, tmp, mt_env, pt_env):
    """One point's interleaved rounds: its table row (prints its line as it goes)."""
    mt, pt, mt_cpu, pt_cpu = [], [], [], []
    for r in range(args.rounds):

        def memtrade_side(steps, keep=True):
            samples = run_memtrade(args.memtrade, point, args.threads, steps, results, mt_env)
            if keep:
                mt.extend(samples)

        def torch_side():
            samples, cpu = run_torch(args.memtrade, results, args.threads, args.steps,
                                     tmp / f"pt-{r}.json", pt_env)
            pt.extend(samples)
            pt_cpu.extend(cpu)

        def memtrade_measured():
            if not args.cpu:
                return memtrade_side(args.steps)
            mt_cpu.append(cpu_per_step(
                lambda steps: memtrade_side(steps, keep=steps == args.steps), args.steps))

        sides = [memtrade_measured, torch_side]
        if not results.exists():  # torch runs memtrade's point: memtrade goes first once,
            # then the order flips every round
            sides[0]()
            sides = sides[1:]
        for run in (sides if r % 2 == 0 else sides[::-1]):
            run()
    m, p = statistics.median(mt), statistics.median(pt)
    row = {"model": point[0], "batch": int(point[1]), "precision": point[2],
           "memtrade_s": m, "torch_s": p, "ratio": p / m, "samples": [len(mt), len(pt)]}
    line = (f"  {point[0]:<10} b{point[1]:<4} {point[2]:<5} memtrade {m * 1e3:9.2f} ms  "
            f"torch {p * 1e3:9.2f} ms  torch/memtrade {p / m:5.2f}")
    if args.cpu:
        mc, pc = statistics.median(mt_cpu), statistics.median(pt_cpu)
        row.update({"memtrade_cpu_s": mc, "torch_cpu_s": pc, "cpu_ratio": pc / mc})
        line += f"  | CPU/step {mc * 1e3:9.2f} / {pc * 1e3:9.2f} ms  {pc / mc:5.2f}"
    print(line, flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memtrade", default="build/memtrade")
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu", action="store_true",
                    help="also measure CPU time per step (all threads), by a second, 1-step run")
    ap.add_argument("--isa", choices=sorted(ISA_ENV), default="native",
                    help="native, or avx2: both sides kept off AVX-512 (a CPU without it)")
    ap.add_argument("--json", help="also write the table as JSON")
    args = ap.parse_args()
    if args.cpu and args.steps < 2:
        print("compare_cpu: --cpu needs --steps >= 2", file=sys.stderr)
        return 2

    points = []
    for item in args.points.split(","):
        f = item.split(":")
        if len(f) not in (2, 3):
            print(f"compare_cpu: --points {item!r}: expected MODEL:BATCH[:PRECISION]",
                  file=sys.stderr)
            return 2
        points.append((f[0], f[1], f[2] if len(f) == 3 else "fp32"))

    mt_env, pt_env = ISA_ENV[args.isa]
    versions = version_lines(args.memtrade, mt_env)
    openblas = versions.get("OpenBLAS", "not linked")
    kernels = versions.get("CPU kernels", "CPU kernels: not reported")
    onednn = pt_env.get("DNNL_MAX_CPU_ISA", "the CPU's own")
    print(f"CPU: {cpu_model()}, {args.threads} threads; OpenBLAS: {openblas}")
    print(f"--isa {args.isa}: memtrade {kernels}; PyTorch oneDNN ISA {onednn}")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        for point in points:
            try:
                rows.append(measure(args, point, tmp / f"mt-{len(rows)}.json", tmp, mt_env,
                                    pt_env))
            except RuntimeError as e:  # PyTorch could not run the point: a row that says so
                rows.append({"model": point[0], "batch": int(point[1]), "precision": point[2],
                             "error": str(e)})
                print(f"  {point[0]:<10} b{point[1]:<4} {point[2]:<5} {e}", flush=True)
    cpu_head = f" {'CPU ms':>10} {'torch CPU':>10} {'CPU ratio':>9}" if args.cpu else ""
    print(f"\n{'model':<10} {'batch':>5} {'prec':<5} {'memtrade ms':>12} {'torch ms':>10} "
          f"{'torch/memtrade':>15}{cpu_head}")
    for r in rows:
        head = f"{r['model']:<10} {r['batch']:>5} {r['precision']:<5}"
        if "error" in r:
            print(f"{head} {'—':>12} {'—':>10} {'—':>15}  ({r['error']})")
            continue
        cpu_cols = (f" {r['memtrade_cpu_s'] * 1e3:>10.2f} {r['torch_cpu_s'] * 1e3:>10.2f} "
                    f"{r['cpu_ratio']:>9.2f}") if args.cpu else ""
        print(f"{head} {r['memtrade_s'] * 1e3:>12.2f} {r['torch_s'] * 1e3:>10.2f} "
              f"{r['ratio']:>15.2f}{cpu_cols}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "threads": args.threads,
                                                       "openblas": openblas,
                                                       "isa": args.isa, "memtrade_kernels": kernels,
                                                       "onednn_isa": onednn,
                                                       "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
