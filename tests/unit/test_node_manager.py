"""Node managers (file and in-memory) and the activations over them, in one process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tandem.config import load_config
from tandem.errors import NotActive
from tandem.ha.activation import Act, make_activation
from tandem.ha.lockfile import FAILBACK, LIVE, NOT_STARTED, PAUSED
from tandem.ha.node_manager import FileNodeManager, InMemoryNodeManager, NodeManager, SharedStore
from tandem.server.broker import Broker


def pairs(tmp_path: Path) -> list[tuple[NodeManager, NodeManager]]:
    store = SharedStore()
    return [
        (FileNodeManager(tmp_path), FileNodeManager(tmp_path)),
        (InMemoryNodeManager(store), InMemoryNodeManager(store)),
    ]


@pytest.mark.parametrize("kind", [0, 1], ids=["file", "memory"])
def test_locks_exclude_within_one_process(tmp_path: Path, kind: int) -> None:
    a, b = pairs(tmp_path)[kind]
    assert a.node_id == b.node_id, "one store, one node id"
    assert a.state() == NOT_STARTED
    assert a.try_live() and not b.try_live()
    assert b.live_held_elsewhere() and not a.live_held_elsewhere()
    assert b.try_backup() and not a.try_backup()
    a.set_state(LIVE)
    assert b.state() == LIVE
    a.close()  # like a crash: the live lock goes
    assert b.try_live()
    b.close()


def test_file_lock_state_and_id_survive_reopening(tmp_path: Path) -> None:
    a = FileNodeManager(tmp_path)
    node = a.node_id
    a.set_state(PAUSED)
    a.close()
    b = FileNodeManager(tmp_path)
    assert (b.node_id, b.state()) == (node, PAUSED)
    assert (tmp_path / "server.lock").stat().st_size == 19
    b.close()


def test_backup_never_queues_while_a_live_primary_asks_for_failback(tmp_path: Path) -> None:
    """F stands while the primary that wrote it holds the primary lock; once it dies, the backup goes on."""
    primary, other = FileNodeManager(tmp_path), FileNodeManager(tmp_path)
    assert primary.try_primary() and not other.try_primary() and other.primary_waiting()
    primary.set_state(FAILBACK)
    backup = make_activation(SimpleNamespace(config=_config("b", "shared-store-backup")), other)  # type: ignore[arg-type]
    for _ in range(20):
        backup.step()  # the broker's side of each step is not needed here
    assert backup.pc.startswith("queue") and not other.has_backup
    primary.close()  # a kill -9: its locks go, its F stays
    assert not other.primary_waiting()
    for _ in range(20):
        if backup.step() is Act.SERVE:
            break
    assert backup.pc == "live" and other.state() == LIVE, "the F of a dead primary is void: the backup serves"
    other.close()


def _config(name: str, policy: str, **extra: Any) -> Any:
    return load_config(
        None,
        name=name,
        persistence_enabled=False,
        ha_policy=policy,
        lock_check_period=10,
        acceptors=[{"name": "n", "bind": "127.0.0.1:0"}],
        **extra,
    )


async def _until(cond: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_activations_failover_and_failback_in_memory() -> None:
    async def main() -> None:
        store = SharedStore()
        primary = Broker(_config("p", "shared-store-primary"), InMemoryNodeManager(store))
        backup = Broker(_config("b", "shared-store-backup"), InMemoryNodeManager(store))
        await primary.start()
        await _until(lambda: primary.active)
        await backup.start()
        await _until(lambda: backup.ha_state == "passive")
        # crash of the primary: its locks go, state stays L
        primary.node_manager.close()  # type: ignore[union-attr]
        await primary.stop(leave_state=False)
        await _until(lambda: backup.active)
        assert store.state == LIVE
        # the primary comes back: asks for failback, the backup steps down and waits again
        again = Broker(_config("p", "shared-store-primary"), InMemoryNodeManager(store))
        await again.start()
        await _until(lambda: again.active)
        await _until(lambda: backup.ha_state == "passive")
        assert not backup.active
        # a clean stop: state P, the backup stays passive
        await again.stop()
        assert store.state == PAUSED
        await asyncio.sleep(0.2)
        assert backup.ha_state == "passive"
        await backup.stop()

    asyncio.run(main())


def test_live_only_refuses_a_store_in_use() -> None:
    async def main() -> None:
        store = SharedStore()
        first = Broker(_config("a", "live-only"), InMemoryNodeManager(store))
        await first.start()
        second = Broker(_config("b", "live-only"), InMemoryNodeManager(store))
        with pytest.raises(Exception, match="in use"):
            await second.start()
        await first.stop()

    asyncio.run(main())


def test_a_live_broker_that_loses_its_lock_stops_serving() -> None:
    """Within a lock-check-period or so; as when a network file system lets the lock go."""

    async def main() -> None:
        store = SharedStore()
        broker = Broker(_config("a", "live-only"), InMemoryNodeManager(store))
        await broker.start()
        assert broker.active
        store.live = object()  # another server holds the live lock now
        await _until(lambda: not broker.active)
        await asyncio.wait_for(broker.wait_stopped(), 5)
        assert isinstance(broker.failure, NotActive), broker.failure
        assert store.state == LIVE, "a server that lost its lock writes nothing more"

    asyncio.run(main())
