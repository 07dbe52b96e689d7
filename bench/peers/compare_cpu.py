"""memtrade vs PyTorch eager, fp32 Adam training step on the CPU, measured side by side.

For each (model, batch) the two are run alternately for several rounds in one job (same
machine, same moment, same threads), and the ratio of median step times is reported. This
machine is shared and noisy: the alternation is what makes the ratio meaningful.
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent


def memtrade_point(binary, model, batch, threads, steps, tmp):
    out = tmp / f"mt-{model}-{batch}.json"
    subprocess.run([binary, "run", "--backend", "cpu", "--model", model, "--batch-size",
                    str(batch), "--optimizer", "adam", "--precision", "fp32", "--threads",
                    str(threads), "--warmup", "3", "--steps", str(steps), "--out", str(out)],
                   check=True, capture_output=True, text=True)
    return json.loads(out.read_text())["points"][0]["time"]["samples_s"]


def torch_point(model, batch, threads, steps, tmp, binary):
    dump = tmp / f"dump-{model}"
    if not dump.exists():
        subprocess.run([binary, "step", "--backend", "cpu", "--model", model, "--batch-size",
                        "1", "--optimizer", "adam", "--dump", str(dump)],
                       check=True, capture_output=True, text=True)
    res = subprocess.run([sys.executable, str(HERE / "torch_cpu_step.py"), "--meta",
                          str(dump / "meta.json"), "--batch-size", str(batch), "--threads",
                          str(threads), "--steps", str(steps)],
                         check=True, capture_output=True, text=True)
    return json.loads(res.stdout)["samples_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memtrade", default="build/memtrade")
    ap.add_argument("--points", default="gpt-tiny:8,gpt-mini:8,mlp-small:64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        for point in args.points.split(","):
            model, batch = point.split(":")
            mt, pt = [], []
            for _ in range(args.rounds):  # interleaved: memtrade, torch, memtrade, torch, ...
                mt += memtrade_point(args.memtrade, model, int(batch), args.threads, args.steps, tmp)
                pt += torch_point(model, int(batch), args.threads, args.steps, tmp, args.memtrade)
            m, p = statistics.median(mt), statistics.median(pt)
            rows.append((model, batch, m, p, p / m))
    print(f"{'model':<10} {'batch':>5} {'memtrade ms':>12} {'torch ms':>10} {'torch/memtrade':>15}")
    for model, batch, m, p, r in rows:
        print(f"{model:<10} {batch:>5} {m * 1e3:>12.3f} {p * 1e3:>10.3f} {r:>15.2f}")


if __name__ == "__main__":
    main()
