"""A connection's outgoing bytes written by a thread of its own (a replicating primary's backup link).

A journal batch's replication frame is made on the journal's writer thread. Handing it to the
event loop to write means waiting for the loop's next pass, and the loop then spends the send
system call (the loopback's whole TCP path) under the interpreter lock. This writer takes frames
from any thread, in the order they are handed to it, and a thread of its own writes them on a
duplicate of the connection's descriptor, without the lock during the call (decision 0042).
A frame handed over by another thread (the journal's writer) while nothing is queued or being
written is written at once on that thread, as far as the socket takes it, and only the rest is
queued: the common case then costs no wake-up of this thread (decision 0076).
The event loop keeps reading the connection; once a writer is attached every write of the
connection goes through it, so frames never overtake each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable

CLOSE_FLUSH = 2.0  # s: what is still queued at close is written for at most this long
MAX_WRITEV = 512  # buffers per writev (IOV_MAX is 1024 on Linux)


class LinkWriter:
    """Writes what any thread hands it, in order, on its own descriptor of the socket."""

    def __init__(
        self,
        fd: int,
        loop: asyncio.AbstractEventLoop,
        high: int,
        low: int,
        paused: Callable[[], None],
        resumed: Callable[[], None],
        failed: Callable[[OSError], None],
    ) -> None:
        self._fd = os.dup(fd)  # shares the socket (and its O_NONBLOCK flag): closed by this thread
        self._loop = loop
        self._high = high
        self._low = low
        self._paused_cb = paused
        self._resumed_cb = resumed
        self._failed_cb = failed
        self._cv = threading.Condition(threading.Lock())
        self._queue: deque[bytes | bytearray | memoryview] = deque()
        self._pending = 0  # bytes handed over, not written yet
        self._paused = False
        self._closing = False
        self._deadline = 0.0
        self._loop_thread = threading.get_ident()  # made on the loop: its own writes are queued
        self.written_directly = 0  # bytes written on the calling thread (decision 0076)
        self._thread = threading.Thread(target=self._run, name="replication-send", daemon=True)
        self._thread.start()

    def write(self, data: bytes | bytearray) -> None:
        """(Any thread) queue `data` after everything handed over before it."""
        with self._cv:
            if self._closing:
                return
            if not self._pending and threading.get_ident() != self._loop_thread:
                # Nothing queued or being written: no frame can be overtaken. A full socket, or an
                # error, leaves the rest to this writer's thread (which reports the error).
                try:
                    n = os.write(self._fd, data)
                except OSError:
                    n = 0
                self.written_directly += n
                if n == len(data):
                    return
            else:
                n = 0
            rest = memoryview(data)[n:] if n else data
            self._queue.append(rest)
            self._pending += len(rest)
            if self._pending > self._high and not self._paused:
                self._paused = True
                self._post(self._paused_cb)
            self._cv.notify()

    def close(self) -> None:
        """(Any thread) write what is queued (for at most CLOSE_FLUSH), then let the socket go."""
        with self._cv:
            if not self._closing:
                self._closing = True
                self._deadline = time.monotonic() + CLOSE_FLUSH
            self._cv.notify()

    @property
    def pending(self) -> int:
        return self._pending

    def _post(self, cb: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens any more
            self._loop.call_soon_threadsafe(cb, *args)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLOUT)
        try:
            while True:
                with self._cv:
                    while not self._queue and not self._closing:
                        self._cv.wait()
                    if not self._queue:
                        return
                    batch = list(self._queue)
                    self._queue.clear()
                if not self._write_all(batch, poller):
                    return
                with self._cv:
                    self._pending -= sum(len(b) for b in batch)
                    if self._paused and self._pending <= self._low:
                        self._paused = False
                        self._post(self._resumed_cb)
        except OSError as exc:
            with self._cv:
                self._closing = True
                self._queue.clear()
            self._post(self._failed_cb, exc)
        finally:
            os.close(self._fd)

    def _write_all(self, buffers: list[bytes | bytearray | memoryview], poller: select.poll) -> bool:
        """Every byte of `buffers`; False when closing ran out of time first."""
        views = [memoryview(b) for b in buffers]
        i = 0
        while i < len(views):
            try:
                n = os.writev(self._fd, views[i : i + MAX_WRITEV])
            except BlockingIOError:
                n = 0
            while n and i < len(views):
                size = len(views[i])
                if n >= size:
                    n -= size
                    i += 1
                else:
                    views[i] = views[i][n:]
                    n = 0
            if i < len(views):
                if self._closing and time.monotonic() > self._deadline:
                    return False
                poller.poll(100)  # ms: the socket's buffer is full; look at the deadline now and then
        return True
