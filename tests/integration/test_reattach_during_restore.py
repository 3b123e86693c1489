"""A link lost again while a session is being restored, and the client reattaches to that restore.

The broker restarted (its sessions gone: the client restores them on it), and the link fails
while the restore waits for the broker's answer to CREATE_SESSION. The broker keeps that new
connection for its TTL, so the client reattaches to it. A send written while the REATTACH is
answered is kept for the reattach's replay: it must reach the broker once, not also straight
away (the broker would then store it twice: auto_dedup is off, no dedup id).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

import tandem.aio as aio
from client_io import drain_texts
from tandem.errors import TandemError
from tandem.testing import AsyncFaultProxy, free_port

FAST = {"client_failure_check_period": 2000, "connect_timeout": 3000, "retry_interval": 100}


async def _until(cond: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.002)


@pytest.mark.timeout(90)
def test_a_send_written_while_reattaching_to_a_restore_reaches_the_broker_once(broker_factory: Any) -> None:
    port, proxy_port = free_port(), free_port()
    broker = broker_factory(
        connection_check_period=100,
        connector_ref="via-proxy",
        extra_toml=(
            f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:{port}"\n'
            f'[[connectors]]\nname = "via-proxy"\nurl = "127.0.0.1:{proxy_port}"\n'
        ),
    ).start()
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await aio.connect(
                proxy.url,
                confirmation_window_size=1024,
                auto_dedup=False,
                reconnect_attempts=-1,
                connection_ttl=30_000,
                **FAST,
            )
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            session = await conn.create_session()
            await session.create_queue("once")
            producer = session.create_producer("once")
            await producer.send("before")
            broker.kill()
            await asyncio.get_running_loop().run_in_executor(None, broker.start)
            # Answers from the restarted broker come late: the restore's CREATE_SESSION reaches
            # it at once, its answer is still in the proxy when the link is cut.
            await proxy.delay(1.0, "down")
            await _until(lambda: conn._restoring, "the client restores its session on the restarted broker")
            await asyncio.sleep(0.3)
            generation = conn.generation
            assert await proxy.reset() >= 1
            # The next connection: its REATTACH answer is 1 s late; a send is written meanwhile.
            await _until(lambda: conn.generation > generation, "the client connects again")
            assert not conn.ready
            during = producer.send_nowait("during")
            assert during is not None
            await asyncio.wait_for(during, 20)
            await proxy.delay(0, "down")
            await producer.send("after")
            await conn.close()

    try:
        asyncio.run(main())
    except TandemError as exc:
        pytest.fail(f"the client failed: {exc!r} (events {events})")
    texts = asyncio.run(drain_texts(broker.url, "once"))
    assert sorted(texts) == ["after", "before", "during"], f"{texts} (events {events})"
