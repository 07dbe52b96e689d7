#!/usr/bin/env python3
"""How well `memtrade history changes` finds a change in a nightly series, beside Apache Otava's
defaults, on synthetic series with the noise of a shared machine (issue 29, item 6).

Series: N nights of one point. Time: the night's level carries 2% noise (night to night) and the
value is the median of S steps that each carry 3% more; memory is exact (the CPU's bytes). Planted
steps from night P on: memory +1 MiB; time +3, +5, +10 and +15%; and A/A series (no change).

For each tool:
- detected: the change found on the full series, within 2 nights of where it was planted;
- delay: nights after the first bad one until the nightly job alerts (each night the job asks
  for a regression starting within its last 2 runs, memtrade's exit 1; for Otava a change point
  at one of the last 2 indices), median over the series detected;
- false alarms: such nightly alerts where nothing changed, per 1000 point-nights (every series,
  every night before the planted step, and every night of the A/A series).

Usage: bench/gate_quality.py [--bin build/memtrade] [--reps 100] [--otava DIR] [--markdown F]
       [--chart F]
--otava DIR: where `pip download apache-otava==0.8.0 --no-deps` was unzipped (or anything that
makes `import otava` work); without it the Otava columns are left out.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

NIGHTS, PLANTED, STEPS = 60, 40, 8
NIGHT_NOISE, STEP_NOISE = 0.02, 0.03
CASES = [("memory +1 MiB", "peak_allocated", 1 << 20), ("time +3%", "median_s", 0.03),
         ("time +5%", "median_s", 0.05), ("time +10%", "median_s", 0.10),
         ("time +15%", "median_s", 0.15), ("A/A time", "median_s", 0.0),
         ("A/A memory", "peak_allocated", 0)]


def make_series(metric, step, rng):
    if metric == "peak_allocated":
        base = 50 << 20
        return [float(base + (step if i >= PLANTED else 0)) for i in range(NIGHTS)]
    out = []
    for i in range(NIGHTS):
        level = 1e-3 * (1 + (step if i >= PLANTED else 0)) * (1 + rng.gauss(0, NIGHT_NOISE))
        out.append(statistics.median(level * (1 + rng.gauss(0, STEP_NOISE)) for _ in range(STEPS)))
    return out


EXTRA_ARGS = []  # --memtrade-arg: more flags for `history changes` (e.g. --min-effect 0.03)


def memtrade_changes(binary, series, length):
    """{series index: [(index, direction)]} of memtrade on every series cut to `length`."""
    doc = {"series": [{"id": str(i), "metric": m, "values": v[:length]}
                      for i, (m, v) in enumerate(series)]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    try:
        p = subprocess.run([binary, "history", "changes", "--series", f.name, "--json",
                            *EXTRA_ARGS],
                           capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if p.returncode not in (0, 1):
        sys.exit(f"memtrade history changes failed: {p.stderr}")
    found = {}
    for c in json.loads(p.stdout)["changes"]:
        found.setdefault(int(c["point"]), []).append((c["index"], c["direction"]))
    return found


def otava_changes(series, length):
    from otava.analysis import compute_change_points  # defaults: window 50, p 0.001, magnitude 0
    found = {}
    for i, (_, v) in enumerate(series):
        cps, _ = compute_change_points(v[:length])
        found[i] = [(c.index, "regression" if c.stats.mean_2 > c.stats.mean_1 else "improvement")
                    for c in cps]
    return found


def score(tool, series, planted_step):
    """(detected fraction, median delay, false alarms per 1000 point-nights) of one case."""
    full = tool(series, NIGHTS)
    detected = [i for i in range(len(series))
                if planted_step and any(abs(ix - PLANTED) <= 2 for ix, _ in full.get(i, []))]
    delays, alarms, nights = [], 0, 0
    first_alert = {}
    for length in range(4, NIGHTS + 1):
        found = tool(series, length)
        for i in range(len(series)):
            alert = any(d == "regression" and ix >= length - 2 for ix, d in found.get(i, []))
            bad_night = planted_step and length - 1 >= PLANTED
            if not bad_night:
                nights += 1
                alarms += alert
            elif alert and i not in first_alert:
                first_alert[i] = length - 1 - PLANTED
    delays = [first_alert[i] for i in detected if i in first_alert]
    return (len(detected) / len(series) if planted_step else None,
            statistics.median(delays) if delays else None, 1000 * alarms / max(nights, 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/memtrade")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--otava", help="folder to import otava from")
    ap.add_argument("--markdown", help="write the table here")
    ap.add_argument("--chart", help="draw example series with their change points (PNG)")
    ap.add_argument("--memtrade-arg", action="append", default=[])
    ap.add_argument("--no-otava", action="store_true")
    a = ap.parse_args()
    EXTRA_ARGS.extend(a.memtrade_arg)
    if a.otava:
        sys.path.insert(0, a.otava)
    try:
        import otava.analysis  # noqa: F401
        have_otava = not a.no_otava
    except ImportError:
        have_otava = False
    binary = os.path.abspath(a.bin)
    rng = random.Random(a.seed)
    rows = []
    examples = {}
    for name, metric, step in CASES:
        series = [(metric, make_series(metric, step, rng)) for _ in range(a.reps)]
        examples[name] = series[0]
        m = score(lambda s, n: memtrade_changes(binary, s, n), series, step)
        o = score(otava_changes, series, step) if have_otava else None
        rows.append((name, m, o))
        print(name, m, o, file=sys.stderr)

    def cell(v, pct=False):
        if v is None:
            return "–"
        return f"{100 * v:.0f}%" if pct else (f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}")

    head = "| series | memtrade: detected | delay (nights) | false alarms / 1000 |"
    sep = "|---|---:|---:|---:|"
    if have_otava:
        head += " Otava defaults: detected | delay | false alarms / 1000 |"
        sep += "---:|---:|---:|"
    lines = [head, sep]
    for name, m, o in rows:
        line = f"| {name} | {cell(m[0], True)} | {cell(m[1])} | {cell(m[2])} |"
        if have_otava:
            line += f" {cell(o[0], True)} | {cell(o[1])} | {cell(o[2])} |"
        lines.append(line)
    table = "\n".join(lines) + "\n"
    print(table)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(PAGE.format(reps=a.reps, nights=NIGHTS, planted=PLANTED + 1, steps=STEPS,
                                night=100 * NIGHT_NOISE, step=100 * STEP_NOISE, table=table,
                                otava="" if have_otava else OTAVA_MISSING,
                                chart=os.path.basename(a.chart) if a.chart else "changes.png"))
    if a.chart:
        draw(binary, examples, a.chart)


PAGE = """# Change points over the nightly history: how well they are found

Generated by `make docs` (`bench/gate_quality.py`). `memtrade history changes` (docs/design.md,
"The gate over history") on synthetic nightly series of one point each: {nights} nights, a step
planted from night {planted} on, {reps} series per row. Time carries {night:.0f}% noise night to
night and {step:.0f}% per step (the value is the median of {steps} steps); memory is exact, as on
the CPU.

- **detected**: the change found on the whole series, within 2 nights of where it was planted;
- **delay**: nights after the first bad one until the nightly job alerts (memtrade: exit 1, a
  regression starting within the last 2 runs; Otava: a change point at one of the last 2
  indices), the median over the series detected;
- **false alarms**: such alerts where nothing had changed, per 1000 point-nights.

Otava is Apache Otava 0.8.0 from PyPI with its defaults (`compute_change_points`: window 50,
max p 0.001, min magnitude 0), run on the same series.{otava}

{table}
memtrade's delay is 1 night by design: a change must hold for 2 runs (`--min-runs`), so a
one-night blip is never an alert; Otava alerts on the first bad night and pays for it in false
alarms. Below the 2% minimum effect (`--min-effect`, the night-to-night noise) a step is not
reported at all; a 3% step is found about 6 times in 10.

![series and their change points]({chart})
"""
OTAVA_MISSING = "\n\n(Otava could not be imported here: its columns are left out.)"


def draw(binary, examples, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [n for n in examples if n != "A/A memory"]
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.0 * len(names)), sharex=True)
    found = memtrade_changes(binary, [examples[n] for n in names], NIGHTS)
    for i, (ax, name) in enumerate(zip(axes, names)):
        metric, values = examples[name]
        scale = 1e3 if metric == "median_s" else 1 / (1 << 20)
        ax.plot(range(1, NIGHTS + 1), [v * scale for v in values], ".-", lw=0.8, ms=3)
        aa = name.startswith("A/A")
        if not aa:
            ax.axvline(PLANTED + 1, color="0.6", ls=":", lw=1)
        for ix, d in found.get(i, []):
            ax.axvline(ix + 1, color="tab:red" if d == "regression" else "tab:green", lw=1.5)
        ax.set_ylabel("ms" if metric == "median_s" else "MiB")
        ax.set_title(f"{name}: nothing planted; a change found would be red" if aa else
                     f"{name}: planted at night {PLANTED + 1} (dotted), found (red)", fontsize=9)
    axes[-1].set_xlabel("night")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
