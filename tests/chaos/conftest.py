"""The chaos runs start a pair, a ZooKeeper and a dozen clients each: under `pytest -n` they share
one worker (xdist group "chaos"), so two of them never load the machine at once."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    runs = Path(__file__).parent / "test_chaos_run.py"
    for item in items:
        if Path(str(item.path)) == runs:
            item.add_marker(pytest.mark.xdist_group("chaos"))
