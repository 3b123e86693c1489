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
  pymalloc part of a storm stays resident (`memory-allocator = "mimalloc"` or `"malloc"` gives
  it all back, server/allocator.py).
- mimalloc gives an emptied page back only when a later allocation looks at its segment:
  `_Mimalloc.purge` makes it look.

So once the number of connections has fallen far and held still, the broker empties the free
lists and gives the allocator's free pages back, once: nothing is done per message or per
connection.

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
import os
import time
from collections.abc import Callable

from .allocator import mimalloc_version

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


class _Mimalloc:
    """mimalloc's own calls, when the broker runs with mimalloc 2.x (server/allocator.py)."""

    PURGE_DELAY = 15  # mi_option_t's slot for the purge delay (2.0: decommit_delay, 2.1: purge_delay)
    CHURN_BLOCK = 4000  # bytes: small blocks, in mimalloc's 64 KiB pages
    CHURN_BLOCKS = 4096  # per round: ~16 MiB
    CHURN_ROUNDS = 64  # at most (1 GiB)

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.mi_option_get.argtypes = [ctypes.c_int]
        lib.mi_option_get.restype = ctypes.c_long
        lib.mi_option_set.argtypes = [ctypes.c_int, ctypes.c_long]
        lib.mi_option_set.restype = None
        lib.mi_collect.argtypes = [ctypes.c_bool]
        lib.mi_collect.restype = None

    @classmethod
    def load(cls) -> _Mimalloc | None:
        """None with another allocator, or a mimalloc whose option slots may differ (not 2.x)."""
        return cls(ctypes.CDLL(None)) if 200 <= mimalloc_version() < 300 else None

    def purge(self) -> None:
        """Give back the pages a storm emptied.

        mimalloc gives an emptied page back only after its purge delay (25 ms), and then only
        when a later allocation or free in the same segment looks at it: an idle broker keeps a
        storm's pages resident for ever. With the delay at 0, blocks allocated over those pages
        and freed again give them back at once; rounds of 16 MiB go on while the resident size
        falls by a quarter of that (at most 64). Measured in decision 0083."""
        lib = self.lib
        delay = lib.mi_option_get(self.PURGE_DELAY)
        lib.mi_option_set(self.PURGE_DELAY, 0)
        try:
            lib.mi_collect(True)
            before = _resident()
            for _ in range(self.CHURN_ROUNDS):
                blocks = [bytearray(self.CHURN_BLOCK) for _ in range(self.CHURN_BLOCKS)]
                del blocks
                lib.mi_collect(True)
                now = _resident()
                if before - now < self.CHURN_BLOCK * self.CHURN_BLOCKS // 4:
                    break
                before = now
        finally:
            lib.mi_option_set(self.PURGE_DELAY, delay)


def _resident() -> int:
    """This process's resident bytes (Linux: mimalloc is only chosen there)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_mimalloc = _Mimalloc.load()


def release_free_memory() -> bool:
    """Return the C heap's free pages to the OS; False where there is no way to."""
    if _mimalloc is not None:
        _mimalloc.purge()
        return True
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
