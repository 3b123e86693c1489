"""A failover that hits an error the client does not expect (a bug) gives the connection up.

The reconnection runs as a task of its own; an exception other than a TandemError ended that
task and left the client not ready for ever: nothing failed, nothing went on, and every call
waited for its own timeout. The fault is put into the client (its session's restore raises);
the broker and the link are real.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import tandem.aio as aio
from tandem.errors import TandemError
from tandem.testing import AsyncFaultProxy

FAST = {"client_failure_check_period": 2000, "connect_timeout": 3000, "retry_interval": 100}


@pytest.mark.timeout(60)
def test_an_unexpected_error_in_a_failover_gives_the_connection_up(broker_factory: Any) -> None:
    broker = broker_factory().start()
    events: list[aio.FailureEvent] = []
    outcome: dict[str, object] = {}

    async def main() -> None:
        async with AsyncFaultProxy(broker.port) as proxy:
            # No confirmation window: a lost link is followed by a restore, not a reattach.
            conn = await aio.connect(proxy.url, reconnect_attempts=-1, call_timeout=30_000, **FAST)
            conn.add_failure_listener(lambda kind, _cause: events.append(kind))
            session = await conn.create_session()
            producer = session.create_producer("q")
            await producer.send("before")

            async def broken() -> None:
                raise RuntimeError("a bug in the restore")

            session._restore = broken  # type: ignore[method-assign]
            assert await proxy.reset() >= 1
            deadline = time.monotonic() + 15
            while not conn.closed and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            outcome["closed"] = conn.closed
            started = time.monotonic()
            try:
                await producer.send("after")
                outcome["send"] = None
            except TandemError as exc:
                outcome["send"] = exc
            outcome["send_s"] = time.monotonic() - started
            await conn.close()

    asyncio.run(main())
    assert outcome["closed"] is True, (outcome, events)
    assert events and events[-1] == aio.FailureEvent.DISCONNECT, events
    assert isinstance(outcome["send"], TandemError), outcome
    assert outcome["send_s"] < 10, outcome  # failed at once, not after its call timeout (30 s)
