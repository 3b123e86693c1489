"""Acknowledging messages read back from pages, out of order, then kill -9 (decision 0063): a
message read back stays a page record and its acknowledgement is a PAGE_ACK record, so what was
acknowledged must never come back and everything else must, in order."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from typing import Any

import pytest
from test_paging import PAGED, _numbers, receive, run, send_range

import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat

N = 12_000
SKIP = 6_000  # consumed in order first: what follows was paged, read back when consumed
WINDOW = 300


async def ack_out_of_order(conn: Any, queue: str, transacted: bool) -> tuple[list[int], list[int]]:
    """Consume SKIP messages in order, then take WINDOW more and acknowledge two in three of them
    in a shuffled order, each waited for (or: hold some, commit the next in a transaction);
    returns (acknowledged, held unacknowledged) numbers. The caller kills the broker under the connection."""
    session = await conn.create_session(ack_mode="individual")
    consumer = await session.create_consumer(queue)
    acked: list[int] = []
    for _ in range(SKIP):
        m = await consumer.receive(10)
        assert m is not None
        await m.ack()
        acked.append(_numbers([m.text])[0])
    if transacted:
        # Out of order through a transaction: this session holds the first messages unacknowledged
        # while a transacted one takes the next and commits (a commit acknowledges all it received).
        first = [await consumer.receive(10) for _ in range(WINDOW // 3)]
        assert all(m is not None for m in first)
        tsession = await conn.create_session(transacted=True)
        tconsumer = await tsession.create_consumer(queue)
        taken = []
        for _ in range(WINDOW):
            m = await tconsumer.receive(10)
            assert m is not None
            m.ack()
            taken.append(m)
        await tsession.commit()
        acked += _numbers([m.text for m in taken])
        return acked, sorted(_numbers([m.text for m in first if m is not None]))
    window = []
    for _ in range(WINDOW):
        m = await consumer.receive(10)
        assert m is not None
        window.append(m)
    rng = random.Random(7)
    chosen = [m for i, m in enumerate(window) if i % 3 != 1]
    rng.shuffle(chosen)
    for m in chosen:
        await m.ack()  # waits for the broker: acknowledged means journaled
    acked += _numbers([m.text for m in chosen])
    held = sorted(set(_numbers([m.text for m in window])) - set(acked))
    return acked, held


async def _close(conn: Any) -> None:
    try:
        await conn.close()
    except Exception:
        pass  # (its broker was killed)


@pytest.mark.parametrize("transacted", [False, True], ids=["one-by-one", "transaction"])
def test_out_of_order_acks_of_depaged_messages_survive_kill_9(broker_factory: Any, transacted: bool) -> None:
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    run(send_range(b.url, "paged.o", 0, N, body="y" * 200))
    stat = run(queue_stat(b.url, "paged.o"))
    assert stat["paged_count"] > N - SKIP, stat  # (the acknowledged window is read back from pages)

    async def then_kill() -> tuple[list[int], list[int]]:
        conn = await aio.connect(b.url, reconnect_attempts=0)
        try:
            out = await ack_out_of_order(conn, "paged.o", transacted)
            assert b.proc is not None
            os.kill(b.proc.pid, signal.SIGKILL)  # right after the confirmations
            return out
        finally:
            await _close(conn)

    acked, held = run(then_kill())
    b.wait_exit(10)
    b.start()
    rest = _numbers(run(receive(b.url, "paged.o", N + 1, wait=5.0)))
    assert not set(acked) & set(rest), "an acknowledged message was delivered again"
    assert rest == sorted(set(range(N)) - set(acked)), "a message is missing or out of order"
    assert rest[: len(held)] == held


def test_out_of_order_acks_then_restart_twice_keep_the_journal_bounded(broker_factory: Any) -> None:
    """Acknowledged positions behind a queue's cursor leave no record behind: after the rest is
    consumed, a second restart finds the queue empty and delivers nothing."""
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    run(send_range(b.url, "paged.p", 0, N, body="y" * 200))

    async def then_kill() -> tuple[list[int], list[int]]:
        conn = await aio.connect(b.url, reconnect_attempts=0)
        try:
            out = await ack_out_of_order(conn, "paged.p", False)
            assert b.proc is not None
            os.kill(b.proc.pid, signal.SIGKILL)
            return out
        finally:
            await _close(conn)

    acked, _held = run(then_kill())
    b.wait_exit(10)
    b.start()
    rest = _numbers(run(receive(b.url, "paged.p", N + 1, wait=5.0)))
    assert sorted(rest + acked) == list(range(N))
    b.stop()
    b.start()
    assert run(receive(b.url, "paged.p", 10, wait=1.0)) == []
    stat = run(queue_stat(b.url, "paged.p"))
    assert stat["message_count"] == 0 and stat["paged_count"] == 0, stat


def test_unacknowledged_depaged_messages_keep_their_delivery_count_across_kill_9(broker_factory: Any) -> None:
    """A message read back from a page, delivered and given back (a failed delivery), then the
    broker killed: it comes back from its page with the count it had."""
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    run(send_range(b.url, "paged.c", 0, N, body="y" * 200))

    async def nack_then_kill() -> list[int]:
        conn = await aio.connect(b.url, reconnect_attempts=0)
        try:
            session = await conn.create_session(ack_mode="individual")
            consumer = await session.create_consumer("paged.c")
            for _ in range(SKIP):
                m = await consumer.receive(10)
                assert m is not None
                await m.ack()
            m = await consumer.receive(10)
            assert m is not None
            await m.nack()
            assert b.proc is not None
            await asyncio.sleep(0.5)  # (the count is advisory: written as the delivery fails, not waited for)
            os.kill(b.proc.pid, signal.SIGKILL)
            return _numbers([m.text])
        finally:
            await _close(conn)

    nacked = run(nack_then_kill())
    b.wait_exit(10)
    b.start()

    async def first() -> tuple[int, int]:
        conn = await aio.connect(b.url)
        try:
            session = await conn.create_session(ack_mode="individual")
            consumer = await session.create_consumer("paged.c")
            m = await consumer.receive(10)
            assert m is not None
            return _numbers([m.text])[0], m.delivery_count
        finally:
            await conn.close()

    number, count = run(first())
    assert number == nacked[0]
    assert count == 2, "its failed delivery was forgotten"  # (the count sent is the failed ones + 1)
