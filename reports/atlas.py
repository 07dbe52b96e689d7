"""The memory atlas (docs/atlas.md): peak memory, its breakdown and the largest batch per card of
the published GPT-2 and Llama sizes and the Hugging Face configs of Qwen2.5-7B, Mistral-7B,
Gemma-2-9B and Mixtral-8x7B (MODELS below), predicted by memtrade's CUDA memory model, beside the
closed-form references people use: 16Ψ bytes of model states for mixed-precision Adam (ZeRO) and
Korthikanti et al.'s activations per transformer layer.

Input: an `Atlas` that ci/atlas.py fills from `memtrade estimate --json` and `memtrade fit --json`
documents; nothing here runs memtrade. Every number on the page comes from those documents or
from the two closed forms below; every table and chart says that it is predicted.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Sequence

from . import analysis as A
from .charts import CATEGORY_COLORS, EXTRA_COLORS, _figure, _save
from .page import _md_table

# The published sizes people train (the atlas's rows, and docs/advise.md's): memtrade's own sizes
# by name, then Hugging Face config.json files (`--model-config`; the fixtures the HF tests prove
# the architectures on) by a short display name. This is the one list.
BUILTIN_MODELS = ["gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m", "llama3.2-1b",
                  "llama3.2-3b", "llama3-8b"]
CONFIG_MODELS = {
    "qwen2.5-7b": "tests/models/fixtures/hf/Qwen2.5-7B.json",
    "mistral-7b": "tests/models/fixtures/hf/Mistral-7B-v0.1.json",
    "gemma-2-9b": "tests/models/fixtures/hf/gemma-2-9b.json",
    "mixtral-8x7b": "tests/models/fixtures/hf/Mixtral-8x7B-v0.1.json",
}
MODELS = BUILTIN_MODELS + list(CONFIG_MODELS)
ROOT = pathlib.Path(__file__).resolve().parents[1]


def model_file(name: str) -> str:
    """The config.json that defines the model `name`: CONFIG_MODELS' file (absolute), or `name`
    itself where it is a path ending in .json; "" for one of memtrade's own sizes."""
    if name in CONFIG_MODELS:
        return str(ROOT / CONFIG_MODELS[name])
    return name if name.endswith(".json") else ""


def display_name(name: str) -> str:
    """The page's name of a model: a config file given by its path is named by its stem."""
    return pathlib.Path(name).stem if name.endswith(".json") else name


def model_args(name: str) -> list[str]:
    """memtrade's flags for the model `name`: --model-config FILE or --model NAME."""
    f = model_file(name)
    return ["--model-config", f] if f else ["--model", name]


def is_config(value: str) -> bool:
    """Whether a model value (Case.value) is a config file's path rather than a `model` value."""
    return value.endswith(".json")


def point_value(config: dict) -> str:
    """The model value a point of `memtrade estimate/fit --json` ran: its config file, else its
    `model` (with overrides)."""
    return config.get("model_config") or config["model"]


PREDICTED = "predicted by the CUDA memory model, not measured"
FORMATS = ("png", "svg")
GiB = A.GiB
MiB = A.MiB
TOLERANCE = 0.10  # a reference cell further than this from memtrade gets a sentence why
MIN_COLUMN = MiB  # a category under this in every row of a table gets no column (io: KiBs)


# ---------------------------------------------------------------------------------------------
# The closed forms


def zero_model_states(num_params: int) -> int:
    """ZeRO (Rajbhandari et al. 2020), mixed-precision Adam: fp16 weights and gradients (2Ψ + 2Ψ)
    and the fp32 master weights, momentum and variance (12Ψ), in bytes."""
    return 16 * num_params


def korthikanti(s: int, b: int, h: int, a: int, dropout: bool) -> float:
    """Activation bytes one transformer layer keeps for backward, Korthikanti et al. 2022 (§4.1),
    16-bit activations, no recomputation: sbh(34 + 5as/h) as published (with dropout), or
    sbh(32 + 2as/h) without dropout (the derivation is on the page: DROPOUT_TERMS)."""
    return s * b * h * ((34 + 5 * a * s / h) if dropout else (32 + 2 * a * s / h))


# Korthikanti et al.'s per-tensor accounting of one layer (bytes, 16-bit activations, 1-byte
# dropout masks) and what a layer without dropout keeps of each; the sums are korthikanti()'s.
DROPOUT_TERMS = [
    ("attention", "input of the Q, K, V projections", "2sbh", "2sbh"),
    ("attention", "Q and K, for QKᵀ", "4sbh", "4sbh"),
    ("attention", "softmax output, for the softmax backward", "2as²b", "2as²b"),
    ("attention", "softmax-dropout mask", "as²b", "—"),
    ("attention", "dropout output, the ·V matmul's left input", "2as²b",
     "— (·V reads the softmax output, already kept)"),
    ("attention", "V, the ·V matmul's right input", "2sbh", "2sbh"),
    ("attention", "input of the output projection", "2sbh", "2sbh"),
    ("attention", "attention-output dropout mask", "sbh", "—"),
    ("MLP", "input of the first linear", "2sbh", "2sbh"),
    ("MLP", "GeLU input (the first linear's output)", "8sbh", "8sbh"),
    ("MLP", "input of the second linear (GeLU output)", "8sbh", "8sbh"),
    ("MLP", "MLP dropout mask", "sbh", "—"),
    ("layer norms", "two inputs", "4sbh", "4sbh"),
    ("total", "", "34sbh + 5as²b", "32sbh + 2as²b"),
]


# ---------------------------------------------------------------------------------------------
# What ci/atlas.py collects


@dataclasses.dataclass
class Case:
    """One model at one sequence length: the `model` value the estimates ran (with overrides), or
    the config file that defines it."""
    model: str            # the page's name, e.g. gpt2-124m, qwen2.5-7b
    seq: int
    value: str            # the model axis value, e.g. gpt2-124m:block_size=2048, or a config path
    extended: bool        # GPT-2 positions extended past the published 1024 (block_size=seq)
    # the same with n_layer = L, L − 1 and 1: one layer's bytes, and the average over L − 1; ()
    # where the per-layer comparison leaves the model out
    layer_values: tuple[str, ...] = ("", "", "")
    file: str = ""        # the config.json that defines the model, as the page shows it
    # axis -> (value, memtrade's one line): a value memtrade refuses for this model
    refused: dict = dataclasses.field(default_factory=dict)


# Where memtrade refuses a setting's value for a model (Gemma 2's soft-capped scores take no flash
# attention), the tables of one setting run it with this instead, and say so.
FALLBACK = {"attention": "math"}


def runs(case: Case, setting: dict) -> bool:
    """Whether memtrade takes this setting for the case's model."""
    return all(str(setting.get(axis, "")) != value for axis, (value, _) in case.refused.items())


def instead(case: Case, setting: dict) -> dict:
    """The setting, or where memtrade refuses a value of it for this model, FALLBACK's."""
    if runs(case, setting):
        return dict(setting)
    return {k: (FALLBACK.get(k, v) if k in case.refused else v) for k, v in setting.items()}


def instead_mark(case: Case, setting: dict) -> str:
    """' (math)' where the case runs FALLBACK's value instead of the setting's, else ''."""
    got = instead(case, setting)
    return "".join(f" ({got[k]})" for k in setting if str(got[k]) != str(setting[k]))


@dataclasses.dataclass
class Atlas:
    version: str                  # `memtrade --version`'s first line
    fixed: dict                   # axis -> value every atlas point shares (precision, optimizer, ...)
    settings: list[dict]          # the main settings: axis -> value (checkpoint, attention)
    breakdown_setting: dict       # the setting the breakdown chart shows
    cards: list[str]              # capacities, as given to `memtrade fit --capacity`
    cases: list[Case]
    peaks: dict                   # memtrade.estimate/1 at batch 1, every case × setting
    fits: dict[str, dict]         # card -> memtrade.fit/1, every case × setting
    layers: dict                  # memtrade.estimate/1 of the per-layer comparison
    layer_fixed: dict             # axis -> value of the per-layer comparison
    layer_precisions: list[str]   # [autocast, 16-bit throughout]
    layer_attentions: list[str]   # [math, flash]
    help: dict[str, str] = dataclasses.field(default_factory=dict)  # axis -> the knob's help
    # Data parallelism: memtrade.estimate/1 per GPU (rank 0, the most loaded) of every case at
    # dp_setting, for each rank count and sharding stage; None: no such section.
    dp: dict | None = None
    dp_setting: dict = dataclasses.field(default_factory=dict)
    dp_ranks: list[int] = dataclasses.field(default_factory=list)
    dp_stages: list[str] = dataclasses.field(default_factory=list)
    # Tensor parallelism: memtrade.estimate/1 per GPU (rank 0) of every case at tp_setting for
    # each tp size the model's heads, KV heads and MLP can split, SP off and on; with a GPU
    # (`gpu`), `tp_time` holds the same points estimated with --gpu (time_model where it fits).
    tp: dict | None = None
    tp_time: dict | None = None
    tp_setting: dict = dataclasses.field(default_factory=dict)
    tp_sizes: list[int] = dataclasses.field(default_factory=list)
    gpu: str | None = None


def _seq_of(config: dict) -> int:
    return int((config.get("hyper") or {}).get("seq_len") or config.get("seq_len") or 0)


def _key(model: str, seq: int, setting: dict) -> tuple:
    return (model, seq) + tuple(sorted((k, str(v)) for k, v in setting.items()))


class Index:
    """Estimate points and fit rows by (model value, sequence length, the varied axes)."""

    def __init__(self, atlas: Atlas):
        self.atlas = atlas
        axes = sorted(atlas.settings[0])
        self.peak = {_key(point_value(p["config"]), _seq_of(p["config"]),
                          {k: p["config"][k] for k in axes}): p for p in atlas.peaks["points"]}
        # A point at the model's own length (seq_len 0 in a fit row's config: block_size, or a
        # sliding window's width where it is shorter) is that length in the estimates' hyper.
        self.block = {point_value(p["config"]): _seq_of(p["config"]) for p in atlas.peaks["points"]
                      if not int(p["config"].get("seq_len") or 0)}
        self.fit: dict[str, dict] = {}
        for card, doc in atlas.fits.items():
            for r in doc["rows"]:
                c = r["config"]
                seq = int(c.get("seq_len") or 0) or self.block.get(point_value(c), 0)
                self.fit[(card,) + _key(point_value(c), seq, {k: c[k] for k in axes})] = r
        layer_axes = ("precision", "attention")
        self.layer = {_key(point_value(p["config"]), _seq_of(p["config"]),
                           {k: p["config"][k] for k in layer_axes}): p for p in atlas.layers["points"]}

    def point(self, case: Case, setting: dict) -> dict:
        k = _key(case.value, case.seq, setting)
        if k not in self.peak:
            raise KeyError(f"no estimate for {case.value} at seq {case.seq}, {setting}")
        return self.peak[k]

    def max_batch(self, card: str, case: Case, setting: dict) -> int:
        k = (card,) + _key(case.value, case.seq, setting)
        if k not in self.fit:
            raise KeyError(f"no fit row for {case.value} at seq {case.seq}, {setting} on {card}")
        return int(self.fit[k]["max_batch"])

    def _activations(self, value: str, case: Case, precision: str, attention: str) -> int:
        k = _key(value, case.seq, {"precision": precision, "attention": attention})
        if k not in self.layer:
            raise KeyError(f"no per-layer estimate for {value} at seq {case.seq}, {precision}, "
                           f"{attention}")
        return self.layer[k]["breakdown_at_peak"]["activations"]

    def layer_bytes(self, case: Case, precision: str, attention: str) -> int:
        """Activations at the peak with L layers minus with L − 1: one layer's saved tensors,
        each counted as the block the allocator gave it."""
        full, less, _ = (self._activations(v, case, precision, attention) for v in case.layer_values)
        return full - less

    def mean_layer_bytes(self, case: Case, precision: str, attention: str, n_layer: int) -> float:
        """(activations with L layers − with 1) / (L − 1): a layer's bytes with the allocator's
        rounding, which depends on where each block lands, spread over L − 1 layers."""
        full, _, one = (self._activations(v, case, precision, attention) for v in case.layer_values)
        return (full - one) / (n_layer - 1)


# ---------------------------------------------------------------------------------------------
# Formatting


def gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def mib(n: float) -> str:
    return f"{n / MiB:,.1f}"


def ratio(x: float, ref: float) -> str:
    return f"×{x / ref:.2f}"


def off(x: float, ref: float) -> bool:
    return abs(x / ref - 1) > TOLERANCE


def setting_label(setting: dict) -> str:
    """checkpoint 0 · math, from the setting's own axes and values (no axis list here)."""
    return " · ".join(f"{k} {v}" if k == "checkpoint" else str(v) for k, v in setting.items())


def caption(n: int, text: str) -> str:
    return f"**Table {n}.** {text} — *{PREDICTED}.*"


# ---------------------------------------------------------------------------------------------
# Reasons: one sentence per reference cell further than TOLERANCE from memtrade, from the numbers


def states_reason(p: dict) -> str:
    """Why params + master + grads + optimizer at the peak is not 16Ψ."""
    b = p["breakdown_at_peak"]
    grads, params = b.get("grads", 0), b.get("params", 0)
    states = sum(b.get(c, 0) for c in ("params", "master", "grads", "optimizer"))
    psi = p["config"]["hyper"]["num_params"]
    if states < zero_model_states(psi) and grads == 0:
        return (f"the gradients hold nothing at the peak (params {gib(params)} + optimizer "
                f"{gib(b.get('optimizer', 0))} GiB = {states / psi:.1f}Ψ): it comes before backward "
                f"allocates the first gradient, with {gib(b.get('activations', 0))} GiB of "
                f"activations live"
                + (", and zero_grad set_to_none freed the last step's"
                   if p["config"].get("zero_grad") == "set_to_none" else ""))
    if states < zero_model_states(psi):
        return (f"the gradients hold {gib(grads)} GiB at the peak, {grads / params:.0%} of a full "
                f"fp32 set (as large as the fp32 weights, {gib(params)} GiB): the peak comes "
                f"during backward, with {gib(b.get('activations', 0))} GiB of activations still live")
    return (f"memtrade holds {states / psi:.1f}Ψ: the allocator rounds every tensor up "
            f"(blocks of 512 B, segments of 2 or 20 MiB)")


@dataclasses.dataclass
class LayerRow:
    case: Case
    h: int
    a: int
    orig: float             # Korthikanti et al. as published
    adj: float              # without dropout
    bytes: dict             # (precision, attention) -> memtrade's per-layer activation bytes
    c1: dict                # precision -> flash bytes / sbh (the mean layer)
    c2: dict                # precision -> (math − flash) bytes / as²b (the mean layer)


def layer_rows(atlas: Atlas, idx: Index) -> list[LayerRow]:
    out = []
    for case in [c for c in atlas.cases if c.layer_values]:
        hyper = idx.point(case, atlas.settings[0])["config"]["hyper"]
        h, a, s = int(hyper["n_embd"]), int(hyper["n_head"]), case.seq
        got = {(p, at): idx.layer_bytes(case, p, at)
               for p in atlas.layer_precisions for at in atlas.layer_attentions}
        mean = {(p, at): idx.mean_layer_bytes(case, p, at, int(hyper["n_layer"]))
                for p in atlas.layer_precisions for at in atlas.layer_attentions}
        math_, flash = atlas.layer_attentions
        c1 = {p: mean[p, flash] / (s * h) for p in atlas.layer_precisions}
        c2 = {p: (mean[p, math_] - mean[p, flash]) / (a * s * s) for p in atlas.layer_precisions}
        out.append(LayerRow(case, h, a, korthikanti(s, 1, h, a, True), korthikanti(s, 1, h, a, False),
                            got, c1, c2))
    return out


def adapted_terms(hyper: dict) -> list[tuple[str, float]]:
    """Korthikanti et al.'s sbh terms (no dropout) redone for a non-GPT layer's shapes: grouped-
    query attention keeps Q (2sbh) and K, V at n_kv/a of the width instead of 6sbh; a SwiGLU MLP
    keeps its input (2sbh) and three tensors of width I (gate, up, their product: 6I/h·sbh)
    instead of GeLU's input and output at 4h (16sbh). Returns (what, change in c₁) pairs."""
    terms = []
    h, a = int(hyper["n_embd"]), int(hyper["n_head"])
    kv = int(hyper.get("n_kv_head") or a)
    if kv != a:
        terms.append((f"grouped-query attention, K and V at {kv}/{a} of the width", 4 * kv / a - 4))
    inter = hyper.get("intermediate_size")
    if inter:
        terms.append((f"SwiGLU, three tensors of width I = {int(inter) / h:.2f}h for GeLU's two of "
                      f"4h", 6 * int(inter) / h - 16))
    return terms


def _arch_clause(row: LayerRow, hyper: dict, p16: str) -> str:
    """For a layer that is not GPT's: the formula's terms for its shapes against memtrade's c₁."""
    if hyper.get("family") == "gpt":
        return ""
    terms = adapted_terms(hyper)
    sums = " ".join(f"{'+' if d >= 0 else '−'} {abs(d):.1f} ({what})" for what, d in terms)
    total = 32 + sum(d for _, d in terms)
    return (f"; and the layer is not GPT's: the same accounting for its shapes gives 32 {sums} = "
            f"{total:.1f}·sbh with 16-bit activations, where memtrade keeps {row.c1[p16]:.1f} "
            f"({p16})")


def layer_reasons(row: LayerRow, hyper: dict, atlas: Atlas) -> list[str]:
    pa, p16 = atlas.layer_precisions
    math_, flash = atlas.layer_attentions
    out = []
    m = row.bytes[pa, math_]
    fp32_copies = row.c2[pa] - row.c2[p16]
    residual = row.c1[pa] - row.c1[p16]
    arch = _arch_clause(row, hyper, p16)
    if off(m, row.adj):
        out.append(
            f"{pa} · {math_}, ×{m / row.adj:.2f} of the no-dropout formula: memtrade keeps "
            f"{row.c1[pa]:.1f}·sbh + {row.c2[pa]:.1f}·as²b against 32·sbh + 2·as²b — autocast's "
            f"copies: the probabilities cost {row.c2[pa]:.1f} bytes an element instead of "
            f"{row.c2[p16]:.1f} ({p16}), +{fp32_copies:.1f}, because softmax is on autocast's fp32 "
            f"list and the ·V matmul keeps its own bf16 copy, and the norms read the fp32 residual "
            f"stream (+{residual:.1f}·sbh over {p16}){arch}.")
    if off(m, row.orig):
        out.append(
            f"{pa} · {math_}, ×{m / row.orig:.2f} of the published formula: as above, less the "
            f"dropout masks and dropout output it counts and a dropout-free layer does not keep "
            f"(2·sbh + 3·as²b).")
    m16 = row.bytes[p16, math_]
    if off(m16, row.adj):
        why = arch[2:] if arch else ("the allocator's rounding: each saved tensor counts as the "
                                     "block the allocator hands it")
        out.append(f"{p16} · {math_}, ×{m16 / row.adj:.2f}: {why}.")
    f = row.bytes[pa, flash]
    if off(f, row.adj):
        out.append(
            f"{pa} · {flash}, ×{f / row.adj:.2f}: attention kind — flash keeps no (b, a, s, s) "
            f"probabilities, only Q, K, V, the output and an fp32 log-sum-exp per row, so the "
            f"formula's 2·as²b term is absent and {row.c1[pa]:.1f}·sbh remains.")
    return out


# ---------------------------------------------------------------------------------------------
# Charts


def _panel_grid(n: int, w: float, h: float):
    cols = 4 if n > 3 else n + 1
    rows = math.ceil((n + 1) / cols)  # one panel more: the legend
    fig = _figure(w, h * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    return fig, axes


def _model_title(case: Case, hyper: dict) -> str:
    return f"{case.model}  (Ψ = {hyper['num_params'] / 1e9:.2f} B)"


def peak_chart(atlas: Atlas, idx: Index, outdir: pathlib.Path, formats: Sequence[str]) -> list[str]:
    """Peak at batch 1 against sequence length, one panel per model, one line per setting, with
    the cards' capacities that fall within the panel."""
    models = list(dict.fromkeys(c.model for c in atlas.cases))
    fig, axes = _panel_grid(len(models), 13, 3.2)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
    styles = ["-", "--", "-.", ":"]
    handles = {}
    for ax, model in zip(axes, models):
        cases = [c for c in atlas.cases if c.model == model]
        top = 0.0
        for i, setting in enumerate(atlas.settings):
            if not runs(cases[0], setting):
                continue  # memtrade refuses it for this model (the panel's title says so)
            pts = [idx.point(c, setting) for c in cases]
            ys = [p["peak_allocated"] / GiB for p in pts]
            top = max(top, *ys)
            (line,) = ax.plot([c.seq for c in cases], ys, marker="o", ms=4, lw=1.6,
                              color=colors[i % len(colors)], ls=styles[i // len(colors) % len(styles)],
                              label=setting_label(setting))
            handles.setdefault(i, line)
        for card in atlas.cards:
            cap = _card_gib(card)
            if cap <= top * 1.15:
                ax.axhline(cap, color="#999", lw=0.8, ls=(0, (2, 2)))
                ax.annotate(f"{card} card", (cases[0].seq, cap), xytext=(2, 2),
                            textcoords="offset points", fontsize=7, color="#666")
        ax.set_xscale("log", base=2)
        ax.set_xticks([c.seq for c in cases], [str(c.seq) for c in cases])
        ax.minorticks_off()
        ax.set_ylim(0, top * 1.18)
        hyper = idx.point(cases[0], atlas.settings[0])["config"]["hyper"]
        ext = any(c.extended for c in cases)
        no = ", ".join(f"{a} {v}" for a, (v, _) in cases[0].refused.items() if a in atlas.settings[0])
        ax.set_title(_model_title(cases[0], hyper) + ("\npositions extended past 1024" if ext else "")
                     + (f"\nno {no} (memtrade refuses it)" if no else ""), fontsize=9)
        ax.set_xlabel("sequence length s")
        ax.set_ylabel("peak allocated (GiB)")
        ax.grid(True, alpha=0.3)
    for ax in axes[len(models):]:
        ax.axis("off")
    axes[len(models)].legend(handles=[handles[i] for i in sorted(handles)], loc="center",
                             title="setting (batch 1)", frameon=False)
    fixed = ", ".join(f"{k} {v}" for k, v in atlas.fixed.items())
    fig.suptitle(f"Peak memory ({fixed}) — {PREDICTED}", fontsize=11)
    return _save(fig, outdir, "atlas-peak", formats)


def _card_gib(card: str) -> float:
    """'24GiB' -> 24 (the cards are given in GiB)."""
    return float(card.lower().removesuffix("gib"))


def _stack_categories(points: Sequence[dict]) -> list[str]:
    cats = A.categories(p["breakdown_at_peak"] for p in points)
    return [c for c in cats if max(p["breakdown_at_peak"].get(c, 0) for p in points) >= MIN_COLUMN]


def breakdown_chart(atlas: Atlas, idx: Index, outdir: pathlib.Path,
                    formats: Sequence[str]) -> list[str]:
    """The breakdown at the peak (batch 1, one setting), one panel per model, a bar per length."""
    models = list(dict.fromkeys(c.model for c in atlas.cases))
    setting = atlas.breakdown_setting
    allpts = [idx.point(c, instead(c, setting)) for c in atlas.cases]
    cats = _stack_categories(allpts)
    fig, axes = _panel_grid(len(models), 13, 3.2)
    handles = {}
    for ax, model in zip(axes, models):
        cases = [c for c in atlas.cases if c.model == model]
        pts = [idx.point(c, instead(c, setting)) for c in cases]
        xs = list(range(len(cases)))
        bottom = [0.0] * len(cases)
        for i, cat in enumerate(cats):
            ys = [p["breakdown_at_peak"].get(cat, 0) / GiB for p in pts]
            bars = ax.bar(xs, ys, bottom=bottom, width=0.6,
                          color=CATEGORY_COLORS.get(cat, EXTRA_COLORS[i % len(EXTRA_COLORS)]), label=cat)
            handles.setdefault(cat, bars)
            bottom = [b + y for b, y in zip(bottom, ys)]
        for x, p in zip(xs, pts):
            ax.annotate(f"{p['peak_allocated'] / GiB:.1f}", (x, p["peak_allocated"] / GiB),
                        xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7.5)
        ax.set_xticks(xs, [f"s={c.seq}" for c in cases])
        ax.set_ylim(0, max(p["peak_allocated"] for p in pts) / GiB * 1.15)
        hyper = pts[0]["config"]["hyper"]
        mark = instead_mark(cases[0], setting)
        ax.set_title(_model_title(cases[0], hyper)
                     + (f"\n{setting_label(instead(cases[0], setting))}: memtrade refuses "
                        + ", ".join(v for a, (v, _) in cases[0].refused.items() if a in setting)
                        if mark else ""), fontsize=9)
        ax.set_ylabel("GiB at the peak")
        ax.grid(True, axis="y", alpha=0.3)
    for ax in axes[len(models):]:
        ax.axis("off")
    axes[len(models)].legend(handles=[handles[c] for c in reversed(cats)], labels=list(reversed(cats)),
                             loc="center", title="allocator category", frameon=False)
    fig.suptitle(f"Breakdown at the peak, batch 1, {setting_label(setting)} — {PREDICTED}",
                 fontsize=11)
    return _save(fig, outdir, "atlas-breakdown", formats)


# ---------------------------------------------------------------------------------------------
# The page


INTRO = """\
# Memory atlas (predicted)

> **Every number and chart on this page is {predicted}.** `memtrade estimate --backend cuda`
> runs the real training step (forward, backward, optimizer) on a meta device: PyTorch's caching
> allocator policy over address space, ops that take exactly the scratch the CUDA ops take, and
> the cuBLASLt workspace; nothing is computed. The CPU backend's peak equals this model byte for
> byte (tests/harness/test_estimate.cpp) and both backends make the same allocations outside
> workspace (tests/gpu/). No GPU ran for this page.

Generated by `ci/atlas.py` (`make docs`) with {version}. *Peak allocated*: bytes held by live
tensors at the step's peak, each counted as the block the allocator hands out; *peak reserved*:
the allocator's segments (what `nvidia-smi` shows, less the CUDA context). Breakdowns are the
allocated bytes per category at that moment (design.md, the memory model). GiB = 2³⁰ bytes.
"""


def settings_section(atlas: Atlas) -> str:
    fixed = ", ".join(f"`{k} = {v}`" for k, v in atlas.fixed.items())
    names = ", ".join(f"**{setting_label(s)}**" for s in atlas.settings)
    lines = [
        "## Settings, and why these",
        "",
        f"Every point: {fixed}. The main settings vary two knobs: {names}.",
        "",
        "- **bf16 autocast + AdamW** is the usual recipe for these models on A100/H100-class cards: "
        "`torch.autocast(dtype=torch.bfloat16)` over fp32 weights (PyTorch's CUDA op lists), "
        "AdamW as in the GPT-2 and Llama recipes. Batch 1 is the cost of one sequence; the "
        "largest-batch tables scale it up.",
        "- **checkpoint 0 and 1** are the two ends of activation checkpointing: nothing recomputed, "
        "or every block recomputed in backward (`model.gradient_checkpointing_enable()` in "
        "Hugging Face). Fractions, √n and selective lie between them.",
        "- **math and flash attention** decide how activations grow with s: math keeps the "
        "(b, a, s, s) probabilities (eager attention), flash keeps a log-sum-exp per row "
        "(`scaled_dot_product_attention`, FlashAttention-2, Hugging Face's default `sdpa`).",
        f"- One more precision, **{atlas.layer_precisions[1]}**, appears only in the per-layer "
        "comparison below: Korthikanti et al. count 16-bit activations throughout (Megatron's "
        f"mixed precision), which is what {atlas.layer_precisions[1]} does and autocast does not, "
        "so it separates the formula's terms from autocast's.",
        "",
        "The knobs, as memtrade's knob table describes them:",
        "",
    ]
    for axis, text in atlas.help.items():
        lines.append(f"- `{axis}`: {text}")
    gpt = [c for c in atlas.cases if c.extended]
    if gpt:
        lines += ["", "GPT-2 has 1024 learned positions. Rows marked *positions extended* run it at "
                  "s > 1024 with `block_size = s` (e.g. `gpt2-124m:block_size=2048`), which adds "
                  "(s − 1024)·h parameters to the position table; Ψ is the extended model's."]
    lines += ["", "`fit` finds the largest batch whose step keeps the allocator's reserved memory "
              "within the card's nominal size (24, 40, 80, 141 GiB) by bisection on the memory "
              "model. A real card has a little less (an H200 reports about 140.4 GiB) and the "
              "CUDA context and library handles take a few hundred MiB outside the allocator, so "
              "at the edge a real run may need one batch less. 0 means batch 1 does not fit. "
              "Bisection finds a batch that fits with the next one failing; the allocator's "
              "peak is not monotonic in the batch everywhere (its segments split differently "
              "as tensors grow: gpt2-124m, s = 1024, checkpoint 1 · flash on 80 GiB fits at 155, "
              "fails at 156 and fits again at 179), so a few cells, most visibly where flash "
              "fits fewer than math under checkpoint 1, understate what a larger batch could do."]
    return "\n".join(lines)


def models_section(atlas: Atlas, idx: Index) -> str:
    """What defines each model, what memtrade refuses for some, and the routing a mixture of
    experts is estimated with."""
    first = {}
    for c in atlas.cases:
        first.setdefault(c.model, c)
    rows = []
    for name, c in first.items():
        hyper = idx.point(c, atlas.settings[0])["config"]["hyper"]
        rows.append([name, f"`--model-config {c.file}`" if c.file else f"`--model {name}`",
                     str(hyper.get("architecture") or hyper.get("family") or "")])
    lines = ["## Models", "",
             "memtrade's own sizes by name, and Hugging Face config.json files read with "
             "`--model-config` (the file defines the model; it is named here by a short name):", "",
             _md_table(["model", "defined by", "architecture"], rows)]
    refused = [(name, axis, value, why) for name, c in first.items()
               for axis, (value, why) in c.refused.items()]
    if refused:
        lines += ["", "What memtrade refuses for some of them (one line, exit 2) and what the "
                  "page does instead:", ""]
        for name, axis, value, why in refused:
            if axis in FALLBACK:
                what = (f"its panels and per-model tables leave the settings with {axis} {value} "
                        f"out, and the tables of one setting (breakdown, data and tensor "
                        f"parallelism) run it with {axis} {FALLBACK[axis]}, marked "
                        f"*({FALLBACK[axis]})*")
            else:
                what = "the tensor parallelism table shows tp 1 only"
            lines.append(f"- {name}, `{axis} = {value}`: \"{why}\" — {what}.")
    moe = {}
    for p in atlas.peaks["points"]:
        if p.get("moe"):
            c = p["config"]
            name = next(x.model for x in atlas.cases if x.value == point_value(c))
            moe.setdefault(name, (c["hyper"].get("moe") or {}, set()))[1].add(p["moe"]["routing"])
    for name, (m, routing) in moe.items():
        lines += ["", f"**{name} is a mixture of experts** ({m.get('num_experts')} experts, top "
                  f"{m.get('top_k')} per token, in {m.get('moe_layers')} layers): its experts' "
                  "activations depend on how the router spreads the tokens, which the memory model, "
                  "running no data, cannot know. Every figure of it on this page assumes "
                  f"**{' and '.join(sorted(routing))} routing** (the estimates' `moe.routing`; "
                  "`memtrade estimate --moe-routing balanced`, its default: each expert receives "
                  "N·top_k/E of a layer's N tokens). `--moe-routing worst` (every token on the same "
                  "top_k experts) or a results file's recorded histograms give other peaks."]
    return "\n".join(lines)


def states_section(atlas: Atlas, idx: Index, n: int) -> tuple[str, int]:
    rows = []
    seen = set()
    for case in atlas.cases:
        psi = idx.point(case, atlas.settings[0])["config"]["hyper"]["num_params"]
        if (case.model, psi) in seen:
            continue
        seen.add((case.model, psi))
        pos = f"extended to {case.seq}" if case.extended else "as published"
        rows.append([case.model, pos, f"{psi:,}", f"{zero_model_states(psi):,}",
                     gib(zero_model_states(psi))])
    text = [
        "## Model states: 16Ψ (ZeRO)",
        "",
        "Rajbhandari et al. (ZeRO, 2020) count mixed-precision Adam as 16Ψ bytes for Ψ parameters: "
        "fp16 weights and gradients (2Ψ + 2Ψ) and fp32 master weights, momentum and variance "
        "(12Ψ). Under `torch.autocast` the layout differs but the sum is the same: the fp32 "
        "weights are the master (4Ψ, *params*), the gradients are fp32 (4Ψ, *grads*) and AdamW "
        "keeps 8Ψ (*optimizer*). Autocast's bf16 copies of the weights (*casts*, up to 2Ψ while "
        "forward and backward use them) are not in the 16Ψ count; the tables show them apart. "
        "Each model's table compares params + master + grads + optimizer **at the peak** with 16Ψ.",
        "",
        caption(n, "Ψ (`config.hyper.num_params` of the estimates) and 16Ψ in bytes"),
        "",
        _md_table(["model", "positions", "Ψ", "16Ψ (bytes)", "16Ψ (GiB)"], rows),
    ]
    return "\n".join(text), n + 1


def korthikanti_section(atlas: Atlas, idx: Index, lrows: list[LayerRow], n: int) -> tuple[str, int]:
    pa, p16 = atlas.layer_precisions
    math_, flash = atlas.layer_attentions
    fixed = ", ".join(f"`{k} = {v}`" for k, v in atlas.layer_fixed.items())
    text = [
        "## Activations per layer: Korthikanti et al.",
        "",
        "Korthikanti et al. (2022, *Reducing Activation Recomputation in Large Transformer "
        "Models*, §4.1) count the bytes one GPT layer keeps for backward with 16-bit activations "
        "and 1-byte dropout masks: **sbh(34 + 5as/h)** for sequence length s, batch b, hidden "
        "size h and a heads. memtrade's layers have no dropout, so the comparison uses the same "
        "accounting with what dropout adds taken out. Per tensor:",
        "",
        _md_table(["block", "kept for backward", "with dropout (published)", "without dropout"],
                  [list(t) for t in DROPOUT_TERMS]),
        "",
        "The three masks go (as²b + sbh + sbh), and so does the dropout output the ·V matmul reads "
        "(2as²b): without dropout it reads the softmax output, which the softmax backward keeps "
        "anyway. What remains is **sbh(32 + 2as/h)** bytes per layer.",
        "",
        f"memtrade's side is measured exactly as the difference of two estimates whose models "
        f"differ by one layer (`model:n_layer=L` and `n_layer=L−1`): the *activations* at the peak "
        f"of the one minus the other's, with {fixed}, math attention as the formula assumes. "
        f"`zero_grad = zero` keeps the gradients allocated through the step and a tied head is "
        f"untied (eager holds a tied head's gradient through backward where one exists), so that "
        f"the peak falls where every layer's activations are live; neither changes an activation. "
        f"Besides the "
        f"main precision ({pa}) the table shows {p16} (16-bit activations throughout, as the "
        f"formula assumes) and flash attention. Ratios are against the no-dropout formula; the "
        f"first memtrade column is also compared with the published one, as people use it.",
        "",
        "The formula is for GPT-style layers. For Llama and the decoders built like it (SwiGLU "
        "with `intermediate_size`, grouped-query attention, RMSNorm instead of LayerNorm: Qwen2.5 "
        "and Mistral too) its terms differ; the table computes it anyway with h = hidden size "
        "and a = query heads, as people do.",
        "",
    ]
    left = []
    for name in dict.fromkeys(c.model for c in atlas.cases if not c.layer_values):
        c = next(x for x in atlas.cases if x.model == name)
        hyper = idx.point(c, atlas.settings[0])["config"]["hyper"]
        why = (["a mixture of experts: each expert keeps the activations of the tokens routed to "
                "it, which the formula has no term for"] if hyper.get("moe") else []) + (
               [f"memtrade refuses {a} {v} for it, and c₁ below comes from the flash estimate"
                for a, (v, _) in c.refused.items() if a == "attention"])
        left.append(f"{name} ({'; '.join(why)})")
    if left:
        text += [f"Left out of this comparison: {', '.join(left)}.", ""]
    rows, notes = [], []
    for r in lrows:
        hyper = idx.point(r.case, atlas.settings[0])["config"]["hyper"]
        m = r.bytes[pa, math_]
        rows.append([
            r.case.model, str(r.case.seq) + (" ᵉ" if r.case.extended else ""), f"{r.h}, {r.a}",
            mib(r.orig), mib(r.adj), mib(m), ratio(m, r.adj), ratio(m, r.orig),
            mib(r.bytes[p16, math_]), ratio(r.bytes[p16, math_], r.adj),
            mib(r.bytes[pa, flash]), ratio(r.bytes[pa, flash], r.adj)])
        for sentence in layer_reasons(r, hyper, atlas):
            notes.append(f"- {r.case.model}, s = {r.case.seq}, {sentence}")
    text += [
        caption(n, "activations per layer, MiB, batch 1 (ᵉ: positions extended)"),
        "",
        _md_table(["model", "s", "h, a", "Korthikanti sbh(34+5as/h)", "no dropout sbh(32+2as/h)",
                   f"memtrade {pa} {math_}", "× no-dropout", "× published",
                   f"memtrade {p16} {math_}", "× no-dropout", f"memtrade {pa} {flash}",
                   "× no-dropout"], rows),
        "",
        f"What memtrade keeps, written as the formula is: **sbh·c₁ + as²b·c₂**, with c₁ from the "
        f"flash estimate (which keeps no s² term; its fp32 log-sum-exp adds 4a/h < 0.1 to c₁) and "
        f"c₂ from math minus flash. The formula's are c₁ = 32, c₂ = 2. Single-layer differences "
        f"carry the allocator's rounding (blocks of 512 B; a block cut from a 20 MiB segment keeps "
        f"a remainder under 1 MiB), which moves c₁ of the small models by a few units at s = 1024.",
        "",
        caption(n + 1, "per-layer coefficients c₁ (per sbh) and c₂ (per as²b)"),
        "",
        _md_table(["model", "s", f"{pa} c₁", f"{pa} c₂", f"{p16} c₁", f"{p16} c₂"],
                  [[r.case.model, str(r.case.seq), f"{r.c1[pa]:.2f}", f"{r.c2[pa]:.2f}",
                    f"{r.c1[p16]:.2f}", f"{r.c2[p16]:.2f}"] for r in lrows]),
        "",
        f"Why the cells of Table {n} that differ from the formula by more than "
        f"{TOLERANCE:.0%} differ, in short: with math attention autocast keeps the probabilities "
        f"in fp32 for the softmax and again in bf16 for the ·V matmul (c₂ ≈ 6 against 2) and its "
        f"norms read the fp32 residual stream (c₁ + 4); bf16-o2, 16-bit throughout as the "
        f"formula assumes, lands within 5% on GPT-2; flash keeps no s² term at all; Llama's "
        f"layer has other shapes (grouped-query K/V, SwiGLU). One sentence per cell:",
        "",
    ]
    if notes:
        text += [f"<details><summary>{len(notes)} cells further than {TOLERANCE:.0%} from the "
                 f"formula</summary>", "", *notes, "", "</details>"]
    else:
        text += ["- none does."]
    return "\n".join(text), n + 2


def model_section(atlas: Atlas, idx: Index, model: str, n: int) -> tuple[str, int]:
    cases = [c for c in atlas.cases if c.model == model]
    pts = [(c, s, idx.point(c, s)) for c in cases for s in atlas.settings if runs(c, s)]
    hyper = pts[0][2]["config"]["hyper"]
    moe = hyper.get("moe") or {}
    cats = _stack_categories([p for _, _, p in pts])
    shape = (f"L = {hyper['n_layer']}, h = {hyper['n_embd']}, a = {hyper['n_head']}"
             + (f", {hyper['n_kv_head']} KV heads" if "n_kv_head" in hyper else "")
             + (f", intermediate {hyper['intermediate_size']}" if "intermediate_size" in hyper else "")
             + (f", {moe['num_experts']} experts, top {moe['top_k']}" if moe else "")
             + f", vocabulary {hyper['vocab_size']:,}")
    rows, notes = [], []
    for c, s, p in pts:
        b = p["breakdown_at_peak"]
        psi = p["config"]["hyper"]["num_params"]
        states = sum(b.get(k, 0) for k in ("params", "master", "grads", "optimizer"))
        z = zero_model_states(psi)
        label = setting_label(s)
        rows.append([str(c.seq) + (" ᵉ" if c.extended else ""), label, gib(p["peak_allocated"]),
                     gib(p["peak_reserved"])] + [gib(b.get(k, 0)) for k in cats]
                    + [gib(z), gib(states), ratio(states, z)])
        if off(states, z):
            notes.append(f"- s = {c.seq}, {label}: ×{states / z:.2f} — {states_reason(p)}.")
    fit_rows = [[str(c.seq) + (" ᵉ" if c.extended else ""), setting_label(s)]
                + [str(idx.max_batch(card, c, s)) for card in atlas.cards]
                for c in cases for s in atlas.settings if runs(c, s)]
    text = [
        f"### {model}",
        "",
        f"Ψ = {hyper['num_params']:,} ({shape}).",
        "",
        caption(n, f"{model}: peak and breakdown at the peak, GiB, batch 1; model states against "
                   f"16Ψ (ᵉ: positions extended)"),
        "",
        _md_table(["s", "setting", "peak allocated", "peak reserved"] + cats
                  + ["16Ψ", "params+master+grads+optimizer", "× 16Ψ"], rows),
        "",
    ]
    text += ([f"Why the model states at the peak differ from 16Ψ by more than {TOLERANCE:.0%}:", ""]
             + notes + [""]) if notes else []
    text += [
        caption(n + 1, f"{model}: largest batch that fits (`memtrade fit`), sequences of length s"),
        "",
        _md_table(["s", "setting"] + [f"{c} card" for c in atlas.cards], fit_rows),
    ]
    return "\n".join(text), n + 2


def dp_section(atlas: Atlas, n: int) -> tuple[str, int]:
    """Per-GPU peaks at each rank count and sharding stage (memtrade's data parallelism)."""
    by = {}
    for p in atlas.dp["points"]:
        c = p["config"]
        by[(point_value(c), _seq_of(c), int(c["data_parallel"]), c["sharding"])] = p
    rows = []
    for case in atlas.cases:
        for ranks in atlas.dp_ranks:
            cells = []
            for stage in atlas.dp_stages:
                p = by.get((case.value, case.seq, ranks, stage))
                cells.append(gib(p["peak_allocated"]) if p else "—")
            rows.append([case.model + instead_mark(case, atlas.dp_setting), str(case.seq), str(ranks),
                         *cells])
    text = [
        "## Per GPU under data parallelism",
        "",
        f"Each GPU's peak at batch 1 per GPU, {setting_label(atlas.dp_setting)}, when the same "
        "training runs on N GPUs (`--dp N`) with each sharding stage (`--sharding`): none is "
        "DDP (weights, grads, DDP's buckets and AdamW's state on every GPU), zero1 shards the "
        "optimizer state, zero2 also the grads, zero3 also the weights (FSDP FULL_SHARD). The "
        "memory model runs rank 0, the most loaded, with every buffer the collectives need "
        "([data-parallel.md](data-parallel.md) has the proof on real ranks).",
        "",
        caption(n, "peak allocated per GPU, GiB"),
        "",
        _md_table(["model", "tokens", "GPUs", *atlas.dp_stages], rows),
    ]
    return "\n".join(text), n + 1


def rate(v: float) -> str:
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}K" if v >= 1e3 else f"{v:.1f}"


def tp_section(atlas: Atlas, n: int) -> tuple[str, int]:
    """Per-GPU peaks at each tp size, SP off and on (and with a GPU, the time model's tokens/s
    per GPU and MFU)."""
    def index(doc):
        by = {}
        for p in (doc or {}).get("points", []):
            c = p["config"]
            sp = c.get("sequence_parallel", "off") if int(c.get("tensor_parallel", 1)) > 1 else "off"
            by[(point_value(c), _seq_of(c), int(c.get("tensor_parallel", 1)), sp)] = p
        return by
    peaks, times = index(atlas.tp), index(atlas.tp_time)
    sps = ["off", "on"]
    rows = []
    for case in atlas.cases:
        for tp in atlas.tp_sizes:
            if (case.value, case.seq, tp, "off") not in peaks:
                continue  # a split this model's heads cannot take
            cells = []
            for sp in sps:
                p = peaks.get((case.value, case.seq, tp, sp))
                cells.append(gib(p["peak_allocated"]) if p and (tp > 1 or sp == "off") else "—")
            if atlas.gpu:
                for sp in sps:
                    t = (times.get((case.value, case.seq, tp, sp)) or {}).get("time_model")
                    ok = t and (tp > 1 or sp == "off")
                    cells.append(f"{rate(t['tokens_per_s_per_gpu'])}, {100 * t['mfu']:.1f}%" if ok
                                 else "—")
            rows.append([case.model + instead_mark(case, atlas.tp_setting), str(case.seq), str(tp),
                         *cells])
    head = ["model", "tokens", "tp", "peak, SP off", "peak, SP on"]
    timed = ""
    if atlas.gpu:
        head += [f"tok/s/GPU, MFU on {atlas.gpu} (SP off)", "(SP on)"]
        timed = (f" With `--gpu {atlas.gpu}` the time model (docs/time-model.md) times each "
                 "configuration that fits one such card: tokens per second per GPU and MFU (PaLM's "
                 "convention, the whole model's FLOPs over tp GPUs), the tp collectives in line "
                 "over NVLink; `—` where it does not fit.")
    text = [
        "## Per GPU under tensor parallelism",
        "",
        f"Each GPU's peak at batch 1, {setting_label(atlas.tp_setting)}, when one replica is split "
        "over tp GPUs of a node (`--tp N`, Megatron's column- and row-parallel linears, heads and "
        "KV heads split, the vocabulary split), without and with sequence parallelism "
        "(`--sequence-parallel on`: the norms, residuals and the linears' saved inputs split "
        "along the tokens). Only the sizes the model's heads, KV heads and MLP divide by are "
        "shown. The memory model runs rank 0, which holds the largest vocabulary part "
        "([tensor-parallel.md](tensor-parallel.md) has Korthikanti et al.'s per-rank formulas "
        f"beside it).{timed}",
        "",
        caption(n, "peak allocated per GPU, GiB" + (", and the time model's throughput" if atlas.gpu
                                                    else "")),
        "",
        _md_table(head, rows),
    ]
    return "\n".join(text), n + 1


def write_atlas(atlas: Atlas, outdir: str | pathlib.Path, formats: Sequence[str] = FORMATS) -> pathlib.Path:
    """Draw the charts into outdir and write outdir/atlas.md; returns the page's path."""
    out = pathlib.Path(outdir)
    idx = Index(atlas)
    peak_files = peak_chart(atlas, idx, out, formats)
    breakdown_files = breakdown_chart(atlas, idx, out, formats)
    lrows = layer_rows(atlas, idx)
    png = {f.rsplit(".", 1)[1]: f for f in peak_files}.get("png", peak_files[0])
    bpng = {f.rsplit(".", 1)[1]: f for f in breakdown_files}.get("png", breakdown_files[0])
    parts = [INTRO.format(predicted=PREDICTED, version=atlas.version), settings_section(atlas), ""]
    parts += [
        "## Peak against sequence length",
        "",
        f"![Peak memory at batch 1 against sequence length, one panel per model, {PREDICTED}]({png})",
        "",
        f"*Chart: {PREDICTED}.* One panel per model, one line per setting; dotted lines are the "
        "cards' capacities that fall within the panel. Math attention's probabilities grow as s², "
        "everything else as s.",
        "",
        "## Breakdown at the peak",
        "",
        f"![Breakdown at the peak, batch 1, {setting_label(atlas.breakdown_setting)}, {PREDICTED}]"
        f"({bpng})",
        "",
        f"*Chart: {PREDICTED}.* Batch 1, {setting_label(atlas.breakdown_setting)}: the setting "
        "most training scripts run by default (no checkpointing, PyTorch's SDPA). The bar is the "
        "peak allocated, split by allocator category at that moment.",
        "",
    ]
    n = 1
    parts += [models_section(atlas, idx), ""]
    section, n = states_section(atlas, idx, n)
    parts += [section, ""]
    section, n = korthikanti_section(atlas, idx, lrows, n)
    parts += [section, ""]
    if atlas.dp:
        section, n = dp_section(atlas, n)
        parts += [section, ""]
    if atlas.tp:
        section, n = tp_section(atlas, n)
        parts += [section, ""]
    parts += ["## Per model: peak at batch 1 and the largest batch per card", ""]
    for model in dict.fromkeys(c.model for c in atlas.cases):
        section, n = model_section(atlas, idx, model, n)
        parts += [section, ""]
    page = out / "atlas.md"
    page.write_text("\n".join(parts).rstrip() + "\n")
    return page
