"""Keeping the C heap small: one malloc arena, and giving memory back after many connections went away.

CPython frees a dead connection's objects at once, but the memory they lived in is not given
back by itself (docs/decisions/0057 has the measurements):

- glibc keeps the C heap it freed for reuse; `malloc_trim` hands the free pages back.
- Python's own allocator (pymalloc) takes memory from the OS in 1 MiB arenas and returns an
  arena only once every block in it is free. A storm of a thousand clients fills a few new
  arenas, and once its objects are gone a few survivors scattered over them keep them all
  resident. Free lists are such survivors: CPython's (tuples, lists, dicts, floats,
  contexts), which a full collection empties, and uvloop's (up to 250 freed callback
  handles), which only putting many handles through the loop renews. Values that outlive the
  storm (a counter, a timestamp set while it raged) are too, and nothing can move them: with
  pymalloc part of a storm stays resident (PYTHONMALLOC=malloc gives it all back).

So once the number of connections has fallen far and held still, the broker empties the free
lists and trims the C heap, once: nothing is done per message or per connection.

glibc also gives each thread that allocates while another holds the lock an arena of its own.
Memory freed in one arena is reused only by allocations from that arena, so messages read back
from pages in a worker thread took new memory while the memory of the messages the queue had
delivered stayed in the main arena: depaging under a 64 MiB limit grew the broker by ~28 MiB
(docs/storage.md, "Memory accounting"). The GIL serialises nearly every allocation anyway, so
the broker runs with one arena (`one_malloc_arena`, at start, before any thread).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("tandem.memory")

TRIM_AFTER = 100  # connections gone since the last trim (a storm of exits, not the daily churn)
HANDLE_CYCLE = 5000  # handles put through the loop to renew its free list (uvloop keeps 250)


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_trim = _load_trim()

M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)


def one_malloc_arena() -> bool:
    """Every thread allocates from the main arena (glibc; call before starting threads); False elsewhere."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, 1))


def release_free_memory() -> bool:
    """Return the C heap's free pages to the OS; False where there is no malloc_trim."""
    if _trim is None:
        return False
    _trim(0)
    return True


def _nothing() -> None:
    pass


async def cycle_loop_handles(n: int = HANDLE_CYCLE) -> None:
    """Renew the event loop's free list of handles, so that the old ones are freed for good.

    uvloop keeps up to 250 freed handles for reuse; after a storm they are handles the storm
    made, in the storm's arenas. The first of `n` handles made here come off that list; the
    last ones come from new pools of the fullest arenas. Freed newest first, those fill the
    free list again, and the storm's are freed for good. Many more than the list holds, so
    that the kept ones are past every partly used pool (measured: 1,000 left them spread over
    five arenas, 5,000 put them all in one; decision 0057). With plain asyncio (no free list)
    this is a few milliseconds of no-op callbacks."""
    loop = asyncio.get_running_loop()
    handles = [loop.call_soon(_nothing) for _ in range(n)]
    await asyncio.sleep(0)  # they have run: only this list holds them now
    while handles:
        handles.pop()


async def release_memory() -> bool:
    """Give back what a storm of connections left behind (see the module's docstring).

    The full collection is skipped while collections are off: whoever turned them off is
    building a large heap (a reload, a follower's warm-up) that it must not be walked."""
    collect = gc.isenabled()
    if collect:
        gc.collect()  # also empties CPython's free lists: their pools are free for what comes next
    await cycle_loop_handles()
    if collect:
        gc.collect()  # the contexts the cycle made
    return release_free_memory()


class ConnectionChurn:
    """Says when to release memory: once the number of connections has fallen by TRIM_AFTER
    from its high point and then held still for a check period (after the storm, not in the
    middle of it)."""

    __slots__ = ("last", "peak")

    def __init__(self) -> None:
        self.peak = 0
        self.last = 0

    def observe(self, open_connections: int) -> bool:
        last, self.last = self.last, open_connections
        if open_connections > self.peak:
            self.peak = open_connections
            return False
        if self.peak - open_connections < TRIM_AFTER or open_connections != last:
            return False
        self.peak = open_connections
        return True

    async def release(self, open_connections: int) -> bool:
        started = time.perf_counter()
        released = await release_memory()
        log.info(
            "connections fell to %d: free memory given back to the OS (%.1f ms%s)",
            open_connections,
            (time.perf_counter() - started) * 1000,
            "" if released else ", Python's only: no malloc_trim here",
        )
        return released
