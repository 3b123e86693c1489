"""Browsers and range readers over paged messages, against real broker processes: they see a
queue's messages in order across memory and page files, without consuming them and without
reading the pages back into the queue."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from test_paging import PAGED, _numbers, receive

import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat

N = 6_000


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def send_numbered(url: str, address: str, n: int, body: str = "b" * 300) -> None:
    """`m0000000` .. confirmed, with an `odd` property (a selector browses half of them)."""
    conn = await aio.connect(url)
    try:
        prod = (await conn.create_session()).create_producer(address)
        for i in range(n):
            await prod.send_async(f"m{i:07d}{body}", properties={"odd": i % 2 == 1})
        await prod.flush()
    finally:
        await conn.close()


async def browse(url: str, queue: str, filter: str | None = None, wait: float = 3.0) -> list[str]:
    conn = await aio.connect(url)
    out: list[str] = []
    try:
        session = await conn.create_session()
        browser = await session.create_browser(queue, filter=filter)
        for _ in range(10 * N):
            m = await browser.receive(wait)
            if m is None:
                break
            out.append(m.text)
        await browser.close()
    finally:
        await conn.close()
    return out


def test_a_browser_sees_paged_messages_in_order_and_consumes_nothing(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    run(send_numbered(b.url, "paged.browse", N))
    stat = run(queue_stat(b.url, "paged.browse"))
    assert stat["paged_count"] > N // 2  # most of them are in pages
    assert _numbers(run(browse(b.url, "paged.browse"))) == list(range(N))
    assert _numbers(run(browse(b.url, "paged.browse", filter="odd = TRUE"))) == list(range(1, N, 2))
    after = run(queue_stat(b.url, "paged.browse"))
    assert after["message_count"] == N
    assert after["paged_count"] == stat["paged_count"]  # browsing read nothing back into the queue
    assert _numbers(run(receive(b.url, "paged.browse", N + 1, wait=3.0))) == list(range(N))


def test_a_browser_started_while_a_consumer_depages_sees_each_message_once(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    run(send_numbered(b.url, "paged.both", N))

    async def both() -> tuple[list[str], list[str]]:
        conn = await aio.connect(b.url)
        try:
            session = await conn.create_session()
            browser = await session.create_browser("paged.both", window=4096)
            consumer = await session.create_consumer("paged.both")
            seen: list[str] = []
            got: list[str] = []
            for _ in range(4 * N):
                if len(seen) < N:
                    m = await browser.receive(3)
                    if m is not None:
                        seen.append(m.text)
                if len(got) < N:
                    c = await consumer.receive(3)
                    if c is not None:
                        got.append(c.text)
                if len(seen) >= N and len(got) >= N:
                    break
            extra = await browser.receive(0.5)
            assert extra is None, extra.text
            return seen, got
        finally:
            await conn.close()

    seen, got = run(both())
    assert _numbers(got) == list(range(N))
    assert _numbers(seen) == list(range(N))


# ----------------------------------------------------------------------------- range readers
async def fill_reader_queue(url: str, queue: str, address: str, start: int, n: int) -> None:
    """A reader-only queue (the Spark source's) and a plain one on a multicast address, then
    `m<start>` .. sent to it, confirmed."""
    conn = await aio.connect(url)
    try:
        s = await conn.create_session()
        await s.create_queue(queue, address, "multicast", reader_only=True, exists_ok=True)
        await s.create_queue(queue + ".plain", address, "multicast", exists_ok=True)
        prod = s.create_producer(address)
        for i in range(start, start + n):
            await prod.send_async(f"m{i:07d}" + "r" * 300, properties={"i": i})
        await prod.flush()
    finally:
        await conn.close()


async def read_all(url: str, queue: str, start: int, chunk: int) -> tuple[int, int, list[tuple[int, str]]]:
    """Every message after `start`, read in chunks as the Spark source does: (first, last, [(seq, text)])."""
    conn = await aio.connect(url)
    try:
        s = await conn.create_session()
        first, last = await s.queue_offsets(queue)
        out: list[tuple[int, str]] = []
        lo = start
        for _ in range(10 * N):
            r = await s.read_range(queue, lo, last, chunk)
            if not r.messages:
                break
            out.extend((m.seq, m.text) for m in r.messages)
            lo = r.messages[-1].seq
        return first, last, out
    finally:
        await conn.close()


async def ack_upto(url: str, queue: str, seq: int) -> int:
    conn = await aio.connect(url)
    try:
        return await (await conn.create_session()).ack_upto(queue, seq)
    finally:
        await conn.close()


def test_range_reads_of_a_paged_queue_equal_those_of_an_unpaged_one(broker_factory: Any) -> None:
    paged: BrokerProcess = broker_factory("paged", address_settings=PAGED).start()
    plain: BrokerProcess = broker_factory("plain").start()
    for b in (paged, plain):
        run(fill_reader_queue(b.url, "paged.rq", "paged.rr", 0, N))
    assert run(queue_stat(paged.url, "paged.rq"))["paged_count"] > N // 2
    assert run(queue_stat(plain.url, "paged.rq"))["paged_count"] == 0
    a = run(read_all(paged.url, "paged.rq", 0, 700))
    assert a == run(read_all(plain.url, "paged.rq", 0, 700))
    assert _numbers([t for _s, t in a[2]]) == list(range(N))
    seqs = [s for s, _t in a[2]]
    # A range in the middle, a limit, and an empty range read the same on both.
    for start, end, limit in ((seqs[1000], seqs[4000], 50), (seqs[2500], seqs[2600], -1), (seqs[-1], seqs[-1] + 9, -1)):

        async def one(url: str, start: int = start, end: int = end, limit: int = limit) -> list[tuple[int, str]]:
            conn = await aio.connect(url)
            try:
                r = await (await conn.create_session()).read_range("paged.rq", start, end, limit)
                return [(m.seq, m.text) for m in r.messages]
            finally:
                await conn.close()

        assert run(one(paged.url)) == run(one(plain.url))
    # Acknowledged up to a sequence in the pages: the same count, the same rest, on both.
    cut = seqs[N // 2]
    assert run(ack_upto(paged.url, "paged.rq", cut)) == run(ack_upto(plain.url, "paged.rq", cut)) == N // 2 + 1
    rest = run(read_all(paged.url, "paged.rq", 0, 1000))
    assert rest == run(read_all(plain.url, "paged.rq", 0, 1000))
    assert rest[0] == cut + 1 and [s for s, _t in rest[2]] == seqs[N // 2 + 1 :]
    # New sends while the address still pages follow the paged ones on both.
    for b in (paged, plain):
        run(fill_reader_queue(b.url, "paged.rq", "paged.rr", N, 100))
    more = run(read_all(paged.url, "paged.rq", 0, 1000))
    assert more == run(read_all(plain.url, "paged.rq", 0, 1000))
    assert _numbers([t for _s, t in more[2]]) == list(range(N // 2 + 1, N + 100))
    # Everything acknowledged (and the plain queue drained): the address stops paging, its pages go.
    assert run(ack_upto(paged.url, "paged.rq", more[1])) == N // 2 + 99
    assert len(run(receive(paged.url, "paged.rq.plain", 2 * N, wait=3.0))) == N + 100
    stat = run(queue_stat(paged.url, "paged.rq"))
    assert (stat["message_count"], stat["paged_count"]) == (0, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p.endswith(".page") for p in os.listdir(paged.data_dir / "paging")):
        time.sleep(0.1)
    assert not [p for p in os.listdir(paged.data_dir / "paging") if p.endswith(".page")]


def test_kill_during_paged_range_reads_loses_nothing_and_serves_no_acked_range_again(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    run(fill_reader_queue(b.url, "paged.rk", "paged.rka", 0, N))
    assert run(queue_stat(b.url, "paged.rk"))["paged_count"] > N // 2
    acked_upto = 0
    read: list[tuple[int, str]] = []

    async def read_and_ack_until_killed() -> None:
        nonlocal acked_upto
        conn = await aio.connect(b.url, reconnect_attempts=0)
        try:
            s = await conn.create_session()
            _first, last = await s.queue_offsets("paged.rk")
            lo = 0
            for _ in range(N):
                r = await s.read_range("paged.rk", lo, last, 400)
                if not r.messages:
                    return
                read.extend((m.seq, m.text) for m in r.messages)
                lo = r.messages[-1].seq
                await s.ack_upto("paged.rk", lo)  # returned: durable
                acked_upto = lo
                if len(read) >= N // 2:
                    assert b.proc is not None
                    os.kill(b.proc.pid, signal.SIGKILL)
        except Exception:
            return
        finally:
            try:
                await conn.close()
            except Exception:
                pass

    run(read_and_ack_until_killed())
    b.wait_exit(10)
    assert acked_upto > 0
    b.start()
    first, _last, rest = run(read_all(b.url, "paged.rk", 0, 1000))
    assert first > acked_upto  # an acknowledged range is never served again
    served = [s for s, _t in read if s <= acked_upto]
    assert not {s for s, _t in rest} & set(served)
    got = [t for s, t in read if s <= acked_upto] + [t for _s, t in rest]
    assert _numbers(got) == list(range(N))  # nothing lost, in order


def test_acknowledging_a_paged_range_deletes_the_pages_behind_it(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()

    async def fill_alone() -> None:
        conn = await aio.connect(b.url)
        try:
            s = await conn.create_session()
            await s.create_queue("paged.alone", reader_only=True)
            prod = s.create_producer("paged.alone")
            for i in range(N):
                await prod.send_async(f"m{i:07d}" + "a" * 1000)
            await prod.flush()
        finally:
            await conn.close()

    def pages() -> list[str]:
        return sorted(p for p in os.listdir(b.data_dir / "paging") if p.endswith(".page"))

    run(fill_alone())
    before = pages()
    assert len(before) >= 4
    _first, last, got = run(read_all(b.url, "paged.alone", 0, 2000))
    assert _numbers([t for _s, t in got]) == list(range(N))
    half = got[N // 2][0]
    assert run(ack_upto(b.url, "paged.alone", half)) == N // 2 + 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(pages()) > len(before) // 2 + 1:
        time.sleep(0.1)
    left = pages()
    assert len(left) <= len(before) // 2 + 1 and left[-1] == before[-1]  # the first half's pages went
    assert b.stop() == 0
    b.start()
    first, last2, rest = run(read_all(b.url, "paged.alone", 0, 2000))
    # (a restart resumes sequences after the reserved block, paged or not: last only grows)
    assert first == half + 1 and last2 >= last
    assert [s for s, _t in rest] == [s for s, _t in got[N // 2 + 1 :]]


def test_a_range_reader_sees_a_transaction_paged_while_open_at_its_commit_sequences(broker_factory: Any) -> None:
    """A transaction paged while it was open numbers its records 1, 2, ... per queue; its commit
    takes the real sequences. Range reads (and browsers) gave the raw numbers: sequences that went
    back to 1 and repeated, so a reader keeping offsets (Spark) would acknowledge past messages
    it never read. Found by the paging model test after decisions 0054 and 0055 met."""
    settings = {"paged.#": {"max-size-bytes": 64 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 64 * 1024}}
    b: BrokerProcess = broker_factory(address_settings=settings).start()
    run(fill_reader_queue(b.url, "paged.tq", "paged.tx", 0, 400))  # the address pages

    async def scenario() -> None:
        conn = await aio.connect(b.url)
        try:
            tx = await conn.create_session(transacted=True)
            prod = tx.create_producer("paged.tx")
            for i in range(400, 1000):  # more than the limit: paged as it arrives
                await prod.send_async(f"m{i:07d}" + "t" * 300)
            await prod.flush()
            other = (await conn.create_session()).create_producer("paged.tx")
            for i in range(1000, 1100):  # sent and confirmed while the transaction is open
                await other.send_async(f"m{i:07d}" + "o" * 300)
            await other.flush()
            await tx.commit()
        finally:
            await conn.close()

    run(scenario())
    _first, _last, got = run(read_all(b.url, "paged.tq", 0, 150))
    seqs = [seq for seq, _ in got]
    assert seqs == sorted(set(seqs)), "range read sequences repeat or go back"
    numbers = [int(text[1:8]) for _, text in got]
    assert numbers == [*range(400), *range(1000, 1100), *range(400, 1000)]  # the commit's place
    assert seqs == list(range(1, 1101))
