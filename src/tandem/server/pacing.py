"""Large uploads paced by a replicating primary's backup link.

A large message's chunks are written to its file and handed to the replication stream as they
arrive; a backup slower than the client (or stalled) lets them queue in the link's writer, in
the primary's memory, without bound. While the link holds more than its high-water mark
(`LinkWriter`, server/link_writer.py, calls the link's `pause_writing`), every connection that
writes a large message's chunk stops being read; below the low-water mark they are read again.
Small sends need none of this: each is confirmed only once the backup has it, so a producer's
window bounds them. (decision 0051)
"""

from __future__ import annotations

from typing import Protocol


class Paced(Protocol):
    """A client connection that can stop being read (server/native.py, server/stomp.py)."""

    closed: bool

    def pace(self, paused: bool) -> None: ...


class UploadPacer:
    """One per broker: whether its backup link is over its high-water mark, and who waits for it."""

    def __init__(self) -> None:
        self.congested = False
        self._waiting: dict[int, Paced] = {}  # by id(): connections are not hashable by value
        self.pauses = 0  # connections paused so far (stats and tests)

    def link_paused(self) -> None:
        self.congested = True

    def link_resumed(self) -> None:
        """Below the low-water mark (or the link is gone): read every paused uploader again."""
        self.congested = False
        waiting, self._waiting = self._waiting, {}
        for conn in waiting.values():
            if not conn.closed:
                conn.pace(False)

    def wrote(self, conn: Paced) -> None:
        """`conn` handed a large message's chunk to the store: stop reading it while the link is full."""
        if self.congested and id(conn) not in self._waiting:
            self._waiting[id(conn)] = conn
            self.pauses += 1
            conn.pace(True)

    @property
    def waiting(self) -> int:
        return len(self._waiting)
