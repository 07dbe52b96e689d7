#!/usr/bin/env python3
"""DeepSpeed's model-state formulas against memtrade's estimate, per rank (docs/data-parallel.md).

    ci/zero_formulas.py BUILD/memtrade [--out docs/data-parallel.md]

DeepSpeed's ZeRO paper (Rajbhandari et al. 2020, §3) and its estimators
(deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs, stage3's
estimate_zero3_model_states_mem_needs) count the model states of mixed-precision Adam per rank,
with Ψ parameters over N ranks: 16-bit weights 2Ψ and grads 2Ψ, fp32 master 4Ψ, Adam's two fp32
moments 8Ψ:
    ZeRO-1  4Ψ + 12Ψ/N      (weights, grads replicated; master + moments sharded)
    ZeRO-2  2Ψ + 14Ψ/N      (+ grads sharded)
    ZeRO-3  16Ψ/N           (+ weights sharded)
memtrade's configuration of that: --precision bf16-o2 (16-bit weights and grads, fp32 master:
DeepSpeed's bf16 mixed precision) --optimizer adam --zero-grad zero (the grads stay resident, as
in DeepSpeed, whose gradient partitions persist), at batch 1 × 128 tokens with every block
checkpointed, so that the activations are small beside the model states. The formula counts
what each rank keeps: the table's "resident" column is the estimate's model-state categories
(params, grads, master, optimizer) still allocated after the step, rank 0's (the most loaded),
against it. The peak adds what a step holds only in flight: under zero2 the full grads of the
block being reduced, under zero3 also the gathered weights of one block and of the parameters
outside the blocks (FSDP's root unit: embeddings, final norm, head) with their full grads.
"""
import argparse
import json
import subprocess
import sys

MODELS = [("gpt2-1558m", "GPT-2 1.5B"), ("llama3-8b", "Llama-3-8B")]
RANKS = [8, 64]
FORMULA = {
    "zero1": lambda p, n: 4 * p + 12 * p / n,
    "zero2": lambda p, n: 2 * p + 14 * p / n,
    "zero3": lambda p, n: 16 * p / n,
}
STATES = ("params", "grads", "master", "optimizer")


def estimate(memtrade, model, ranks, sharding):
    cmd = [memtrade, "estimate", "--backend", "cuda", "--model", model, "--seq-len", "128",
           "--batch-size", "1", "--checkpoint", "1", "--precision", "bf16-o2",
           "--optimizer", "adam", "--zero-grad", "zero", "--dp", str(ranks),
           "--sharding", sharding, "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["points"][0]


def gib(b):
    return f"{b / 2**30:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("memtrade")
    ap.add_argument("--out")
    a = ap.parse_args()
    lines = [
        "| model | N | stage | formula (GiB) | resident (GiB) | gap | params | grads | master "
        "| optimizer | model states at peak (GiB) | peak (GiB) | estimate (s) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    worst = 0.0
    for model, label in MODELS:
        for n in RANKS:
            for stage, formula in FORMULA.items():
                p = estimate(a.memtrade, model, n, stage)
                psi = p["config"]["hyper"]["num_params"]
                b = p["resident_after_step"]
                states = sum(b.get(c, 0) for c in STATES)
                at_peak = sum(p["breakdown_at_peak"].get(c, 0) for c in STATES)
                want = formula(psi, n)
                gap = states / want - 1
                worst = max(worst, abs(gap))
                lines.append(
                    f"| {label} | {n} | {stage} | {gib(want)} | {gib(states)} | {gap:+.2%} | "
                    + " | ".join(gib(b.get(c, 0)) for c in STATES)
                    + f" | {gib(at_peak)} | {gib(p['peak_allocated'])} | {p['seconds']:.3f} |")
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out) as f:
            doc = f.read()
        begin, end = "<!-- zero:begin -->\n", "<!-- zero:end -->"
        i, j = doc.index(begin) + len(begin), doc.index(end)
        with open(a.out, "w") as f:
            f.write(doc[:i] + text + doc[j:])
    sys.stdout.write(text)
    print(f"worst gap {worst:.2%}", file=sys.stderr)


if __name__ == "__main__":
    main()
