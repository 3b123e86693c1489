"""Small broker-side helpers for the Spark tests: fill a queue, look at it, drain it (real client, real broker)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import tandem.aio as aio


def fill(url: str, queue: str, bodies: list[str], properties: dict[str, str] | None = None) -> None:
    """Create `queue` as a reader-only queue (if missing) and send the bodies durably, in order."""

    async def go() -> None:
        conn = await aio.connect(url, retry_interval=100)
        try:
            s = await conn.create_session()
            await s.create_queue(queue, reader_only=True, exists_ok=True)
            p = s.create_producer(queue)
            for b in bodies:
                await p.send_async(b, properties=properties)
            await p.flush()
        finally:
            await conn.close()

    asyncio.run(go())


def make_queue(url: str, queue: str) -> None:
    """An ordinary durable anycast queue (a sink's target)."""

    async def go() -> None:
        conn = await aio.connect(url, retry_interval=100)
        try:
            s = await conn.create_session()
            await s.create_queue(queue, exists_ok=True)
        finally:
            await conn.close()

    asyncio.run(go())


def stat(url: str, queue: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        conn = await aio.connect(url, retry_interval=100)
        try:
            return dict((await conn.manage("queue.stat", name=queue))[0])
        finally:
            await conn.close()

    return asyncio.run(go())


def drain(url: str, queue: str, idle: float = 1.0) -> list[Any]:
    """Consume everything `queue` holds (until `idle` seconds pass without a message)."""

    async def go() -> list[Any]:
        conn = await aio.connect(url, retry_interval=100)
        out: list[Any] = []
        try:
            s = await conn.create_session()
            c = await s.create_consumer(queue)
            while (m := await c.receive(idle)) is not None:
                out.append(m)
                await m.ack()
            await s.close()
        finally:
            await conn.close()
        return out

    return asyncio.run(go())


def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def batches(checkpoint: Path, kind: str) -> list[int]:
    """Batch ids in a streaming checkpoint's `offsets` (planned) or `commits` (finished) log."""
    d = checkpoint / kind
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())
