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

from ..core.paging import PageStore

BACKUP_LINK = "backup link"
PAGE_WRITER = "page writer"
UPLOAD = (BACKUP_LINK,)  # a large message's chunk: written at once, streamed to the backup
PAGED = (PAGE_WRITER, BACKUP_LINK)  # a paged message: queued for the page writer, then the backup


class Paced(Protocol):
    """A client connection that can stop being read (server/native.py, server/stomp.py)."""

    closed: bool

    def pace(self, paused: bool) -> None: ...


def page_mark(pages: PageStore | None) -> int:
    """Where the page files' count stands before a command (for `Pacer.paged` after it)."""
    return pages.appended if pages is not None else 0


class Pacer:
    """One per broker: which buffers are over their high-water marks, and who waits for which."""

    def __init__(self) -> None:
        self._full: set[str] = set()
        # by id(): connections are not hashable by value; each with the buffers it waits for
        self._waiting: dict[int, tuple[Paced, tuple[str, ...]]] = {}
        self.pauses = 0  # connections paused so far (broker.status: pacing_pauses)

    @property
    def congested(self) -> bool:
        return bool(self._full)

    def full(self, buffer: str, is_full: bool) -> None:
        """`buffer` passed its high-water mark, or fell under its low-water mark (or is gone:
        nothing must stay paused for a buffer that no longer exists). A connection is read
        again once none of the buffers it added to is full."""
        if is_full:
            self._full.add(buffer)
            return
        self._full.discard(buffer)
        full = self._full
        for key, (conn, buffers) in list(self._waiting.items()):
            if full and any(b in full for b in buffers):
                continue
            del self._waiting[key]
            if not conn.closed:
                conn.pace(False)

    def wrote(self, conn: Paced, buffers: tuple[str, ...]) -> None:
        """`conn` added to `buffers`: stop reading it while any of them is full."""
        full = self._full
        if full and id(conn) not in self._waiting and any(b in full for b in buffers):
            self._waiting[id(conn)] = (conn, buffers)
            self.pauses += 1
            conn.pace(True)

    def paged(self, conn: Paced, pages: PageStore | None, mark: int) -> None:
        """After a command of `conn`: if it appended to the page files (their count moved
        from `mark`, `page_mark`), it waits while they or the backup link are full."""
        if self._full and pages is not None and pages.appended != mark:  # nothing full: the common case
            self.wrote(conn, PAGED)

    @property
    def waiting(self) -> int:
        return len(self._waiting)
