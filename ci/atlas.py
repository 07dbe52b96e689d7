#!/usr/bin/env python3
"""The memory atlas: DIR/atlas.md and its charts, from memtrade's CUDA memory model only.

    ci/atlas.py BUILD/memtrade DIR [--models M,M] [--seq-lens 1024,2048] [--cards 24GiB,80GiB]
                [--gpu NAME] [--work DIR]

The models: reports/atlas.py MODELS, memtrade's own sizes by name and Hugging Face config.json
files by their display name (CONFIG_MODELS); --models also takes a config.json path (named by its
stem). Writes grid files and runs `memtrade estimate --backend cuda --json` (one process per grid) and
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
# The per-layer comparison unties a tied head: eager holds the head's gradient of the embedding
# through backward until the embedding's arrives where a gradient exists already (zero_grad=zero;
# LayerCtx::hold_grad), which can move the peak off the moment every layer's activations are live
# (Llama 3.2 1B at s = 1024: 2.7·sbh more). A layer's bytes do not depend on the head.
UNTIE_FOR_LAYERS = True
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


def refusal(binary: str, work: pathlib.Path, axes: dict) -> str | None:
    """memtrade's one line where it refuses the point of these axes (exit 2), else None: what a
    model cannot take (Gemma 2 flash attention, tensor parallelism of Gemma 2 or of experts)."""
    grid = write_grid(work / "probe.toml", "atlas-probe", axes, [])
    p = subprocess.run([binary, "estimate", "--grid", str(grid), "--backend", "cuda", "--json"],
                       capture_output=True, text=True)
    if p.returncode == 2:
        return p.stderr.strip().splitlines()[-1].removeprefix("memtrade: ").removeprefix(f"{grid}: ")
    if p.returncode != 0:
        raise RuntimeError(f"{binary} estimate --grid {grid}: exit {p.returncode}: {p.stderr.strip()}")
    return None


def config_with_layers(path: str, n_layer: int, work: pathlib.Path, untie: bool = False) -> str:
    """A copy of the config.json at `path` with n_layer layers (the per-layer comparison's
    `n_layer` override, which a model defined by a file takes as a file), its head untied with
    `untie` (UNTIE_FOR_LAYERS)."""
    cfg = json.loads(pathlib.Path(path).read_text())
    cfg["num_hidden_layers" if "num_hidden_layers" in cfg else "n_layer"] = n_layer
    if untie:
        cfg["tie_word_embeddings"] = False
    out = work / "configs" / f"{pathlib.Path(path).stem}-n_layer{n_layer}{'-untied' if untie else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cfg, indent=1) + "\n")
    return str(out)


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
    # A config file's model is memtrade's to check when it reads the file.
    help_text = check_plan([m for m in models if not R.model_file(m)])
    version = run([binary, "--version"]).splitlines()[0].split(None, 1)[1]
    default_model = knobs.row("model")["default"]
    base_value = {m: R.model_file(m) or m for m in models}
    with_files = any(R.is_config(v) for v in base_value.values())

    def model_axes(values) -> dict:
        """The grid's model axes: `model`, and `model_config` where a file defines some models
        (those run at model's default, which is all the file allows; the others with no file)."""
        names = [v for v in values if not R.is_config(v)]
        files = [v for v in values if R.is_config(v)]
        if not with_files:
            return {"model": names}
        return {"model": names + ([default_model] if files else []),
                "model_config": ([""] if names else []) + files}

    def model_where(value: str) -> dict:
        if not with_files:
            return {"model": [value]}
        return ({"model": [default_model], "model_config": [value]} if R.is_config(value)
                else {"model": [value], "model_config": [""]})

    # The models' own hyper-parameters (positions, layers) decide the overrides.
    base = estimate(binary, write_grid(work / "models.toml", "atlas-models",
                                       {**model_axes(list(base_value.values())),
                                        **{k: [v] for k, v in FIXED.items()}},
                                       [model_where(v) for v in base_value.values()]),
                    work / "models.json")
    by_value = {R.point_value(p["config"]): p for p in base["points"]}
    hyper = {R.display_name(m): by_value[v]["config"]["hyper"] for m, v in base_value.items()}
    cases = []
    for m in models:
        name, file = R.display_name(m), R.CONFIG_MODELS.get(m, base_value[m] if R.model_file(m) else "")
        h = hyper[name]
        n_layer = int(h["n_layer"])
        if n_layer < 3:
            raise BadInput(f"{m}: {n_layer} layers; the per-layer comparison needs 3 or more")
        # What memtrade refuses this model (one point each, at the first length): flash
        # attention, and tensor parallelism at the first size its heads divide by.
        first = seqs[0]
        if R.model_file(m):
            v0 = base_value[m]
        else:
            v0 = model_value(m, {"block_size": first} if first > int(h["block_size"]) else {})
        probe = {**model_axes([v0]), "seq_len": [first], **{k: [v] for k, v in FIXED.items()}}
        refused = {}
        why = refusal(binary, work, {**probe, "attention": ["flash"]})
        if why:
            refused["attention"] = ("flash", why)
        tps = [t for t in TP_SIZES if t > 1 and tp_splits(h, t)]
        why = refusal(binary, work, {**probe, "tensor_parallel": [tps[0]]}) if tps else None
        if why:
            refused["tensor_parallel"] = (str(tps[0]), why)
        for s in seqs:
            if R.model_file(m):
                # The file defines the model: its positions are its own, and the per-layer
                # comparison's layer counts are copies of the file (left out: a model whose layer
                # is not dense, or that takes no flash attention, which c₁ comes from).
                ext, value = False, base_value[m]
                dense = "moe" not in h and "attention" not in refused
                untie = UNTIE_FOR_LAYERS and bool(h.get("tie_word_embeddings"))
                full = config_with_layers(value, n_layer, work, untie) if untie else value
                layers = ((full,) + tuple(config_with_layers(value, n, work, untie)
                                          for n in (n_layer - 1, 1))) if dense else ()
            else:
                ext = s > int(h["block_size"])
                over = {"block_size": s} if ext else {}
                value = model_value(m, over)
                untie = ({"tie_word_embeddings": "false"}
                         if UNTIE_FOR_LAYERS and h.get("tie_word_embeddings") else {})
                layers = (model_value(m, {**over, **untie}),) + tuple(
                    model_value(m, {**over, **untie, "n_layer": n}) for n in (n_layer - 1, 1))
            cases.append(R.Case(name, s, value, ext, layers, file=file, refused=refused))

    def pairs(values_of, setting: dict | None = None) -> list[dict]:
        """[[where]] clauses: each model value at its lengths, and where a setting is given,
        with what the model runs of it (R.instead: math where memtrade refuses flash)."""
        by: dict[tuple, list[int]] = {}
        for c in cases:
            extra = tuple(sorted(R.instead(c, setting).items())) if setting else ()
            for v in values_of(c):
                by.setdefault((v, extra), []).append(c.seq)
        return [{**model_where(v), "seq_len": ss, **{k: [x] for k, x in extra}}
                for (v, extra), ss in by.items()]

    def main_where() -> list[dict]:
        """The main grid's clauses: each model value at its lengths with the attention kinds
        memtrade takes for it."""
        out = []
        for v in dict.fromkeys(c.value for c in cases):
            cs = [c for c in cases if c.value == v]
            kinds = list(dict.fromkeys(s["attention"] for s in SETTINGS if R.runs(cs[0], s)))
            out.append({**model_where(v), "seq_len": [c.seq for c in cs], "attention": kinds})
        return out

    main_axes = {**model_axes(list(dict.fromkeys(c.value for c in cases))), "seq_len": seqs,
                 **{k: [v] for k, v in FIXED.items()},
                 **{k: list(dict.fromkeys(s[k] for s in SETTINGS)) for k in SETTINGS[0]}}
    grid = write_grid(work / "peaks.toml", "atlas-peaks", main_axes, main_where())
    peaks = estimate(binary, grid, work / "peaks.json")
    fits = {}
    for card in cards:
        out = work / f"fit-{card}.json"
        run([binary, "fit", "--grid", str(grid), "--backend", "cuda", "--capacity", card,
             "--json", str(out)])
        fits[card] = load.load_fit(out)

    layer_axes = {**model_axes(list(dict.fromkeys(v for c in cases for v in c.layer_values))),
                  "seq_len": seqs, "precision": LAYER_PRECISIONS, "attention": LAYER_ATTENTIONS,
                  **{k: [v] for k, v in LAYER_FIXED.items()}}
    layers = (estimate(binary, write_grid(work / "layers.toml", "atlas-layers", layer_axes,
                                          pairs(lambda c: c.layer_values)), work / "layers.json")
              if any(c.layer_values for c in cases) else {"points": []})
    def setting_axes(setting: dict, among=None) -> dict:
        """The axes of a setting, with every value the cases run of it (R.instead)."""
        return {k: list(dict.fromkeys(str(R.instead(c, setting)[k]) for c in (among or cases)))
                for k in setting}

    dp_axes = {**model_axes(list(dict.fromkeys(c.value for c in cases))), "seq_len": seqs,
               **{k: [v] for k, v in FIXED.items()}, **setting_axes(DP_SETTING),
               "data_parallel": DP_RANKS, "sharding": DP_STAGES}
    dp = estimate(binary, write_grid(work / "dp.toml", "atlas-dp", dp_axes,
                                     pairs(lambda c: [c.value], DP_SETTING)), work / "dp.json")
    # One grid per tp size, over the models it splits; SP where tp > 1. With a GPU the same grid
    # again with --gpu: its time model where the point fits the card (the peaks above are taken
    # without a capacity, so that a point too large for the card still shows its whole peak).
    tp_docs, tp_times = [], []
    for tp in TP_SIZES:
        ok = [c for c in cases if tp_splits(hyper[c.model], tp)
              and (tp == 1 or "tensor_parallel" not in c.refused)]
        if not ok:
            continue
        axes = {**model_axes(list(dict.fromkeys(c.value for c in ok))), "seq_len": seqs,
                **{k: [v] for k, v in FIXED.items()}, **setting_axes(TP_SETTING, ok),
                "tensor_parallel": [tp], "sequence_parallel": ["off", "on"] if tp > 1 else ["off"]}
        by: dict[tuple, list[int]] = {}
        for c in ok:
            extra = tuple(sorted(R.instead(c, TP_SETTING).items()))
            by.setdefault((c.value, extra), []).append(c.seq)
        where = [{**model_where(v), "seq_len": ss, **{k: [x] for k, x in extra}}
                 for (v, extra), ss in by.items()]
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
