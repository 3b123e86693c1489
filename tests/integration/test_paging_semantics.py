"""Paged messages keep their semantics, against real broker processes: duplicate detection
(across a kill -9), transactions, redelivery with delivery counts, dead letters and expiry."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import drain_bodies, queue_stat

SETTINGS = {
    "paged.#": {
        "max-size-bytes": 64 * 1024,
        "address-full-policy": "PAGE",
        "page-size-bytes": 64 * 1024,
        "dead-letter-address": "DLQ",
        "max-delivery-attempts": 3,
        "expiry-address": "EXP",
    },
}
FILL = 2_000  # ~400 KiB of 200-byte bodies: the address pages after the first ~300


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def fill(url: str, address: str, n: int = FILL, dedup: str | None = None, **fields: Any) -> None:
    conn = await aio.connect(url)
    try:
        prod = (await conn.create_session()).create_producer(address)
        for i in range(n):
            kw = dict(fields)
            if dedup is not None:
                kw["dedup_id"] = f"{dedup}{i}"
            await prod.send_async(f"m{i:06d}" + "p" * 200, **kw)
        await prod.flush()
    finally:
        await conn.close()


async def texts(url: str, queue: str, limit: int, wait: float = 2.0) -> list[str]:
    conn = await aio.connect(url)
    out: list[str] = []
    try:
        consumer = await (await conn.create_session()).create_consumer(queue)
        while len(out) < limit and (m := await consumer.receive(wait)) is not None:
            out.append(m.text[:7])
    finally:
        await conn.close()
    return out


def _expected(n: int) -> list[str]:
    return [f"m{i:06d}" for i in range(n)]


def test_dedup_ids_of_paged_messages_survive_kill(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.d", dedup="d-"))
    assert run(queue_stat(b.url, "paged.d"))["paged_count"] > FILL // 2
    run(fill(b.url, "paged.d", dedup="d-"))  # every one a duplicate: confirmed, not stored
    assert run(queue_stat(b.url, "paged.d"))["message_count"] == FILL
    assert b.proc is not None
    os.kill(b.proc.pid, signal.SIGKILL)
    b.wait_exit(10)
    b.start()
    run(fill(b.url, "paged.d", dedup="d-"))  # the ids are known after the kill as well
    assert run(texts(b.url, "paged.d", 3 * FILL)) == _expected(FILL)


def test_transactions_rollback_and_commit_paged_messages(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.t"))

    async def tx_round() -> list[str]:
        conn = await aio.connect(b.url)
        try:
            session = await conn.create_session(transacted=True)
            consumer = await session.create_consumer("paged.t")
            first = [(await consumer.receive(5)).text[:7] for _ in range(1500)]  # type: ignore[union-attr]
            await session.rollback()
            await consumer.close()  # what it had buffered beyond the 1500 goes back unseen
            consumer = await session.create_consumer("paged.t")
            again = [await consumer.receive(5) for _ in range(1500)]
            assert [m.text[:7] for m in again if m] == first
            assert min(m.delivery_count for m in again if m) == 2
            await session.commit()
            return first
        finally:
            await conn.close()

    committed = run(tx_round())
    assert committed == _expected(1500)
    assert run(texts(b.url, "paged.t", FILL)) == _expected(FILL)[1500:]


def test_paged_messages_redeliver_count_and_dead_letter(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.n"))

    async def nack_first_paged() -> list[int]:
        conn = await aio.connect(b.url)
        counts: list[int] = []
        try:
            session = await conn.create_session(ack_mode="individual")
            consumer = await session.create_consumer("paged.n")
            for _ in range(FILL - 1):  # everything but the last (a paged one) is acknowledged
                m = await consumer.receive(5)
                assert m is not None
                await m.ack()
            for _ in range(3):
                m = await consumer.receive(5)
                assert m is not None and m.text.startswith(f"m{FILL - 1:06d}")
                counts.append(m.delivery_count)
                await m.nack()
        finally:
            await conn.close()
        return counts

    assert run(nack_first_paged()) == [1, 2, 3]
    dead = run(texts(b.url, "DLQ", 10))
    assert dead == [f"m{FILL - 1:06d}"]
    assert run(queue_stat(b.url, "paged.n"))["message_count"] == 0


def test_paged_messages_expire_to_the_expiry_address(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.x", ttl=1500))
    assert run(queue_stat(b.url, "paged.x"))["paged_count"] > 0
    run(asyncio.sleep(2.0))
    assert run(texts(b.url, "paged.x", FILL, wait=1.0)) == []
    assert run(texts(b.url, "EXP", 2 * FILL)) == _expected(FILL)


def test_a_large_message_sent_while_the_address_pages_keeps_its_body(broker_factory: Any) -> None:
    """A page record holds no file: a large message is journaled, not paged, and its body (a
    file) comes whole after the paged messages are read back and after a restart."""
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.l"))
    assert run(queue_stat(b.url, "paged.l"))["paged_count"] > FILL // 2
    body = bytes(range(256)) * 1024  # 256 KiB: a large message

    async def send_large() -> None:
        conn = await aio.connect(b.url)
        prod = (await conn.create_session()).create_producer("paged.l")
        await prod.send(body)
        await conn.close()

    run(send_large())
    b.stop()
    b.start()
    got = run(drain_bodies(b.url, "paged.l", 2.0))
    assert len(got) == FILL + 1
    assert [x for x in got if x == body] == [body]
    assert sorted(x[:7].decode() for x in got if x != body) == _expected(FILL)
