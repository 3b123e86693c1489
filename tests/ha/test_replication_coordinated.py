"""A replicated pair coordinated by a real ZooKeeper (the `zookeeper` fixture), real broker processes:
the live lock and the activation sequence decide who may serve (decision 0034)."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

import tandem.aio as aio
from client_io import Load, drain_texts, send_confirmed
from ha_pair import free_port
from replicated_pair import ReplicatedPair
from tandem.ha.activation_sequence import read_local_sequence
from zookeeper import ZooKeeperServer

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def pair(tmp_path: Path, zookeeper: ZooKeeperServer) -> Any:
    made: list[ReplicatedPair] = []

    def make(**settings: Any) -> ReplicatedPair:
        p = ReplicatedPair(tmp_path / f"pair{len(made)}", zookeeper=zookeeper.hosts, **settings)
        made.append(p)
        return p

    yield make
    for p in made:
        p.kill_all()


async def _drain(url: str, queue: str) -> set[str]:
    conn = await aio.connect(url)
    consumer = await (await conn.create_session(transacted=True)).create_consumer(queue)
    out: set[str] = set()
    while (m := await consumer.receive(1.0)) is not None:
        out.add(m.text)
    await consumer.session.commit()
    await conn.close()
    return out


def test_kill9_of_the_primary_the_backup_takes_the_lock_and_serves_every_confirmed_message(
    pair: Any, zookeeper: ZooKeeperServer
) -> None:
    """No allow-uncoordinated needed; the primary claims sequence 1, the backup takes over once the
    primary's session expires and claims 2; every confirmed message is on it."""
    p = pair().start_all()
    st = p.status(0)
    assert st["activation_sequence"] == 1 and st["coordinator"] == "live lock held", st
    load = Load()

    async def run() -> None:
        task = asyncio.create_task(load.run(p.url_of(0), "q"))
        await load.until(1000)
        await asyncio.to_thread(p.primary.kill)
        await asyncio.wait_for(task, 20)

    asyncio.run(run())
    p.wait_state(1, "active", timeout=20)
    st = p.status(1)
    assert st["activation_sequence"] == 2, st
    assert read_local_sequence(p.dirs[1]) == 2
    assert zookeeper.activation_sequence(st["node_id"]) == 2
    got = asyncio.run(_drain(p.url_of(1), "q"))
    missing = set(load.confirmed) - got
    assert not missing, f"confirmed messages missing: {sorted(missing)[:10]} ({len(missing)})"


def test_a_backup_dropped_while_the_primary_carried_on_never_activates(pair: Any, zookeeper: ZooKeeperServer) -> None:
    """SIGSTOP of the backup past call-timeout: the primary drops it and bumps the sequence; kill -9
    of the primary, SIGCONT of the backup: its copy of the sequence is behind, it stays inactive."""
    p = pair(call_timeout=1000).start_all()
    node = p.status(0)["node_id"]
    load = Load()

    async def run() -> None:
        task = asyncio.create_task(load.run(p.url_of(0), "q"))
        await load.until(300)
        p.backup.signal(signal.SIGSTOP)
        # Dropped first: confirmations the backup gave before the cut may still be on their
        # way to the client; those counted after the drop waited for the bump.
        await asyncio.to_thread(p.wait_replication, 0, "unreplicated")
        n = len(load.confirmed)
        await load.until(n + 500)  # confirmations resume once the backup is dropped
        st = await asyncio.to_thread(p.status, 0)
        assert st["replication"] == "unreplicated"
        assert st["activation_sequence"] == 2, st  # carried on alone: bumped
        await asyncio.to_thread(p.primary.kill)
        await asyncio.wait_for(task, 20)

    try:
        asyncio.run(run())
    finally:
        p.backup.signal(signal.SIGCONT)
    assert zookeeper.activation_sequence(node) == 2
    assert read_local_sequence(p.dirs[1]) < 2
    p.never_active(1, 6.0)  # past the primary's session (2 s) with a margin
    assert "activating" not in p.backup.log_text()


def test_zookeeper_lost_the_active_server_stops_serving(pair: Any, zookeeper: ZooKeeperServer) -> None:
    """ZooKeeper killed: the primary's session counts as lost, it stops at once with status 4."""
    p = pair().start_all()
    zookeeper.stop()
    assert p.primary.wait_exit(15) == 4
    assert "ZooKeeper session lost" in p.primary.log_text()


def test_a_zombie_primary_stops_serving_and_confirms_nothing_after_its_resume(
    pair: Any, zookeeper: ZooKeeperServer
) -> None:
    """SIGSTOP of the primary under load; the backup takes over once the session expired; SIGCONT:
    the primary stops (status 4), no send made during its pause is confirmed, nothing confirmed is lost."""
    p = pair(connection_ttl=1000).start_all()
    load = Load()
    stopped_at: list[int] = []

    async def run() -> None:
        task = asyncio.create_task(load.run(p.url_of(0), "q"))
        await load.until(500)
        p.primary.signal(signal.SIGSTOP)
        stopped_at.append(load.sent)
        try:
            await asyncio.to_thread(p.wait_state, 1, "active", 20)
            await asyncio.sleep(0.3)  # the client keeps sending into the paused server's socket
        finally:
            p.primary.signal(signal.SIGCONT)
        load.stop.set()
        await asyncio.wait_for(task, 20)

    asyncio.run(run())
    assert p.primary.wait_exit(15) == 4
    assert load.sent > stopped_at[0], "nothing was sent during the pause"
    late = sorted(n for n, i in load.confirmed.items() if i >= stopped_at[0])
    assert not late, f"the zombie confirmed sends made during its pause: {late[:10]} ({len(late)})"
    got = asyncio.run(_drain(p.url_of(1), "q"))
    missing = set(load.confirmed) - got
    assert not missing, f"confirmed messages missing: {sorted(missing)[:10]} ({len(missing)})"


def _checks(port: int) -> str:
    return f'network-check-list = ["127.0.0.1:{port}"]\nnetwork-check-period = 200\nnetwork-check-timeout = 300\n'


def test_an_active_primary_that_reaches_no_network_check_target_stops_and_the_backup_serves(pair: Any) -> None:
    """The primary's only network-check target closes: it stops (status 4) and its backup takes over."""
    target = socket.create_server(("127.0.0.1", 0), backlog=512)
    try:
        p = pair(server_toml=(_checks(target.getsockname()[1]), "")).start_all()
        p.wait_state(0, "active")
    finally:
        target.close()
    assert p.primary.wait_exit(15) == 4
    assert "network check" in p.primary.log_text()
    p.wait_state(1, "active", timeout=20)
    assert p.status(1)["activation_sequence"] == 2


def test_a_backup_that_reaches_no_network_check_target_does_not_take_over(pair: Any) -> None:
    """kill -9 of the primary; the backup, holding a current copy, reaches none of its targets: it stays inactive."""
    p = pair(server_toml=("", _checks(free_port()))).start_all()
    p.primary.kill()
    p.never_active(1, 5.0)
    assert "network-check-list" in p.backup.log_text()


def test_an_in_sync_backup_whose_takeover_zookeeper_refused_takes_over_once_zookeeper_is_back(
    pair: Any, zookeeper: ZooKeeperServer
) -> None:
    """ZooKeeper killed: the active primary stops (status 4) and its in-sync backup cannot take the
    lock. It must not activate while ZooKeeper is down, and must not give up either: once ZooKeeper
    is back (and the dead primary's session has expired) it takes the lock with its sequence, which
    is current, and serves every confirmed message, without anybody restarting anything."""
    p = pair().start_all()
    load = Load()

    async def run() -> None:
        task = asyncio.create_task(load.run(p.url_of(0), "q"))
        await load.until(500)
        await asyncio.to_thread(zookeeper.stop)  # while the producer sends
        await asyncio.wait_for(task, 20)

    asyncio.run(run())
    assert p.primary.wait_exit(15) == 4
    p.never_active(1, 12.0)  # longer than connect-timeout (8 s): its takeover attempt has failed meanwhile
    zookeeper.start()
    p.wait_state(1, "active", timeout=30)
    st = p.status(1)
    assert st["activation_sequence"] == 2, st
    got = asyncio.run(_drain(p.url_of(1), "q"))
    missing = set(load.confirmed) - got
    assert not missing, f"confirmed messages missing: {sorted(missing)[:10]} ({len(missing)})"


def test_a_primary_refused_the_live_lock_at_start_waits_as_a_backup_then_serves_once_it_is_free(
    pair: Any, holders: Any
) -> None:
    """Chaos seed 1127207: a primary restarted while its backup was taking the node over found no
    active server, then lost the race for the live lock, and exited (status 1). It must wait as a
    backup instead. Here another process holds the lock: the primary starts and does not serve;
    once the holder is gone, its copy (current: nobody claimed a newer one) serves every message."""
    p = pair(coordinator_toml="connect-timeout = 1000\n")  # a refused activation waits 2 sessions + this
    p.primary.start()
    p.wait_state(0, "active")
    node_id = p.status(0)["node_id"]
    sent = asyncio.run(send_confirmed(p.url_of(0), "held", "m", 50))
    p.primary.kill()
    holder = holders(node_id)
    holder.expect("locked")
    p.primary.start(timeout=60)  # waits out the lock (2 sessions and a connect timeout): it used to exit here
    p.never_active(0, 1.0)
    assert "another server holds the live lock" in p.primary.log_text()
    holder.kill()
    p.wait_state(0, "active", timeout=40)
    assert sorted(asyncio.run(drain_texts(p.url_of(0), "held"))) == sorted(sent)
