"""Writes that nothing else bounds, paced by the buffer in front of them.

Two buffers in the broker fill at a client's pace, not at the disk's or the backup's, because
what goes into them is not confirmed later:

- the backup link (a replicating primary): a large message's chunks are written to its file and
  handed to the replication stream as they arrive (decision 0051);
- the page files' writer: an open transaction's sends to a paging address, a non-durable
  message paged, a STOMP SEND without a receipt are queued for the writer and answered at once
  (decision 0085).

While either holds more than its high-water mark, every connection that adds to them stops
being read; once none does, they are read again. Small durable sends need none of this: each
is confirmed only once it is written (and on a pair, replicated), so a producer's window bounds
them.
"""

from __future__ import annotations

from typing import Protocol

BACKUP_LINK = "backup link"
PAGE_WRITER = "page writer"


class Paced(Protocol):
    """A client connection that can stop being read (server/native.py, server/stomp.py)."""

    closed: bool

    def pace(self, paused: bool) -> None: ...


class Pacer:
    """One per broker: which buffers are over their high-water marks, and who waits for them."""

    def __init__(self) -> None:
        self._full: set[str] = set()
        self._waiting: dict[int, Paced] = {}  # by id(): connections are not hashable by value
        self.pauses = 0  # connections paused so far (broker.status: pacing_pauses)

    @property
    def congested(self) -> bool:
        return bool(self._full)

    def full(self, buffer: str, is_full: bool) -> None:
        """`buffer` passed its high-water mark, or fell under its low-water mark (or is gone:
        nothing must stay paused for a buffer that no longer exists)."""
        if is_full:
            self._full.add(buffer)
            return
        self._full.discard(buffer)
        if self._full:
            return
        waiting, self._waiting = self._waiting, {}
        for conn in waiting.values():
            if not conn.closed:
                conn.pace(False)

    def wrote(self, conn: Paced) -> None:
        """`conn` added to a paced buffer: stop reading it while any is full."""
        if self._full and id(conn) not in self._waiting:
            self._waiting[id(conn)] = conn
            self.pauses += 1
            conn.pace(True)

    @property
    def waiting(self) -> int:
        return len(self._waiting)
