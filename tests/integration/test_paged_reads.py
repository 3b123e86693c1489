"""Browsers and range readers over paged messages, against real broker processes: they see a
queue's messages in order across memory and page files, without consuming them and without
reading the pages back into the queue."""

from __future__ import annotations

import asyncio
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
