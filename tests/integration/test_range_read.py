"""Range reads (read by sequence without consuming, acknowledge up to a sequence), as the
Spark source uses them, against real broker processes: order, limits, expiry, durability
of sequences and acks across a kill -9, and that nothing is read before it is on disk."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat as _stat


async def _fill(url: str, queue: str, bodies: list[str], **fields: Any) -> None:
    conn = await aio.connect(url)
    try:
        s = await conn.create_session()
        await s.create_queue(queue, reader_only=True, exists_ok=True)
        prod = s.create_producer(queue)
        for b in bodies:
            await prod.send(b, **fields)
    finally:
        await conn.close()


async def _read(url: str, queue: str, start: int, end: int, limit: int = -1) -> Any:
    conn = await aio.connect(url)
    try:
        return await (await conn.create_session()).read_range(queue, start, end, limit)
    finally:
        await conn.close()


def test_reads_in_order_within_the_range_and_limit_without_consuming(broker: BrokerProcess) -> None:
    asyncio.run(_fill(broker.url, "rr", [f"m{i}" for i in range(10)]))
    r = asyncio.run(_read(broker.url, "rr", 0, 10))
    assert [m.body for m in r.messages] == [f"m{i}".encode() for i in range(10)]
    seqs = [m.seq for m in r.messages]
    assert seqs == sorted(seqs) and len(set(seqs)) == 10
    assert (r.first_seq, r.last_seq) == (seqs[0], seqs[-1])
    assert all(m.delivery_count == 1 for m in r.messages)

    part = asyncio.run(_read(broker.url, "rr", seqs[2], seqs[7]))
    assert [m.seq for m in part.messages] == seqs[3:8]  # (start, end]
    limited = asyncio.run(_read(broker.url, "rr", seqs[2], seqs[9], limit=3))
    assert [m.seq for m in limited.messages] == seqs[3:6]
    assert asyncio.run(_read(broker.url, "rr", seqs[9], seqs[9] + 100)).messages == []
    assert asyncio.run(_stat(broker.url, "rr"))["message_count"] == 10  # nothing consumed


def test_expired_messages_are_skipped(broker: BrokerProcess) -> None:
    asyncio.run(_fill(broker.url, "rx", ["keep-1"]))
    asyncio.run(_fill(broker.url, "rx", ["gone"], ttl=50))
    asyncio.run(_fill(broker.url, "rx", ["keep-2"]))
    asyncio.run(asyncio.sleep(0.3))
    r = asyncio.run(_read(broker.url, "rx", 0, 1_000_000))
    assert [m.body for m in r.messages] == [b"keep-1", b"keep-2"]


def test_ack_upto_and_sequences_survive_a_kill(broker_factory: Any) -> None:
    b = broker_factory().start()
    asyncio.run(_fill(b.url, "ra", [f"m{i}" for i in range(6)]))
    before = asyncio.run(_read(b.url, "ra", 0, 1_000_000)).messages
    seqs = [m.seq for m in before]

    async def ack(url: str, upto: int) -> int:
        conn = await aio.connect(url)
        try:
            return await (await conn.create_session()).ack_upto("ra", upto)
        finally:
            await conn.close()

    assert asyncio.run(ack(b.url, seqs[2])) == 3
    assert asyncio.run(ack(b.url, seqs[2])) == 0  # idempotent: a replayed commit acks nothing
    b.kill()  # the ack was confirmed, so it is on disk
    b.start()
    after = asyncio.run(_read(b.url, "ra", 0, 1_000_000))
    assert [(m.seq, m.body) for m in after.messages] == [(m.seq, m.body) for m in before[3:]]
    assert after.first_seq == seqs[3]
    asyncio.run(_fill(b.url, "ra", ["new"]))
    newest = asyncio.run(_read(b.url, "ra", seqs[-1], 1_000_000)).messages
    assert [m.body for m in newest] == [b"new"] and newest[0].seq > seqs[-1]  # never a reused number


def test_nothing_is_read_before_it_is_on_disk(broker_factory: Any) -> None:
    """A reader keeping offsets must not see a message a crash could take back: the range
    result waits for the fsync of everything routed before it (here a 300 ms group commit)."""
    b = broker_factory(journal_buffer_timeout=300_000_000).start()
    asyncio.run(_fill(b.url, "rd", ["first"]))

    async def main() -> None:
        conn = await aio.connect(b.url)
        try:
            s = await conn.create_session()
            confirmed = s.create_producer("rd").send_nowait("second")
            assert confirmed is not None
            r = await s.read_range("rd", 0, 1_000_000)
            assert [m.body for m in r.messages] == [b"first", b"second"]
            assert confirmed.done(), "the range result left before the message it holds was fsync'd"
        finally:
            await conn.close()

    asyncio.run(main())


def test_a_reader_only_queue_refuses_ordinary_consumers(broker: BrokerProcess) -> None:
    asyncio.run(_fill(broker.url, "ro", ["x"]))

    async def consume() -> None:
        conn = await aio.connect(broker.url)
        try:
            await (await conn.create_session()).create_consumer("ro")
        finally:
            await conn.close()

    with pytest.raises(tandem.TandemError) as info:
        asyncio.run(consume())
    assert "reader-only" in str(info.value)
    assert len(asyncio.run(_read(broker.url, "ro", 0, 100)).messages) == 1
