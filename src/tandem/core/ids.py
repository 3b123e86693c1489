"""Monotonic ids that stay unique across restarts (reserved in blocks, like Artemis's ID counter)."""

from __future__ import annotations

from collections.abc import Callable

BLOCK = 1 << 20


class IdGenerator:
    """Hands out ids; persists a reservation well before the current block runs out."""

    __slots__ = ("_next", "_reserve", "_reserved")

    def __init__(self, start: int, reserved: int, reserve: Callable[[int], None]) -> None:
        # Ids up to the last reservation may have been handed out before a crash: start above it.
        self._next = max(start, reserved, 1)
        self._reserved = self._next
        self._reserve = reserve
        if self._reserved - self._next < BLOCK // 2:
            self._extend()

    def _extend(self) -> None:
        self._reserved = self._next + BLOCK
        self._reserve(self._reserved)

    def next(self) -> int:
        n = self._next
        self._next = n + 1
        if self._reserved - n < BLOCK // 2:
            self._extend()
        return n

    def seen(self, n: int) -> None:
        """Reload: id `n` is stored where the journals' highest id does not look (a page)."""
        if n >= self._next:
            self._next = n + 1
            if self._reserved - self._next < BLOCK // 2:
                self._extend()

    @property
    def peek(self) -> int:
        return self._next
