"""One function per chart. Each writes DIR/<key>.<fmt> for every format and returns a Chart:
the files written, the table of numbers behind the chart, notes, or why it was not drawn.

Charts never raise on thin data (no points, all OOM, nothing to compare): they return a Chart
with ``skipped`` set, or draw an informative figure, and the page says so.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import textwrap
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.transforms  # noqa: E402

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from . import analysis as A  # noqa: E402

MAX_BARS = 30          # points per bar chart
MAX_LABELS = 12        # Pareto points labelled with their knobs (beyond: numbers)
MAX_LINES = 6          # lines per curve chart
MAX_TREND = 8          # point ids in the commit trend

MODEL_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
CATEGORY_COLORS = {
    "params": "#4c72b0", "master": "#8172b2", "casts": "#a1c9f4", "grads": "#dd8452", "optimizer": "#c44e52",
    "activations": "#55a868", "temporaries": "#937860", "workspace": "#da8bc3", "io": "#8c8c8c",
}
EXTRA_COLORS = ["#ccb974", "#64b5cd", "#b0b0b0", "#ffb482"]

matplotlib.rcParams.update({
    "font.size": 9,
    "axes.titlesize": 11,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "axes.spines.top": False,
    "svg.hashsalt": "memtrade",
})


@dataclasses.dataclass
class Chart:
    key: str
    title: str
    files: list[str] = dataclasses.field(default_factory=list)  # names relative to the output dir
    headers: list[str] = dataclasses.field(default_factory=list)
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    skipped: str | None = None  # why the chart was not drawn


# ---------------------------------------------------------------------------------------------
# Helpers


def _figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, outdir: pathlib.Path, key: str, formats: Sequence[str]) -> list[str]:
    outdir.mkdir(parents=True, exist_ok=True)
    names = []
    for fmt in formats:
        name = f"{key}.{fmt}"
        meta = {"Date": None} if fmt == "svg" else None
        fig.savefig(outdir / name, format=fmt, dpi=130, metadata=meta)
        names.append(name)
    return names


def _model_colors(points: Sequence[dict]) -> dict[str, str]:
    models = sorted({str(p["config"].get("model")) for p in points})
    return {m: MODEL_COLORS[i % len(MODEL_COLORS)] for i, m in enumerate(models)}


def _cat_color(cat: str, i: int) -> str:
    return CATEGORY_COLORS.get(cat, EXTRA_COLORS[i % len(EXTRA_COLORS)])


def _plain_fmt() -> FuncFormatter:
    return FuncFormatter(lambda v, _pos: f"{v:g}")


def _message(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=11,
            color="#444", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _overlap(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


_OFFSETS = [(7, 7, "left", "bottom"), (7, -7, "left", "top"), (-7, 7, "right", "bottom"),
            (-7, -7, "right", "top"), (0, 11, "center", "bottom"), (0, -11, "center", "top"),
            (14, 20, "left", "bottom"), (14, -20, "left", "top"), (-14, 20, "right", "bottom"),
            (-14, -20, "right", "top"), (0, 30, "center", "bottom"), (0, -30, "center", "top")]


def _place_labels(fig: Figure, ax, xs, ys, labels, fontsize: float = 7.5, color="#222",
                  obstacles: Sequence[Any] = ()) -> None:
    """Annotate (x, y) points, choosing per label the offset that overlaps least with labels
    already placed, the markers, and the axes edge (greedy, in display space)."""
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()  # settle constrained layout so display coordinates are final
    axbox = ax.get_window_extent(renderer)
    pts = ax.transData.transform(list(zip(xs, ys))) if len(xs) else []
    r = 6 * fig.dpi / 72  # marker radius plus a little clearance
    marks = [matplotlib.transforms.Bbox([[px - r, py - r], [px + r, py + r]]) for px, py in pts]
    placed: list[Any] = [o.get_window_extent(renderer) for o in obstacles]
    for x, y, lab in zip(xs, ys, labels):
        best = None
        for dx, dy, ha, va in _OFFSETS:
            far = abs(dx) > 10 or abs(dy) > 12
            t = ax.annotate(lab, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                            fontsize=fontsize, color=color,
                            arrowprops=dict(arrowstyle="-", color="#555", lw=0.7, shrinkA=0, shrinkB=3) if far else None)
            bb = t.get_window_extent(renderer)
            cost = sum(_overlap(bb, o) for o in placed) + sum(_overlap(bb, m) for m in marks)
            outside = bb.width * bb.height - _overlap(bb, axbox)
            cost += 3 * outside + (5 if far else 0)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, t, bb)
            else:
                t.remove()
            if cost == 0:
                break
        placed.append(best[2])


def _n(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


def _skip(key: str, title: str, why: str) -> Chart:
    return Chart(key=key, title=title, skipped=why)


# ---------------------------------------------------------------------------------------------
# 1. Trade-off frontier


def frontier(points: Sequence[dict], meta: dict, outdir: pathlib.Path, formats: Sequence[str]) -> Chart:
    key, title = "frontier", "Trade-off frontier: peak memory vs throughput"
    inference = [p for p in points if A.is_inference(p)]
    points = A.training_points(points)  # eval points are not training: their own panel
    ok = A.ok_points(points)
    oom = [p for p in points if p.get("status") == "oom"]
    if not ok and not oom:
        return _skip(key, title, "no points in the results")
    colors = _model_colors(ok + oom)
    cap = meta.get("capacity")
    # the capacity line: meta.capacity, else (only to place OOM markers) the max measured memory
    cap_line = cap if cap else (max(A.peak(p) for p in ok) if ok and oom else None)
    peaks = [A.peak(p) for p in ok] + ([cap_line] if cap_line else [])
    unit, div = A.memory_unit(max(peaks) if peaks else 0)
    fig = _figure(8.5, 5.6 if ok else 2.2)
    ax = fig.add_subplot()
    ax.set_title(title)
    # Throughput in rate()'s unit: tokens/s for a language model (a shorter sequence is more
    # samples of fewer tokens), samples/s for MLP and CNN; the front is taken in it.
    rate_unit = A.rate_unit(ok) if ok else "samples/s"
    mixed = rate_unit not in ("tok/s", "samples/s")
    chart = Chart(key=key, title=title, headers=["#", "model", "knobs", f"peak ({unit})",
                                                  "throughput" if mixed else rate_unit, "median step"])
    if not ok:
        _message(ax, f"No ok points: {len(oom)} of {len(points)} point(s) ran out of memory"
                 + (f" at capacity {cap / A.GiB:g} GiB" if cap else "") + "\n(listed in the table below)")
        for sp in ax.spines.values():
            sp.set_visible(False)
        chart.notes.append(f"No ok points; {len(oom)} OOM point(s) — see the table of OOM points.")
        chart.headers = ["model", "knobs", "status", "error"]
        lk = A.label_knobs(oom)
        chart.rows = [[p["config"]["model"], A.compact_label(p["config"], lk), "oom", (p.get("error") or "")[:90]]
                      for p in oom]
        chart.files = _save(fig, outdir, key, formats)
        return chart
    thr = [A.rate(p)[0] for p in ok]
    log_y = min(thr) > 0 and max(thr) / min(thr) > 20
    by_model: dict[str, list[dict]] = {}
    for p in ok:
        by_model.setdefault(p["config"]["model"], []).append(p)
    multi = len(by_model) > 1
    front_all: list[tuple[dict, str]] = []
    for model, pts in sorted(by_model.items()):
        c = colors[model]
        ax.scatter([A.peak(p) / div for p in pts], [A.rate(p)[0] for p in pts], s=22, color=c, alpha=0.45,
                   linewidths=0, zorder=2)
        front = [pts[i] for i in A.pareto_front([(A.peak(p), A.rate(p)[0]) for p in pts])]
        fx, fy = [A.peak(p) / div for p in front], [A.rate(p)[0] for p in front]
        ax.step(fx, fy, where="post", color=c, lw=1.4, zorder=3)
        ax.scatter(fx, fy, s=42, color=c, edgecolors="black", linewidths=0.7, zorder=4)
        lk = _front_knobs(front) + A.setting_knobs()  # what varies, and every knob turned
        front_all += [(p, A.compact_label(p["config"], lk)) for p in front]
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_plain_fmt())
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _p: ""))
    ax.set_xlim(0, max(peaks) / div * 1.12)
    if not log_y:
        ax.set_ylim(0, max(thr) * 1.15)
    else:
        ax.set_ylim(min(thr) / 1.6, max(thr) * 1.6)
    ax.set_xlabel(f"peak allocated memory ({unit})")
    ax.set_ylabel(f"throughput ({rate_unit}" + (", log scale)" if log_y else ")"))
    ax.grid(alpha=0.25)
    handles = [Line2D([], [], color=colors[m], marker="o", lw=1.4, label=m) for m in sorted(by_model)]
    handles.append(Line2D([], [], color="gray", marker="o", mec="black", lw=1.4, label="Pareto-optimal (step line)"))
    obstacles: list[Any] = []
    if cap_line:
        cap_line /= div
        ax.axvline(cap_line, color="#555", ls="--", lw=1)
        what = "capacity" if cap else "max measured"
        obstacles.append(ax.text(cap_line, 0.99, f" {what} {cap_line:.3g} {unit}", transform=ax.get_xaxis_transform(),
                rotation=90, ha="right", va="top", fontsize=7.5, color="#555"))
    if oom:
        oom_models = sorted({p["config"]["model"] for p in oom})
        for j, m in enumerate(oom_models):
            n = sum(p["config"]["model"] == m for p in oom)
            y = 0.05 + 0.07 * j
            ax.scatter([cap_line], [y], marker="x", s=60, color=colors[m], linewidths=2,
                       transform=ax.get_xaxis_transform(), zorder=5, clip_on=False)
            ax.text(cap_line, y, f"{n} OOM  ", transform=ax.get_xaxis_transform(), ha="right",
                    va="center", fontsize=7.5, color=colors[m])
        handles.append(Line2D([], [], color="gray", marker="x", lw=0, mew=2, label="OOM (placed at capacity)"))
    # Outside the axes: inside, "best" still covers points at the corners (a fast, small model).
    leg = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
                    frameon=True, framealpha=0.9)
    numbered = len(front_all) > MAX_LABELS
    labels = [(f"#{i + 1}" if numbered else (f"{lab}" if not multi else lab)) for i, (p, lab) in enumerate(front_all)]
    _place_labels(fig, ax, [A.peak(p) / div for p, _ in front_all], [A.rate(p)[0] for p, _ in front_all], labels,
                  obstacles=[leg] + obstacles)
    for i, (p, lab) in enumerate(front_all):
        chart.rows.append([str(i + 1), p["config"]["model"], lab, f"{A.peak(p) / div:.3g}",
                           _rate_cell(p, mixed), _fmt_time(A.step_time(p))])
    if inference:
        chart.notes.append(f"{len(inference)} inference point(s) (mode = eval) are left out: they do not "
                           "train; see the inference panel.")
    chart.notes.append(f"{len(ok)} ok point(s), {len(oom)} OOM; the table lists the Pareto-optimal points "
                       "(no other point of the same model has less memory and more throughput).")
    chart.notes.append(_RATE_NOTE)
    if numbered:
        chart.notes.append("Pareto points are numbered on the chart; the numbers refer to the table.")
    if log_y:
        chart.notes.append("Throughput axis is logarithmic (models differ by more than 20×).")
    chart.files = _save(fig, outdir, key, formats)
    return chart


_RATE_NOTE = ("Throughput is tokens/s for language models (a shorter sequence is more samples of fewer "
              "tokens), samples/s for MLP and CNN.")


def _rate_cell(p: dict, mixed: bool) -> str:
    """rate() of a point, with its unit where the table's column mixes kinds of model."""
    v, unit = A.rate(p)
    return _n(v) + (f" {unit}" if mixed else "")


def _front_knobs(front: Sequence[dict]) -> list[str]:
    """Axes for Pareto labels: those that vary along the front (the model has its colour)."""
    return [k for k in A.varying_knobs(front) if k != "model"]


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "–"
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms"


# ---------------------------------------------------------------------------------------------
# 2. Knob effects


def knob_effects(points: Sequence[dict], outdir: pathlib.Path, formats: Sequence[str],
                 baseline_id: str | None = None) -> Chart:
    key, title = "knob-effects", "Knob effects vs the baseline point"
    if baseline_id:
        b = A.find_point(points, baseline_id)
        if b is None:
            return _skip(key, title, f"baseline point {baseline_id!r} is not in the results")
        baselines = {b["config"]["model"]: b}
    else:
        baselines = A.default_baselines(points)
    if not baselines:
        return _skip(key, title, "no baseline point: no ok point has every knob at its default "
                                 "(pass --baseline-point ID)")
    rows: list[tuple[dict, dict]] = []
    for model, base in sorted(baselines.items()):
        # Inference points (mode = eval) have their own panel: their throughput "lost" (-240 %)
        # would set this axis and squash every training knob.
        same = [p for p in points if p["config"].get("model") == model and not A.is_inference(p)]
        try:
            eff = A.knob_effects(same, base)
        except ValueError as e:
            return _skip(key, title, str(e))
        rows += [(base, r) for r in eff]
    if not rows:
        return _skip(key, title, "no point differs from the baseline in exactly one knob")
    multi = len(baselines) > 1
    names = [(f"{r['point_id'].split('/')[0]} · " if multi else "") + f"{r['knob']}={r['value']}"
             for _, r in rows]
    n = len(rows)
    fig = _figure(8.5, 1.4 + 0.36 * n)
    ax = fig.add_subplot()
    y = list(range(n))
    h = 0.38
    mem = [r["mem_saved_pct"] if r["mem_saved_pct"] is not None else 0 for _, r in rows]
    thr = [r["thr_lost_pct"] if r["thr_lost_pct"] is not None else 0 for _, r in rows]
    ax.barh([v - h / 2 for v in y], mem, height=h, color="#4c72b0", label="memory saved (%)")
    ax.barh([v + h / 2 for v in y], thr, height=h, color="#dd8452", label="throughput lost (%)")
    span = max([abs(v) for v in mem + thr] + [1])
    for i, (_, r) in enumerate(rows):
        if r["mem_saved_pct"] is None:
            ax.text(0, i, f"  {r['status'].upper()}", va="center", ha="left", fontsize=7.5, color="#c00")
            continue
        for val, dy in ((r["mem_saved_pct"], -h / 2), (r["thr_lost_pct"], h / 2)):
            ax.text(val + (0.01 if val >= 0 else -0.01) * span, i + dy, f"{val:+.0f}%", va="center",
                    ha="left" if val >= 0 else "right", fontsize=6.5, color="#333")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.axvline(0, color="black", lw=0.8)
    prev = None
    for i, (_, r) in enumerate(rows):  # thin separators between knobs
        if prev is not None and r["knob"] != prev:
            ax.axhline(i - 0.5, color="#ccc", lw=0.6)
        prev = r["knob"]
    lo, hi = min(mem + thr + [0]), max(mem + thr + [0])
    pad = 0.14 * (hi - lo or 1)
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_xlabel("% relative to the baseline (memory saved: higher is better; throughput lost: lower is better)")
    base_desc = "; ".join(f"{A.short_label(b['config'])}" for b in baselines.values())
    ax.set_title("\n".join(textwrap.wrap(f"Knob effects vs baseline: {base_desc}", 80)), fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=True, framealpha=0.9)
    ax.grid(axis="x", alpha=0.25)
    chart = Chart(key=key, title=title,
                  headers=["model", "knob", "value", "peak", "throughput", "memory saved", "throughput lost"])
    for base, r in rows:
        chart.rows.append([base["config"]["model"], r["knob"], str(r["value"]), A.fmt_bytes(r["peak"]),
                           f"{_n(r['rate'])} {r['rate_unit']}" if r["rate"] is not None else r["status"],
                           A.fmt_pct(r["mem_saved_pct"]), A.fmt_pct(r["thr_lost_pct"])])
    for b in baselines.values():
        b_rate, b_unit = A.rate(b)
        chart.notes.append(f"Baseline {b['id']}: peak {A.fmt_bytes(A.peak(b))}, {_n(b_rate)} {b_unit}.")
    chart.notes.append(_RATE_NOTE[:-1] + "; throughput lost is in that unit.")
    defaults = ", ".join(A.short_value(k, A.K.default(k)) for k in A.setting_knobs())
    chart.notes.append("Baseline rule: --baseline-point if given, else per model the ok point with every knob "
                       f"at its default ({defaults}) at the batch size with the most ok points of that "
                       "model. Each row is a point that differs from it in exactly one knob.")
    chart.files = _save(fig, outdir, key, formats)
    return chart


# ---------------------------------------------------------------------------------------------
# 2b. Inference points (mode = eval)


def inference(points: Sequence[dict], outdir: pathlib.Path, formats: Sequence[str]) -> Chart:
    """Inference points next to the training point they differ from only in mode (else their
    model's training baseline): peak and throughput, in two panels."""
    key, title = "inference", "Inference (mode = eval) next to training"
    evals = [p for p in A.ok_points(points) if A.is_inference(p)]
    if not evals:
        return _skip(key, title, "no ok inference point (mode = eval)")
    train = A.training_points(A.ok_points(points))
    baselines = A.default_baselines(train)
    pairs = []
    for e in evals:
        twin = next((t for t in train if A.differing_knobs(t, e) == ["mode"]), None)
        pairs.append((e, twin or baselines.get(e["config"].get("model"))))
    labels = [A.short_label(e["config"]) for e, _ in pairs]
    fig = _figure(8.5, 1.6 + 0.45 * len(pairs))
    axm, axt = fig.subplots(1, 2, sharey=True)
    unit, div = A.memory_unit(max(A.peak(p) for pair in pairs for p in pair if p))
    y = list(range(len(pairs)))
    h = 0.38
    rate_unit = A.rate_unit([p for pair in pairs for p in pair if p])
    mixed = rate_unit not in ("tok/s", "samples/s")
    for ax, get, xlabel in ((axm, lambda p: A.peak(p) / div, f"peak allocated ({unit})"),
                            (axt, lambda p: A.rate(p)[0], f"throughput ({rate_unit})")):
        ax.barh([v - h / 2 for v in y], [get(t) if t else 0 for _, t in pairs], height=h, color="#4c72b0",
                label="training")
        ax.barh([v + h / 2 for v in y], [get(e) for e, _ in pairs], height=h, color="#55a868", label="eval")
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.25)
    axm.set_yticks(y, labels)
    axm.invert_yaxis()
    axt.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=True, framealpha=0.9)
    fig.suptitle(title, fontsize=11)
    col = "throughput" if mixed else rate_unit
    chart = Chart(key=key, title=title, headers=["eval point", f"peak ({unit})", col, "training point",
                                                 f"its peak ({unit})", f"its {col}"])
    for lab, (e, t) in zip(labels, pairs):
        chart.rows.append([lab, f"{A.peak(e) / div:.3g}", _rate_cell(e, mixed),
                           A.short_label(t["config"]) if t else "–", f"{A.peak(t) / div:.3g}" if t else "–",
                           _rate_cell(t, mixed) if t else "–"])
    chart.notes.append("Eval runs the forward pass only and keeps nothing for backward: it is inference, not a "
                       "setting of training, so it is kept off the training frontier and the knob effects.")
    chart.files = _save(fig, outdir, key, formats)
    return chart


# ---------------------------------------------------------------------------------------------
# 3. Memory breakdown


def breakdown(points: Sequence[dict], outdir: pathlib.Path, formats: Sequence[str]) -> Chart:
    key, title = "breakdown", "Memory breakdown at peak"
    pts = [p for p in A.ok_points(points) if isinstance((p["memory"] or {}).get("breakdown_at_peak"), dict)]
    if not pts:
        return _skip(key, title, "no ok point with a memory breakdown")
    total = len(pts)
    if total > MAX_BARS:  # keep the Pareto points, fill up evenly across the peak range
        keep = {id(pts[i]) for i in A.pareto_front(pts)}
        rest = sorted((p for p in pts if id(p) not in keep), key=A.peak)
        need = max(MAX_BARS - len(keep), 0)
        step = len(rest) / need if need else 0
        chosen = [p for p in pts if id(p) in keep][:MAX_BARS] + [rest[int(i * step)] for i in range(need)]
        pts = chosen
    pts = sorted(pts, key=A.peak)
    cats = A.categories(p["memory"]["breakdown_at_peak"] for p in pts)
    cats = [c for c in cats if any(p["memory"]["breakdown_at_peak"].get(c) for p in pts)]
    unit, div = A.memory_unit(max(A.peak(p) for p in pts))
    lk = A.label_knobs(pts)
    labels = [A.compact_label(p["config"], lk) for p in pts]
    n = len(pts)
    fig = _figure(9, 1.6 + 0.3 * n)
    ax = fig.add_subplot()
    left = [0.0] * n
    for i, c in enumerate(cats):
        vals = [p["memory"]["breakdown_at_peak"].get(c, 0) / div for p in pts]
        ax.barh(range(n), vals, left=left, color=_cat_color(c, i), label=c, height=0.72)
        left = [a + b for a, b in zip(left, vals)]
    ax.scatter([A.peak(p) / div for p in pts], range(n), marker="|", color="black", s=90, zorder=3,
               label="peak allocated")
    ax.set_yticks(range(n), labels, fontsize=7.5 if n > 15 else 8.5)
    ax.set_xlabel(f"memory at peak ({unit})")
    ax.set_title(title + (f" ({n} of {total} points)" if n < total else ""))
    ax.legend(loc="lower right", frameon=True, framealpha=0.92)
    ax.grid(axis="x", alpha=0.25)
    ax.set_ylim(-0.6, n - 0.4)
    chart = Chart(key=key, title=title, headers=["point", f"peak ({unit})"] + cats)
    for lab, p in zip(labels, pts):
        bd = p["memory"]["breakdown_at_peak"]
        chart.rows.append([lab, f"{A.peak(p) / div:.3g}"] + [f"{bd.get(c, 0) / div:.3g}" for c in cats])
    chart.notes.append(f"Bytes live by category at the moment of peak allocation, in {unit}; sorted by peak.")
    if n < total:
        chart.notes.append(f"Showing {n} of {total} points: the Pareto points and an even spread of the rest.")
    chart.files = _save(fig, outdir, key, formats)
    return chart


# ---------------------------------------------------------------------------------------------
# 4. Checkpoint density


def checkpoint_curve(points: Sequence[dict], outdir: pathlib.Path, formats: Sequence[str]) -> Chart:
    key, title = "checkpoint", "Activation checkpointing: peak memory and step time vs density"
    numeric = [p for p in A.ok_points(points) if A.checkpoint_density(p["config"].get("checkpoint", "0")) is not None]
    groups = A.groups_varying(numeric, "checkpoint")[:MAX_LINES]
    if not groups:
        return _skip(key, title, "no points that differ only in a numeric checkpoint density")
    allp = [p for g in groups for p in g]
    lk = [k for k in A.label_knobs(allp) if k != "checkpoint"] or ["model"]
    unit, div = A.memory_unit(max(A.peak(p) for p in allp))
    tunit, tdiv = A.time_unit(max(A.step_time(p) for p in allp))
    fig = _figure(8.5, 5.2)
    ax = fig.add_subplot()
    ax2 = ax.twinx()
    handles = []
    chart = Chart(key=key, title=title, headers=["line", "density", f"peak ({unit})", f"median step ({tunit})"])
    dens_all = set()
    for i, g in enumerate(groups):
        g = sorted(g, key=lambda p: A.checkpoint_density(p["config"]["checkpoint"]))
        c = MODEL_COLORS[i % len(MODEL_COLORS)]
        d = [A.checkpoint_density(p["config"]["checkpoint"]) for p in g]
        dens_all.update(d)
        lab = A.compact_label(g[0]["config"], lk)
        ax.plot(d, [A.peak(p) / div for p in g], color=c, marker="o", lw=1.6)
        ax2.plot(d, [A.step_time(p) / tdiv for p in g], color=c, marker="s", ls="--", lw=1.2, ms=4)
        handles.append(Line2D([], [], color=c, lw=2, label=lab))
        for dd, p in zip(d, g):
            chart.rows.append([lab, f"{dd:g}", f"{A.peak(p) / div:.3g}", f"{A.step_time(p) / tdiv:.3g}"])
    handles += [Line2D([], [], color="gray", marker="o", lw=1.6, label=f"peak memory (left, {unit})"),
                Line2D([], [], color="gray", marker="s", ls="--", lw=1.2, label=f"step time (right, {tunit})")]
    ax.set_xlabel("checkpoint density (fraction of blocks recomputed in backward)")
    ax.set_ylabel(f"peak allocated memory ({unit})")
    ax2.set_ylabel(f"median step time ({tunit})")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    ax2.set_ylim(0, ax2.get_ylim()[1] * 1.08)
    ax2.spines["top"].set_visible(False)
    ax.set_xticks(sorted(dens_all))
    ax.xaxis.set_major_formatter(_plain_fmt())
    ax.grid(alpha=0.25)
    ax.set_title(title)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=min(len(handles), 3),
              frameon=False)
    others = sorted({str(p["config"]["checkpoint"]) for p in A.ok_points(points)
                     if A.checkpoint_density(p["config"].get("checkpoint", "0")) is None})
    if others:
        chart.notes.append(f"Non-numeric checkpoint settings ({', '.join(others)}) are not on the density axis; "
                           "see the knob effects table.")
    chart.files = _save(fig, outdir, key, formats)
    return chart


# ---------------------------------------------------------------------------------------------
# 4b. Sequence length: math vs flash attention


def seq_len_curve(points: Sequence[dict], estimates: Sequence[dict], outdir: pathlib.Path,
                  formats: Sequence[str]) -> Chart:
    """Peak memory against sequence length: measured points that differ only in seq_len (left)
    and, from `memtrade estimate --json` documents, predicted ones (right, labelled with the
    memory model's backend). Attention kinds are told apart by line style."""
    key, title = "seq-len", "Peak memory vs sequence length (math vs flash attention)"
    measured = A.seq_len_lines(A.ok_points(points), A.peak)
    predicted_rows = [r for e in estimates for r in e["points"]]
    predicted_lines = A.seq_len_lines(predicted_rows, lambda r: r.get("peak_allocated"))
    if not measured and not predicted_lines:
        return _skip(key, title, "no points that differ only in sequence length")
    panels = [(l, "measured") for l in [measured] if l] + \
             [(l, "predicted") for l in [predicted_lines] if l]
    fig = _figure(5.2 * len(panels) + 1.0, 4.8)
    chart = Chart(key=key, title=title, headers=["kind", "line", "tokens", "peak"])
    for n, (lines, kind) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), n + 1)
        allp = [p for _, pts in lines for p in pts]
        unit, div = A.memory_unit(max(pk for _, pk in allp))
        lk = [k for k in A.varying_knobs([{"config": c} for c, _ in lines])
              if k not in ("seq_len", "attention", "model")]
        # One colour per line apart from the attention kind, which is the line style.
        colours: dict[tuple, str] = {}
        for cfg, pts in lines[:MAX_LINES * 2]:
            flash = cfg.get("attention") == "flash"
            rest = A.knob_tuple(cfg, exclude=("seq_len", "attention"))
            colour = colours.setdefault(rest, MODEL_COLORS[len(colours) % len(MODEL_COLORS)])
            extra = A.compact_label(cfg, lk) if lk else ""
            lab = " ".join(x for x in (str(cfg.get("model")), extra, str(cfg.get("attention")))
                           if x)
            ax.plot([t for t, _ in pts], [pk / div for _, pk in pts], marker="s" if flash else "o",
                    ls="--" if flash else "-", color=colour, lw=1.6, label=lab)
            for t, pk in pts:
                chart.rows.append([kind, lab, str(t), A.fmt_bytes(pk)])
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(_plain_fmt())
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(f"peak allocated memory ({unit})")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        ax.grid(alpha=0.25)
        backends = sorted({str(e.get("backend")) for e in estimates})
        sub = ("measured on this machine" if kind == "measured" else
               f"predicted by the {'/'.join(backends).upper()} memory model (not measured)")
        ax.set_title(sub, fontsize=9)
        ax.legend(frameon=False, fontsize=7.5)
    fig.suptitle(title, fontsize=11)
    chart.notes.append("Solid: math attention (the (B, heads, T, T) probabilities are kept for "
                       "backward, so memory grows quadratically); dashed: flash (output and a "
                       "log-sum-exp per row, linear in T).")
    chart.files = _save(fig, outdir, key, formats)
    return chart


# ---------------------------------------------------------------------------------------------
# 5. Batch-size scaling


def batch_scaling(points: Sequence[dict], meta: dict, outdir: pathlib.Path, formats: Sequence[str]) -> Chart:
    key, title = "batch", "Batch-size scaling and the largest batch that fits"
    caps = [c * A.GiB for c in A.CAPACITY_PRESETS_GIB]
    if meta.get("capacity") and int(meta["capacity"]) not in caps:
        caps.append(int(meta["capacity"]))
    caps.sort()
    fits = A.batch_fits(points, caps)[:MAX_LINES]
    if not fits:
        return _skip(key, title, "no points that differ only in batch size")
    allp = [p for f in fits for p in f["group"]]
    lk = [k for k in A.label_knobs(allp) if k != "batch_size"] or ["model"]
    fig = _figure(11, 5.2)
    ax, axt = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.5, 1]})
    bmin = min(p["config"]["batch_size"] for p in allp)
    fitted = [b for f in fits for b in f["fits"].values() if b]
    bmax = max([p["config"]["batch_size"] for p in allp] + fitted)
    xs_line = [bmin / 1.5 * (bmax * 2.0 / (bmin / 1.5)) ** (i / 60) for i in range(61)]
    div = A.GiB
    chart = Chart(key=key, title=title, headers=["line", "batches measured", "GiB per sample (fit)"]
                  + [f"fits {c / A.GiB:g} GiB" for c in caps])
    handles = []
    for i, f in enumerate(fits):
        g = f["group"]
        c = MODEL_COLORS[i % len(MODEL_COLORS)]
        lab = A.compact_label(g[0]["config"], lk)
        bs = [p["config"]["batch_size"] for p in g]
        ax.plot(bs, [A.peak(p) / div for p in g], color=c, marker="o", lw=1.8, zorder=3)
        axt.plot(bs, [A.rate(p)[0] for p in g], color=c, marker="o", lw=1.6)
        if f["fit"]:
            a, b = f["fit"]
            ys = [(a + b * x) / div for x in xs_line]
            ax.plot([x for x, y in zip(xs_line, ys) if y > 0], [y for y in ys if y > 0], color=c, ls="--",
                    lw=1, alpha=0.8)
            for cap, nb in f["fits"].items():
                if nb:
                    ax.plot([nb], [cap / div], marker="v", color=c, ms=6, zorder=4)
                    if i == 0:
                        ax.annotate(f"b≤{nb:,}", (nb, cap / div), xytext=(-4, 4), textcoords="offset points",
                                    ha="right", va="bottom", fontsize=7, color=c)
        handles.append(Line2D([], [], color=c, marker="o", lw=1.8, label=lab))
        slope = f"{f['fit'][1] / A.GiB:.3g}" if f["fit"] else "–"
        chart.rows.append([lab, ", ".join(str(b) for b in bs), slope]
                          + [("–" if f["fits"][cap] is None else f"{f['fits'][cap]:,}") for cap in caps])
    for cap in caps:
        emulated = meta.get("capacity") and cap == int(meta["capacity"]) and cap / A.GiB not in A.CAPACITY_PRESETS_GIB
        ax.axhline(cap / div, color="#c00" if emulated else "#777", lw=0.8, ls=":")
        ax.text(1.0, cap / div, f" {cap / div:g} GiB" + (" (run)" if emulated else ""), va="center", ha="left",
                fontsize=7, color="#555", transform=ax.get_yaxis_transform())
    ax.set_xscale("log")
    ax.set_yscale("log")
    axt.set_xscale("log", base=2)
    axt.set_xticks(sorted({p["config"]["batch_size"] for p in allp}))
    for a_ in (ax, axt):
        a_.xaxis.set_major_formatter(_plain_fmt())
        a_.xaxis.set_minor_formatter(FuncFormatter(lambda v, _p: ""))
    ax.yaxis.set_major_formatter(_plain_fmt())
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _p: ""))
    ax.set_ylim(min(A.peak(p) for p in allp) / div / 1.6, max(caps) / div * 1.8)
    ax.set_xlim(bmin / 1.6, bmax * 2.2)
    ax.set_xlabel("batch size (log)")
    ax.set_ylabel("peak allocated memory (GiB, log)")
    ax.set_title("Peak memory; dashed = linear fit, extrapolated", fontsize=10)
    ax.grid(alpha=0.2, which="major")
    axt.set_xlabel("batch size (log₂)")
    axt.set_ylabel(f"throughput ({A.rate_unit(allp)})")
    axt.set_ylim(0, axt.get_ylim()[1] * 1.1)
    axt.set_title("Throughput (measured)", fontsize=10)
    axt.grid(alpha=0.25)
    handles += [Line2D([], [], color="gray", ls="--", lw=1, label="linear fit (extrapolated)"),
                Line2D([], [], color="gray", marker="v", lw=0, label="largest batch that fits (fit)"),
                Line2D([], [], color="#777", ls=":", lw=0.8, label="capacity presets")]
    fig.suptitle(title, fontsize=11)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.12), ncol=3, frameon=False)
    chart.notes.append("Largest batch that fits: peak allocated = a + b·batch fitted by least squares through the "
                       "measured batches and extrapolated linearly to each capacity — an estimate, not a "
                       "measurement (allocator fragmentation, workspace and the CUDA context are not in it).")
    chart.files = _save(fig, outdir, key, formats)
    return chart


# ---------------------------------------------------------------------------------------------
# 6. Predicted vs measured


def predicted(points: Sequence[dict], outdir: pathlib.Path, formats: Sequence[str]) -> Chart:
    key, title = "predicted", "Memory model: predicted vs measured peak"
    pts = [p for p in A.ok_points(points) if A._finite((p["memory"] or {}).get("predicted_peak"))]
    if not pts:
        return _skip(key, title, "no ok point has a predicted_peak")
    meas = [A.peak(p) for p in pts]
    pred = [p["memory"]["predicted_peak"] for p in pts]
    unit, div = A.memory_unit(max(meas + pred))
    colors = _model_colors(pts)
    fig = _figure(6.8, 6.2)
    ax = fig.add_subplot()
    meas = [m / div for m in meas]
    pred = [p / div for p in pred]
    hi = max(meas + pred) * 1.08
    line = [0, hi]
    ax.fill_between(line, [0, hi * 0.97], [0, hi * 1.03], color="#999", alpha=0.25, lw=0, label="±3%")
    ax.plot(line, line, color="black", lw=0.8, label="predicted = measured")
    for m in sorted(colors):
        sel = [i for i, p in enumerate(pts) if p["config"]["model"] == m]
        ax.scatter([meas[i] for i in sel], [pred[i] for i in sel], color=colors[m], s=26, label=m, zorder=3)
    err = [100.0 * (pr - me) / me for pr, me in zip(pred, meas)]
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_aspect("equal")
    ax.set_xlabel(f"measured peak allocated ({unit})")
    ax.set_ylabel(f"predicted peak ({unit})")
    ax.set_title(title)
    ax.grid(alpha=0.25)
    ax.legend(loc="upper left", frameon=False)
    outl = sorted((i for i in range(len(pts)) if abs(err[i]) > 3), key=lambda i: -abs(err[i]))[:8]
    lk = A.label_knobs(pts)
    _place_labels(fig, ax, [meas[i] for i in outl], [pred[i] for i in outl],
                  [f"{A.compact_label(pts[i]['config'], lk)} ({err[i]:+.1f}%)" for i in outl], fontsize=7)
    inside = sum(abs(e) <= 3 for e in err)
    chart = Chart(key=key, title=title, headers=["point", f"measured ({unit})", f"predicted ({unit})", "error"])
    for i in sorted(range(len(pts)), key=lambda i: -abs(err[i]))[:MAX_BARS]:
        chart.rows.append([A.compact_label(pts[i]["config"], lk), f"{meas[i]:.3g}", f"{pred[i]:.3g}",
                           f"{err[i]:+.1f}%"])
    chart.notes.append(f"{inside} of {len(pts)} predictions within ±3% of the measured peak; "
                       f"largest error {max(err, key=abs):+.1f}%. Points outside the band are labelled.")
    chart.files = _save(fig, outdir, key, formats)
    return chart


# ---------------------------------------------------------------------------------------------
# 7. Memory timeline of one step


def timeline(trace: dict, outdir: pathlib.Path, formats: Sequence[str], key: str = "timeline") -> Chart:
    cfg = trace.get("config") or {}
    who = A.short_label(cfg) if cfg.get("model") else str(trace.get("point", "?"))
    title = f"Memory timeline of one step: {who}"
    tl = A.trace_timeline(trace.get("events") or [], trace.get("live_at_start"))
    if not tl["seq"]:
        return _skip(key, title, f"trace {trace.get('_path', '')} has no events")
    tops = [max((a or 0) for a in tl["allocated"]), max((r or 0) for r in tl["reserved"])]
    tops += [sum(col) for col in zip(*tl["live"])] if tl["live"] else []
    unit, div = A.memory_unit(max(tops + [1]))
    fig = _figure(10, 5.2)
    ax = fig.add_subplot()
    keep = _downsample(tl, 4000)
    seq = [tl["seq"][i] for i in keep]
    live = [[vals[i] for i in keep] for vals in tl["live"]]
    base = [0.0] * len(seq)
    for i, (c, vals) in enumerate(zip(tl["categories"], live)):
        top = [b + v / div for b, v in zip(base, vals)]
        ax.fill_between(seq, base, top, step="post", color=_cat_color(c, i), label=c, lw=0)
        base = top
    if any(r is not None for r in tl["reserved"]):
        ax.step(seq, [(tl["reserved"][i] or 0) / div for i in keep], where="post", color="black", ls="--", lw=1,
                label="reserved")
    if any(a is not None for a in tl["allocated"]):
        ax.step(seq, [(tl["allocated"][i] or 0) / div for i in keep], where="post", color="black", lw=0.7,
                label="allocated (allocator)")
    span = (seq[-1] - seq[0]) or 1
    shades = {}
    for j, (ph, s0, s1) in enumerate(tl["phases"]):
        shade = shades.setdefault(ph, ["#f2f2f2", "#e0e8f5", "#f5eadc", "#e3f2e1", "#f3e1f0"][len(shades) % 5])
        ax.axvspan(s0 - 0.5, s1 + 0.5, color=shade, zorder=0, lw=0)
        if (s1 - s0 + 1) / span > 0.05:
            ax.text((s0 + s1) / 2, 1.005, ph, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=8, color="#333")
    for s in tl["ooms"]:
        ax.axvline(s, color="#c00", lw=1.5)
        ax.text(s, 0.95, " OOM", color="#c00", transform=ax.get_xaxis_transform(), fontsize=8)
    ax.set_xlim(seq[0] - 0.5, seq[-1] + 0.5)
    ax.set_ylim(0, max(tops + [1]) / div * 1.1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("allocator event (seq); shaded bands = phases")
    ax.set_ylabel(f"live bytes ({unit})")
    ax.set_title(title, pad=16)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    chart = Chart(key=key, title=title, headers=["category", f"max live ({unit})", f"live at end ({unit})"])
    for c, vals in zip(tl["categories"], tl["live"]):
        chart.rows.append([c, f"{max(vals) / div:.3g}", f"{vals[-1] / div:.3g}"])
    pk = max(range(len(tl["seq"])), key=lambda i: tl["allocated"][i] or 0)
    seq = tl["seq"]
    chart.notes.append(f"Point {trace.get('point', '?')}; {len(seq)} events"
                       + (f" (drawn: {len(keep)}, the highest of each run of events)" if len(keep) < len(seq) else "")
                       + ". Per-category live bytes are rebuilt "
                       f"from alloc/free events; peak allocated {(tl['allocated'][pk] or 0) / div:.3g} {unit} at "
                       f"event {seq[pk]} ({tl['phases'] and _phase_at(tl['phases'], seq[pk])}).")
    chart.files = _save(fig, outdir, key, formats)
    return chart


def _downsample(tl: dict, limit: int) -> list[int]:
    """Indices of at most ~limit events: from each bucket of consecutive events the one with the
    most live bytes, so peaks survive; phase boundaries and OOMs fall on kept events' buckets."""
    n = len(tl["seq"])
    if n <= limit:
        return list(range(n))
    k = math.ceil(n / limit)
    totals = [sum(col) for col in zip(*tl["live"])] if tl["live"] else [0] * n
    keep = [max(range(i, min(i + k, n)), key=lambda j: totals[j]) for i in range(0, n, k)]
    if keep[-1] != n - 1:
        keep.append(n - 1)
    return keep


def _phase_at(phases, s) -> str:
    for ph, a, b in phases:
        if a <= s <= b:
            return ph
    return "?"


# ---------------------------------------------------------------------------------------------
# 8. Commit trend from history


def history_trend(hist: dict, outdir: pathlib.Path, formats: Sequence[str], top_n: int = MAX_TREND) -> Chart:
    key, title = "history", "Commit trend: peak memory and step time per commit"
    runs = hist.get("runs") or []
    if not runs:
        return _skip(key, title, "the history database has no runs")
    machine = runs[-1].get("machine")
    runs = [r for r in runs if r.get("machine") == machine]
    run_ix = {r["id"]: i for i, r in enumerate(runs)}
    series: dict[str, dict] = {}
    for p in hist.get("points") or []:
        if p.get("run_id") not in run_ix or p.get("status") != "ok" or not A._finite(p.get("peak_allocated")):
            continue
        s = series.setdefault(p["point_id"], {"config": p.get("config") or {}, "x": [], "peak": [], "t": []})
        s["x"].append(run_ix[p["run_id"]])
        s["peak"].append(p["peak_allocated"])
        s["t"].append(p.get("median_s"))
    if not series:
        return _skip(key, title, "the history database has no ok points")
    chosen = sorted(series.items(), key=lambda kv: (-len(kv[1]["x"]), -kv[1]["peak"][-1]))[:top_n]
    for _, s in chosen:
        order = sorted(range(len(s["x"])), key=lambda i: s["x"][i])
        for f in ("x", "peak", "t"):
            s[f] = [s[f][i] for i in order]
    unit, div = A.memory_unit(max(max(s["peak"]) for _, s in chosen))
    tmax = max([t for _, s in chosen for t in s["t"] if A._finite(t)] + [0])
    tunit, tdiv = A.time_unit(tmax)
    cfgs = [{"config": s["config"]} for _, s in chosen]
    lk = A.label_knobs(cfgs)
    lk = lk if "model" in lk else ["model"] + lk
    fig = _figure(10, 6.4)
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    for i, (pid, s) in enumerate(chosen):
        c = MODEL_COLORS[i % len(MODEL_COLORS)]
        lab = A.compact_label(s["config"], lk) if s["config"] else pid
        ax.plot(s["x"], [v / div for v in s["peak"]], color=c, marker="o", ms=4, lw=1.4, label=lab)
        tt = [(x, t / tdiv) for x, t in zip(s["x"], s["t"]) if A._finite(t)]
        ax2.plot([x for x, _ in tt], [t for _, t in tt], color=c, marker="o", ms=4, lw=1.4)
    # The change points of `memtrade history changes` on these series: a triangle at the first run
    # of the new level (red: a regression, green: an improvement).
    changes = [c for c in (hist.get("changes") or []) if c.get("machine") == machine]
    by_id = dict(chosen)
    marked = []
    for c in changes:
        s = by_id.get(c.get("point"))
        if s is None or not 0 <= c.get("index", -1) < len(s["x"]):
            continue
        x = s["x"][c["index"]]
        mem = c.get("metric") == "peak_allocated"
        y = (c["after"] / div) if mem else (c["after"] / tdiv)
        colour = "tab:red" if c.get("direction") == "regression" else "tab:green"
        (ax if mem else ax2).plot([x], [y], marker="v", ms=11, color=colour, zorder=5, ls="none")
        marked.append(f"{c['direction']} of {A.fmt_pct(100 * c['relative']) if c.get('relative') is not None else '?'} "
                      f"in {'peak memory' if mem else 'step time'} from commit {(c.get('commit') or '?')[:10]} "
                      f"({c.get('point')})")
    ax.set_ylabel(f"peak allocated ({unit})")
    ax2.set_ylabel(f"median step time ({tunit})")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
    ax2.set_ylim(0, ax2.get_ylim()[1] * 1.1)
    ticks = list(range(len(runs)))
    step = max(1, math.ceil(len(runs) / 20))
    ax2.set_xticks(ticks[::step], [f"{(r.get('commit_hash') or '?')[:7]}\n{(r.get('time') or '')[:10]}"
                                   for r in runs[::step]], fontsize=7)
    ax2.set_xlabel("commit (run time order)")
    for a_ in (ax, ax2):
        a_.grid(alpha=0.25)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="point")
    chart = Chart(key=key, title=title, headers=["point", "runs", f"first peak ({unit})", f"last peak ({unit})",
                                                  "peak change", f"first step ({tunit})", f"last step ({tunit})",
                                                  "step change"])
    for pid, s in chosen:
        lab = A.compact_label(s["config"], lk) if s["config"] else pid
        t0, t1 = s["t"][0], s["t"][-1]
        chart.rows.append([lab, str(len(s["x"])), f"{s['peak'][0] / div:.3g}", f"{s['peak'][-1] / div:.3g}",
                           A.fmt_pct(A.pct_change(s["peak"][0], s["peak"][-1])),
                           f"{t0 / tdiv:.3g}" if A._finite(t0) else "–", f"{t1 / tdiv:.3g}" if A._finite(t1) else "–",
                           A.fmt_pct(A.pct_change(t0, t1))])
    chart.notes.append(f"{len(runs)} run(s) on machine {machine!r}; {len(chosen)} of {len(series)} point ids shown "
                       "(those present in most runs, then the largest).")
    if hist.get("changes") is None:
        chart.notes.append("Change points not drawn: no memtrade binary to ask ($MEMTRADE_BIN).")
    else:
        chart.notes.append(f"Change points (memtrade history changes, triangles): {len(marked)}"
                           + (": " + "; ".join(marked) if marked else "."))
    chart.files = _save(fig, outdir, key, formats)
    return chart


# ---------------------------------------------------------------------------------------------
# 9. Baseline vs head


def baseline_vs_head(head: dict, base: dict, outdir: pathlib.Path, formats: Sequence[str]) -> Chart:
    key, title = "compare", "Baseline vs head"
    pairs = A.pair_points(head["points"], base["points"])
    if not pairs:
        return _skip(key, title, "no ok point id is present in both the baseline and the head results")

    def change(bp, hp):
        dm = A.pct_change(A.peak(bp), A.peak(hp)) or 0
        dt = A.pct_change(A.step_time(bp), A.step_time(hp)) or 0
        return abs(dm) + abs(dt)

    total = len(pairs)
    pairs = sorted(pairs, key=lambda bh: -change(*bh))[:MAX_BARS]
    lk = A.label_knobs([h for _, h in pairs])
    labels = [A.compact_label(h["config"], lk) for _, h in pairs]
    unit, div = A.memory_unit(max(max(A.peak(b), A.peak(h)) for b, h in pairs))
    tunit, tdiv = A.time_unit(max(max(A.step_time(b), A.step_time(h)) for b, h in pairs))
    n = len(pairs)
    fig = _figure(11, 1.8 + 0.34 * n)
    axm, axt = fig.subplots(1, 2, sharey=True)
    y = list(range(n))
    h = 0.38
    bc, hc = (base["meta"].get("commit") or "?")[:7], (head["meta"].get("commit") or "?")[:7]
    for ax, get, d, u, name in ((axm, A.peak, div, unit, "peak allocated"),
                                (axt, A.step_time, tdiv, tunit, "median step time")):
        bv = [get(b) / d for b, _ in pairs]
        hv = [get(hh) / d for _, hh in pairs]
        ax.barh([v - h / 2 for v in y], bv, height=h, color="#9fb7d9", label=f"baseline {bc}")
        ax.barh([v + h / 2 for v in y], hv, height=h, color="#2f5f9e", label=f"head {hc}")
        for i, (b_, h_) in enumerate(zip(bv, hv)):
            pc = A.pct_change(b_, h_)
            if pc is not None:
                ax.text(max(b_, h_), i, f" {pc:+.1f}%", va="center", fontsize=7,
                        color="#c00" if pc > 1 else ("#080" if pc < -1 else "#333"))
        ax.set_xlabel(f"{name} ({u})")
        ax.set_xlim(0, max(bv + hv) * 1.22)
        ax.grid(axis="x", alpha=0.25)
    axm.set_yticks(y, labels, fontsize=7.5 if n > 15 else 8.5)
    axm.invert_yaxis()
    axm.legend(loc="lower right", frameon=True, framealpha=0.9)
    fig.suptitle(f"Baseline {bc} vs head {hc}: peak memory and step time per point", fontsize=11)
    chart = Chart(key=key, title=title, headers=["point", f"base peak ({unit})", f"head peak ({unit})", "Δ peak",
                                                  f"base step ({tunit})", f"head step ({tunit})", "Δ step"])
    for lab, (b, hh) in zip(labels, pairs):
        chart.rows.append([lab, f"{A.peak(b) / div:.3g}", f"{A.peak(hh) / div:.3g}",
                           A.fmt_pct(A.pct_change(A.peak(b), A.peak(hh))), f"{A.step_time(b) / tdiv:.3g}",
                           f"{A.step_time(hh) / tdiv:.3g}", A.fmt_pct(A.pct_change(A.step_time(b), A.step_time(hh)))])
    chart.notes.append(f"{total} point id(s) ok in both files" + (f"; the {n} with the largest changes shown"
                                                                   if n < total else "") +
                       ". Δ = head relative to baseline (positive: more memory / slower).")
    chart.files = _save(fig, outdir, key, formats)
    return chart
