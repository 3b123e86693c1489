"""A warm shared-store backup takes over with exactly the state a cold load would build.

The review's reproduction, as a user would run it: small journal files, online compaction
under load, the backup started afterwards, more confirmed sends, kill -9 of the primary.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import tandem.aio as aio
from ha_pair import Cluster
from tandem.errors import TandemError


async def _send(url: str, queue: str, prefix: str, n: int) -> None:
    conn = await aio.connect(url)
    prod = (await conn.create_session()).create_producer(queue)
    for i in range(n):
        await prod.send_async(f"{prefix}{i}")
    await prod.flush()  # every send confirmed (durable) before we go on
    await conn.close()


async def _ack_first(url: str, queue: str, n: int) -> None:
    """Receive `n` messages and acknowledge them all with one confirmed cumulative ack."""
    conn = await aio.connect(url)
    consumer = await (await conn.create_session(ack_mode="client")).create_consumer(queue)
    last = None
    for _ in range(n):
        last = await consumer.receive(10)
        assert last is not None
    assert last is not None
    await last.ack()
    await conn.close()


async def _drain(url: str, queue: str) -> list[str]:
    conn = await aio.connect(url)
    consumer = await (await conn.create_session(transacted=True)).create_consumer(queue)
    out: list[str] = []
    while (m := await consumer.receive(1.0)) is not None:
        out.append(m.text)
    await consumer.session.commit()
    await conn.close()
    return out


def _stat(c: Cluster, i: int) -> dict[str, Any]:
    return c.status(i)


def _data_print(store: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "tandem", "data", "print", str(store)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _queue_counts(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    section = False
    for line in text.splitlines():
        if line.startswith("== messages per queue"):
            section = True
        elif section and line.strip():
            name, n = line.split()
            counts[name] = int(n)
    return counts


@pytest.mark.timeout(180)
def test_backup_started_after_compaction_serves_every_confirmed_message(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 1, journal_file_size=65536, journal_compact_percentage=60)
    try:
        c.primary.start()
        c.wait_state(0, "active")
        asyncio.run(_send(c.url_of(0), "first", "a", 3000))
        asyncio.run(_ack_first(c.url_of(0), "first", 2900))
        deadline = time.monotonic() + 30
        while _stat(c, 0)["journal"]["compactions"] == 0:
            assert time.monotonic() < deadline, "no online compaction ran"
            asyncio.run(_send(c.url_of(0), "filler", "f", 50))  # appends let the journal re-check
            asyncio.run(_drain(c.url_of(0), "filler"))
        c.backup.start()
        c.wait_state(1, "passive")
        deadline = time.monotonic() + 30
        while not _stat(c, 1).get("following", {}).get("caught_up"):
            assert time.monotonic() < deadline, "backup never caught up"
            time.sleep(0.05)
        asyncio.run(_send(c.url_of(0), "second", "b", 101))
        time.sleep(0.5)  # let the follower read them (it must be right either way)
        c.primary.kill()
        c.wait_state(1, "active", timeout=20)

        c.backup.kill()  # what the backup served must be what is on disk
        counts = _queue_counts(text := _data_print(c.data))
        assert "CORRUPT" not in text, text
        assert counts.get("first") == 100, text
        assert counts.get("second") == 101, text

        c.backup.start()  # the primary is dead: the backup takes over again, from a cold load
        c.wait_state(1, "active", timeout=20)
        first = asyncio.run(_drain(c.url_of(1), "first"))
        second = asyncio.run(_drain(c.url_of(1), "second"))
        assert sorted(first) == sorted(f"a{i}" for i in range(2900, 3000)), "acked messages came back or some are lost"
        assert sorted(second) == sorted(f"b{i}" for i in range(101)), "confirmed sends lost"
    finally:
        c.kill_all()


async def _load(url: str, confirmed: set[str], acked: set[str], ack_sent: set[str], stop: asyncio.Event) -> None:
    """One producer and one consumer on `work` until `stop` or the connection fails."""

    async def produce() -> None:
        conn = await aio.connect(url, ha=False, reconnect_attempts=0, auto_dedup=False)
        try:
            prod = (await conn.create_session()).create_producer("work", window=32)
            i = 0
            while not stop.is_set():
                name = f"w{i}"
                await prod.send_async(name + "." * 1500, lambda exc, n=name: exc or confirmed.add(n))
                i += 1
                while len(confirmed) - len(acked) > 3000 and not stop.is_set():  # the consumer keeps up:
                    await asyncio.sleep(0.01)  # most of what is written dies, so compaction has work
        except TandemError:
            pass
        finally:
            await _quietly(conn.close())

    async def consume() -> None:
        conn = await aio.connect(url, ha=False, reconnect_attempts=0)
        try:
            consumer = await (await conn.create_session(ack_mode="individual")).create_consumer("work")
            while not stop.is_set():
                m = await consumer.receive(0.2)
                if m is not None and int(m.text[1:8].rstrip(".")) % 3:  # leave every third one queued
                    ack_sent.add(m.text[:8].rstrip("."))
                    await m.ack()
                    acked.add(m.text[:8].rstrip("."))
        except TandemError:
            pass
        finally:
            await _quietly(conn.close())

    await asyncio.gather(produce(), consume())


async def _quietly(aw: Any) -> None:
    try:
        await aw
    except TandemError:
        pass


@pytest.mark.timeout(180)
def test_kill9_during_compaction_under_load_loses_and_resurrects_nothing(tmp_path: Path) -> None:
    """The backup follows while the primary compacts under load; kill -9 mid-load; the backup serves
    every confirmed, unacknowledged message exactly once, no acknowledged one, and disk agrees."""
    c = Cluster(tmp_path, 1, journal_file_size=65536, journal_compact_percentage=60, journal_compact_min_files=4)
    try:
        c.start_all()
        confirmed: set[str] = set()
        acked: set[str] = set()
        ack_sent: set[str] = set()

        async def run() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(_load(c.url_of(0), confirmed, acked, ack_sent, stop))
            deadline = time.monotonic() + 40
            compactions = 0
            while time.monotonic() < deadline:  # until compaction ran a few times while followed
                await asyncio.sleep(0.5)
                compactions = (await asyncio.to_thread(_stat, c, 0))["journal"]["compactions"]
                if compactions >= 3 and len(acked) > 1000:
                    break
            assert compactions >= 3, f"the primary compacted {compactions} times: the test tests nothing"
            await asyncio.to_thread(c.primary.kill)
            stop.set()
            await asyncio.wait_for(task, 30)

        asyncio.run(run())
        c.wait_state(1, "active", timeout=20)
        queued = asyncio.run(_queue_count(c.url_of(1), "work"))
        c.backup.kill()
        text = _data_print(c.data)
        assert "CORRUPT" not in text, text
        assert _queue_counts(text).get("work") == queued, text
        c.backup.start()
        c.wait_state(1, "active", timeout=20)
        present = asyncio.run(_drain(c.url_of(1), "work"))
        names = [p[:8].rstrip(".") for p in present]
        assert len(names) == len(set(names)), "a message was delivered twice"
        assert not set(names) & acked, f"acknowledged messages came back: {sorted(set(names) & acked)[:5]}"
        missing = confirmed - ack_sent - set(names)  # an ack sent but not confirmed may have landed
        assert not missing, f"confirmed messages lost: {sorted(missing)[:10]} ({len(missing)})"
        assert len(names) == queued
        assert len(confirmed) > 2000 and len(acked) > 1000
    finally:
        c.kill_all()


async def _queue_count(url: str, queue: str) -> int:
    conn = await aio.connect(url)
    try:
        return int((await conn.manage("queue.stat", name=queue))[0]["message_count"])
    finally:
        await conn.close()
