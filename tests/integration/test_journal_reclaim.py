"""A drained queue gives its journal back, although every send left a dedup id behind.

The client gives every durable send a dedup id, journaled with the message; the id stays live
while the address's id cache remembers it (20,000 by default), long after the message was
acknowledged. Reclaim and compaction judge files by live bytes, so those small records are
copied forward and the files they sat in are freed.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import msgspec

import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat

FILE_SIZE = 64 * 1024
MESSAGES = 3000
QUEUE = "drain"


def journal_files(b: BrokerProcess) -> tuple[list[Path], list[Path]]:
    """The message journal's data files and pooled files."""
    d = b.data_dir / "journal"
    files = sorted(d.glob("tandem-data-*.tj"))
    free = [p for p in files if "-free-" in p.name]
    return [p for p in files if p not in free], free


async def send_all(url: str) -> None:
    conn = await aio.connect(url)
    try:
        session = await conn.create_session()
        producer = session.create_producer(QUEUE)
        body = b"m" * 1024
        sends = [await producer.send_async(body) for _ in range(MESSAGES)]
        await asyncio.wait_for(asyncio.gather(*(f for f in sends if f is not None)), 60)  # confirmed: on disk
    finally:
        await conn.close()


async def drain(url: str) -> list[str]:
    """Receive every message, then acknowledge them all (cumulatively; awaited: on disk)."""
    conn = await aio.connect(url)
    ids: list[str] = []
    try:
        session = await conn.create_session(ack_mode="client")
        consumer = await session.create_consumer(QUEUE)
        while len(ids) < MESSAGES:
            msg = await consumer.receive(10)
            assert msg is not None, f"only {len(ids)} of {MESSAGES} messages came"
            assert msg.dedup_id is not None, "the client gives every durable send a dedup id"
            ids.append(msg.dedup_id)
        await asyncio.wait_for(msg.ack(), 10)
        assert await consumer.receive(0.2) is None
    finally:
        await conn.close()
    return ids


async def status(url: str) -> dict[str, Any]:
    conn = await aio.connect(url)
    try:
        return await conn.manage("broker.status")  # type: ignore[no-any-return]
    finally:
        await conn.close()


async def send_with(url: str, dedup_id: str, text: str) -> None:
    conn = await aio.connect(url)
    try:
        session = await conn.create_session()
        await session.create_producer(QUEUE).send(text, dedup_id=dedup_id)
    finally:
        await conn.close()


def test_drained_queue_shrinks_the_journal_and_its_dedup_ids_survive(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(
        journal_file_size=FILE_SIZE,
        journal_min_files=2,
        journal_pool_files=2,
        journal_compact_min_files=2,
        journal_compact_percentage=30,
    ).start()
    asyncio.run(send_all(b.url))
    grown = len(journal_files(b)[0])
    assert grown >= 40, grown  # 3 MiB of messages in 64 KiB files

    ids = asyncio.run(drain(b.url))
    assert len(set(ids)) == MESSAGES

    # The dedup ids stay live (the cache holds 20,000). Each is a DUPLICATE_ID record, a 26-byte
    # header and a msgpack body [address, dedup id] (docs/storage.md), and that is all that is live
    # now: the journal shrinks to the files they need (in each file 58 bytes go to its header and
    # end marker, and a record that does not fit leaves a gap) or journal-min-files, and its pool
    # to journal-pool-files.
    live = sum(26 + len(msgspec.msgpack.encode([QUEUE, dedup_id])) for dedup_id in ids)
    need = math.ceil(live / (FILE_SIZE - 58 - 100))
    assert need <= 5
    deadline = time.monotonic() + 30
    while True:
        data, free = journal_files(b)
        st = asyncio.run(status(b.url))["journal"]
        if len(data) <= max(2, need) and len(free) <= 2 and st["compactions"] >= 1:
            break  # (the files go before the broker counts the compaction: wait for both)
        assert time.monotonic() < deadline, (
            f"the journal kept {len(data)} data files (+{len(free)} pooled) of {grown}; the {MESSAGES} "
            f"live dedup ids need {need}; {st['compactions']} compactions"
        )
        time.sleep(0.1)
    assert st["live_ids"] == MESSAGES
    assert st["live_bytes"] == st["used_bytes"] == live, "compacted: every byte is a dedup id's"

    # kill -9, restart: the dedup ids came through compaction and the restart
    b.kill()
    b.start()
    for dedup_id in (ids[-1], ids[0]):
        asyncio.run(send_with(b.url, dedup_id, "duplicate"))
    assert asyncio.run(queue_stat(b.url, QUEUE))["message_count"] == 0, "a duplicate was accepted after the restart"
    asyncio.run(send_with(b.url, "fresh-id", "new"))
    assert asyncio.run(queue_stat(b.url, QUEUE))["message_count"] == 1
