"""Fixtures of the HA tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicated_pair import ReplicatedPair


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
