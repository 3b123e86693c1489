"""An I/O error anywhere in the journal stops the broker (exit status 3) and loses nothing confirmed.

Errors come from the journal's fault seam (journal/faults.py, switched on through the broker's
environment): the real code paths run, and the chosen system call fails as a full or broken
disk would make it fail. Whatever the stage — writing or syncing a batch, creating, renaming or
retiring a file, compacting — every client is told (IO_ERROR) instead of waiting for ever, the
broker logs it once and exits, and a restart on a healthy disk has every confirmed message.
The page files (`tandem-paging:`) and large messages' files (`tandem-large:`) go through the
same seam and stop the broker the same way; a large message is never delivered partial.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
from test_large_messages import STOMP_ACCEPTORS, RawStomp

import tandem.aio as aio
from ha_pair import Cluster
from replicated_pair import ReplicatedPair
from tandem.errors import TandemError
from tandem.journal.faults import ENV

BODY = 2000
SENDS = 4000


async def _traffic(
    url: str, sent: dict[int, str], acked: set[int], ack_sent: set[int], stop: asyncio.Event, keep: int, told: set[str]
) -> None:
    """A producer (window 64) and an acknowledging consumer, until the broker goes or SENDS are done.

    The consumer leaves every `keep`-th message unacknowledged (0: acknowledges all, so whole
    files die and are retired; otherwise compaction has live records to copy).

    `sent[i]` ends as "ok" or the error's code name: every send must come to an end."""

    async def produce() -> None:
        conn = await aio.connect(url, ha=False, reconnect_attempts=0, auto_dedup=False)
        try:
            prod = (await conn.create_session()).create_producer("disk", window=64)
            for i in range(SENDS):
                if stop.is_set():
                    break
                sent[i] = "pending"

                def done(exc: BaseException | None, i: int = i) -> None:
                    sent[i] = "ok" if exc is None else getattr(getattr(exc, "code", None), "name", repr(exc))

                try:
                    await prod.send_async(f"{i}".ljust(BODY, "."), done)
                except TandemError as e:  # refused before it went out: that is an end too
                    sent[i] = e.code.name
                    raise
            await prod.flush()
        except TandemError:
            pass
        finally:
            await _quietly(conn.close())

    async def consume() -> None:
        conn = await aio.connect(url, ha=False, reconnect_attempts=0)
        try:
            consumer = await (await conn.create_session(ack_mode="individual")).create_consumer("disk")
            while not stop.is_set():
                m = await consumer.receive(0.2)
                if m is not None and (not keep or int(m.text.rstrip(".")) % keep):
                    n = int(m.text.rstrip("."))
                    ack_sent.add(n)
                    await m.ack()
                    acked.add(n)
        except TandemError as e:
            told.add(e.code.name)
        finally:
            await _quietly(conn.close())

    await asyncio.gather(produce(), consume())


async def _quietly(aw: Any) -> None:
    try:
        await aw
    except TandemError:
        pass


async def _drain(url: str, queue: str = "disk") -> list[int]:
    conn = await aio.connect(url)
    try:
        consumer = await (await conn.create_session(ack_mode="client")).create_consumer(queue)
        out = []
        while (m := await consumer.receive(1.0)) is not None:
            out.append(int(m.text.rstrip(".")))
        return out
    finally:
        await conn.close()


def _run_until_failure(url: str, proc_alive: Any, keep: int = 4) -> tuple[dict[int, str], set[int], set[int], set[str]]:
    """Traffic until the broker exits; what was sent and acknowledged, and the errors clients saw."""
    told: set[str] = set()
    sent: dict[int, str] = {}
    acked: set[int] = set()
    ack_sent: set[int] = set()

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(_traffic(url, sent, acked, ack_sent, stop, keep, told))
        deadline = time.monotonic() + 60
        while proc_alive() and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 30)  # a client left waiting for ever fails here

    asyncio.run(main())
    return sent, acked, ack_sent, told | (set(sent.values()) - {"ok"})


def _check(present: list[int], sent: dict[int, str], acked: set[int], ack_sent: set[int]) -> None:
    assert len(present) == len(set(present)), "a message came back twice"
    assert not set(present) & acked, "acknowledged messages came back"
    confirmed = {i for i, r in sent.items() if r == "ok"}
    missing = sorted(confirmed - ack_sent - set(present))
    assert not missing, f"confirmed messages lost: {missing[:10]} ({len(missing)})"


FAULTS = [  # (stage, errno, calls let through, keep): each stage of the journal's I/O
    ("write", "EIO", 40, 4),
    ("sync", "ENOSPC", 40, 4),
    ("create", "ENOSPC", 6, 4),
    ("rename", "EROFS", 2, 4),
    ("recycle", "EIO", 0, 0),
    ("compact", "ENOSPC", 0, 4),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("stage", "errno", "after", "keep"), FAULTS, ids=[f[0] for f in FAULTS])
def test_an_io_error_stops_the_broker_and_loses_nothing_confirmed(
    broker_factory: Any, stage: str, errno: str, after: int, keep: int
) -> None:
    b = broker_factory(
        journal_file_size=64 * 1024,
        journal_pool_files=2,
        journal_compact_min_files=3,
        journal_compact_percentage=60,
        env={ENV: f"tandem-data:{stage}={errno}@{after}"},
    )
    b.start()
    sent, acked, ack_sent, told = _run_until_failure(b.url, lambda: b.running, keep)
    rc = b.wait_exit(30)
    log = b.log_text()
    assert rc == 3, f"exit status {rc}\n{log[-3000:]}"
    assert "injected" in log and errno in log.split("storage failure", 1)[-1][:300], log[-3000:]
    assert log.count("storage failure") == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    results = set(sent.values())
    assert "pending" not in results, "a send never came to an end"
    assert "ok" in results and told, f"no client was told of the failure: {results}"

    b.env.clear()  # the disk is healthy again
    b.start()
    _check(asyncio.run(_drain(b.url)), sent, acked, ack_sent)


@pytest.mark.timeout(180)
def test_an_io_error_on_the_primary_hands_over_to_the_backup(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 1, journal_file_size=64 * 1024)
    c.primary.env[ENV] = "tandem-data:sync=EIO@60"
    try:
        c.start_all()
        sent, acked, ack_sent, _told = _run_until_failure(c.url_of(0), lambda: c.primary.running)
        assert c.primary.wait_exit(30) == 3
        c.wait_state(1, "active", timeout=20)
        assert "ok" in set(sent.values())
        _check(asyncio.run(_drain(c.url_of(1))), sent, acked, ack_sent)
    finally:
        c.kill_all()


@pytest.mark.timeout(120)
def test_a_kernel_without_rwf_dsync_falls_back_to_fdatasync(broker_factory: Any) -> None:
    """EOPNOTSUPP from the RWF_DSYNC write: the journal writes and syncs separately, says so once
    per journal, and what it confirmed survives a kill -9 (decision 0015's fallback)."""
    b = broker_factory(env={ENV: "dsync=EOPNOTSUPP"})
    b.start()

    async def send(n: int) -> None:
        conn = await aio.connect(b.url, ha=False, reconnect_attempts=0)
        try:
            prod = (await conn.create_session()).create_producer("fallback", window=64)
            for i in range(n):
                await prod.send_async(f"{i}".ljust(BODY, "."))
            await prod.flush()
        finally:
            await conn.close()

    asyncio.run(send(500))
    asyncio.run(send(500))  # still serving after the switch
    b.kill()
    log = b.log_text()
    assert "storage failure" not in log, log[-3000:]
    warnings = [line for line in log.splitlines() if "RWF_DSYNC refused" in line]
    assert 1 <= len(warnings) <= 2, log[-3000:]  # once per journal (messages, maybe bindings)
    assert len({w.split("journal ", 1)[1].split(":", 1)[0] for w in warnings}) == len(warnings)

    b.env.clear()
    b.start()

    assert sorted(asyncio.run(_drain(b.url, "fallback"))) == sorted(list(range(500)) * 2)


PAGING = '[address-settings."disk"]\nmax-size-bytes = 8192\naddress-full-policy = "PAGE"\npage-size-bytes = 65536\n'
PAGE_FAULTS = [("write", "EIO", 30), ("sync", "ENOSPC", 30), ("create", "ENOSPC", 2)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("stage", "errno", "after"), PAGE_FAULTS, ids=[f[0] for f in PAGE_FAULTS])
def test_an_io_error_writing_a_page_file_stops_the_broker_and_loses_nothing_confirmed(
    broker_factory: Any, stage: str, errno: str, after: int
) -> None:
    """The page files' writer through the same seam (`tandem-paging:`): a paging address (four
    messages fill it) whose page write fails stops the broker as a journal's would."""
    b = broker_factory(extra_toml=PAGING, env={ENV: f"tandem-paging:{stage}={errno}@{after}"})
    b.start()
    sent, acked, ack_sent, told = _run_until_failure(b.url, lambda: b.running)
    rc = b.wait_exit(30)
    log = b.log_text()
    assert rc == 3, f"exit status {rc}\n{log[-3000:]}"
    assert "address paging" in log and "injected" in log, log[-3000:]
    assert errno in log.split("storage failure", 1)[-1][:300], log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    results = set(sent.values())
    assert "pending" not in results, "a send never came to an end"
    assert "ok" in results and told, f"no client was told of the failure: {results}"

    b.env.clear()
    b.start()
    _check(asyncio.run(_drain(b.url)), sent, acked, ack_sent)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["shared-store", "replicated"])
def test_an_io_error_writing_a_page_file_on_the_primary_hands_over_to_the_backup(tmp_path: Path, kind: str) -> None:
    """A pair's primary whose page file sync fails stops at once, as a journal failure makes it:
    its final flush of the message journal does not wait (a chaos run saw it wait 30 s for a batch
    that could no longer complete, with the replication link up, so the backup did not take over
    for those 30 s; tests/unit/test_journal.py has that case). The backup takes over with every
    confirmed message."""
    paging = {"disk": {"max_size_bytes": 8192, "address_full_policy": "PAGE", "page_size_bytes": 65536}}
    pair = Cluster if kind == "shared-store" else ReplicatedPair
    c = pair(tmp_path, 1, address_settings=paging) if pair is Cluster else pair(tmp_path, address_settings=paging)
    c.primary.env[ENV] = "tandem-paging:sync=ENOSPC@30"
    try:
        c.start_all()
        sent, acked, ack_sent, told = _run_until_failure(c.url_of(0), lambda: c.primary.running)
        assert c.primary.wait_exit(30) == 3
        log = c.primary.log_text()
        assert "address paging" in log and "tandem-paging" in log.split("storage failure", 1)[-1][:300], log[-3000:]
        assert "final flush timed out" not in log, log[-3000:]
        assert "ok" in set(sent.values()) and told, sent
        c.wait_state(1, "active", timeout=20)
        _check(asyncio.run(_drain(c.url_of(1))), sent, acked, ack_sent)
    finally:
        c.kill_all()


LARGE = 64 * 1024  # the clients' min_large_message_size here (their chunk size too)
LARGE_SENDS = 12
LARGE_FAULTS = [  # (stage, errno, calls let through): each stage of a large message's file I/O
    ("create", "ENOSPC", 3),
    ("write", "EIO", 17),  # five chunks a message: the fourth fails in its third chunk
    ("sync", "ENOSPC", 4),  # the body's and the directory's: the third message's body
    ("rename", "EROFS", 3),
]


def _large_body(i: int) -> bytes:
    """Five chunks (less a little, more each time) that differ chunk to chunk and message to message."""
    block = hashlib.sha256(str(i).encode()).digest() * (LARGE // 32)
    return b"".join(j.to_bytes(8, "little") + block[8:] for j in range(5))[: 5 * LARGE - 100 + i]


async def _send_large(url: str, sent: dict[int, str], told: list[TandemError], sends: int = LARGE_SENDS) -> None:
    """Large messages one by one (each confirmed before the next), until one fails."""
    conn = await aio.connect(f"{url}?min_large_message_size={LARGE}", ha=False, reconnect_attempts=0)
    try:
        prod = (await conn.create_session()).create_producer("disk")
        for i in range(sends):
            sent[i] = "pending"
            try:
                await asyncio.wait_for(prod.send(_large_body(i), properties={"n": i}), 30)
            except TandemError as e:
                sent[i] = e.code.name
                told.append(e)
                return
            sent[i] = "ok"
    finally:
        await _quietly(conn.close())


async def _drain_large(url: str) -> dict[int, bytes]:
    """Every message of `disk`, body whole (a large one read to its end), acknowledged."""
    conn = await aio.connect(f"{url}?min_large_message_size={LARGE}")
    try:
        consumer = await (await conn.create_session(ack_mode="individual")).create_consumer("disk")
        out: dict[int, bytes] = {}
        while (m := await consumer.receive(1.0)) is not None:
            n = m.properties["n"]
            assert n not in out, f"large message {n} came back twice"
            out[n] = bytes(m.body)
            await m.ack()
        return out
    finally:
        await conn.close()


def _check_large(got: dict[int, bytes], sent: dict[int, str]) -> None:
    confirmed = {i for i, r in sent.items() if r == "ok"}
    assert set(got) <= set(sent), f"messages never sent: {sorted(set(got) - set(sent))}"
    lost = sorted(confirmed - set(got))
    assert not lost, f"confirmed large messages lost: {lost}"
    for n, data in got.items():
        want = _large_body(n)
        assert len(data) == len(want) and data == want, f"large message {n}: {len(data)} bytes, not its {len(want)}"


def _told_of_the_disk(told: list[TandemError], errno: str) -> None:
    """The failed send's error names the disk's: IO_ERROR (its answer), or UNBLOCKED (outcome
    unknown) when the broker's IO_ERROR to the whole connection overtook that answer."""
    assert len(told) == 1, told
    e = told[0]
    assert e.code.name in ("IO_ERROR", "UNBLOCKED"), f"the sender was told {e.code.name}: {e.message}"
    assert "injected" in e.message and errno in e.message, e.message
    assert "INTERNAL" not in e.message and "Traceback" not in e.message, e.message


def _large_files(data_dir: Path) -> list[str]:
    d = data_dir / "large-messages"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("stage", "errno", "after"), LARGE_FAULTS, ids=[f[0] for f in LARGE_FAULTS])
def test_an_io_error_storing_a_large_message_stops_the_broker_and_loses_nothing_confirmed(
    broker_factory: Any, stage: str, errno: str, after: int
) -> None:
    """A large message's file (`tandem-large:` in the seam) fails while it is created, written,
    synced or renamed: its sender is told IO_ERROR, the broker stops as for a failed journal, and
    after a restart every large message confirmed before is there whole and nothing partial is."""
    b = broker_factory(env={ENV: f"tandem-large:{stage}={errno}@{after}"})
    b.start()
    sent: dict[int, str] = {}
    told: list[TandemError] = []
    asyncio.run(_send_large(b.url, sent, told))
    results = set(sent.values())
    assert "pending" not in results, "a send never came to an end"
    assert "ok" in results, f"nothing was confirmed before the fault: {sent}"
    _told_of_the_disk(told, errno)
    rc = b.wait_exit(30)
    log = b.log_text()
    assert rc == 3, f"exit status {rc}\n{log[-3000:]}"
    assert "injected" in log and errno in log.split("storage failure", 1)[-1][:300], log[-3000:]
    assert "tandem-large" in log.split("storage failure", 1)[-1][:300], log[-3000:]
    assert log.count("storage failure") == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]

    b.env.clear()  # the disk is healthy again
    b.start()
    left = _large_files(b.data_dir)
    assert not [n for n in left if not n.endswith(".msg")], f"a partial file survived the restart: {left}"
    assert len(left) == sum(r == "ok" for r in sent.values()), left
    _check_large(asyncio.run(_drain_large(b.url)), sent)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["shared-store", "replicated"])
def test_an_io_error_storing_a_large_message_on_the_primary_hands_over_to_the_backup(tmp_path: Path, kind: str) -> None:
    """The primary's large message write fails (its chunks so far already streamed to a
    replicating backup); the backup takes over with every large message the primary confirmed
    whole, and no partial file or message."""
    c = Cluster(tmp_path, 1) if kind == "shared-store" else ReplicatedPair(tmp_path)
    c.primary.env[ENV] = "tandem-large:write=EIO@17"
    try:
        c.start_all()
        sent: dict[int, str] = {}
        told: list[TandemError] = []
        asyncio.run(_send_large(c.url_of(0), sent, told))
        assert "ok" in set(sent.values()), sent
        _told_of_the_disk(told, "EIO")
        assert c.primary.wait_exit(30) == 3
        c.wait_state(1, "active", timeout=20)
        left = _large_files(c.data if kind == "shared-store" else c.servers[1].data_dir)
        assert not [n for n in left if not n.endswith(".msg")], f"a partial file on the new primary: {left}"
        assert len(left) == sum(r == "ok" for r in sent.values()), left
        _check_large(asyncio.run(_drain_large(c.url_of(1))), sent)
    finally:
        c.kill_all()


@pytest.mark.timeout(120)
def test_an_io_error_storing_a_stomp_large_body_stops_the_broker(broker_factory: Any) -> None:
    """A STOMP SEND whose body streams into a large message's file: the second body's sync fails;
    its sender gets an ERROR frame naming the disk error (no RECEIPT), the broker stops, and the
    first body, receipted, is there whole after a restart."""
    b = broker_factory(
        extra_toml=STOMP_ACCEPTORS, min_large_message_size=16 * 1024, env={ENV: "tandem-large:sync=ENOSPC@2"}
    )
    b.start()
    sender = RawStomp(b.ports["stomp"])
    frames = []
    try:
        for i in range(2):
            data = _large_body(i)
            head = f"SEND\ndestination:/queue/disk\npersistent:true\nreceipt:r{i}\ncontent-length:{len(data)}\n\n"
            sender.sock.sendall(head.encode() + data + b"\0")
            frames.append(sender.next())
    finally:
        sender.close()
    assert frames[0].command == "RECEIPT" and frames[0].headers["receipt-id"] == "r0", frames[0]
    error = frames[1]
    assert error.command == "ERROR" and "No space left on device" in error.headers["message"], error
    assert b.wait_exit(30) == 3
    log = b.log_text()
    assert log.count("storage failure") == 1 and "Traceback" not in log, log[-3000:]

    b.env.clear()
    b.start()
    left = _large_files(b.data_dir)
    assert len(left) == 1 and left[0].endswith(".msg"), f"a partial file survived the restart: {left}"

    async def drain() -> list[bytes]:
        conn = await aio.connect(b.url)
        try:
            consumer = await (await conn.create_session()).create_consumer("disk")
            out = []
            while (m := await consumer.receive(1.0)) is not None:
                out.append(bytes(m.body))
            return out
        finally:
            await conn.close()

    assert asyncio.run(drain()) == [_large_body(0)]


@pytest.mark.timeout(120)
def test_a_partial_large_file_the_broker_could_not_remove_goes_at_the_next_start(broker_factory: Any) -> None:
    """The write of the fourth large message fails midway and so does the removal of its `.part`
    (`recycle`: removing a large message's file): the partial file stays while the broker is down,
    the next start removes it, and only the whole, confirmed messages are delivered."""
    b = broker_factory(env={ENV: "tandem-large:write=EIO@17,tandem-large:recycle=EIO"})
    b.start()
    sent: dict[int, str] = {}
    told: list[TandemError] = []
    asyncio.run(_send_large(b.url, sent, told))
    _told_of_the_disk(told, "EIO")
    assert b.wait_exit(30) == 3
    left = _large_files(b.data_dir)
    assert len([n for n in left if n.endswith(".part")]) == 1, left
    assert "cannot remove large message file" in b.log_text()

    b.env.clear()
    b.start()
    left = _large_files(b.data_dir)
    assert not [n for n in left if not n.endswith(".msg")], f"a partial file survived the restart: {left}"
    assert "left by a crash" in b.log_text()
    _check_large(asyncio.run(_drain_large(b.url)), sent)


@pytest.mark.timeout(120)
def test_an_acknowledged_large_message_whose_file_stays_is_not_delivered_again(broker_factory: Any) -> None:
    """Removing an acknowledged large message's file fails: the broker goes on (a file no record
    names is harmless; logged), and the next start removes it without delivering it again."""
    b = broker_factory(env={ENV: "tandem-large:recycle=EIO"})
    b.start()
    sent: dict[int, str] = {}
    told: list[TandemError] = []
    asyncio.run(_send_large(b.url, sent, told, sends=2))
    assert sent == {0: "ok", 1: "ok"} and not told
    got = asyncio.run(_drain_large(b.url))
    _check_large(got, sent)
    assert sorted(got) == [0, 1]
    deadline = time.monotonic() + 10
    while "cannot remove large message file" not in b.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.running and len(_large_files(b.data_dir)) == 2, b.log_text()[-3000:]

    b.stop()
    b.env.clear()
    b.start()
    assert _large_files(b.data_dir) == []
    assert asyncio.run(_drain_large(b.url)) == {}
