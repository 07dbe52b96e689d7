#!/usr/bin/env python3
"""Keeps the knob table of docs/design.md equal to `memtrade knobs --markdown`.

    ci/knob_table_doc.py BUILD/memtrade docs/design.md           rewrite the table in place
    ci/knob_table_doc.py BUILD/memtrade docs/design.md --check   exit 1 when it differs
"""
import pathlib
import re
import subprocess
import sys

BEGIN = re.compile(r"^<!-- knobs:begin.*-->$", re.M)
END = "<!-- knobs:end -->"


def main(argv):
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] != "--check"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    binary, doc = argv[1], pathlib.Path(argv[2])
    table = subprocess.run([binary, "knobs", "--markdown"], check=True, capture_output=True,
                           text=True).stdout
    text = doc.read_text()
    begin, end = BEGIN.search(text), text.find(END)
    if begin is None or end < 0:
        print(f"{doc}: no knob-table markers", file=sys.stderr)
        return 2
    new = text[:begin.end()] + "\n" + table + text[end:]
    if len(argv) == 4:
        if new != text:
            print(f"{doc}: the knob table is out of date: run `make docs` (or {argv[0]} "
                  f"{binary} {doc})", file=sys.stderr)
            return 1
        return 0
    doc.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
