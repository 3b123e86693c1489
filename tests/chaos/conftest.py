"""The chaos runs start a pair, a ZooKeeper and a dozen clients each: under `pytest -n` they share
one worker (xdist group "chaos"), so two of them never load the machine at once."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents and "run" in item.name:
            item.add_marker(pytest.mark.xdist_group("chaos"))
