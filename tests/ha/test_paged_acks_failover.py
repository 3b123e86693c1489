"""Acknowledgements of paged messages out of order (several consumers on one queue commit in
turn, under transaction ids), then kill -9 of the primary: the warm backup that takes over never
delivers an acknowledged message again, and loses nothing. (Written while chasing chaos seed
1128002's duplicates, which turned out to be retry_commit's: decision 0084.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import tandem.aio as aio
from client_io import drain_texts, send_padded

PAGED = {"paged.#": {"max-size-bytes": 64 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 64 * 1024}}
QUEUE = "paged.r"


async def _ack_out_of_order(conn: aio.AsyncConnection, skip: int, rounds: int) -> tuple[list[str], list[str]]:
    """`skip` messages consumed and acknowledged (the ones in memory), then two transacted
    consumers take paged messages in turn; only the first commits, `rounds` times, under a
    transaction id. Returns (committed, held): held stay unacknowledged when the primary dies."""
    committed: list[str] = []
    held: list[str] = []
    plain = await conn.create_session()
    first = await plain.create_consumer(QUEUE)
    for _ in range(skip):
        m = await first.receive(5.0)
        assert m is not None
    await first.close()
    a_session = await conn.create_session(transacted=True)
    b_session = await conn.create_session(transacted=True)
    a = await a_session.create_consumer(QUEUE, window=1)
    b = await b_session.create_consumer(QUEUE, window=1)
    for r in range(rounds):
        for consumer, out in ((b, held), (a, committed)):
            m = await consumer.receive(5.0)
            assert m is not None
            out.append(m.text[:7])
        await a_session.commit(dedup_id=f"tx-{r}")
    return committed, held


def test_paged_messages_acknowledged_out_of_order_are_not_delivered_again_after_a_failover(pair: Any) -> None:
    n, skip = 1500, 100
    p = pair(address_settings=PAGED).start_all()
    asyncio.run(send_padded(p.url_of(0), QUEUE, n))

    async def consume_then_kill() -> tuple[list[str], list[str]]:
        conn = await aio.connect(p.url_of(0))
        try:
            committed, held = await _ack_out_of_order(conn, skip, 40)
            p.primary.kill()  # the consumers still open: held ones are in delivery
        finally:
            await conn.close()
        return committed, held

    committed, held = asyncio.run(consume_then_kill())
    p.wait_state(1, "active")
    got = Counter(t[:7] for t in asyncio.run(drain_texts(p.url_of(1), QUEUE, wait=3.0)))
    again = sorted(m for m in committed if got[m])
    assert not again, f"{len(again)} committed acknowledgements undone by the failover, e.g. {again[:5]}"
    missing = [f"m{i:06d}" for i in range(skip, n) if f"m{i:06d}" not in committed and not got[f"m{i:06d}"]]
    assert not missing, f"{len(missing)} messages lost, e.g. {missing[:5]}"
    assert all(got[m] == 1 for m in held)
