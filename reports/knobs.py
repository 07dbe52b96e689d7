"""The knob table: every axis memtrade has, its default, id prefix and whether it is a workload
axis (what is trained rather than how). memtrade writes it into every results file (meta.knobs);
for files written before it did, the table comes from the memtrade running the report
(`memtrade report` passes it as MEMTRADE_KNOBS_JSON), else from `$MEMTRADE_BIN knobs --json`.
Nothing in reports/ lists axes or defaults of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

_table: list[dict] | None = None


class NoTable(Exception):
    """No knob table: not in the file, not from a memtrade binary."""


def _from_environment() -> list[dict]:
    text = os.environ.get("MEMTRADE_KNOBS_JSON")
    if text:
        return json.loads(text)
    binary = os.environ.get("MEMTRADE_BIN")
    if binary:
        out = subprocess.run([binary, "knobs", "--json"], capture_output=True, text=True,
                             check=True).stdout
        return json.loads(out)
    raise NoTable("this results file has no knob table (meta.knobs, memtrade >= 0.2) and no "
                  "memtrade gave one: run it through `memtrade report`")


def use(table: list[dict] | None) -> None:
    """Make `table` the active one (None: forget it; the next use asks the environment)."""
    global _table
    _table = list(table) if table is not None else None


def use_meta(*metas: dict) -> None:
    """The table of the first results meta that has one, else the environment's."""
    for meta in metas:
        if isinstance(meta, dict) and isinstance(meta.get("knobs"), list):
            use(meta["knobs"])
            return
    use(_from_environment())


def table() -> list[dict]:
    if _table is None:
        use(_from_environment())
    return _table


def names() -> list[str]:
    """Every axis, in id order."""
    return [k["name"] for k in table()]


def row(name: str) -> dict:
    for k in table():
        if k["name"] == name:
            return k
    raise KeyError(name)


def default(name: str) -> Any:
    return row(name)["default"]


def is_workload(name: str) -> bool:
    return bool(row(name).get("workload", False))


def prefix(name: str) -> str:
    return row(name).get("id_prefix", "")
