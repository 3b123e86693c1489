"""Small asyncio-client steps the integration tests share (each opens its own connection)."""

from __future__ import annotations

from typing import Any

import tandem.aio as aio


async def queue_stat(url: str, queue: str) -> dict[str, Any]:
    """One queue's `queue.stat` row."""
    conn = await aio.connect(url)
    try:
        return (await conn.manage("queue.stat", name=queue))[0]  # type: ignore[no-any-return]
    finally:
        await conn.close()


async def drain_texts(url: str, queue: str, wait: float = 0.5) -> list[str]:
    """Receive (auto-acknowledged) until `queue` has been quiet for `wait` seconds; the texts in order."""
    conn = await aio.connect(url)
    try:
        consumer = await (await conn.create_session()).create_consumer(queue)
        out = []
        while (m := await consumer.receive(wait)) is not None:
            out.append(m.text)
        return out
    finally:
        await conn.close()
