"""A send is confirmed only once everything it depends on is durable: the message, and the address
and queue it auto-created (bindings journal) — or a restart would drop the message as an orphan."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

import tandem.aio as aio
from tandem.errors import TandemError

ROUNDS = int(os.environ.get("TANDEM_BINDINGS_ROUNDS", "12"))
PER_ROUND = 300


async def _send_to_new_queues(url: str, pid: int, prefix: str, n: int) -> set[str]:
    """Pipeline one durable message to each of `n` new (auto-created) queues; kill -9 the broker
    the moment the last confirmation arrives. Returns the queues whose send was confirmed."""
    conn = await aio.connect(url, ha=False, reconnect_attempts=0)
    confirmed: set[str] = set()
    done = asyncio.get_running_loop().create_future()
    prod = (await conn.create_session()).create_producer(window=n)

    def on_confirm(exc: BaseException | None, queue: str) -> None:
        if exc is None:
            confirmed.add(queue)
        if len(confirmed) == n:
            os.kill(pid, signal.SIGKILL)  # right after the last confirmation: nothing gets flushed
            if not done.done():
                done.set_result(None)

    for i in range(n):
        q = f"{prefix}{i}"
        prod.send_nowait(q.encode(), lambda exc, q=q: on_confirm(exc, q), address=q)
    try:
        await asyncio.wait_for(done, 30)
    finally:
        try:
            await conn.close()
        except TandemError:
            pass  # the broker is gone
    return confirmed


async def _present(url: str, queues: set[str]) -> set[str]:
    conn = await aio.connect(url)
    try:
        stats = await conn.manage("queue.stat")
    finally:
        await conn.close()
    by_name = {s["name"]: s for s in stats}
    return {q for q in queues if q in by_name and by_name[q]["message_count"] == 1}


@pytest.mark.timeout(300)
def test_confirmed_sends_to_auto_created_queues_survive_kill9(broker_factory: Any) -> None:
    b = broker_factory()
    all_confirmed: set[str] = set()
    for r in range(ROUNDS):
        b.start()
        assert b.proc is not None
        confirmed = asyncio.run(_send_to_new_queues(b.url, b.proc.pid, f"r{r}-q", PER_ROUND))
        assert len(confirmed) == PER_ROUND
        b.kill()
        all_confirmed |= confirmed
        b.start()
        present = asyncio.run(_present(b.url, all_confirmed))
        missing = sorted(all_confirmed - present)
        assert not missing, f"round {r}: confirmed sends lost with their auto-created queues: {missing[:10]}"
        b.kill()
