"""Keeping the C heap small: one malloc arena, and giving memory back after many connections went away.

CPython frees a dead connection's objects at once, but glibc keeps the freed heap for reuse:
without a trim, a broker that served a thousand clients for a minute holds their memory for
ever. `malloc_trim` hands the free pages back; elsewhere (no glibc) this does nothing.

glibc also gives each thread that allocates while another holds the lock an arena of its own.
Memory freed in one arena is reused only by allocations from that arena, so messages read back
from pages in a worker thread took new memory while the memory of the messages the queue had
delivered stayed in the main arena: depaging under a 64 MiB limit grew the broker by ~28 MiB
(docs/storage.md, "Memory accounting"). The GIL serialises nearly every allocation anyway, so
the broker runs with one arena (`one_malloc_arena`, at start, before any thread).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger("tandem.memory")

TRIM_AFTER = 100  # connections gone since the last trim (a storm of exits, not the daily churn)


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


class ConnectionChurn:
    """Trims once the number of connections has fallen by TRIM_AFTER from its high point and
    then held still for a check period (after the storm, not in the middle of it)."""

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
        released = release_free_memory()
        log.debug("connections fell to %d: free heap returned to the OS (%s)", open_connections, released)
        return released
