"""Pure analysis of memtrade results: no I/O, no plotting.

Points are the dicts of a results file (schema memtrade.results/1). "Peak memory" everywhere in
reports means ``memory.peak_allocated`` (bytes held by live tensors at the step's peak); the
throughput is ``throughput.samples_per_s``.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from . import knobs as K

# Allocator categories in stacking order (kernels/allocator.h); a breakdown may hold more (a newer
# memtrade): categories() appends them.
CATEGORIES = ("params", "master", "casts", "grads", "optimizer", "activations", "temporaries",
              "workspace", "io")


def categories(breakdowns: Iterable[dict]) -> list[str]:
    """CATEGORIES, then any other category the breakdowns have, in first-seen order."""
    out = list(CATEGORIES)
    for b in breakdowns:
        for c in (b or {}):
            if c not in out:
                out.append(c)
    return out

# Capacity presets (GiB) for the batch-size chart: common card sizes.
CAPACITY_PRESETS_GIB = (16, 24, 40, 80, 141)

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10


# ---------------------------------------------------------------------------------------------
# Accessors


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def peak(point: dict) -> int | None:
    return _get(point, "memory", "peak_allocated")


def throughput(point: dict) -> float | None:
    return _get(point, "throughput", "samples_per_s")


def step_time(point: dict) -> float | None:
    return _get(point, "time", "median_s")


def is_ok(point: dict) -> bool:
    return point.get("status") == "ok" and _finite(peak(point)) and _finite(throughput(point))


def ok_points(points: Iterable[dict]) -> list[dict]:
    return [p for p in points if is_ok(p)]


def is_inference(point: dict) -> bool:
    """A point that does not train (mode = eval: forward only, nothing saved): it does not belong
    on a training trade-off, and gets its own panel."""
    names = K.names()
    return "mode" in names and knob_value(point.get("config") or {}, "mode") == "eval"


def training_points(points: Iterable[dict]) -> list[dict]:
    return [p for p in points if not is_inference(p)]


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def norm_checkpoint(value: Any) -> str:
    """Canonical checkpoint string: 0 / 0.0 / "0" -> "0", "0.50" -> "0.5", "sqrt" stays."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{float(value):g}"
    s = str(value)
    try:
        return f"{float(s):g}"
    except ValueError:
        return s


def checkpoint_density(value: Any) -> float | None:
    """Numeric checkpoint density, or None for "sqrt" / "selective"."""
    try:
        return float(norm_checkpoint(value))
    except ValueError:
        return None


def knob_value(config: dict, knob: str) -> Any:
    """The value of an axis in a config, its default where the file predates the axis."""
    v = config.get(knob, K.default(knob))
    if K.row(knob)["type"] == "density":
        return norm_checkpoint(v)
    return v


def _default_norm(knob: str) -> Any:
    v = K.default(knob)
    return norm_checkpoint(v) if K.row(knob)["type"] == "density" else v


def knob_tuple(config: dict, exclude: Sequence[str] = ()) -> tuple:
    return tuple(knob_value(config, k) for k in K.names() if k not in exclude)


def setting_knobs() -> list[str]:
    """The axes that say how a workload is trained (every axis but the workload ones)."""
    return [k for k in K.names() if not K.is_workload(k)]


# ---------------------------------------------------------------------------------------------
# Labels


def short_value(knob: str, value: Any) -> str:
    """One axis value as in point ids: "bf16", "ck0.5", "off-activations", "b8", "a4"."""
    v = norm_checkpoint(value) if K.row(knob)["type"] == "density" else value
    return f"{K.prefix(knob)}{v}"


def varying_knobs(points: Iterable[dict]) -> list[str]:
    """Knobs that take more than one value among the points (in label order)."""
    seen: dict[str, set] = {k: set() for k in K.names()}
    for p in points:
        cfg = p.get("config") or {}
        for k in K.names():
            seen[k].add(str(knob_value(cfg, k)))
    return [k for k in K.names() if len(seen[k]) > 1]


def _always_shown(knob: str) -> bool:
    """A workload axis every id has (model, batch size): labels name it even at its default."""
    return K.is_workload(knob) and K.row(knob).get("id_rule") == "always"


def short_label(config: dict, knobs: Sequence[str] | None = None) -> str:
    """Label such as "gpt-mini b8 bf16 ck0.5" from the given axes, in id order (default: model
    and batch size, and every axis not at its default, so a label names every knob turned)."""
    if knobs is None:
        knobs = [k for k in K.names()
                 if _always_shown(k) or knob_value(config, k) != _default_norm(k)]
    parts = [short_value(k, knob_value(config, k)) for k in K.names() if k in knobs]
    return " ".join(parts) if parts else str(config.get("model", "?"))


def compact_label(config: dict, varying: Sequence[str]) -> str:
    """Label within a set of points: of the axes that vary in the set, the workload ones always
    and the others where this point is not at the default (so "b8" and "b8 off-activations", not
    "b8 off-none zg-set_to_none ...")."""
    ks = [k for k in varying if _always_shown(k) or knob_value(config, k) != _default_norm(k)]
    return short_label(config, ks) if ks else str(config.get("model", "?"))


def turned_label(config: dict, reference: dict, varying: Sequence[str] = ()) -> str:
    """The axes where `config` differs from `reference` (and the `varying` workload axes), as in
    point ids: "b2 a4 ckfirst0.5 off-optimizer"; "as is" when none differs."""
    ks = [k for k in K.names()
          if knob_value(config, k) != knob_value(reference, k) or (k in varying and _always_shown(k))]
    return short_label(config, ks) if ks else "as is"


def label_knobs(points: Sequence[dict]) -> list[str]:
    """Knobs worth showing in labels for this set of points: those that vary (at least model)."""
    ks = varying_knobs(points)
    return ks if ks else ["model"]


# ---------------------------------------------------------------------------------------------
# Pareto front


def _mem_thr(item: Any) -> tuple[Any, Any]:
    if isinstance(item, dict):
        return peak(item), throughput(item)
    return item[0], item[1]


def pareto_front(points: Sequence[Any]) -> list[int]:
    """Indices of the Pareto-optimal points, ordered by memory ascending.

    Each item is either a results point (dict: peak_allocated, samples_per_s) or a pair
    (memory, throughput). Lower memory and higher throughput are better. A point is on the front
    when no other point is at least as good in both and strictly better in one; exact duplicates
    of a front point are all kept (neither dominates the other). Items with a missing or
    non-finite value are ignored.
    """
    vals = []
    for i, item in enumerate(points):
        m, t = _mem_thr(item)
        if _finite(m) and _finite(t):
            vals.append((m, -t, i))
    vals.sort()
    front: list[int] = []
    best_thr = -math.inf
    last: tuple[Any, Any] | None = None
    for m, neg_t, i in vals:
        t = -neg_t
        if t > best_thr:
            front.append(i)
            best_thr = t
            last = (m, t)
        elif last is not None and (m, t) == last:
            front.append(i)
    return front


# ---------------------------------------------------------------------------------------------
# Baselines and knob effects


def is_default_point(point: dict) -> bool:
    cfg = point.get("config") or {}
    return all(knob_value(cfg, k) == _default_norm(k) for k in setting_knobs())


def default_baselines(points: Sequence[dict]) -> dict[str, dict]:
    """The default baseline point of each model.

    Rule: among the model's ok points with every setting axis at its default (the knob table's
    defaults; any value of the workload axes), take the one whose
    batch size has the most ok points of that model (ties: the smaller batch). Models without
    such a point have no baseline.
    """
    out: dict[str, dict] = {}
    by_model: dict[str, list[dict]] = {}
    for p in ok_points(points):
        by_model.setdefault(str((p.get("config") or {}).get("model")), []).append(p)
    for model, pts in by_model.items():
        counts: dict[Any, int] = {}
        for p in pts:
            b = p["config"].get("batch_size")
            counts[b] = counts.get(b, 0) + 1
        cands = [p for p in pts if is_default_point(p)]
        if not cands:
            continue
        cands.sort(key=lambda p: (-counts.get(p["config"].get("batch_size"), 0),
                                  _num(p["config"].get("batch_size"))))
        out[model] = cands[0]
    return out


def _num(x: Any) -> float:
    return float(x) if _finite(x) else math.inf


def differing_knobs(a: dict, b: dict) -> list[str]:
    ca, cb = a.get("config") or {}, b.get("config") or {}
    return [k for k in K.names() if knob_value(ca, k) != knob_value(cb, k)]


def knob_effects(points: Sequence[dict], baseline: dict | None) -> list[dict]:
    """Effect of each single-knob change relative to the baseline point.

    For every point that differs from ``baseline`` in exactly one knob, returns a dict with
    knob, value, label (short value), point_id, status, peak, samples_per_s, rate and rate_unit
    (rate(): tokens/s for a language model, samples/s otherwise),
    mem_saved_pct = 100 * (base_peak - peak) / base_peak and
    thr_lost_pct = 100 * (base_rate - rate) / base_rate (None for a point that is not ok, e.g.
    oom): in tokens for a language model, so that a shorter sequence (more samples, as many
    tokens) is not a throughput gain.
    Rows are ordered by knob (label order) then by memory saved, largest first.
    Raises ValueError when the baseline is missing or not an ok point.
    """
    if baseline is None:
        raise ValueError("no baseline point: none has every knob at its default; pass --baseline-point ID")
    if not is_ok(baseline):
        raise ValueError(f"baseline point {baseline.get('id')!r} is not an ok point "
                         f"(status {baseline.get('status')!r})")
    bm, (bt, _) = peak(baseline), rate(baseline)
    rows = []
    for p in points:
        if p is baseline or p.get("id") == baseline.get("id"):
            continue
        diff = differing_knobs(p, baseline)
        if len(diff) != 1:
            continue
        k = diff[0]
        v = knob_value(p.get("config") or {}, k)
        ok = is_ok(p)
        r, unit = rate(p)
        rows.append({
            "knob": k,
            "value": v,
            "label": short_value(k, v),
            "point_id": p.get("id"),
            "status": p.get("status"),
            "peak": peak(p) if ok else None,
            "samples_per_s": throughput(p) if ok else None,
            "rate": r if ok else None,
            "rate_unit": unit,
            "mem_saved_pct": 100.0 * (bm - peak(p)) / bm if ok and bm else None,
            "thr_lost_pct": 100.0 * (bt - r) / bt if ok and bt else None,
        })
    order = {k: i for i, k in enumerate(K.names())}
    rows.sort(key=lambda r: (order[r["knob"]],
                             -(r["mem_saved_pct"] if r["mem_saved_pct"] is not None else -math.inf)))
    return rows


def find_point(points: Sequence[dict], point_id: str) -> dict | None:
    for p in points:
        if p.get("id") == point_id:
            return p
    return None


# ---------------------------------------------------------------------------------------------
# Groups, curves and capacity fits


def groups_varying(points: Sequence[dict], knob: str, min_values: int = 2) -> list[list[dict]]:
    """Ok points grouped by every knob except ``knob``; groups with >= min_values distinct values
    of ``knob``, each sorted by that knob. Groups are ordered by how many knobs are at their
    default (most default first), then by size."""
    groups: dict[tuple, list[dict]] = {}
    for p in ok_points(points):
        groups.setdefault(knob_tuple(p["config"], exclude=(knob,)), []).append(p)
    out = []
    for key, pts in groups.items():
        if len({str(knob_value(p["config"], knob)) for p in pts}) >= min_values:
            out.append(pts)

    def nondefault(pts: list[dict]) -> int:
        cfg = pts[0]["config"]
        return sum(knob_value(cfg, k) != _default_norm(k) for k in setting_knobs() if k != knob)

    out.sort(key=lambda g: (nondefault(g), -len(g), str(g[0]["config"].get("model"))))
    return out


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope) of y = a + b x; None with fewer than 2 distinct x."""
    if len(set(xs)) < 2:
        return None
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    b = sxy / sxx
    return my - b * mx, b


def largest_batch_fitting(batches: Sequence[float], peaks: Sequence[float], capacity: float) -> int | None:
    """Largest integer batch whose linearly extrapolated peak is <= capacity.

    Fits peak = a + b * batch through the measured points. Returns 0 when even batch 1 does not
    fit, None when the fit is impossible (fewer than 2 batch sizes, or peak not growing with batch).
    """
    fit = linear_fit([float(b) for b in batches], [float(p) for p in peaks])
    if fit is None:
        return None
    a, b = fit
    if b <= 0:
        return None
    n = math.floor((capacity - a) / b)
    return max(n, 0)


def batch_fits(points: Sequence[dict], capacities_bytes: Sequence[int]) -> list[dict]:
    """For each group of ok points that differ only in batch size: the largest batch that fits
    each capacity (linear extrapolation of peak_allocated). Returns dicts: group (points),
    fit (a, b), fits {capacity: batch or None}."""
    out = []
    for g in groups_varying(points, "batch_size"):
        bs = [g_p["config"]["batch_size"] for g_p in g]
        pk = [peak(g_p) for g_p in g]
        out.append({
            "group": sorted(g, key=lambda p: p["config"]["batch_size"]),
            "fit": linear_fit([float(b) for b in bs], [float(p) for p in pk]),
            "fits": {c: largest_batch_fitting(bs, pk, c) for c in capacities_bytes},
        })
    return out


# ---------------------------------------------------------------------------------------------
# Units


def memory_unit(max_bytes: float) -> tuple[str, float]:
    """("GiB", 2**30) when the largest value is at least 1 GiB, else MiB (or KiB below 1 MiB)."""
    if max_bytes >= GiB:
        return "GiB", float(GiB)
    if max_bytes >= MiB:
        return "MiB", float(MiB)
    return "KiB", float(KiB)


def time_unit(max_seconds: float) -> tuple[str, float]:
    """("s", 1) or ("ms", 1e-3) so that values read naturally."""
    return ("s", 1.0) if max_seconds >= 1.0 else ("ms", 1e-3)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    unit, div = memory_unit(abs(n))
    return f"{n / div:.2f} {unit}"


def fmt_pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1f}%"


# ---------------------------------------------------------------------------------------------
# Traces


def trace_timeline(events: Sequence[dict], live_at_start: dict | None = None) -> dict:
    """Rebuild per-category live bytes from a trace's alloc/free events.

    `live_at_start` (the trace's own field) gives each category's bytes already allocated when
    the trace began (parameters, optimizer state, ...), so the stack adds up to `allocated`.

    Returns seq (list), categories (list, CATEGORIES order then others), live (list of lists:
    live[c][i] = bytes of category c live after event i), allocated / reserved (the allocator's
    own counters after each event), phases [(phase, first_seq, last_seq)], ooms [seq].
    """
    cats: list[str] = [c for c in CATEGORIES]
    start = dict(live_at_start or {})
    for c in start:
        if c not in cats:
            cats.append(c)
    for e in events:
        c = e.get("category")
        if e.get("kind") in ("alloc", "free") and c and c not in cats:
            cats.append(c)
    idx = {c: i for i, c in enumerate(cats)}
    cur = [int(start.get(c, 0) or 0) for c in cats]
    live: list[list[int]] = [[] for _ in cats]
    seq, allocated, reserved, ooms = [], [], [], []
    phases: list[list[Any]] = []
    for i, e in enumerate(events):
        s = e.get("seq", i)
        kind = e.get("kind")
        c = e.get("category")
        if kind in ("alloc", "free") and c in idx:
            delta = int(e.get("bytes") or 0)
            cur[idx[c]] += delta if kind == "alloc" else -delta
            if cur[idx[c]] < 0:  # a free of a block allocated before the trace started
                cur[idx[c]] = 0
        if kind == "oom":
            ooms.append(s)
        seq.append(s)
        for j in range(len(cats)):
            live[j].append(cur[j])
        allocated.append(e.get("allocated"))
        reserved.append(e.get("reserved"))
        ph = e.get("phase") or "?"
        if phases and phases[-1][0] == ph:
            phases[-1][2] = s
        else:
            phases.append([ph, s, s])
    used = [j for j, c in enumerate(cats) if any(live[j])]
    return {
        "seq": seq,
        "categories": [cats[j] for j in used],
        "live": [live[j] for j in used],
        "allocated": allocated,
        "reserved": reserved,
        "phases": [tuple(p) for p in phases],
        "ooms": ooms,
    }


# ---------------------------------------------------------------------------------------------
# Baseline vs head


def pair_points(head: Sequence[dict], base: Sequence[dict]) -> list[tuple[dict, dict]]:
    """(base, head) pairs of ok points with the same id, in head order."""
    b = {p.get("id"): p for p in ok_points(base)}
    return [(b[p["id"]], p) for p in ok_points(head) if p.get("id") in b]


def pct_change(old: float | None, new: float | None) -> float | None:
    if not _finite(old) or not _finite(new) or old == 0:
        return None
    return 100.0 * (new - old) / old


# ---------------------------------------------------------------------------------------------
# Sequence length


def tokens_per_sample(config: dict) -> int | None:
    """The sequence length a point trained at (the model's own when the seq_len axis is 0)."""
    t = (config.get("hyper") or {}).get("seq_len")
    return int(t) if _finite(t) else None


def rate(point: dict) -> tuple[float | None, str]:
    """A point's throughput in the unit its kind of model is read in: (tokens/s, "tok/s") for a
    language model (a seq_len in its hyper-parameters), (samples/s, "samples/s") otherwise."""
    thr, t = throughput(point), tokens_per_sample(point.get("config") or {})
    if t is None:
        return thr, "samples/s"
    return (thr * t if _finite(thr) else None), "tok/s"


def rate_unit(points: Iterable[dict]) -> str:
    """The unit of rate() over these points: tok/s or samples/s, or, where language models and
    MLP/CNN mix, both named (each point's value is then in its own kind's unit)."""
    units = {rate(p)[1] for p in points}
    return units.pop() if len(units) == 1 else "tok/s for language models, samples/s for MLP and CNN"


def seq_len_lines(items: Sequence[dict], peak_of) -> list[tuple[dict, list[tuple[int, float]]]]:
    """Points (results points or estimate rows) that differ only in seq_len, as lines: [(config
    of the line, [(tokens, peak), ...] sorted by tokens)], lines with >= 2 lengths only."""
    lines: dict[tuple, tuple[dict, list]] = {}
    for it in items:
        cfg = it.get("config") or {}
        t, pk = tokens_per_sample(cfg), peak_of(it)
        if t is None or not _finite(pk):
            continue
        key = knob_tuple(cfg, exclude=("seq_len",))
        lines.setdefault(key, (cfg, []))[1].append((t, pk))
    out = [(cfg, sorted(pts)) for cfg, pts in lines.values() if len({t for t, _ in pts}) >= 2]
    out.sort(key=lambda l: (str(l[0].get("model")), str(l[0].get("attention"))))
    return out
