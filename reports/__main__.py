"""python3 -m reports RESULTS... [--baseline FILE] [--history DB] [--trace FILE...]
                      [--estimates FILE...] -o DIR [--formats png,svg] [--title T]
                      [--baseline-point ID]

Exit codes: 0 all charts drawn or skipped for lack of data, 1 a chart failed to render,
2 bad input (one line on stderr naming the problem).
"""

from __future__ import annotations

import argparse
import sys

from . import build_report
from .load import InputError

PROG = "memtrade report"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog=PROG, description="Draw memtrade trade-off charts and an index page from results files.")
    p.add_argument("results", nargs="+", metavar="RESULTS", help="results JSON files (memtrade.results/1)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    p.add_argument("--baseline", metavar="FILE", help="baseline results file: draws baseline vs head")
    p.add_argument("--baseline-point", metavar="ID",
                   help="point id used as the knob-effects baseline (default: the all-default point per model)")
    p.add_argument("--history", metavar="DB", help="history SQLite DB (memtrade history add): commit trend")
    p.add_argument("--trace", nargs="+", action="extend", default=[], metavar="FILE", help="allocator trace files: memory timeline")
    p.add_argument("--estimates", nargs="+", action="extend", default=[], metavar="FILE",
                   help="`memtrade estimate --json` outputs: predicted curves (sequence length)")
    p.add_argument("--formats", default="png,svg", help="comma-separated image formats (png, svg, pdf)")
    p.add_argument("--title", help="page title")
    a = p.parse_args(argv)
    fmts = [f.strip().lower() for f in a.formats.split(",") if f.strip()]
    bad = [f for f in fmts if f not in ("png", "svg", "pdf")]
    if not fmts or bad:
        p.error(f"--formats: unsupported format {', '.join(bad) or '(none)'}; use png, svg or pdf")
    a.formats = fmts
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        charts = build_report(a.results, a.output, baseline=a.baseline, history=a.history, traces=a.trace,
                              formats=a.formats, title=a.title, baseline_point=a.baseline_point,
                              estimates=a.estimates)
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    drawn = [c for c in charts if c.files]
    print(f"{a.output}/index.html: {len(drawn)} chart(s) drawn, {len(charts) - len(drawn)} not drawn")
    return 1 if any((c.skipped or "").startswith("failed:") for c in charts) else 0


if __name__ == "__main__":
    sys.exit(main())
