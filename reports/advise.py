"""`memtrade advise` documents (memtrade.advise/1): the chart of the frontier with the capacity
line, the start and the chosen point, for the report and for the docs section "What to turn when
you run out of memory" (ci/advise_doc.py writes that section)."""

from __future__ import annotations

import pathlib
import textwrap
from typing import Sequence

from matplotlib.lines import Line2D

from . import analysis as A
from . import charts as C


def throughput_label(doc: dict) -> str:
    """What the throughput figures are: predictions of a model measured where, or of a GPU's time
    model."""
    cm = doc["cost_model"]
    if cm.get("kind") == "time-model":
        return f"predicted by the time model of {cm['gpu']} (docs/time-model.md)"
    if cm.get("transferred"):
        return f"predicted from the CPU-calibrated model ({cm['model']} on {cm['device']})"
    return f"predicted by the cost model measured on {cm['device']}"


def _tokens_per_sample(doc: dict) -> int:
    """A language model's tokens per sample (its sequence length); 0 for MLP and CNN."""
    hyper = doc["start"]["config"].get("hyper") or {}
    return int(hyper.get("seq_len") or 0)


def throughput_unit(doc: dict) -> str:
    """Language models: tokens/s per GPU; MLP and CNN: samples/s (per GPU on several)."""
    if _tokens_per_sample(doc):
        return "tok/s/GPU"
    return "samples/s/GPU" if int(doc.get("gpus") or 1) > 1 else "samples/s"


def throughput(doc: dict, p: dict, key: str = "predicted_samples_per_s") -> float:
    """A point's throughput in throughput_unit(doc): samples/s over its tp × dp GPUs, × tokens."""
    c = p.get("config") or doc["start"]["config"]
    gpus = int(c.get("data_parallel", 1)) * int(c.get("tensor_parallel", 1))
    per_gpu = p[key] / gpus if _tokens_per_sample(doc) or int(doc.get("gpus") or 1) > 1 else p[key]
    return per_gpu * (_tokens_per_sample(doc) or 1)


def mfu(p: dict) -> str:
    t = p.get("time_model")
    return f"{100 * t['mfu']:.1f}%" if t else ""


def frontier(doc: dict, outdir: pathlib.Path, formats: Sequence[str], key: str = "advise") -> C.Chart:
    start = doc["start"]
    model = start["config"]["model"]
    cap, limit = doc["capacity"], doc["limit"]
    title = f"advise: {model} on {A.fmt_bytes(cap)} ({doc['backend']} memory model)"
    front = doc["frontier"]
    if not front:
        return C.Chart(key=key, title=title, skipped="the advise document has no frontier")
    rec = doc.get("recommended")
    configs = {p["id"]: p["config"] for p in front + [start] + ([rec] if rec else [])}
    # A confirmed run, with its config (its GPUs) where the document has it.
    confirmed = [dict(c, config=configs.get(c["id"], start["config"]))
                 for c in doc.get("confirmed", []) if c.get("measured_samples_per_s")]
    unit_t = throughput_unit(doc)
    tput = lambda p, key="predicted_samples_per_s": throughput(doc, p, key)  # noqa: E731
    # The x range: the card and what fits on it, with room; a point far beyond (a start that
    # needs 7 cards) is drawn at the right edge with its peak written, not allowed to squash the
    # frontier against the axis.
    near = [p["predicted_peak"] for p in front if p["fits"]] + [cap]
    near += [c["measured_peak"] for c in confirmed if c.get("measured_peak")]
    xmax_b = max(max(near) * 1.6, min(max(p["predicted_peak"] for p in front + [start]), max(near) * 3))
    unit, div = A.memory_unit(xmax_b)
    xmax = xmax_b / div

    def x_of(b: float) -> float:
        return min(b / div, xmax * 0.97)
    fig = C._figure(9.5, 5.8)
    ax = fig.add_subplot()
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=10.5)
    xs = [x_of(p["predicted_peak"]) for p in front]
    ys = [tput(p) for p in front]
    ax.step(xs, ys, where="post", color="#1f77b4", lw=1.3, zorder=2)
    colors = ["#1f77b4" if p["fits"] else "#b0b0b0" for p in front]
    ax.scatter(xs, ys, s=40, c=colors, edgecolors="black", linewidths=0.6, zorder=3)
    ax.axvline(cap / div, color="#c00", ls="--", lw=1.1)
    ax.text(cap / div, 0.99, f" capacity {cap / div:.3g} {unit}", transform=ax.get_xaxis_transform(),
            rotation=90, ha="right", va="top", fontsize=7.5, color="#c00")
    if limit < cap:
        ax.axvline(limit / div, color="#c00", ls=":", lw=1)
    ax.scatter([x_of(start["predicted_peak"])], [tput(start)], marker="s", s=70,
               facecolors="none", edgecolors="#444", linewidths=1.4, zorder=4)
    for p in front + [start]:
        if p["predicted_peak"] / div > xmax * 0.97:
            ax.annotate(f"{p['predicted_peak'] / div:.3g} {unit} →", (xmax * 0.97, tput(p)),
                        xytext=(-6, -12), textcoords="offset points", ha="right", fontsize=7, color="#444")
    if rec:
        ax.scatter([x_of(rec["predicted_peak"])], [tput(rec)], marker="*", s=260,
                   color="#d62728", edgecolors="black", linewidths=0.7, zorder=5)
    for c in confirmed:
        mx, my = x_of(c["measured_peak"]), tput(c, "measured_samples_per_s")
        ax.scatter([mx], [my], marker="x", s=55, color="#2ca02c", linewidths=2, zorder=5)
        ax.plot([x_of(c["predicted_peak"]), mx], [tput(c), my], color="#2ca02c", lw=0.8,
                ls=":", zorder=1)
    handles = [Line2D([], [], color="#1f77b4", marker="o", mec="black", lw=1.3, label="frontier (fits)"),
               Line2D([], [], color="#b0b0b0", marker="o", mec="black", lw=0, label="frontier (over the limit)"),
               Line2D([], [], color="#444", marker="s", mfc="none", lw=0, label="start (as given)"),
               Line2D([], [], color="#d62728", marker="*", mec="black", ms=13, lw=0, label="recommended"),
               Line2D([], [], color="#c00", ls="--", label="capacity")]
    if limit < cap:
        handles.append(Line2D([], [], color="#c00", ls=":", label=f"limit (margin {A.fmt_bytes(doc['margin'])})"))
    if confirmed:
        handles.append(Line2D([], [], color="#2ca02c", marker="x", mew=2, lw=0, label="measured (--confirm)"))
    leg = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
                    frameon=True, framealpha=0.9)
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, max(ys + [tput(start)] + [tput(c, "measured_samples_per_s") for c in confirmed])
                * 1.15)
    ax.set_xlabel(f"peak allocated memory ({unit}, memory model)")
    ax.set_ylabel("\n".join(textwrap.wrap(f"throughput ({unit_t}, {throughput_label(doc)})", 60)))
    ax.grid(alpha=0.25)
    labels = [A.turned_label(p["config"], start["config"]) for p in front]
    numbered = len(front) > C.MAX_LABELS
    C._place_labels(fig, ax, xs, ys, [f"#{i + 1}" for i in range(len(front))] if numbered else labels,
                    obstacles=[leg])
    timed = all("time_model" in p for p in front)
    chart = C.Chart(key=key, title=title, headers=["#", f"peak ({unit})", unit_t, *(["MFU"] if timed else []),
                                                   "fits", "knobs turned"])
    for i, (p, lab) in enumerate(zip(front, labels)):
        mark = " (recommended)" if rec and p["id"] == rec["id"] else ""
        chart.rows.append([str(i + 1), f"{p['predicted_peak'] / div:.3g}", C._n(tput(p)),
                           *([mfu(p)] if timed else []), "yes" if p["fits"] else "no", lab + mark])
    s = doc["search"]
    chart.notes.append(f"Searched {s['candidates']} configurations ({s['estimates']} memory-model estimates) in "
                       f"{s['seconds']:.2f} s, turning {', '.join(doc['axes'])}; throughput {throughput_label(doc)}.")
    if rec and not any(p["id"] == rec["id"] for p in front):
        chart.notes.append("The recommendation is off the frontier: a smaller configuration is predicted as fast, "
                           "and ties go to the larger micro-batch (what the cost model cannot tell apart, the one "
                           "nearest the start).")
    if rec:
        chart.notes.append(f"Recommended: {A.turned_label(rec['config'], start['config'])} — peak "
                           f"{A.fmt_bytes(rec['predicted_peak'])} of {A.fmt_bytes(limit)}, "
                           f"{C._n(tput(rec))} {unit_t}" + (f", MFU {mfu(rec)}" if mfu(rec) else "") + ".")
        chart.notes += [e["text"] for e in rec["explanation"]]
    elif doc.get("nothing_fits"):
        n = doc["nothing_fits"]
        chart.notes.append(f"Nothing fits {A.fmt_bytes(limit)}: the smallest peak reachable is "
                           f"{A.fmt_bytes(n['smallest']['predicted_peak'])}. What would have to change: "
                           + "; ".join(n["changes"]) + ".")
    if numbered:
        chart.notes.append("Frontier points are numbered on the chart; the numbers refer to the table.")
    chart.files = C._save(fig, outdir, key, formats)
    return chart
