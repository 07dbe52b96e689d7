"""The docs page: DIR/index.html (self-contained apart from the images, inline CSS) and DIR/index.md.

Only files that exist in DIR are linked; charts that were not drawn are listed with the reason.
"""

from __future__ import annotations

import html
import pathlib
from typing import Sequence

from .charts import Chart

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;height:auto;border:1px solid #eee}
.note{color:#555;font-size:.9em}.skipped{color:#8a5a00}
code{background:#f4f4f4;padding:0 .2em}
"""


def meta_rows(meta: dict, sources: Sequence[str]) -> list[tuple[str, str]]:
    versions = meta.get("versions") or {}
    cap = meta.get("capacity")
    rows = [
        ("commit", str(meta.get("commit") or "?")),
        ("dirty", str(meta.get("dirty"))),
        ("device", str(meta.get("device") or "?")),
        ("backend", str(meta.get("backend") or "?")),
        ("capacity", f"{cap / (1 << 30):g} GiB (emulated)" if cap else "device memory"),
        ("grid", str(meta.get("grid") or "?")),
        ("host", str(meta.get("host") or "?")),
        ("time", str(meta.get("time") or "?")),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or "?"),
        ("results", ", ".join(sources)),
    ]
    return rows


def _existing(outdir: pathlib.Path, files: Sequence[str]) -> list[str]:
    return [f for f in files if (outdir / f).is_file() and (outdir / f).stat().st_size > 0]


def _is_num(s: str) -> bool:
    t = s.replace("%", "").replace(",", "").replace("+", "").replace(" ms", "").replace(" s", "")
    try:
        float(t)
        return True
    except ValueError:
        return False


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(
            f"<td class=\"num\">{html.escape(c)}</td>" if _is_num(c) else f"<td>{html.escape(c)}</td>" for c in r)
            + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


LEGEND_INTRO = ("Labels name the knobs turned from their defaults (e.g. `b8 bf16-o2 ck1 sgd`); "
                "the axes that vary here, as memtrade's knob table describes them:")


def write_page(outdir: pathlib.Path, charts: Sequence[Chart], meta: dict, sources: Sequence[str],
               title: str = "memtrade report",
               legend: Sequence[tuple[str, str]] = ()) -> list[str]:
    """Write index.html and index.md; returns their names. `legend`: (axis, what it means) for the
    knobs the labels name, from the knob table."""
    outdir.mkdir(parents=True, exist_ok=True)
    drawn = [(c, _existing(outdir, c.files)) for c in charts]
    drawn = [(c, f) for c, f in drawn if f]
    skipped = [c for c in charts if not _existing(outdir, c.files)]
    mrows = meta_rows(meta, sources)

    # --- HTML
    h = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
         f"<title>{html.escape(title)}</title>", f"<style>{CSS}</style></head><body>",
         f"<h1>{html.escape(title)}</h1>", _html_table(["", ""], mrows).replace("<thead><tr><th></th><th></th></tr></thead>", "")]
    if legend:
        h.append(f"<p class=\"note\">{html.escape(LEGEND_INTRO)}</p><ul>")
        h += [f"<li><b>{html.escape(a)}</b>: {html.escape(t)}</li>" for a, t in legend]
        h.append("</ul>")
    if drawn:
        h.append("<p>Charts: " + ", ".join(f"<a href=\"#{c.key}\">{html.escape(c.title)}</a>" for c, _ in drawn) + "</p>")
    for c, files in drawn:
        h.append(f"<h2 id=\"{c.key}\">{html.escape(c.title)}</h2>")
        png = [f for f in files if f.endswith(".png")]
        img = png[0] if png else files[0]
        h.append(f"<p><img src=\"{html.escape(img)}\" alt=\"{html.escape(c.title)}\"></p>")
        h.append("<p class=\"note\">Files: " + " · ".join(f"<a href=\"{html.escape(f)}\">{html.escape(f)}</a>"
                                                         for f in files) + "</p>")
        for n in c.notes:
            h.append(f"<p class=\"note\">{html.escape(n)}</p>")
        if c.rows:
            h.append(_html_table(c.headers, c.rows))
    if skipped:
        h.append("<h2 id=\"not-drawn\">Not drawn</h2><ul>")
        for c in skipped:
            h.append(f"<li class=\"skipped\"><b>{html.escape(c.title)}</b>: {html.escape(c.skipped or 'no output')}</li>")
        h.append("</ul>")
    h.append("</body></html>")
    (outdir / "index.html").write_text("\n".join(h) + "\n", encoding="utf-8")

    # --- Markdown
    m = [f"# {title}", "", _md_table(["run", ""], mrows), ""]
    if legend:
        m += [LEGEND_INTRO, ""] + [f"- **{a}**: {t}" for a, t in legend] + [""]
    for c, files in drawn:
        m += [f"## {c.title}", ""]
        png = [f for f in files if f.endswith(".png")]
        m += [f"![{c.title}]({png[0] if png else files[0]})", ""]
        m += ["Files: " + " · ".join(f"[{f}]({f})" for f in files), ""]
        for n in c.notes:
            m += [n, ""]
        if c.rows:
            m += [_md_table(c.headers, c.rows), ""]
    if skipped:
        m += ["## Not drawn", ""] + [f"- **{c.title}**: {c.skipped or 'no output'}" for c in skipped] + [""]
    (outdir / "index.md").write_text("\n".join(m), encoding="utf-8")
    return ["index.html", "index.md"]
