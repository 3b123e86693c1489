"""A JournalStorage driven from a test's own event loop (the paging and queue-ops models)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from tandem.store.journal_storage import JournalStorage


def run(loop: asyncio.AbstractEventLoop, coro: Any, timeout: float) -> Any:
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


def settle(loop: asyncio.AbstractEventLoop, storage: JournalStorage, timeout: float) -> None:
    """Let every write finish (pages, then the journals) and the loop run its callbacks."""

    async def go() -> None:
        for _ in range(3):
            done: asyncio.Future[None] = loop.create_future()
            storage.after_durable(lambda fut=done: fut.done() or fut.set_result(None))  # type: ignore[misc]
            await done
            await asyncio.sleep(0)

    run(loop, go(), timeout)


def close(loop: asyncio.AbstractEventLoop, storage: JournalStorage | None, directory: Path, timeout: float) -> None:
    """Stop the store, close the loop, remove its files."""
    try:
        if storage is not None:
            run(loop, storage.stop(), timeout)
    finally:
        loop.close()
        shutil.rmtree(directory, ignore_errors=True)
