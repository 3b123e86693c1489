"""A coordinated replicated pair whose replication link runs through a FaultProxy: partitions
between primary and backup, with a real ZooKeeper deciding who may serve (decision 0034)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client_io import Load, drain_texts
from ha_pair import free_port
from replicated_pair import ReplicatedPair, linked_pairs
from tandem.ha.activation_sequence import read_local_sequence
from tandem.testing import FaultProxy
from zookeeper import ZooKeeperServer

pytestmark = pytest.mark.timeout(90)


class Watch:
    """Polls both servers' status on a thread of its own, for as long as the test runs: every
    sample where both say `active` is kept (split brain)."""

    def __init__(self, pair: ReplicatedPair) -> None:
        self.pair = pair
        self.samples = 0
        self.both: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _state(self, i: int) -> dict[str, Any]:
        try:
            return self.pair.status(i)
        except Exception:
            return {"state": "down"}

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            a, b = self._state(0), self._state(1)
            self.samples += 1
            if a["state"] == "active" and b["state"] == "active":
                self.both.append((a, b))

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def check(self) -> None:
        assert self.samples > 10, "the watch hardly ran"
        assert not self.both, f"both servers active at once: {self.both[:2]}"


@pytest.fixture
def linked(tmp_path: Path, zookeeper: ZooKeeperServer) -> Iterator[Any]:
    """make(**settings) -> (pair, proxy): the backup reaches its primary through the proxy only."""
    # A refused activation waits 2 sessions + the connect timeout.
    with linked_pairs(tmp_path, zookeeper=zookeeper.hosts, coordinator_toml="connect-timeout = 1000\n") as make:
        yield make


TTL = "connection-ttl = 2000\n"  # the backup's pings and its primary's silence (a loaded machine: not shorter)


def _backup_gave_up(p: ReplicatedPair, timeout: float = 30.0) -> None:
    """Wait until the backup has let its link go: told it was dropped, or refused the activation.
    The primary may drop it by its call timeout (REPLICA_STOP) or, a moment later on a busy
    machine, by the link's TTL (an ERROR): either way the backup starts over, no takeover."""
    deadline = time.monotonic() + timeout
    gave_up = ("dropped by the primary", "does not activate", "ended the replication with an error")
    while not any(s in (log := p.backup.log_text()) for s in gave_up):
        assert time.monotonic() < deadline, f"the backup still holds its link:\n{log[-3000:]}"
        time.sleep(0.1)


def _missing(load: Load, got: list[str]) -> list[str]:
    return sorted(set(load.confirmed) - set(got))


@pytest.mark.parametrize("direction", ["both", "up"])  # "down" is "both" as the backup sees it
def test_a_partition_under_load_never_makes_two_active_and_loses_nothing_after_the_heal(
    linked: Any, zookeeper: ZooKeeperServer, direction: str
) -> None:
    """Blackhole the replication link (both ways, or one): the primary drops its backup and carries
    on (sequence 2), the backup never activates; healed, the backup syncs again (oldreplica.1) and,
    at the primary's kill -9, takes over with every confirmed message. Never two active at once."""
    p, proxy = linked(call_timeout=2000, server_toml=(TTL, TTL))
    p.start_all()
    node = p.status(0)["node_id"]
    load = Load()
    with Watch(p) as watch:

        async def run() -> None:
            task = asyncio.create_task(load.run(p.url_of(0), "q"))
            await load.until(300)
            proxy.blackhole(direction)
            # Dropped first: confirmations the backup gave before the cut may still be on their
            # way to the client; those counted after the drop waited for the bump.
            await asyncio.to_thread(p.wait_replication, 0, "unreplicated")
            n = len(load.confirmed)
            await load.until(n + 300)  # confirmations resume once the backup is dropped
            st = await asyncio.to_thread(p.status, 0)
            assert st["replication"] == "unreplicated" and st["activation_sequence"] == 2, st
            await asyncio.to_thread(_backup_gave_up, p)
            proxy.heal()
            await asyncio.to_thread(p.wait_in_sync)
            n = len(load.confirmed)
            await load.until(n + 300)  # replicated again
            load.stop.set()
            await asyncio.wait_for(task, 20)
            await asyncio.to_thread(p.wait_in_sync)  # still (a stall under load may drop it once more)
            await asyncio.to_thread(p.primary.kill)

        asyncio.run(run())
        p.wait_state(1, "active", timeout=20)
    watch.check()
    assert (p.dirs[1] / "oldreplica.1").is_dir(), "the backup did not sync again after the heal"
    seq = p.status(1)["activation_sequence"]
    assert seq >= 3 and seq == zookeeper.activation_sequence(node), seq
    missing = _missing(load, asyncio.run(drain_texts(p.url_of(1), "q")))
    assert not missing, f"confirmed messages missing: {missing[:10]} ({len(missing)})"


def test_a_backup_cut_off_while_the_primary_carried_on_refuses_to_activate_at_the_primary_s_death(
    linked: Any, zookeeper: ZooKeeperServer
) -> None:
    """The partition variant of a stale backup: the link blackholed, the primary drops its backup
    (sequence 2) and is then killed; the backup, alive all along, notices its primary's silence
    only after the live lock is free (connection-ttl 6 s > drop 2 s + session 2 s), so what stops it is its
    stale copy of the sequence (1): it never activates, and says why."""
    p, proxy = linked(call_timeout=2000, server_toml=(TTL, "connection-ttl = 6000\n"))
    p.start_all()
    node = p.status(0)["node_id"]
    load = Load()

    async def run() -> None:
        task = asyncio.create_task(load.run(p.url_of(0), "q"))
        await load.until(300)
        proxy.blackhole()
        # Dropped first: confirmations the backup gave before the cut may still be on their
        # way to the client; those counted after the drop waited for the bump.
        await asyncio.to_thread(p.wait_replication, 0, "unreplicated")
        n = len(load.confirmed)
        await load.until(n + 300)
        assert (await asyncio.to_thread(p.status, 0))["activation_sequence"] == 2
        await asyncio.to_thread(p.primary.kill)
        await asyncio.wait_for(task, 20)

    with Watch(p) as watch:
        asyncio.run(run())
        deadline = time.monotonic() + 20
        while "does not activate" not in (log := p.backup.log_text()):
            assert time.monotonic() < deadline, f"the backup never tried to activate:\n{log[-3000:]}"
            time.sleep(0.1)
        p.never_active(1, 2.0)
    watch.check()
    assert "stale" in log.split("does not activate", 1)[1].splitlines()[0], log[-2000:]
    assert read_local_sequence(p.dirs[1]) == 1 and zookeeper.activation_sequence(node) == 2
    assert "activating" not in p.backup.log_text()


def test_a_backup_dropped_before_its_first_zookeeper_read_answers_never_takes_over(
    tmp_path: Path, zookeeper: ZooKeeperServer
) -> None:
    """The backup's first ZooKeeper session is slow (its requests held by a proxy) while it syncs;
    its link is then cut, the primary drops it, bumps the sequence to 2 and confirms more alone,
    and dies. The backup's read of the sequence, answered only now, must not make it current: it
    must never activate without what the primary confirmed alone."""
    link, zk_port = free_port(), free_port()
    p = ReplicatedPair(
        tmp_path / "pair",
        zookeeper=zookeeper.hosts,
        backup_zookeeper=f"127.0.0.1:{zk_port}",
        link_port=link,
        call_timeout=1000,
        server_toml=(TTL, TTL),
    )
    with FaultProxy(p.ports[0], port=link) as proxy, FaultProxy(zookeeper.port, port=zk_port) as zk_proxy:
        try:
            p.primary.start()
            p.wait_state(0, "active")
            node = p.status(0)["node_id"]
            load = Load()

            async def run() -> None:
                task = asyncio.create_task(load.run(p.url_of(0), "q"))
                await load.until(200)
                zk_proxy.cut("up")  # the backup's session request waits
                await asyncio.to_thread(p.backup.start)
                await asyncio.to_thread(p.wait_replication, 1, "in-sync")
                proxy.blackhole()
                # Dropped first: confirmations the backup gave before the cut may still be on their
                # way to the client; those counted after the drop waited for the bump.
                await asyncio.to_thread(p.wait_replication, 0, "unreplicated")
                n = len(load.confirmed)
                await load.until(n + 300)  # confirmed without the backup, after the bump
                assert (await asyncio.to_thread(p.status, 0))["activation_sequence"] == 2
                await asyncio.to_thread(p.primary.kill)
                await asyncio.wait_for(task, 20)
                zk_proxy.heal()

            asyncio.run(run())
            deadline = time.monotonic() + 20  # its silence check, then its claim once the lock is free
            while "does not activate" not in (log := p.backup.log_text()):
                st = p.status(1)
                if st["state"] == "active":
                    missing = _missing(load, asyncio.run(drain_texts(p.url_of(1), "q")))
                    raise AssertionError(
                        f"a dropped backup activated (sequence {st['activation_sequence']}); "
                        f"confirmed messages missing: {len(missing)}\n{log[-3000:]}"
                    )
                assert time.monotonic() < deadline, f"the backup never tried to activate:\n{log[-3000:]}"
                time.sleep(0.1)
            assert "stale" in log.split("does not activate", 1)[1].splitlines()[0], log[-2000:]
            p.never_active(1, 1.0)
            assert zookeeper.activation_sequence(node) == 2
            assert read_local_sequence(p.dirs[1]) < 2
        finally:
            p.kill_all()


def test_a_primary_cut_off_from_zookeeper_stops_and_its_backup_serves_everything_it_confirmed(
    tmp_path: Path, zookeeper: ZooKeeperServer
) -> None:
    """The primary's ZooKeeper link blackholed under load (the replication link intact): the
    primary counts its session lost and stops (status 4), handing over to its backup, which
    takes the lock once the session has expired. Never two active; nothing confirmed lost."""
    zk_port = free_port()
    p = ReplicatedPair(tmp_path / "pair", zookeeper=zookeeper.hosts, primary_zookeeper=f"127.0.0.1:{zk_port}")
    with FaultProxy(zookeeper.port, port=zk_port) as zk_proxy, Watch(p) as watch:
        try:
            p.start_all()
            load = Load()

            async def run() -> None:
                task = asyncio.create_task(load.run(p.url_of(0), "q"))
                await load.until(300)
                zk_proxy.blackhole()
                await asyncio.wait_for(task, 30)  # ends when the primary stops

            asyncio.run(run())
            assert p.primary.wait_exit(20) == 4
            p.wait_state(1, "active", timeout=20)
            assert p.status(1)["activation_sequence"] == 2
            missing = _missing(load, asyncio.run(drain_texts(p.url_of(1), "q")))
            assert not missing, f"confirmed messages missing: {missing[:10]} ({len(missing)})"
        finally:
            p.kill_all()
    watch.check()
