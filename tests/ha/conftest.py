"""Fixtures of the HA tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lock_holder import Holder
from replicated_pair import ReplicatedPair
from zookeeper import ZooKeeperServer


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Any]:
    """Make uncoordinated replicated pairs (ReplicatedPair settings as keywords); all killed at the end.
    Files with another kind of pair define their own `pair`."""
    made: list[ReplicatedPair] = []

    def make(**settings: Any) -> ReplicatedPair:
        p = ReplicatedPair(tmp_path / f"pair{len(made)}", **settings)
        made.append(p)
        return p

    yield make
    for p in made:
        p.kill_all()


@pytest.fixture
def holders(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[Any]:
    """Make Holders of a node id's live lock on the `zookeeper` fixture; all killed at the end."""
    made: list[Holder] = []

    def make(node_id: str = "node-1") -> Holder:
        h = Holder(zookeeper.hosts, node_id, tmp_path / f"holder{len(made)}.err")
        made.append(h)
        return h

    yield make
    for h in made:
        h.kill()
