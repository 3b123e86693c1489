"""Large messages on a replicated pair: their files travel over the replication stream (and its
initial sync) like journal files, so a backup that takes over after kill -9 of its primary
delivers every confirmed large message whole."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import tandem

CHUNK = 64 * 1024


def body(n: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * (CHUNK // 32)
    return (block * (n // len(block) + 1))[:n]


def test_a_backup_taking_over_delivers_large_messages_synced_and_streamed(pair: Any) -> None:
    """One large message before the backup joins (the initial sync copies its file), one while it
    replicates (the stream carries its chunks): after kill -9 of the primary, the backup delivers
    both whole, and removes each file once it is acknowledged."""
    p = pair()
    p.primary.start()
    p.wait_state(0, "active")
    before, during = body(3 * CHUNK + 11, 1), body(20 * CHUNK + 5, 2)
    opts = f"?min_large_message_size={CHUNK}"
    with tandem.connect(p.url_of(0) + opts) as c, c.session() as s:
        s.create_queue("big")
        s.create_producer("big").send(before)
    p.backup.start()
    p.wait_in_sync()
    with tandem.connect(p.url_of(0) + opts + "&ha=false&reconnect_attempts=0") as c, c.session() as s:
        s.create_producer("big").send(during)  # confirmed: the backup has the file and the record
    p.primary.kill()
    p.wait_state(1, "active", timeout=30)
    large = p.dirs[1] / "large-messages"
    assert len([f for f in large.iterdir() if f.suffix == ".msg"]) == 2
    with tandem.connect(p.url_of(1) + opts + "&ha=false") as c, c.session() as s:
        cons = s.create_consumer("big")
        got = [cons.receive(10), cons.receive(10)]
        assert [m.body if m is not None else None for m in got] == [before, during]
        assert all(m is not None and m.large for m in got)
        assert cons.receive(0.3) is None
    deadline = time.monotonic() + 10
    while list(large.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(large.iterdir()) == []


def test_a_range_read_of_large_messages_cut_by_a_failover_reads_the_same_on_the_backup(pair: Any) -> None:
    """The Spark source's path on a pair: a range reader is in the middle of a large body when the
    primary is killed; it follows the pair to the backup, asks again and gets exactly what a fresh
    read of the primary got (same sequences, delivery counts and bodies), and ACK_UP_TO there
    removes the large files the backup holds."""
    import asyncio

    import tandem.aio as aio

    p = pair()
    p.primary.start()
    p.wait_state(0, "active")
    p.backup.start()
    p.wait_in_sync()
    bodies = [b"small-0", body(8 << 20, 7), b"small-1", body(3 * CHUNK + 5, 8), b"small-2"]
    url = p.url + ("&" if "?" in p.url else "?")

    async def fill() -> None:
        async with await aio.connect(url + f"min_large_message_size={CHUNK}") as c:
            s = await c.create_session()
            await s.create_queue("rq", reader_only=True)
            prod = s.create_producer("rq")
            for b in bodies:
                await prod.send(b)

    async def read(s: Any) -> list[tuple[int, int, str, bool]]:
        r = await s.read_range("rq", 0, 1 << 60, -1)
        return [(m.seq, m.delivery_count, hashlib.sha256(m.body).hexdigest(), m.large) for m in r.messages]

    async def run() -> tuple[list[tuple[int, int, str, bool]], list[tuple[int, int, str, bool]]]:
        await fill()
        async with await aio.connect(url + "retry_interval=100") as c:
            fresh = await read(await c.create_session())
        async with await aio.connect(url + "retry_interval=100&reconnect_attempts=-1") as c:
            s = await c.create_session()
            task = asyncio.create_task(read(s))
            deadline = time.monotonic() + 20
            while not any(r.received for r in s._range_reads.values()):
                assert time.monotonic() < deadline, "no chunk arrived"
                assert not task.done()
                await asyncio.sleep(0.001)
            transport = c._proto.transport  # type: ignore[attr-defined]
            transport.pause_reading()  # the primary's stream stalls at its high-water mark, mid-body
            await asyncio.sleep(0.2)
            assert not task.done()
            p.primary.kill()
            transport.resume_reading()
            again = await asyncio.wait_for(task, 60)
            await s.ack_upto("rq", again[-1][0])
            return fresh, again

    fresh, again = asyncio.run(run())
    assert [d for _, _, d, _ in fresh] == [hashlib.sha256(b).hexdigest() for b in bodies]
    assert again == fresh
    p.wait_state(1, "active", timeout=30)
    large = p.dirs[1] / "large-messages"
    deadline = time.monotonic() + 10
    while [f for f in large.iterdir() if f.suffix == ".msg"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [f for f in large.iterdir() if f.suffix == ".msg"] == []
