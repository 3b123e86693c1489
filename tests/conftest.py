from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from broker_process import BrokerProcess
from zookeeper import ZooKeeperServer


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    """Make BrokerProcess instances that are all killed at the end of the test."""
    made: list[BrokerProcess] = []

    def make(name: str = "b", **settings: object) -> BrokerProcess:
        b = BrokerProcess(tmp_path / name, name=name, **settings)  # type: ignore[arg-type]
        made.append(b)
        return b

    yield make
    for b in made:
        b.kill()


@pytest.fixture
def broker(broker_factory: object) -> BrokerProcess:
    """A running broker process with default settings (small journal files)."""
    return broker_factory().start()  # type: ignore[operator, no-any-return]


@pytest.fixture
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A private ZooKeeper on 127.0.0.1 (tick 500 ms), killed at the end of the test.

    Per test, not per module: it answers within about half a second, and a test that stops or
    pauses it leaves nothing behind for the next one.
    """
    zk = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")).start()
    try:
        yield zk
    finally:
        zk.stop()


# The longest work first, so that no worker is left with it at the end while the other idles:
# the Spark tests, then the chaos and crash loops, then everything else in its usual order.
LONGEST_FIRST = (
    "tests/spark/",
    "tests/chaos/",
    "tests/integration/test_crash.py",
    "tests/integration/test_tx_crash.py",
)

# Tests that share one costly thing run on one worker: one JVM and SparkSession for tests/spark,
# one Chromium for tests/browser, and the chaos runs one after the other (each starts a pair, a
# ZooKeeper and a dozen clients). Not xdist_group marks: pytest-xdist 3.8 writes the group into
# `item._nodeid`, which pytest 9 no longer reads, so `--dist loadgroup` groups nothing.
GROUPS = {
    "tests/spark/": "spark",
    "tests/browser/": "browser",
    "tests/chaos/test_chaos_run.py": "chaos",
}


def group_of(nodeid: str) -> str:
    """The scheduling unit of a test: its group, or the test itself."""
    return next((g for prefix, g in GROUPS.items() if nodeid.startswith(prefix)), nodeid)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: the order within each rank stays


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadgroup` with GROUPS as the groups (largest group first, then the rest in order)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)
