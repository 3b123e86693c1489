"""The chaos runs start a pair, a ZooKeeper and a dozen clients each: under `pytest -n` they belong
to the xdist group "chaos". (With pytest 9.2 and pytest-xdist 3.8.0 `--dist loadgroup` does not
group anything: xdist writes the group into `item._nodeid`, which pytest 9 no longer reads. So the
two runs are one test, run one after the other.)"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into the node id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    runs = Path(__file__).parent / "test_chaos_run.py"
    for item in items:
        if Path(str(item.path)) == runs:
            item.add_marker(pytest.mark.xdist_group("chaos"))
