import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _pydeps():
    """ci/setup.sh's folder of the PyPI packages of ci/requirements-hf.txt (transformers), named by
    that file's SHA-256, or $MEMTRADE_PYDEPS: on sys.path after Debian's packages."""
    import hashlib
    req = ROOT / "ci" / "requirements-hf.txt"
    default = pathlib.Path.home() / ".cache" / "memtrade" / (
        "pydeps-" + hashlib.sha256(req.read_bytes()).hexdigest()[:12])
    return pathlib.Path(os.environ.get("MEMTRADE_PYDEPS", default))


if (_pydeps() / ".complete").exists():
    import sys
    sys.path.append(str(_pydeps()))


@pytest.fixture(scope="session")
def memtrade_bin():
    path = pathlib.Path(os.environ.get("MEMTRADE_BIN", ROOT / "build" / "memtrade"))
    if not path.exists():
        pytest.fail(f"memtrade binary not found at {path} (set MEMTRADE_BIN)")
    return str(path)


@pytest.fixture(scope="session", autouse=True)
def knob_table(memtrade_bin):
    """The knob table of the binary under test, for the reports of results files that predate
    meta.knobs (the fixtures) and for the reports' own analysis functions."""
    import json
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT))
    from reports import knobs

    text = subprocess.run([memtrade_bin, "knobs", "--json"], check=True, capture_output=True,
                          text=True).stdout
    os.environ["MEMTRADE_KNOBS_JSON"] = text
    knobs.use(json.loads(text))
    return knobs.table()
