"""The fault proxy between a client and a real broker process: the client's failure detection sees a
blackhole (no packet within `client_failure_check_period`), and after the heal it reconnects and works."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import tandem.aio as aio
from broker_process import BrokerProcess
from tandem.errors import TandemError
from tandem.testing import FaultProxy, free_port

FAST = {"client_failure_check_period": 500, "connect_timeout": 500, "retry_interval": 100}


async def _receive_all(url: str, queue: str) -> list[str]:
    conn = await aio.connect(url)
    try:
        consumer = await (await conn.create_session()).create_consumer(queue)
        out = []
        while (m := await consumer.receive(0.5)) is not None:
            out.append(m.text)
        return out
    finally:
        await conn.close()


async def _until(cond: object, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.02)


def test_blackhole_is_detected_then_heal_lets_the_client_reconnect(broker_factory: Any) -> None:
    # The client reconnects to the address the broker announces (its topology), not to its URL's:
    # the broker announces the proxy, or the reconnection would go around it.
    port = free_port()
    broker: BrokerProcess = broker_factory(
        connector_ref="via-proxy", extra_toml=f'[[connectors]]\nname = "via-proxy"\nurl = "127.0.0.1:{port}"\n'
    ).start()
    events: list[tuple[aio.FailureEvent, TandemError | None]] = []

    async def main() -> None:
        with FaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(proxy.url, reconnect_attempts=-1, **FAST)
            try:
                conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
                producer = (await conn.create_session()).create_producer("faults")
                await producer.send("before")
                proxy.blackhole()
                # The client notices the silence by itself and tries again: a second connection to the proxy.
                await _until(lambda: proxy.stats().connections >= 2, "the client detects the loss and reconnects")
                assert events == [], "no reconnection can succeed through a blackhole"
                proxy.heal()
                await _until(lambda: events, "the client reconnects after the heal")
                kind, cause = events[0]
                assert kind is aio.FailureEvent.RECONNECTED
                assert cause is not None and "no packet" in cause.message, cause
                assert conn.server == proxy.address, "the client went around the proxy"
                await producer.send("after")
            finally:
                await conn.close()

    asyncio.run(main())
    assert asyncio.run(_receive_all(broker.url, "faults")) == ["before", "after"]


def test_blackhole_without_reconnection_reports_the_loss(broker: BrokerProcess) -> None:
    events: list[tuple[aio.FailureEvent, TandemError | None]] = []

    async def main() -> None:
        with FaultProxy(broker.port) as proxy:
            conn = await aio.connect(proxy.url, reconnect_attempts=0, **FAST)
            try:
                conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
                proxy.blackhole("down")  # the broker gets the pings, the client hears nothing back
                await _until(lambda: events, "the client reports the loss")
                kind, cause = events[0]
                assert kind is aio.FailureEvent.DISCONNECT
                assert cause is not None and "no packet" in cause.message, cause
            finally:
                await conn.close()
            proxy.heal()
            again = await aio.connect(proxy.url, **FAST)  # a new connection through the healed path works
            await (await again.create_session()).create_producer("faults").send("healed")
            await again.close()

    asyncio.run(main())
    assert asyncio.run(_receive_all(broker.url, "faults")) == ["healed"]
