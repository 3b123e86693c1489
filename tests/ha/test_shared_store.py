"""Shared-store HA with real processes on one data directory: kill -9, SIGSTOP, clean stops, failback."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from client_io import exactly_once_across_a_kill
from ha_pair import Cluster
from tandem.aio import FailureEvent


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    made: list[Cluster] = []

    def make(backups: int = 1, **settings: Any) -> Cluster:
        c = Cluster(tmp_path, backups, **settings)
        made.append(c)
        return c

    yield make
    for c in made:
        c.kill_all()


async def _count(url: str, queue: str) -> int:
    conn = await aio.connect(url, retry_interval=100)
    try:
        return int((await conn.manage("queue.stat", name=queue))[0]["message_count"])
    finally:
        await conn.close()


@pytest.mark.timeout(180)
def test_kill9_of_the_primary_under_load_loses_and_duplicates_nothing(cluster: Any) -> None:
    """Producer with auto_dedup, transacted consumer: every confirmed message consumed exactly once."""
    c = cluster().start_all()
    total = 3000
    consumed, times = exactly_once_across_a_kill(c.url, c.primary.kill, total)
    dupes = [k for k, n in Counter(consumed).items() if n > 1]
    assert not dupes, f"consumed twice: {dupes[:10]}"
    assert sorted(consumed) == list(range(total)), f"lost: {sorted(set(range(total)) - set(consumed))[:10]}"
    assert c.status(1)["state"] == "active"
    print(f"failover: first confirmed send {times['first_send'] - times['kill']:.3f}s after kill -9")


def test_clean_stop_does_not_fail_over_by_default(cluster: Any) -> None:
    c = cluster().start_all()
    c.primary.stop()
    time.sleep(1.0)
    assert c.status(1)["state"] == "passive", "a clean stop (state P) must not wake the backup"
    c.primary.start()
    c.wait_state(0, "active")


def test_failover_on_shutdown_and_admin_stop_and_failover(cluster: Any, tmp_path: Path) -> None:
    c = cluster(failover_on_shutdown=True).start_all()
    c.primary.stop()
    c.wait_state(1, "active", timeout=10)
    c.backup.stop()  # leaves L too: nobody is waiting; the primary starts normally
    # stop-and-failover by management, without failover-on-shutdown
    d = Cluster(tmp_path / "second").start_all()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "tandem", "admin", "stop", "--failover", "--url", d.url_of(0)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        d.wait_state(1, "active", timeout=10)
        assert d.primary.proc is not None and d.primary.proc.wait(10) == 0
    finally:
        d.kill_all()


@pytest.mark.timeout(240)
def test_failback_three_cycles_with_clients_following(cluster: Any) -> None:
    c = cluster().start_all()
    sent = 0

    async def send_some(n: int) -> None:
        nonlocal sent
        conn = await aio.connect(c.url, retry_interval=50)
        prod = (await conn.create_session()).create_producer("fb")
        for _ in range(n):
            await prod.send(str(sent))
            sent += 1
        await conn.close()

    events: list[FailureEvent] = []

    async def cycle() -> None:
        conn = await aio.connect(c.url, retry_interval=50)
        conn.add_failure_listener(lambda kind, cause: events.append(kind))
        prod = (await conn.create_session()).create_producer("fb")
        nonlocal sent
        for _ in range(3):
            c.primary.kill()
            for _ in range(50):
                await prod.send(str(sent))
                sent += 1
            assert conn.server == f"127.0.0.1:{c.ports[1]}"
            c.primary.start()  # asks for failback; the backup steps down
            deadline = time.monotonic() + 30
            while conn.server != f"127.0.0.1:{c.ports[0]}" and time.monotonic() < deadline:
                await prod.send(str(sent))
                sent += 1
                await asyncio.sleep(0.01)
            assert conn.server == f"127.0.0.1:{c.ports[0]}", "the client did not follow the failback"
        await conn.close()

    asyncio.run(send_some(10))
    asyncio.run(cycle())
    c.wait_state(1, "passive")
    assert events.count(FailureEvent.FAILOVER) == 6
    assert asyncio.run(_count(c.url, "fb")) == sent


def test_sigstop_primary_keeps_the_lock_then_kill_lets_the_backup_in(cluster: Any) -> None:
    c = cluster().start_all()
    c.primary.pause()
    try:
        time.sleep(2.0)
        assert c.status(1)["state"] == "passive", "the backup must not activate while the primary holds the lock"
    finally:
        c.primary.kill()
    took = c.wait_state(1, "active", timeout=10)
    assert took < 5


def test_two_backups_the_second_backs_up_the_new_active(cluster: Any) -> None:
    c = cluster(backups=2)
    c.start_all()
    time.sleep(0.5)
    states = {c.status(1)["state"], c.status(2)["state"]}
    assert states == {"passive", "waiting"}, states
    first = 1 if c.status(1)["state"] == "passive" else 2
    second = 3 - first
    c.primary.kill()
    c.wait_state(first, "active", timeout=10)
    c.wait_state(second, "passive", timeout=10)
    # the new active learns its new backup (topology) ...
    deadline = time.monotonic() + 10
    while c.status(first)["peer"] != f"127.0.0.1:{c.ports[second]}" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert c.status(first)["peer"] == f"127.0.0.1:{c.ports[second]}"
    # ... and takes over when that one dies too
    c.servers[first].kill()
    c.wait_state(second, "active", timeout=10)


def test_client_given_only_the_primary_learns_the_backup_from_topology(cluster: Any) -> None:
    c = cluster().start_all()
    time.sleep(0.5)  # the backup has announced itself

    async def main() -> None:
        conn = await aio.connect(c.url_of(0), retry_interval=50)  # one address: no HA unless topology says so
        assert any(n.get("backup") == f"127.0.0.1:{c.ports[1]}" for n in conn.topology), conn.topology
        assert conn.reconnect_attempts == -1
        prod = (await conn.create_session()).create_producer("topo")
        await prod.send("before")
        c.primary.kill()
        await prod.send("after")
        assert conn.server == f"127.0.0.1:{c.ports[1]}"
        await conn.close()

    asyncio.run(main())
    assert asyncio.run(_count(c.url, "topo")) == 2


def test_unblocked_rollback_only_and_listeners(cluster: Any) -> None:
    c = cluster().start_all()

    async def main() -> None:
        conn = await aio.connect(c.url, retry_interval=50)
        events: list[tuple[FailureEvent, Any]] = []
        conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
        plain = await conn.create_session()
        waiting = await plain.create_consumer("nothing.comes")
        blocked = asyncio.create_task(waiting.receive(30))
        tx = await conn.create_session(transacted=True)
        await tx.create_producer("txq").send("in open tx")
        await asyncio.sleep(0.2)
        c.primary.kill()
        with pytest.raises(tandem.Unblocked):
            await asyncio.wait_for(blocked, 20)
        with pytest.raises(tandem.TransactionRolledBack):
            await tx.commit()
        # usable again after the rollback
        await tx.create_producer("txq").send("after")
        await tx.commit()
        assert [k for k, _ in events] == [FailureEvent.FAILOVER]
        assert isinstance(events[0][1], tandem.ConnectionLost)
        await conn.close()
        assert await _count(c.url, "txq") == 1

    asyncio.run(main())


def test_disconnect_and_application_level_failover(cluster: Any) -> None:
    c = cluster().start_all()

    async def main() -> None:
        conn = await aio.connect(c.url_of(0), reconnect_attempts=0)
        events: list[FailureEvent] = []
        conn.add_failure_listener(lambda kind, cause: events.append(kind))
        prod = (await conn.create_session()).create_producer("app")
        await prod.send("one")
        c.primary.kill()
        with pytest.raises(tandem.ConnectionLost):
            for _ in range(100):
                await prod.send("x")
                await asyncio.sleep(0.05)
        assert events == [FailureEvent.DISCONNECT]
        # the application fails over by itself
        conn2 = await aio.connect(c.url_of(1), initial_connect_attempts=100, retry_interval=100)
        await (await conn2.create_session()).create_producer("app").send("two")
        await conn2.close()

    asyncio.run(main())
    assert asyncio.run(_count(c.url, "app")) == 2


def test_reconnect_to_the_same_server_is_reported_as_reconnected(broker_factory: Any) -> None:
    b = broker_factory().start()

    async def main() -> None:
        conn = await aio.connect(b.url, reconnect_attempts=-1, retry_interval=100)
        events: list[FailureEvent] = []
        conn.add_failure_listener(lambda kind, cause: events.append(kind))
        prod = (await conn.create_session()).create_producer("same")
        await prod.send("one")
        await asyncio.get_running_loop().run_in_executor(None, b.kill)
        await asyncio.get_running_loop().run_in_executor(None, b.start)
        await prod.send("two")
        assert events == [FailureEvent.RECONNECTED]
        await conn.close()

    port = b.port
    b.config_path.write_text(b.config_path.read_text().replace("127.0.0.1:0", f"127.0.0.1:{port}"))
    asyncio.run(main())


def test_warm_backup_takes_over_a_backlog_without_reloading(cluster: Any) -> None:
    c = cluster().start_all()

    async def fill() -> None:
        conn = await aio.connect(c.url)
        prod = (await conn.create_session()).create_producer("backlog")
        for i in range(2000):
            await prod.send_async(f"{i}", properties={"i": i}, priority=i % 10)
        await prod.flush()
        consumer = await (await conn.create_session(ack_mode="individual")).create_consumer("backlog")
        for _ in range(300):  # ack some, leave some redelivered
            m = await consumer.receive(5)
            assert m is not None
            if int(m.properties["i"]) % 2:
                await m.ack()
        await conn.close()

    asyncio.run(fill())
    deadline = time.monotonic() + 30
    while not c.status(1).get("following", {}).get("caught_up") and time.monotonic() < deadline:
        time.sleep(0.1)
    expected_before = asyncio.run(_count(c.url, "backlog"))
    c.primary.kill()
    c.wait_state(1, "active", timeout=10)
    status = c.status(1)
    assert status["warm_activation"] is True
    assert asyncio.run(_count(c.url_of(1), "backlog")) == expected_before

    async def drain() -> list[tuple[int, int]]:
        conn = await aio.connect(c.url_of(1))
        consumer = await (await conn.create_session()).create_consumer("backlog")
        out = []
        while (m := await consumer.receive(1)) is not None:
            out.append((m.priority, int(m.properties["i"])))
        await conn.close()
        return out

    got = asyncio.run(drain())
    assert len(got) == expected_before
    assert [p for p, _ in got] == sorted((p for p, _ in got), reverse=True), "priority order lost"


@pytest.mark.timeout(120)
def test_blocking_iteration_rides_through_a_failover(cluster: Any) -> None:
    """`for msg in consumer` (blocking API) keeps going after a kill -9, as `async for` does."""
    c = cluster().start_all()
    total = 400
    with tandem.connect(c.url, retry_interval=50) as pconn:
        prod = pconn.session().create_producer("iter")
        for i in range(total // 2):
            prod.send(str(i))
    seen: list[int] = []
    errors: list[BaseException] = []
    with tandem.connect(c.url, retry_interval=50) as conn:
        session = conn.session(transacted=True)
        consumer = session.create_consumer("iter")

        def read() -> None:
            try:
                batch: list[int] = []
                for msg in consumer:
                    batch.append(int(msg.text))
                    if len(batch) == 10:
                        try:
                            session.commit()
                            seen.extend(batch)
                        except (tandem.TransactionRolledBack, tandem.Unblocked):
                            session.rollback()  # not committed: these come again
                        except tandem.TransactionOutcomeUnknown:
                            if not session.retry_commit():  # False: the first attempt was committed
                                seen.extend(batch)
                        batch = []
                    if len(set(seen)) >= total:
                        return
            except BaseException as exc:
                errors.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 30
        while len(seen) < total // 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the reader now waits in receive() for more
        c.primary.kill()
        c.wait_state(1, "active")
        with tandem.connect(c.url, retry_interval=50) as pconn:
            prod = pconn.session().create_producer("iter")
            for i in range(total // 2, total):
                prod.send(str(i))
        reader.join(60)
        assert not reader.is_alive(), f"iteration stopped after {len(seen)} messages"
        assert not errors, errors
    assert sorted(seen) == list(range(total))  # every message once, none lost, none twice
