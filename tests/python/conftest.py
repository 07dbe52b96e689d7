import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def memtrade_bin():
    path = pathlib.Path(os.environ.get("MEMTRADE_BIN", ROOT / "build" / "memtrade"))
    if not path.exists():
        pytest.fail(f"memtrade binary not found at {path} (set MEMTRADE_BIN)")
    return str(path)
