"""Closing a consumer while deliveries are still on their way to it: the messages the client never
received (in flight when it closed) go back without counting a failed delivery, as those in its
buffer do. Under load a whole window can be in flight; counting them would raise every delivery
count (and, with max-delivery-attempts, dead-letter messages no application ever saw)."""

from __future__ import annotations

import asyncio
import time

import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat


def test_deliveries_in_flight_at_close_keep_their_delivery_count(broker: BrokerProcess) -> None:
    async def go() -> list[int]:
        async with await aio.connect(broker.url) as conn:
            s = await conn.create_session()
            await s.create_queue("inflight", exists_ok=True)
            p = s.create_producer("inflight")
            for i in range(50):
                await p.send(f"m{i}".encode())
            # Window 0: nothing comes until a receive asks; the asked-for message stays in the
            # socket (reading paused): in flight when the consumer closes.
            c = await s.create_consumer("inflight", window=0)
            transport = conn._proto.transport  # type: ignore[union-attr]
            transport.pause_reading()
            assert await c.receive(0.3) is None
            deadline = time.monotonic() + 10
            while (await queue_stat(broker.url, "inflight"))["delivering_count"] < 1:
                assert time.monotonic() < deadline, "the broker did not deliver"
                await asyncio.sleep(0.02)
            assert not c.buffer and c.received == 0
            asyncio.get_running_loop().call_later(0.2, transport.resume_reading)
            await c.close()  # sent while the delivery is unread
            c2 = await s.create_consumer("inflight")
            counts = []
            for _ in range(50):
                m = await c2.receive(5)
                assert m is not None
                counts.append(m.delivery_count)
                await m.ack()
            return counts

    got = asyncio.run(go())
    assert got == [1] * 50, got
