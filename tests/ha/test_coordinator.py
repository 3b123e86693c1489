"""The ZooKeeper coordinator of a replicated pair, against a real ZooKeeper (the `zookeeper` fixture).

One live lock per node id; an activation sequence bumped by compare-and-set, so a stale
claim is refused; a session that is lost (ZooKeeper gone, silent, or the holder frozen past
its session) is reported so the server stops serving. Sessions are 2 s here (the fixture's
tick is 500 ms), so expiries take seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from lock_holder import SESSION_MS
from tandem.errors import IllegalState
from tandem.ha.coordinator import AsyncCoordinator, Coordinator, SessionLost, StaleActivation
from zookeeper import ZooKeeperServer


@pytest.fixture
def coordinators(zookeeper: ZooKeeperServer) -> Iterator[Any]:
    """Make started Coordinators on the fixture's ZooKeeper; all closed at the end."""
    made: list[Coordinator] = []

    def make(node_id: str = "node-1", start: bool = True, **kw: Any) -> Coordinator:
        kw.setdefault("session_timeout", SESSION_MS)
        kw.setdefault("connect_timeout", 5000)
        c = Coordinator(zookeeper.hosts, node_id, **kw)
        made.append(c)
        if start:
            c.start()
        return c

    yield make
    for c in made:
        c.close()


def holders_when(c: Coordinator, count: int, timeout: float = 10.0) -> list[str]:
    """The live lock's line once it has `count` entries (polled, at most `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        line: list[str] = c.live_lock_holders()
        if len(line) == count or time.monotonic() > deadline:
            return line
        time.sleep(0.02)


# ---------------------------------------------------------------- the live lock
def test_only_one_coordinator_per_node_id_holds_the_live_lock(coordinators: Any) -> None:
    a, b, other = coordinators(holder="a"), coordinators(holder="b"), coordinators("node-2")
    assert a.try_lock_live(timeout=5)
    assert a.try_lock_live(timeout=0), "taking a lock already held is a no-op"
    assert not b.try_lock_live(timeout=0.5)
    assert a.live_lock_holders() == ["a"], "b gave up its place in line when its wait timed out"
    assert other.try_lock_live(timeout=5), "another node id has a lock of its own"
    a.unlock()
    assert b.try_lock_live(timeout=5)
    assert b.live_lock_holders() == ["b"]
    assert not a.try_lock_live(timeout=0.2)


def test_a_waiting_coordinator_gets_the_lock_when_the_holder_closes(coordinators: Any) -> None:
    a, b = coordinators(holder="a"), coordinators(holder="b")
    assert a.try_lock_live(timeout=5)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(b.try_lock_live(timeout=20)))
    waiter.start()
    assert holders_when(b, 2) == ["a", "b"], "b waits in line behind a"
    a.close()
    waiter.join(30)
    assert got == [True]
    assert b.holds_live_lock


def test_the_lock_of_a_killed_process_goes_when_its_session_expires(coordinators: Any, holders: Any) -> None:
    h = holders()
    h.expect("locked")
    peer = coordinators(holder="peer")
    assert not peer.try_lock_live(timeout=0)
    h.kill()  # SIGKILL: no session close; its ephemeral lock node stays until ZooKeeper expires the session
    assert not peer.try_lock_live(timeout=0), "the session of a killed holder outlives it until it expires"
    assert peer.try_lock_live(timeout=20)
    assert peer.live_lock_holders() == ["peer"]


# ----------------------------------------------------------- activation sequence
def test_claim_activation_bumps_the_sequence_by_compare_and_set(coordinators: Any) -> None:
    a, b = coordinators(), coordinators()
    assert a.activation_sequence() == 0, "a node id ZooKeeper never saw starts at 0"
    written: list[int] = []
    with pytest.raises(IllegalState, match="live lock"):
        a.claim_activation(0, written.append)
    assert written == [] and a.activation_sequence() == 0

    assert a.try_lock_live(timeout=5)
    assert a.claim_activation(0, written.append) == 1
    assert written == [1], "the local copy is written between the claim and its commit"
    assert b.activation_sequence() == 1
    with pytest.raises(StaleActivation, match="stale"):
        a.claim_activation(0, written.append)  # what a replica left behind at 0 would try
    assert written == [1] and b.activation_sequence() == 1
    assert a.claim_activation(1, written.append) == 2
    assert written == [1, 2] and b.activation_sequence() == 2


def test_an_interrupted_claim_is_finished_by_the_next_claim(coordinators: Any) -> None:
    """A claimant that dies between its claim and its commit never served: a peer that was in sync may go on."""
    a, b = coordinators(holder="a"), coordinators(holder="b")
    assert a.try_lock_live(timeout=5)
    assert a.claim_activation(0, lambda n: None) == 1

    def crash(n: int) -> None:
        raise OSError(f"disk gone while writing {n}")

    with pytest.raises(OSError):
        a.claim_activation(1, crash)
    assert b.activation_sequence() == -2, "the claim of 2 is left in progress"
    a.close()
    written: list[int] = []
    assert b.try_lock_live(timeout=10)
    with pytest.raises(StaleActivation):
        b.claim_activation(0, written.append)
    assert b.claim_activation(1, written.append) == 3
    assert written == [3] and b.activation_sequence() == 3


def test_a_claim_after_the_lock_node_vanished_is_refused_and_reported(
    coordinators: Any, zookeeper: ZooKeeperServer
) -> None:
    """What ZooKeeper does to an expired session, seen before the client notices: no claim goes through."""
    a = coordinators()
    lost: list[str] = []
    a.on_session_lost(lost.append)
    assert a.try_lock_live(timeout=5)
    assert a.claim_activation(0, lambda n: None) == 1
    assert a.verify_live_lock()
    rogue = KazooClient(zookeeper.hosts)
    rogue.start(timeout=10)
    try:
        for child in rogue.get_children(a.live_path):
            rogue.delete(f"{a.live_path}/{child}")
        written: list[int] = []
        with pytest.raises(SessionLost):
            a.claim_activation(1, written.append)
        assert written == []
        assert rogue.get(a.sequence_path)[0] == b"1"
    finally:
        rogue.stop()
        rogue.close()
    assert len(lost) == 1 and "live lock" in lost[0]
    assert not a.holds_live_lock and not a.verify_live_lock()


# ----------------------------------------------------------------- session loss
def test_zookeeper_stopped_reports_the_session_lost_then_a_new_session_locks_again(
    coordinators: Any, zookeeper: ZooKeeperServer
) -> None:
    a = coordinators(holder="a")
    lost = threading.Event()
    reasons: list[str] = []
    a.on_session_lost(lambda r: (reasons.append(r), lost.set()))
    assert a.try_lock_live(timeout=5)
    zookeeper.stop()
    assert lost.wait(30), "a server cut off from ZooKeeper must learn it may no longer serve"
    assert len(reasons) == 1 and "ZooKeeper" in reasons[0]
    assert a.lost is not None and not a.holds_live_lock
    with pytest.raises(SessionLost):
        a.try_lock_live(timeout=0)
    with pytest.raises(SessionLost):
        a.claim_activation(0, lambda n: None)
    a.close()

    zookeeper.start()
    b = coordinators(holder="b")
    assert b.try_lock_live(timeout=20), "a new session locks once the old one is gone"
    assert b.live_lock_holders() == ["b"]


def test_a_silent_zookeeper_reports_the_session_lost(coordinators: Any, zookeeper: ZooKeeperServer) -> None:
    """SIGSTOP: the connection stays open but nothing answers; suspended past the grace counts as lost."""
    a = coordinators()
    lost = threading.Event()
    a.on_session_lost(lambda r: lost.set())
    assert a.try_lock_live(timeout=5)
    zookeeper.pause()
    try:
        assert lost.wait(30)
    finally:
        zookeeper.resume()
    assert a.lost is not None
    with pytest.raises(SessionLost):
        a.activation_sequence()


def test_a_frozen_holder_learns_it_was_superseded_and_cannot_claim(coordinators: Any, holders: Any) -> None:
    """The zombie: SIGSTOP past its session, a peer takes over, SIGCONT: it reports the loss and claims nothing."""
    h = holders()
    h.expect("locked")
    h.send("claim 0")
    assert h.expect("claimed") == "claimed 1"
    os.kill(h.proc.pid, signal.SIGSTOP)
    peer = coordinators(holder="peer")
    assert peer.try_lock_live(timeout=20)
    assert peer.claim_activation(1, lambda n: None) == 2
    os.kill(h.proc.pid, signal.SIGCONT)
    h.send("claim 1")
    # Either order: the claim may meet the dead session (refused, then the loss is declared) or
    # find it declared lost already.
    got = h.expect_each(("lost:", "refused"))
    assert got["refused"].startswith("refused"), got
    assert peer.activation_sequence() == 2 and peer.holds_live_lock


# ------------------------------------------------------------------------ asyncio
def test_the_async_coordinator_keeps_the_loop_free_and_calls_back_on_it(
    coordinators: Any, zookeeper: ZooKeeperServer
) -> None:
    blocker = coordinators(holder="blocker")
    assert blocker.try_lock_live(timeout=5)

    async def main() -> None:
        loop_thread = threading.get_ident()
        c = AsyncCoordinator(coordinators(start=False, holder="async"))
        await c.start()
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        called_on: list[int] = []

        def on_lost(reason: str) -> None:
            called_on.append(threading.get_ident())
            lost.set_result(reason)

        c.on_session_lost(on_lost)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        assert not await c.try_lock_live(timeout=1.0)
        assert ticks > 0, "the loop ran while the lock wait went on"
        blocker.unlock()
        assert await c.try_lock_live(timeout=5)
        assert await c.claim_activation(0, lambda n: None) == 1
        assert await c.activation_sequence() == 1
        assert await c.verify_live_lock()
        zookeeper.stop()
        assert "ZooKeeper" in await asyncio.wait_for(lost, 30)
        assert called_on == [loop_thread]
        ticker.cancel()
        await c.close()

    asyncio.run(main())


def test_a_lost_connection_to_zookeeper_raises_nothing_in_kazoos_worker(
    coordinators: Any, zookeeper: ZooKeeperServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection loss fires every watch with an event of no path (kazoo's watcher reset): the
    watch on our own lock node must not take it for a node event (seen in chaos runs: a TypeError
    from `exists_async(None)` logged by kazoo's worker thread at each ZooKeeper outage)."""
    a = coordinators(holder="a")
    lost = threading.Event()
    a.on_session_lost(lambda r: lost.set())
    assert a.try_lock_live(timeout=5)
    caplog.set_level(logging.ERROR)
    zookeeper.stop()
    assert lost.wait(30)
    time.sleep(1.0)  # kazoo's worker runs the watch callbacks
    failures = [r for r in caplog.records if r.exc_info]
    assert not failures, [r.getMessage() + ": " + repr(r.exc_info[1]) for r in failures if r.exc_info]
