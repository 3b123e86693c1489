"""Connection attempts bounded in time that never leak the connection they made.

`asyncio.wait_for(loop.create_connection(...), t)` drops a connection made just as the waiting
task is cancelled (Python 3.11: the inner attempt is cancelled, completes anyway, and
`wait_for` re-raises the cancellation): its transport stays open until the garbage collector
finds it (a ResourceWarning, a socket held meanwhile). A client's reconnection task is
cancelled that way when the client closes, or gives a link up (decision 0074).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

_T = TypeVar("_T")


async def within(timeout: float, make: Callable[[], Awaitable[_T]], discard: Callable[[_T], None]) -> _T:
    """`make()` within `timeout` seconds (TimeoutError otherwise); if this ends in any error after
    `make` produced its result, `discard` gets that result (close the transport)."""
    made: list[_T] = []

    async def attempt() -> _T:
        result = await make()
        made.append(result)  # no await after this: the result is never lost in between
        return result

    try:
        return await asyncio.wait_for(attempt(), timeout)
    except BaseException:
        for result in made:
            discard(result)
        raise
