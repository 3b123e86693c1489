"""A replicated pair with real processes, each server on its own data directory: pairing, status,
kill -9 of the primary under load, an initial sync of a full store, the loss of the backup."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import exactly_once_across_a_kill, send_confirmed
from replicated_pair import admin_status, status_row
from tandem.config import DEFAULT_CLUSTER_PASSWORD, DEFAULT_CLUSTER_USER
from tandem.errors import ProtocolError
from tandem.protocol import native as p_native


async def _drain(url: str, queue: str) -> list[str]:
    conn = await aio.connect(url)
    consumer = await (await conn.create_session(transacted=True)).create_consumer(queue)
    out: list[str] = []
    while (m := await consumer.receive(1.0)) is not None:
        out.append(m.text)
        if len(out) % 500 == 0:
            await consumer.session.commit()
    await consumer.session.commit()
    await conn.close()
    return out


def test_pair_syncs_and_both_sides_show_the_replication_state(pair: Any) -> None:
    """The backup reports in-sync, takes its primary's node id, and `tandem admin status` shows
    the state and the peer on both sides; the primary tells clients where its backup is."""
    p = pair().start_all()
    primary, backup = admin_status(p.url_of(0)), admin_status(p.url_of(1))
    assert status_row(primary, "replication") == "in-sync"
    assert status_row(backup, "replication") == "in-sync"
    assert status_row(primary, "replication_peer") == f"127.0.0.1:{p.ports[1]}"
    assert status_row(backup, "replication_peer") == f"127.0.0.1:{p.ports[0]}"
    assert status_row(backup, "state") == "passive"
    assert status_row(primary, "node_id") == status_row(backup, "node_id")

    async def topology() -> list[Any]:
        conn = await aio.connect(p.url_of(0))
        try:
            return conn.topology
        finally:
            await conn.close()

    (node,) = asyncio.run(topology())
    assert node["backup"] == f"127.0.0.1:{p.ports[1]}"
    assert "connected: initial sync" in p.primary.log_text()
    assert "in sync with primary" in p.backup.log_text()


def test_replication_without_a_coordinator_needs_allow_uncoordinated(tmp_path: Path) -> None:
    """No coordinator yet: a replication policy starts only with allow-uncoordinated = true, and says why."""
    b = BrokerProcess(tmp_path / "p", extra_toml='ha-policy = "replication-primary"\n')
    try:
        with pytest.raises(RuntimeError) as info:
            b.start()
    finally:
        b.kill()  # closes its output pipe
    assert "exited with 2" in str(info.value)
    assert "allow-uncoordinated" in str(info.value)


@pytest.mark.parametrize("wrong", ["password", "group"])
def test_a_backup_with_the_wrong_cluster_password_or_group_is_refused_and_both_log_it(pair: Any, wrong: str) -> None:
    p = pair()
    extra = 'cluster-password = "not the pair"\n' if wrong == "password" else 'group-name = "other"\n'
    b = p.backup
    b.config_path.write_text(extra + b.config_path.read_text())
    p.primary.start()
    p.wait_state(0, "active")
    b.start()
    deadline = time.monotonic() + 15
    needle = "wrong cluster-user or cluster-password" if wrong == "password" else "group-name"
    while needle not in b.log_text() or needle not in p.primary.log_text():
        assert time.monotonic() < deadline, f"not logged on both sides:\n{p.primary.log_text()}\n{b.log_text()}"
        time.sleep(0.1)
    assert "refused" in b.log_text() and "refused" in p.primary.log_text()
    st = p.status(1)
    assert st["state"] == "waiting" and st["replication"] != "in-sync"
    assert p.status(0)["replication"] == "unreplicated"


class _ReplicaStartBefore0086(p_native.Packet, tag=40):
    """REPLICA_START as a backup from before decision 0086 sends it: no store format."""

    user: str
    password: str
    connector: str
    group_name: str | None = None


def test_a_backup_that_cannot_read_the_store_format_is_refused(pair: Any) -> None:
    """A backup from before decision 0086 skips page records that hold runs of messages: had it
    replicated, a failover would have made it active and it would have deleted every paged
    message as read. It sends no store format in its REPLICA_START; the primary refuses it, says
    why (to it and in its log), and stays unreplicated. (A real old backup, not a mock: the bytes
    such a backup sends, on a real socket.)"""
    p = pair()
    p.primary.start()
    p.wait_state(0, "active")
    user, password = DEFAULT_CLUSTER_USER, DEFAULT_CLUSTER_PASSWORD
    old_start = _ReplicaStartBefore0086(user, password, "127.0.0.1:1")
    hello = p_native.Hello(p_native.PROTOCOL_VERSION, None, user, password, "tandem-backup")
    reader = p_native.FrameReader(p_native.ServerPacket, 1 << 20, expect_magic=False)
    got: list[Any] = []
    with socket.create_connection(("127.0.0.1", p.primary.port), timeout=10) as sock:
        sock.sendall(p_native.MAGIC + p_native.encode(hello) + p_native.encode(old_start))
        deadline = time.monotonic() + 10
        while not any(isinstance(x, p_native.Error) for x in got) and time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                break
            try:
                got += reader.feed(data)
            except ProtocolError:  # frames that are no packet: the store's files, streamed to it
                got.append("the primary's replication stream")
                break
    errors = [x for x in got if isinstance(x, p_native.Error)]
    assert errors and "store format" in errors[0].message, got
    deadline = time.monotonic() + 10
    while "store format" not in p.primary.log_text():
        assert time.monotonic() < deadline, p.primary.log_text()
        time.sleep(0.1)
    assert p.status(0)["replication"] == "unreplicated"


@pytest.mark.timeout(120)
def test_kill9_of_the_primary_under_load_loses_and_duplicates_nothing(pair: Any) -> None:
    """Producer with auto_dedup, transacted consumer, both on the pair URL: the backup takes over
    with its replica, clients follow, every confirmed message is consumed exactly once."""
    p = pair().start_all()
    total = 3000
    consumed, times = exactly_once_across_a_kill(p.url, p.primary.kill, total)
    dupes = [k for k, n in Counter(consumed).items() if n > 1]
    assert not dupes, f"consumed twice: {dupes[:10]}"
    assert sorted(consumed) == list(range(total)), f"lost: {sorted(set(range(total)) - set(consumed))[:10]}"
    st = p.status(1)
    assert st["state"] == "active" and st["warm_activation"] is True
    print(f"failover: first confirmed send {times['first_send'] - times['kill']:.3f}s after kill -9")


async def _load(url: str, queue: str, confirmed: set[str], stop: asyncio.Event) -> None:
    """A producer on one server (no failover): confirmed sends recorded, until `stop` or its server dies."""
    conn = await aio.connect(url, ha=False, reconnect_attempts=0, auto_dedup=False)
    try:
        prod = (await conn.create_session()).create_producer(queue, window=64)
        i = 0
        while not stop.is_set():
            name = f"L{i}"
            await prod.send_async(name, lambda exc, n=name: exc or confirmed.add(n))
            i += 1
            if i % 64 == 0:
                await asyncio.sleep(0.001)
    except tandem.TandemError:
        pass
    finally:
        try:
            await conn.close()
        except tandem.TandemError:
            pass


def _files(directory: Path) -> dict[str, bytes]:
    return {
        f"{sub}/{f.name}": f.read_bytes()
        for sub in ("bindings", "journal")
        if (directory / sub).is_dir()
        for f in sorted((directory / sub).iterdir())
        if f.is_file()
    }


def _data_print(directory: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "tandem", "data", "print", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.replace(str(directory), "<data>")


@pytest.mark.timeout(150)
def test_backup_started_on_a_full_store_syncs_under_load_then_takes_over_with_everything(pair: Any) -> None:
    """20k messages in the primary, a producer still sending: the backup copies the store, catches
    up with the stream, reports in sync; kill -9 of the primary: every confirmed message is there."""
    p = pair(journal_file_size=256 * 1024)
    p.primary.start()
    p.wait_state(0, "active")
    first = asyncio.run(send_confirmed(p.url_of(0), "full", "f", 20_000))
    confirmed: set[str] = set()

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(_load(p.url_of(0), "full", confirmed, stop))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(p.backup.start)
        st = await asyncio.to_thread(p.wait_replication, 1, "in-sync")
        assert st["state"] == "passive"
        n = len(confirmed)
        while len(confirmed) < n + 500:  # the stream after the sync, too
            await asyncio.sleep(0.05)
        await asyncio.to_thread(p.primary.kill)
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())
    assert "syncing" in p.backup.log_text() and len(confirmed) > 1000
    p.wait_state(1, "active", timeout=20)
    got = asyncio.run(_drain(p.url_of(1), "full"))
    assert len(got) == len(set(got)), "a message is there twice"
    missing = (set(first) | confirmed) - set(got)
    assert not missing, f"confirmed messages missing on the backup: {sorted(missing)[:10]} ({len(missing)})"


@pytest.mark.timeout(150)
def test_kill_of_the_backup_under_load_then_it_resyncs_into_oldreplica_and_takes_over_later(pair: Any) -> None:
    """The primary carries on alone when its backup dies; the backup, restarted, moves its old
    data to oldreplica.1, syncs again, and has everything when the primary dies in turn."""
    p = pair(journal_file_size=256 * 1024).start_all()
    confirmed: set[str] = set()

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(_load(p.url_of(0), "work", confirmed, stop))
        while len(confirmed) < 1000:
            await asyncio.sleep(0.02)
        await asyncio.to_thread(p.backup.kill)
        n = len(confirmed)
        deadline = time.monotonic() + 20
        while len(confirmed) < n + 2000:  # the primary confirms without its backup
            assert time.monotonic() < deadline, "the primary stopped confirming when its backup died"
            await asyncio.sleep(0.02)
        st = await asyncio.to_thread(p.status, 0)
        assert st["replication"] == "unreplicated" and st["state"] == "active"
        await asyncio.to_thread(p.backup.start)
        await asyncio.to_thread(p.wait_in_sync)
        n = len(confirmed)
        while len(confirmed) < n + 500:
            await asyncio.sleep(0.02)
        await asyncio.to_thread(p.primary.kill)
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())
    assert "dropped" in p.primary.log_text()
    old = p.dirs[1] / "oldreplica.1"
    assert (old / "journal").is_dir() and any((old / "journal").iterdir()), "the old replica was not kept"
    assert "oldreplica.1" in p.backup.log_text()
    p.wait_state(1, "active", timeout=20)
    got = asyncio.run(_drain(p.url_of(1), "work"))
    assert len(got) == len(set(got))
    missing = confirmed - set(got)
    assert not missing, f"confirmed messages missing after the resync: {sorted(missing)[:10]} ({len(missing)})"


@pytest.mark.timeout(120)
def test_after_the_sync_the_backup_directory_is_the_primary_s(pair: Any) -> None:
    """A store with acknowledged, queued and transacted messages and compactions, synced under
    load: once quiet, both data directories hold the same files byte for byte, and `tandem data
    print` (a cold load) reads the same store from both."""
    p = pair(journal_file_size=64 * 1024, journal_compact_min_files=4, journal_compact_percentage=60)
    p.primary.start()
    p.wait_state(0, "active")
    asyncio.run(send_confirmed(p.url_of(0), "gone", "g", 3000))
    asyncio.run(send_confirmed(p.url_of(0), "kept", "k", 1500))
    asyncio.run(_drain(p.url_of(0), "gone"))  # acknowledged: dead records, reclaimed and compacted files
    confirmed: set[str] = set()

    async def consume(stop: asyncio.Event) -> None:
        """Acknowledge what the load sends: dead records all the time, so compactions run during the sync."""
        conn = await aio.connect(p.url_of(0), ha=False, reconnect_attempts=0)
        consumer = await (await conn.create_session(ack_mode="auto")).create_consumer("later")
        while not stop.is_set():
            await consumer.receive(0.1)
        await conn.close()

    async def run() -> None:
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(_load(p.url_of(0), "later", confirmed, stop)),
            asyncio.create_task(consume(stop)),
        ]
        await asyncio.sleep(0.5)
        await asyncio.to_thread(p.backup.start)
        await asyncio.to_thread(p.wait_in_sync)
        await asyncio.to_thread(_drain_some, p.url_of(0), "kept", 1000)
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)

    asyncio.run(run())
    deadline = time.monotonic() + 20
    while (a := _files(p.dirs[0])) != (b := _files(p.dirs[1])):
        assert time.monotonic() < deadline, (
            f"only on the primary: {sorted(set(a) - set(b))}, only on the backup: {sorted(set(b) - set(a))}, "
            f"different: {sorted(k for k in set(a) & set(b) if a[k] != b[k])}"
        )
        time.sleep(0.2)
    assert len(a) >= 4
    assert _data_print(p.dirs[0]) == _data_print(p.dirs[1])
    assert p.status(0)["journal"]["compactions"] >= 1, "no compaction ran"


def _drain_some(url: str, queue: str, n: int) -> None:
    async def go() -> None:
        conn = await aio.connect(url)
        consumer = await (await conn.create_session(transacted=True)).create_consumer(queue)
        for _ in range(n):
            assert await consumer.receive(5.0) is not None
        await consumer.session.commit()
        await conn.close()

    asyncio.run(go())


def test_a_clean_stop_of_the_primary_hands_over_to_the_backup(pair: Any) -> None:
    """Ctrl-C of the primary: its last batches reach the backup, which takes over with all of them."""
    p = pair().start_all()
    sent = asyncio.run(send_confirmed(p.url_of(0), "handover", "h", 2000))
    assert p.primary.stop() == 0
    p.wait_state(1, "active", timeout=20)
    assert "the primary is stopping" in p.backup.log_text()
    assert sorted(asyncio.run(_drain(p.url_of(1), "handover"))) == sorted(sent)


@pytest.mark.timeout(120)
def test_a_backup_that_stops_answering_is_dropped_and_never_takes_over(pair: Any) -> None:
    """SIGSTOP of the backup: the primary drops it after call-timeout and confirms without it; the
    backup, continued, learns it was dropped and syncs again instead of taking over."""
    p = pair(call_timeout=1000).start_all()
    confirmed: set[str] = set()

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(_load(p.url_of(0), "slow", confirmed, stop))
        while len(confirmed) < 500:
            await asyncio.sleep(0.02)
        p.backup.signal(signal.SIGSTOP)
        try:
            n = len(confirmed)
            deadline = time.monotonic() + 20
            while len(confirmed) < n + 1000:  # confirmations resume once the backup is dropped
                assert time.monotonic() < deadline, "the primary waits for a stopped backup for ever"
                await asyncio.sleep(0.05)
            st = await asyncio.to_thread(p.status, 0)
            assert st["replication"] == "unreplicated"
        finally:
            p.backup.signal(signal.SIGCONT)
        await asyncio.to_thread(p.wait_in_sync)
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())
    assert "no acknowledgement within call-timeout" in p.primary.log_text()
    assert "dropped by the primary" in p.backup.log_text()
    assert "activating" not in p.backup.log_text()
    assert (p.dirs[1] / "oldreplica.1").is_dir()
    p.primary.kill()
    p.wait_state(1, "active", timeout=20)
    got = asyncio.run(_drain(p.url_of(1), "slow"))
    missing = confirmed - set(got)
    assert not missing, f"confirmed messages missing: {sorted(missing)[:10]} ({len(missing)})"


@pytest.mark.timeout(120)
def test_a_disk_error_on_the_primary_hands_over_to_the_backup(pair: Any) -> None:
    """The primary's journal fails (EIO from the fault seam): it stops with status 3, and the
    backup takes over with every message the primary had confirmed."""
    p = pair()
    p.primary.env["TANDEM_JOURNAL_FAULTS"] = "tandem-data:sync=EIO@300"
    p.start_all()
    confirmed: set[str] = set()

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(_load(p.url_of(0), "disk", confirmed, stop))
        await asyncio.wait_for(task, 60)  # ends when the primary stops

    asyncio.run(run())
    assert p.primary.wait_exit(20) == 3
    p.wait_state(1, "active", timeout=20)
    assert confirmed, "nothing was confirmed before the fault"
    got = asyncio.run(_drain(p.url_of(1), "disk"))
    missing = confirmed - set(got)
    assert not missing, f"confirmed messages missing on the backup: {sorted(missing)[:10]} ({len(missing)})"


def test_bursts_sent_to_new_queues_are_confirmed_in_full(pair: Any) -> None:
    """300 pipelined sends to a queue they auto-create: the first slice's confirmation waits for
    the bindings record, so the slices' confirmations come out of order; the last one (the whole
    burst) must not be overwritten by an earlier, lower one (it was: flush() waited for ever)."""
    p = pair().start_all()

    async def bursts() -> None:
        conn = await aio.connect(p.url_of(0))
        session = await conn.create_session()
        for q in range(8):
            prod = session.create_producer(f"burst{q}")
            for i in range(300):
                await prod.send_async(f"b{i}")
            await asyncio.wait_for(prod.flush(), 10)
        await conn.close()

    asyncio.run(bursts())
    assert p.status(0)["messages"] == 8 * 300
