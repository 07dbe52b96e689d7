"""Read and validate memtrade results, trace and history files.

Every problem is raised as InputError with one line naming the file and what is wrong; the CLI
turns it into that line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sqlite3
import subprocess
import sys
from typing import Any

RESULTS_SCHEMA = "memtrade.results/1"
TRACE_SCHEMA = "memtrade.trace/1"
ADVISE_SCHEMA = "memtrade.advise/1"
ESTIMATE_SCHEMA = "memtrade.estimate/1"
FIT_SCHEMA = "memtrade.fit/1"


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


SCHEMA_DIR = pathlib.Path(__file__).resolve().parents[1] / "schemas"


def _check_schema(path: Any, doc: Any, expected: str) -> None:
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object with \"schema\": \"{expected}\", "
                         f"got {type(doc).__name__}")
    schema = doc.get("schema")
    if schema != expected:
        raise InputError(f"{path}: schema is {schema!r}, expected {expected!r}")


def _validator(kind: str):
    """The JSON Schema of a memtrade file kind (schemas/<kind>.schema.json): the one statement of
    each contract, shared with the tests."""
    import jsonschema

    schema = json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def _where(error) -> str:
    """'points[3].memory.peak_allocated' from a validation error's path."""
    out = ""
    for k in error.absolute_path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "document"


def _check(path: Any, doc: Any, kind: str, expected: str) -> None:
    _check_schema(path, doc, expected)
    try:
        validator = _validator(kind)
    except ImportError:  # a bare GPU image without jsonschema: the schema name is all we check
        print(f"memtrade report: warning: python3-jsonschema missing, {path} not validated",
              file=sys.stderr)
        return
    errors = list(validator.iter_errors(doc))
    if errors:
        import jsonschema

        e = jsonschema.exceptions.best_match(errors)
        raise InputError(f"{path}: {_where(e)}: {e.message}")


def validate_results(doc: Any, path: Any = "<results>") -> dict:
    """Check a results document against schemas/results.schema.json; returns it with missing
    optional sections of every point set to None."""
    _check(path, doc, "results", RESULTS_SCHEMA)
    for p in doc["points"]:
        for sec in ("memory", "time", "throughput", "train", "transfer"):
            p.setdefault(sec, None)
    return doc


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


def _load_doc(path: str | pathlib.Path, what: str, schema: str) -> dict:
    doc = _read_json(path)
    _check(path, doc, what, schema)
    doc["_path"] = str(path)
    return doc


def load_trace(path: str | pathlib.Path) -> dict:
    """`memtrade run --trace FILE` output (memtrade.trace/1): one step's allocator events."""
    return _load_doc(path, "trace", TRACE_SCHEMA)


def load_estimates(path: str | pathlib.Path) -> dict:
    """`memtrade estimate --json` output (memtrade.estimate/1): predicted peaks, not measured."""
    return _load_doc(path, "estimate", ESTIMATE_SCHEMA)


def load_fit(path: str | pathlib.Path) -> dict:
    """`memtrade fit --json FILE` output (memtrade.fit/1): the largest batch per knob setting."""
    return _load_doc(path, "fit", FIT_SCHEMA)


def load_advise(path: str | pathlib.Path) -> dict:
    """`memtrade advise --json` output (memtrade.advise/1): the frontier and the recommendation."""
    return _load_doc(path, "advise", ADVISE_SCHEMA)


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
    return {"runs": runs, "points": points, "_path": str(p), "changes": history_changes(p)}


def history_changes(db: pathlib.Path) -> list | None:
    """The change points of the history (`memtrade history changes --json`), from the binary in
    $MEMTRADE_BIN (set by `memtrade report`); None where there is none to ask."""
    binary = os.environ.get("MEMTRADE_BIN")
    if not binary or not os.path.exists(binary):
        return None
    r = subprocess.run([binary, "history", "changes", "--db", str(db), "--json"],
                       capture_output=True, text=True)
    if r.returncode not in (0, 1):
        return None
    try:
        return json.loads(r.stdout).get("changes", [])
    except json.JSONDecodeError:
        return None
