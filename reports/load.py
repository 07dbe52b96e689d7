"""Read and validate memtrade results, trace and history files.

Every problem is raised as InputError with one line naming the file and what is wrong; the CLI
turns it into that line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import math
import pathlib
import sqlite3
from typing import Any

RESULTS_SCHEMA = "memtrade.results/1"
TRACE_SCHEMA = "memtrade.trace/1"
STATUSES = ("ok", "oom", "error", "timeout", "skipped")


class InputError(Exception):
    """Bad input file: the message is one line naming the file and the problem."""


def _read_json(path: str | pathlib.Path) -> Any:
    p = pathlib.Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory, expected a JSON file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: cannot read: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{p}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_schema(path: Any, doc: Any, expected: str) -> None:
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object with \"schema\": \"{expected}\", "
                         f"got {type(doc).__name__}")
    schema = doc.get("schema")
    if schema != expected:
        raise InputError(f"{path}: schema is {schema!r}, expected {expected!r}")


def validate_results(doc: Any, path: Any = "<results>") -> dict:
    """Check a results document against memtrade.results/1; returns it (points normalised:
    missing optional sections become None)."""
    _check_schema(path, doc, RESULTS_SCHEMA)
    meta = doc.get("meta")
    if meta is None:
        meta = doc["meta"] = {}
    if not isinstance(meta, dict):
        raise InputError(f"{path}: \"meta\" must be an object")
    cap = meta.get("capacity")
    if cap is not None and not _is_num(cap):
        raise InputError(f"{path}: meta.capacity must be a number of bytes or null, got {cap!r}")
    points = doc.get("points")
    if not isinstance(points, list):
        raise InputError(f"{path}: \"points\" must be a list")
    for i, p in enumerate(points):
        where = f"{path}: points[{i}]"
        if not isinstance(p, dict):
            raise InputError(f"{where}: expected an object")
        if not isinstance(p.get("id"), str):
            raise InputError(f"{where}.id: expected a string")
        where = f"{path}: point {p['id']!r}"
        if not isinstance(p.get("config"), dict):
            raise InputError(f"{where}: \"config\" must be an object")
        cfg = p["config"]
        if not isinstance(cfg.get("model"), str):
            raise InputError(f"{where}: config.model must be a string")
        if not _is_int(cfg.get("batch_size")) or cfg["batch_size"] < 1:
            raise InputError(f"{where}: config.batch_size must be a positive integer")
        if p.get("status") not in STATUSES:
            raise InputError(f"{where}: status {p.get('status')!r} is not one of {', '.join(STATUSES)}")
        for sec in ("memory", "time", "throughput", "train", "transfer"):
            if p.get(sec) is not None and not isinstance(p[sec], dict):
                raise InputError(f"{where}: \"{sec}\" must be an object or null")
            p.setdefault(sec, None)
        if p["status"] == "ok":
            _require(where, p, ("memory", "peak_allocated"), _is_int, "an integer number of bytes")
            _require(where, p, ("throughput", "samples_per_s"), _is_num, "a number")
            _require(where, p, ("time", "median_s"), _is_num, "a number of seconds")
            bd = p["memory"].get("breakdown_at_peak")
            if bd is not None:
                if not isinstance(bd, dict) or not all(_is_num(v) for v in bd.values()):
                    raise InputError(f"{where}: memory.breakdown_at_peak must map categories to bytes")
            pp = p["memory"].get("predicted_peak")
            if pp is not None and not _is_num(pp):
                raise InputError(f"{where}: memory.predicted_peak must be bytes or null")
    return doc


def _require(where: str, p: dict, keys: tuple[str, ...], pred, what: str) -> None:
    d: Any = p
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    if not pred(d):
        raise InputError(f"{where}: {'.'.join(keys)} must be {what} for an ok point, got {d!r}")


def load_results(path: str | pathlib.Path) -> dict:
    doc = validate_results(_read_json(path), path)
    doc["_path"] = str(path)
    return doc


def merge_results(docs: list[dict]) -> dict:
    """One results document from several: meta of the first, points of all (a later file's point
    replaces an earlier one with the same id)."""
    if not docs:
        raise InputError("no results files given")
    if len(docs) == 1:
        return docs[0]
    by_id: dict[str, dict] = {}
    for d in docs:
        for p in d["points"]:
            by_id[p["id"]] = p
    meta = dict(docs[0]["meta"])
    caps = [d["meta"].get("capacity") for d in docs if d["meta"].get("capacity")]
    if caps:
        meta["capacity"] = max(caps)
    return {"schema": RESULTS_SCHEMA, "meta": meta, "points": list(by_id.values()),
            "_path": ", ".join(d.get("_path", "?") for d in docs),
            "_sources": docs}


def load_trace(path: str | pathlib.Path) -> dict:
    doc = _read_json(path)
    _check_schema(path, doc, TRACE_SCHEMA)
    events = doc.get("events")
    if not isinstance(events, list):
        raise InputError(f"{path}: \"events\" must be a list")
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise InputError(f"{path}: events[{i}]: expected an object")
        if e.get("kind") not in ("alloc", "free", "segment_alloc", "segment_free", "oom"):
            raise InputError(f"{path}: events[{i}].kind {e.get('kind')!r} is not alloc, free, "
                             f"segment_alloc, segment_free or oom")
        if e.get("kind") in ("alloc", "free") and not _is_int(e.get("bytes")):
            raise InputError(f"{path}: events[{i}].bytes must be an integer")
    doc["_path"] = str(path)
    return doc


def load_history(path: str | pathlib.Path) -> dict:
    """Runs (ordered by time, then id) and their points from a `memtrade history` SQLite DB."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    try:
        con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise InputError(f"{p}: cannot open SQLite database: {e}") from None
    try:
        con.row_factory = sqlite3.Row
        runs = [dict(r) for r in con.execute(
            "SELECT id, commit_hash, branch, time, machine, backend, device, grid FROM runs "
            "ORDER BY time, id")]
        points = [dict(r) for r in con.execute(
            "SELECT run_id, point_id, config_json, status, peak_allocated, peak_reserved, "
            "predicted_peak, median_s, samples_per_s FROM points")]
    except sqlite3.DatabaseError as e:
        raise InputError(f"{p}: not a memtrade history database: {e}") from None
    finally:
        con.close()
    for r in points:
        try:
            r["config"] = json.loads(r.get("config_json") or "{}")
        except json.JSONDecodeError:
            r["config"] = {}
    return {"runs": runs, "points": points, "_path": str(p)}
