"""The broker trims the C heap after a storm of departures, not in the middle of one."""

from __future__ import annotations

import pytest

from tandem.server import memory
from tandem.server.memory import TRIM_AFTER, ConnectionChurn


def test_trims_once_the_count_has_fallen_and_held_still(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: trims.append(1) or True)
    churn = ConnectionChurn()
    for n in (10, 500, 1000, 1000):
        assert not churn.observe(n)  # growing or steady at the top: nothing to give back
    assert not churn.observe(1000 - TRIM_AFTER + 1)  # not far enough down
    assert not churn.observe(400)  # far enough, but still falling
    assert churn.observe(400)  # held still: trim
    assert not churn.observe(400)  # once
    assert not churn.observe(350)
    assert not churn.observe(350)  # 50 fewer since the trim: not a storm
    assert trims == [1]


def test_release_free_memory_runs_where_there_is_no_glibc_too() -> None:
    assert memory.release_free_memory() is (memory._trim is not None)
