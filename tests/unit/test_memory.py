"""The broker gives memory back after a storm of departures, not in the middle of one."""

from __future__ import annotations

import asyncio
import gc

import pytest
import uvloop

from tandem.server import memory
from tandem.server.memory import TRIM_AFTER, ConnectionChurn


def test_releases_once_the_count_has_fallen_and_held_still() -> None:
    churn = ConnectionChurn()
    for n in (10, 500, 1000, 1000):
        assert not churn.observe(n)  # growing or steady at the top: nothing to give back
    assert not churn.observe(1000 - TRIM_AFTER + 1)  # not far enough down
    assert not churn.observe(400)  # far enough, but still falling
    assert churn.observe(400)  # held still: release
    assert not churn.observe(400)  # once
    assert not churn.observe(350)
    assert not churn.observe(350)  # 50 fewer since the release: not a storm


def test_release_free_memory_runs_where_there_is_no_glibc_too() -> None:
    assert memory.release_free_memory() is (memory._trim is not None)


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_release_leaves_the_loop_and_the_collector_as_it_found_them(run: object) -> None:
    async def main() -> tuple[bool, bool, int]:
        ran: list[int] = []
        asyncio.get_running_loop().call_soon(ran.append, 1)  # someone else's callback still runs
        released = await ConnectionChurn().release(0)
        return released, gc.isenabled(), len(ran)

    released, enabled, ran = run(main())  # type: ignore[operator]
    assert (released, enabled, ran) == (memory._trim is not None, True, 1)


def test_no_collection_while_collections_are_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload or a follower's warm-up turned them off: its heap must not be walked."""
    collections: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(1) or 0)
    gc.disable()
    try:
        asyncio.run(memory.release_memory())
    finally:
        gc.enable()
    assert collections == []
    asyncio.run(memory.release_memory())
    assert collections == [1, 1]
