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
