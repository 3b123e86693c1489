"""Range reads (READ_RANGE / ACK_UP_TO, the Spark source's path) over large messages, against real
broker processes: a large message's body follows its RANGE_RESULT as DELIVER_CHUNKs, and the
reader gets it whole, in order with the small messages around it, across a kill -9 and a
reconnection (a range read has no side effect, so it is simply asked again)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat
from tandem.testing import FaultProxy, free_port
from tandem.testing.procs import memory
from tandem.testing.streams import GeneratedBody

Factory = Callable[..., BrokerProcess]
CHUNK = 64 * 1024  # the producers' min_large_message_size here
QUEUE = "rl"
FAST = {"retry_interval": 100, "client_failure_check_period": 2000}


def body(n: int, seed: int) -> bytes:
    """`n` bytes that differ from chunk to chunk (a shifted, repeated or lost chunk shows)."""
    block = hashlib.sha256(str(seed).encode()).digest() * 256  # 8 KiB
    out = bytearray()
    i = 0
    while len(out) < n:
        out += i.to_bytes(8, "little") + block
        i += 1
    return bytes(out[:n])


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files(b: BrokerProcess) -> list[str]:
    d = b.data_dir / "large-messages"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# Small, large, compressed large, and bodies whose sum passes what one RANGE_RESULT carries.
BODIES = [
    b"small-0",
    body(5 * CHUNK + 7, seed=1),
    b"small-1",
    body(3 << 20, seed=2),
    body(3 << 20, seed=3),
    b"small-2",
    body(4 << 20, seed=4),
    body(CHUNK + 1, seed=5),
    b"small-3",
]
COMPRESSED = 7  # this one is sent by a producer that zlib-compresses large bodies


def fill(url: str, queue: str = QUEUE, bodies: list[bytes] = BODIES) -> None:
    async def go() -> None:
        async with await aio.connect(url, min_large_message_size=CHUNK) as plain:
            async with await aio.connect(url, min_large_message_size=CHUNK, compress_large_messages=True) as zipped:
                s = await plain.create_session()
                await s.create_queue(queue, reader_only=True, exists_ok=True)
                prods = [s.create_producer(queue), (await zipped.create_session()).create_producer(queue)]
                for i, b in enumerate(bodies):
                    await prods[i == COMPRESSED].send(b)

    asyncio.run(go())


async def read_all(session: Any, queue: str = QUEUE, step: int = -1) -> list[tuple[int, int, str, bool]]:
    """(seq, delivery count, body digest, large) of everything in `queue`, `step` messages a call."""
    out: list[tuple[int, int, str, bool]] = []
    start = 0
    for _ in range(1000):
        r = await session.read_range(queue, start, 1 << 60, step)
        if not r.messages:
            return out
        out += [(m.seq, m.delivery_count, digest(m.body), m.large) for m in r.messages]
        start = r.messages[-1].seq
        if step < 0:
            return out
    raise AssertionError("the range never ended")


def read_fresh(url: str, step: int = -1) -> list[tuple[int, int, str, bool]]:
    async def go() -> list[tuple[int, int, str, bool]]:
        async with await aio.connect(url) as conn:
            return await read_all(await conn.create_session(), step=step)

    return asyncio.run(go())


def expected(seqs: list[int]) -> list[tuple[int, int, str, bool]]:
    return [(s, 1, digest(b), len(b) > CHUNK) for s, b in zip(seqs, BODIES, strict=True)]


def test_small_and_large_messages_come_in_order_with_exact_bodies(broker: BrokerProcess) -> None:
    fill(broker.url)
    stored = files(broker)
    assert len(stored) == 5  # the large ones are files, as for a consumer
    whole = read_fresh(broker.url)
    seqs = [s for s, *_ in whole]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(BODIES)
    assert whole == expected(seqs)
    assert read_fresh(broker.url, step=1) == whole  # one at a time: the same offsets, the same bytes
    assert read_fresh(broker.url, step=2) == whole

    async def records_and_offsets() -> tuple[Any, ...]:
        async with await aio.connect(broker.url) as conn:
            s = await conn.create_session()
            got = []
            start = 0
            for _ in range(20):  # the bulk form may stop early after large bodies: ask again from the last
                _f, _l, recs = await s.read_range_records(QUEUE, start, seqs[-1])
                if not recs:
                    break
                got += [(seq, digest(d.body)) for seq, _mid, _dc, d, _n in recs]
                start = recs[-1][0]
            return got, await s.queue_offsets(QUEUE)

    recs, offsets = asyncio.run(records_and_offsets())
    assert recs == [(s, d) for s, _, d, _ in whole]
    assert offsets == (seqs[0], seqs[-1])
    assert asyncio.run(queue_stat(broker.url, QUEUE))["message_count"] == len(BODIES)  # nothing consumed
    assert files(broker) == stored


def test_ack_upto_past_a_large_message_removes_its_file(broker: BrokerProcess) -> None:
    fill(broker.url)
    seqs = [s for s, *_ in read_fresh(broker.url)]
    assert len(files(broker)) == 5

    async def ack(upto: int) -> int:
        async with await aio.connect(broker.url) as conn:
            return await (await conn.create_session()).ack_upto(QUEUE, upto)

    assert asyncio.run(ack(seqs[2])) == 3  # small, large, small
    assert wait_for(lambda: len(files(broker)) == 4), files(broker)
    assert read_fresh(broker.url) == expected(seqs)[3:]
    assert asyncio.run(ack(seqs[-1])) == len(BODIES) - 3
    assert wait_for(lambda: files(broker) == []), files(broker)
    assert read_fresh(broker.url) == []


def fixed_port_broker(broker_factory: Factory) -> BrokerProcess:
    port = free_port()
    return broker_factory(extra_toml=f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:{port}"\n').start()


def test_kill_mid_read_of_a_large_message_then_restart_reads_the_same(broker_factory: Factory) -> None:
    """The broker dies while a large body streams out to a range reader: the reader never hands
    over the part it had; it asks again after the restart and gets what a fresh read gets."""
    broker = fixed_port_broker(broker_factory)
    big = body(16 << 20, seed=9)  # more than the socket buffers hold
    fill(broker.url, bodies=[b"before", big, b"after"])
    before = read_fresh(broker.url)
    assert [d for _, _, d, _ in before] == [digest(b"before"), digest(big), digest(b"after")]

    async def run() -> list[tuple[int, int, str, bool]]:
        async with await aio.connect(broker.url, reconnect_attempts=-1, **FAST) as conn:
            s = await conn.create_session()
            task = asyncio.create_task(read_all(s))
            deadline = time.monotonic() + 20
            while not any(r.received for r in s._range_reads.values()):
                assert time.monotonic() < deadline, "no chunk arrived"
                assert not task.done()
                await asyncio.sleep(0.001)
            transport = conn._proto.transport  # type: ignore[union-attr]
            transport.pause_reading()  # the broker's stream stalls at its high-water mark
            await asyncio.sleep(0.2)
            assert not task.done()  # part of the body is here: nothing handed over
            broker.kill()
            transport.resume_reading()
            await asyncio.to_thread(broker.start)
            return await asyncio.wait_for(task, 30)

    assert asyncio.run(run()) == before
    assert read_fresh(broker.url) == before
    assert asyncio.run(queue_stat(broker.url, QUEUE))["message_count"] == 3


@pytest.mark.parametrize("window", [-1, 1 << 20], ids=["reconnect", "reattach"])
def test_a_connection_lost_mid_read_reads_it_again_identically(broker_factory: Factory, window: int) -> None:
    """The link breaks (a reset of both sides) while a range read's large bodies stream, the
    broker's stream stalled half way: the client reconnects, or reattaches to its session (a
    range read's body in transfer does not prevent it), and asks again: the same messages,
    offsets and bytes as a read that nothing interrupted."""
    port = free_port()
    broker = broker_factory(
        connector_ref="via-proxy", extra_toml=f'[[connectors]]\nname = "via-proxy"\nurl = "127.0.0.1:{port}"\n'
    ).start()
    # A body larger than every buffer on the way (client, proxy, broker) holds: its stream stalls.
    fill(broker.url, bodies=[b"before", body(48 << 20, seed=10), b"after", body(CHUNK + 3, seed=11)])
    before = read_fresh(broker.url)

    async def run() -> list[tuple[int, int, str, bool]]:
        with FaultProxy(broker.port, port=port) as proxy:
            async with await aio.connect(
                proxy.url, reconnect_attempts=-1, confirmation_window_size=window, **FAST
            ) as conn:
                events: list[aio.FailureEvent] = []
                conn.add_failure_listener(lambda kind, cause: events.append(kind))
                s = await conn.create_session()
                task = asyncio.create_task(read_all(s))
                deadline = time.monotonic() + 20
                while not any(r.received for r in s._range_reads.values()):
                    assert time.monotonic() < deadline, "no chunk arrived"
                    assert not task.done()
                    await asyncio.sleep(0.001)
                transport = conn._proto.transport  # type: ignore[union-attr]
                transport.pause_reading()  # the broker's stream stalls at its high-water mark
                await asyncio.sleep(0.3)
                assert not task.done()
                assert proxy.reset() == 1
                transport.resume_reading()
                got = await asyncio.wait_for(task, 30)
                assert proxy.stats().connections == 2  # it did go again, once
                assert events == [aio.FailureEvent.REATTACHED if window > 0 else aio.FailureEvent.RECONNECTED]
                return got

    assert asyncio.run(run()) == before
    assert read_fresh(broker.url) == before


def test_an_ack_upto_during_the_read_of_a_large_body_waits_for_its_last_chunk(broker: BrokerProcess) -> None:
    """ACK_UP_TO covers a message whose body is streaming to a range reader: the reader still
    gets it whole (the file is read to its end), and the file goes once the last chunk is out."""
    big = body(16 << 20, seed=11)
    fill(broker.url, bodies=[big, b"after"])
    assert len(files(broker)) == 1

    async def run() -> list[tuple[int, int, str, bool]]:
        async with await aio.connect(broker.url) as conn, await aio.connect(broker.url) as other:
            s = await conn.create_session()
            task = asyncio.create_task(read_all(s))
            deadline = time.monotonic() + 20
            while not any(r.received for r in s._range_reads.values()):
                assert time.monotonic() < deadline, "no chunk arrived"
                await asyncio.sleep(0.001)
            transport = conn._proto.transport  # type: ignore[union-attr]
            transport.pause_reading()  # the body stalls half way
            acked = await (await other.create_session()).ack_upto(QUEUE, 1 << 60)
            assert acked == 2
            await asyncio.sleep(0.3)
            assert len(files(broker)) == 1, "the file went while its body was being read"
            transport.resume_reading()
            return await asyncio.wait_for(task, 30)

    got = asyncio.run(run())
    # The answer stopped after the 16 MiB body (`more`); the next one came after the ack: empty.
    assert [(d, large) for _, _, d, large in got] == [(digest(big), True)]
    assert wait_for(lambda: files(broker) == []), files(broker)
    assert read_fresh(broker.url) == []


BIG = int(os.environ.get("TANDEM_LARGE_TEST_MIB", "128")) << 20


def test_a_range_read_of_a_message_far_larger_than_the_broker_memory_growth_allows(broker: BrokerProcess) -> None:
    """A BIG-byte message read by a range reader: the broker's peak RSS (VmHWM of the real
    process) grows by far less than the message (read from its file a chunk at a time, paced
    by the socket), and the reader's body, spooled to a file, is intact."""
    assert broker.proc is not None
    pid = broker.proc.pid
    src = GeneratedBody(BIG)

    async def run() -> tuple[int, str]:
        async with await aio.connect(broker.url, min_large_message_size=256 * 1024) as conn:
            s = await conn.create_session()
            await s.create_queue(QUEUE, reader_only=True)
            base = memory(pid, "VmRSS")
            await s.create_producer(QUEUE).send_stream(src, size=BIG)
            r = await s.read_range(QUEUE, 0, 1 << 60)
            (m,) = r.messages
            assert m.large
            h = hashlib.sha256()
            stream = m.body_stream()
            while block := stream.read(1 << 20):
                h.update(block)
            return memory(pid, "VmHWM") - base, h.hexdigest()

    growth, got = asyncio.run(run())
    assert got == src.digest.hexdigest()
    # (measured: about 4 MiB for 128 MiB; a body held whole would add at least its own size)
    assert growth < 32 << 20, f"broker peak RSS grew by {growth >> 20} MiB for a {BIG >> 20} MiB message"
