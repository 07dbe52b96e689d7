"""memtrade reports: trade-off charts and the docs page from memtrade results files.

Usage: python3 -m reports [RESULTS...] [--baseline FILE] [--history DB] [--trace FILE...]
       [--advise FILE...] -o DIR [--formats png,svg] [--title T] [--baseline-point ID]

Modules: __main__ (CLI), load (read/validate inputs), analysis (pure functions), charts (one
function per chart), advise (the chart of a `memtrade advise --json` document), page (index.html /
index.md). build_report() below ties them together.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Callable, Sequence

from . import advise as ADV
from . import charts as C
from . import knobs
from . import load
from .page import write_page

FORMATS = ("png", "svg")


def build_report(results: Sequence[str], outdir: str | pathlib.Path, *, baseline: str | None = None,
                 history: str | None = None, traces: Sequence[str] = (), formats: Sequence[str] = FORMATS,
                 title: str | None = None, baseline_point: str | None = None,
                 estimates: Sequence[str] = (), strict: bool = False,
                 advise: Sequence[str] = ()) -> list[C.Chart]:
    """Load the inputs (raising load.InputError on bad input), draw the charts into outdir and
    write index.html / index.md. A chart that fails is reported on stderr and listed as not drawn
    (strict=True re-raises instead)."""
    out = pathlib.Path(outdir)
    advs = [load.load_advise(a) for a in advise]
    if not results:
        if not advs:
            raise load.InputError("no results files and no --advise files given")
        return _advise_only(advs, out, formats, title, strict)
    docs = [load.load_results(r) for r in results]
    doc = load.merge_results(docs)
    base = load.load_results(baseline) if baseline else None
    hist = load.load_history(history) if history else None
    trs = [load.load_trace(t) for t in traces]
    ests = [load.load_estimates(e) for e in estimates]
    try:
        knobs.use_meta(*(d["meta"] for d in docs), *([base["meta"]] if base else []))
    except knobs.NoTable as e:
        raise load.InputError(f"{results[0]}: {e}") from None
    if baseline_point and not any(p["id"] == baseline_point for p in doc["points"]):
        raise load.InputError(f"--baseline-point {baseline_point!r} is not a point id in the results")
    pts, meta = doc["points"], doc["meta"]

    jobs: list[tuple[str, str, Callable[[], C.Chart]]] = [
        ("frontier", "Trade-off frontier", lambda: C.frontier(pts, meta, out, formats)),
        ("knob-effects", "Knob effects", lambda: C.knob_effects(pts, out, formats, baseline_point)),
        ("inference", "Inference (mode = eval)", lambda: C.inference(pts, out, formats)),
        ("breakdown", "Memory breakdown", lambda: C.breakdown(pts, out, formats)),
        ("checkpoint", "Checkpoint density", lambda: C.checkpoint_curve(pts, out, formats)),
        ("seq-len", "Sequence length", lambda: C.seq_len_curve(pts, [e for e in ests], out, formats)),
        ("batch", "Batch-size scaling", lambda: C.batch_scaling(pts, meta, out, formats)),
        ("predicted", "Predicted vs measured peak", lambda: C.predicted(pts, out, formats)),
    ]
    for i, t in enumerate(trs):
        key = "timeline" if len(trs) == 1 else f"timeline-{i + 1}"
        jobs.append((key, "Memory timeline", lambda t=t, key=key: C.timeline(t, out, formats, key)))
    if not trs:
        jobs.append(("timeline", "Memory timeline of one step", None))
    for i, a in enumerate(advs):
        key = "advise" if len(advs) == 1 else f"advise-{i + 1}"
        jobs.append((key, "advise", lambda a=a, key=key: ADV.frontier(a, out, formats, key)))
    jobs.append(("history", "Commit trend", (lambda: C.history_trend(hist, out, formats)) if hist else None))
    jobs.append(("compare", "Baseline vs head", (lambda: C.baseline_vs_head(doc, base, out, formats)) if base else None))

    missing = {"timeline": "no --trace file given", "history": "no --history database given",
               "compare": "no --baseline results file given"}
    charts: list[C.Chart] = []
    out.mkdir(parents=True, exist_ok=True)
    for key, title_, fn in jobs:
        if fn is None:
            charts.append(C.Chart(key=key, title=title_, skipped=missing[key]))
            continue
        try:
            charts.append(fn())
        except Exception as e:  # one broken chart must not lose the others
            if strict:
                raise
            print(f"memtrade report: warning: chart {key} failed: {type(e).__name__}: {e}", file=sys.stderr)
            charts.append(C.Chart(key=key, title=title_, skipped=f"failed: {type(e).__name__}: {e}"))
    ok = sum(p.get("status") == "ok" for p in pts)
    if not ok:  # say plainly why the results charts are empty
        counts: dict[str, int] = {}
        for p in pts:
            counts[p.get("status", "?")] = counts.get(p.get("status", "?"), 0) + 1
        why = ("the results have no points" if not pts else
               "no ok points (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")")
        for c in charts:
            if c.skipped and c.key in ("knob-effects", "inference", "breakdown", "checkpoint", "batch", "predicted",
                                       "frontier"):
                c.skipped = why
    sources = [d.get("_path", "?") for d in docs] + [a["_path"] for a in advs]
    varying = [a for a in knobs.names()
               if len({json.dumps(p.get("config", {}).get(a), sort_keys=True) for p in pts}) > 1]
    legend = [(a, knobs.row(a)["help"]) for a in varying]
    write_page(out, charts, meta, sources, title or f"memtrade report — {meta.get('grid') or 'results'}",
               legend)
    return charts


def _advise_only(advs: list[dict], out: pathlib.Path, formats: Sequence[str], title: str | None,
                 strict: bool) -> list[C.Chart]:
    """A page of advise charts alone (no results files)."""
    knobs.use_meta()
    out.mkdir(parents=True, exist_ok=True)
    charts = []
    for i, a in enumerate(advs):
        key = "advise" if len(advs) == 1 else f"advise-{i + 1}"
        try:
            charts.append(ADV.frontier(a, out, formats, key))
        except Exception as e:  # one broken chart must not lose the others
            if strict:
                raise
            print(f"memtrade report: warning: chart {key} failed: {type(e).__name__}: {e}", file=sys.stderr)
            charts.append(C.Chart(key=key, title="advise", skipped=f"failed: {type(e).__name__}: {e}"))
    meta = {"backend": advs[0]["backend"], "capacity": advs[0]["capacity"]}
    write_page(out, charts, meta, [a["_path"] for a in advs], title or "memtrade advise")
    return charts
