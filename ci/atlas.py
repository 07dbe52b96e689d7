#!/usr/bin/env python3
"""The memory atlas: DIR/atlas.md and its charts, from memtrade's CUDA memory model only.

    ci/atlas.py BUILD/memtrade DIR [--models M,M] [--seq-lens 1024,2048] [--cards 24GiB,80GiB]
                [--gpu NAME] [--work DIR]

Writes grid files and runs `memtrade estimate --backend cuda --json` (one process per grid) and
`memtrade fit --backend cuda` (one per card), then reports/atlas.py turns the documents into the
page. --models, --seq-lens and --cards narrow the plan (the test runs one model at one length);
--gpu NAME (a row of `memtrade devices --table`) adds that card's time model to the tensor
parallelism table (tokens/s per GPU and MFU where a configuration fits it); --work keeps the
grids and JSON documents there instead of in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reports import atlas as R  # noqa: E402
from reports import knobs, load  # noqa: E402

# The plan. Axis names are checked against memtrade's knob table.
MODELS = R.MODELS
SEQ_LENS = [1024, 2048, 4096]
CARDS = ["24GiB", "40GiB", "80GiB", "141GiB"]
FIXED = {"precision": "bf16", "optimizer": "adamw", "batch_size": 1}
SETTINGS = [{"checkpoint": ck, "attention": at} for ck in ("0", "1") for at in ("math", "flash")]
BREAKDOWN_SETTING = {"checkpoint": "0", "attention": "flash"}
# The per-layer comparison: Korthikanti et al.'s setting (math attention, nothing recomputed);
# the gradients stay allocated (zero_grad = zero) so that every layer's activations are live at
# the peak. The second precision keeps activations 16-bit throughout, as the formula assumes.
LAYER_FIXED = {"checkpoint": "0", "zero_grad": "zero", "optimizer": "adamw", "optimizer_impl": "fused",
               "batch_size": 1}
LAYER_PRECISIONS = ["bf16", "bf16-o2"]
LAYER_ATTENTIONS = ["math", "flash"]
HELP_AXES = ["precision", "checkpoint", "attention"]
# Data parallelism: the per-GPU peak at 8 and 64 GPUs for each sharding stage, with every block
# checkpointed and flash attention (how sharded runs of these sizes are trained).
DP_RANKS = [8, 64]
DP_STAGES = ["none", "zero1", "zero2", "zero3"]
DP_SETTING = {"checkpoint": "1", "attention": "flash"}
# Tensor parallelism: the per-GPU peak at tp 1 to 8 (one node of eight), SP off and on, in the same
# setting; a tp the model's heads, KV heads, MLP width or vocabulary cannot split is left out.
TP_SIZES = [1, 2, 4, 8]
TP_SETTING = DP_SETTING


def tp_splits(hyper: dict, tp: int) -> bool:
    """Whether memtrade's tensor_parallel row takes tp for a model of these hyper-parameters: the
    heads, KV heads and MLP width divide by it and every rank gets part of the vocabulary
    (models/layers/tensor_parallel.h)."""
    heads = int(hyper["n_head"])
    kv = int(hyper.get("n_kv_head") or heads)
    mlp = int(hyper.get("intermediate_size") or 4 * int(hyper["n_embd"]))
    vocab = int(hyper["vocab_size"])
    return heads % tp == 0 and kv % tp == 0 and mlp % tp == 0 and -(-vocab // tp) * (tp - 1) < vocab


class BadInput(Exception):
    pass


def model_value(base: str, overrides: dict) -> str:
    """The model axis value with overrides, keys sorted as memtrade canonicalises them."""
    if not overrides:
        return base
    return base + ":" + ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))


def toml_value(v) -> str:
    return json.dumps(v) if isinstance(v, str) else str(v)


def write_grid(path: pathlib.Path, name: str, axes: dict, where: list[dict]) -> pathlib.Path:
    lines = [f"name = {toml_value(name)}", 'mode = "cartesian"', "", "[axes]"]
    lines += [f"{k} = [{', '.join(toml_value(v) for v in vs)}]" for k, vs in axes.items()]
    for w in where:
        lines += ["", "[[where]]"]
        lines += [f"{k} = [{', '.join(toml_value(v) for v in vs)}]" for k, vs in w.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(args: list[str]) -> str:
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode == 2:  # bad input: memtrade's one line says what
        raise BadInput(f"{' '.join(args[:2])}: {p.stderr.strip()}")
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def estimate(binary: str, grid: pathlib.Path, out: pathlib.Path, *extra: str) -> dict:
    out.write_text(run([binary, "estimate", "--grid", str(grid), "--backend", "cuda", "--json",
                        *extra]))
    return load.load_estimates(out)


def check_plan(models: list[str]) -> dict[str, str]:
    """Every axis and value the plan uses exists in this memtrade's knob table; returns the help
    text of the axes the page quotes."""
    values: dict[str, set] = {"model": set(models)}
    for d in [FIXED, LAYER_FIXED, BREAKDOWN_SETTING, *SETTINGS]:
        for k, v in d.items():
            values.setdefault(k, set()).add(str(v))
    values.setdefault("precision", set()).update(LAYER_PRECISIONS)
    values.setdefault("attention", set()).update(LAYER_ATTENTIONS)
    values.setdefault("seq_len", set())
    for axis, vs in values.items():
        try:
            row = knobs.row(axis)
        except KeyError:
            raise BadInput(f"memtrade has no axis '{axis}' (the atlas plan needs it)") from None
        bad = sorted(v for v in vs if row.get("choices") and v not in row["choices"])
        if bad:
            raise BadInput(f"memtrade's {axis} has no value {', '.join(bad)} (expected one of: "
                           f"{', '.join(row['choices'])})")
    return {a: knobs.row(a)["help"] for a in HELP_AXES}


def collect(binary: str, work: pathlib.Path, models: list[str], seqs: list[int],
            cards: list[str], gpu: str | None = None) -> R.Atlas:
    knobs.use(json.loads(run([binary, "knobs", "--json"])))
    help_text = check_plan(models)
    version = run([binary, "--version"]).splitlines()[0].split(None, 1)[1]

    # The models' own hyper-parameters (positions, layers) decide the overrides.
    base = estimate(binary, write_grid(work / "models.toml", "atlas-models",
                                       {"model": models, **{k: [v] for k, v in FIXED.items()}}, []),
                    work / "models.json")
    hyper = {p["config"]["model"]: p["config"]["hyper"] for p in base["points"]}
    cases = []
    for m in models:
        for s in seqs:
            ext = s > int(hyper[m]["block_size"])
            over = {"block_size": s} if ext else {}
            n_layer = int(hyper[m]["n_layer"])
            if n_layer < 3:
                raise BadInput(f"{m}: {n_layer} layers; the per-layer comparison needs 3 or more")
            layers = (model_value(m, over),) + tuple(
                model_value(m, {**over, "n_layer": n}) for n in (n_layer - 1, 1))
            cases.append(R.Case(m, s, model_value(m, over), ext, layers))

    def pairs(values_of) -> list[dict]:
        by_value: dict[str, list[int]] = {}
        for c in cases:
            for v in values_of(c):
                by_value.setdefault(v, []).append(c.seq)
        return [{"model": [v], "seq_len": ss} for v, ss in by_value.items()]

    main_axes = {"model": list(dict.fromkeys(c.value for c in cases)), "seq_len": seqs,
                 **{k: [v] for k, v in FIXED.items()},
                 **{k: list(dict.fromkeys(s[k] for s in SETTINGS)) for k in SETTINGS[0]}}
    grid = write_grid(work / "peaks.toml", "atlas-peaks", main_axes, pairs(lambda c: [c.value]))
    peaks = estimate(binary, grid, work / "peaks.json")
    fits = {}
    for card in cards:
        out = work / f"fit-{card}.json"
        run([binary, "fit", "--grid", str(grid), "--backend", "cuda", "--capacity", card,
             "--json", str(out)])
        fits[card] = load.load_fit(out)

    layer_axes = {"model": list(dict.fromkeys(v for c in cases for v in c.layer_values)),
                  "seq_len": seqs, "precision": LAYER_PRECISIONS, "attention": LAYER_ATTENTIONS,
                  **{k: [v] for k, v in LAYER_FIXED.items()}}
    layers = estimate(binary, write_grid(work / "layers.toml", "atlas-layers", layer_axes,
                                         pairs(lambda c: c.layer_values)), work / "layers.json")
    dp_axes = {"model": main_axes["model"], "seq_len": seqs, **{k: [v] for k, v in FIXED.items()},
               **{k: [v] for k, v in DP_SETTING.items()}, "data_parallel": DP_RANKS,
               "sharding": DP_STAGES}
    dp = estimate(binary, write_grid(work / "dp.toml", "atlas-dp", dp_axes,
                                     pairs(lambda c: [c.value])), work / "dp.json")
    # One grid per tp size, over the models it splits; SP where tp > 1. With a GPU the same grid
    # again with --gpu: its time model where the point fits the card (the peaks above are taken
    # without a capacity, so that a point too large for the card still shows its whole peak).
    tp_docs, tp_times = [], []
    for tp in TP_SIZES:
        ok = [c for c in cases if tp_splits(hyper[c.model], tp)]
        if not ok:
            continue
        axes = {"model": list(dict.fromkeys(c.value for c in ok)), "seq_len": seqs,
                **{k: [v] for k, v in FIXED.items()}, **{k: [v] for k, v in TP_SETTING.items()},
                "tensor_parallel": [tp], "sequence_parallel": ["off", "on"] if tp > 1 else ["off"]}
        by_value: dict[str, list[int]] = {}
        for c in ok:
            by_value.setdefault(c.value, []).append(c.seq)
        where = [{"model": [v], "seq_len": ss} for v, ss in by_value.items()]
        grid = write_grid(work / f"tp{tp}.toml", f"atlas-tp{tp}", axes, where)
        tp_docs.append(estimate(binary, grid, work / f"tp{tp}.json"))
        if gpu:
            tp_times.append(estimate(binary, grid, work / f"tp{tp}-{gpu}.json", "--gpu", gpu))
    tp = {"points": [p for d in tp_docs for p in d["points"]]}
    tp_time = {"points": [p for d in tp_times for p in d["points"]]} if gpu else None
    return R.Atlas(version=version, fixed=FIXED, settings=SETTINGS, dp=dp, dp_setting=DP_SETTING,
                   dp_ranks=DP_RANKS, dp_stages=DP_STAGES, tp=tp, tp_time=tp_time,
                   tp_setting=TP_SETTING, tp_sizes=TP_SIZES, gpu=gpu,
                   breakdown_setting=BREAKDOWN_SETTING, cards=cards, cases=cases, peaks=peaks,
                   fits=fits, layers=layers, layer_fixed=LAYER_FIXED,
                   layer_precisions=LAYER_PRECISIONS, layer_attentions=LAYER_ATTENTIONS,
                   help=help_text)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("memtrade", help="the memtrade binary")
    ap.add_argument("outdir", help="where atlas.md and its charts go (docs/)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--seq-lens", default=",".join(map(str, SEQ_LENS)))
    ap.add_argument("--cards", default=",".join(CARDS), help="capacities in GiB, e.g. 24GiB")
    ap.add_argument("--gpu", help="time the tensor-parallel table on this card (memtrade devices "
                    "--table)")
    ap.add_argument("--work", help="keep the grids and JSON documents in this directory")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    try:
        models = [m for m in a.models.split(",") if m]
        try:
            seqs = [int(s) for s in a.seq_lens.split(",") if s]
        except ValueError:
            raise BadInput(f"--seq-lens: expected integers, got '{a.seq_lens}'") from None
        cards = [c for c in a.cards.split(",") if c]
        if not models or not seqs or not cards or min(seqs) < 1:
            raise BadInput("--models, --seq-lens and --cards each need at least one value")
        for c in cards:
            if not c.lower().endswith("gib"):
                raise BadInput(f"--cards: '{c}': give capacities in GiB, e.g. 24GiB")
        if not pathlib.Path(a.memtrade).is_file():
            raise BadInput(f"{a.memtrade}: no memtrade binary there (build it first)")
        with tempfile.TemporaryDirectory(prefix="memtrade-atlas-") as tmp:
            work = pathlib.Path(a.work or tmp)
            work.mkdir(parents=True, exist_ok=True)
            atlas = collect(a.memtrade, work, models, seqs, cards, a.gpu)
            page = R.write_atlas(atlas, a.outdir)
    except (BadInput, load.InputError) as e:
        print(f"atlas: {e}", file=sys.stderr)
        return 2
    print(f"atlas: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
