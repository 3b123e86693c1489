"""A replicating primary's side of the stream: its store writes through this, its backup reads it.

The store's writers hand every change to their directories to `ReplicationSource.emit` (the
journal's `Tap`, journal/storeio.py): one REPLICA_OPS frame per journal batch, numbered by a
stream position, sent in order to the one backup. A batch's confirmations wait, beside the
local disk, for the backup's acknowledgement of its position (`after_acked`); frames are
pipelined, so this costs a round trip per batch, not per message, and the next batch is
written while the backup works on this one.

A backup that connects is synced first (`BackupStream.sync`): under each journal's writer
thread, between two batches, the stream starts queueing that directory's operations for it and
every file of the directory is opened; then the files are copied through those descriptors
while the journal goes on, and the queued operations follow. Replaying them over the copies is
exact: a copy holds each byte as it was at the snapshot or as a later operation made it, and
those operations come again, in order, with the same bytes at the same offsets; renames and
removals after the snapshot find the files under the names they had then.

No write waits for the sync (decision 0036): after the copy the stream goes live but
confirmations do not wait for the backup yet; it catches up (applies, syncs and acknowledges
what was queued, then what came meanwhile) while the primary confirms on its own disk. Only
when a round of catching up is short are confirmations gated on its acknowledgements, and it is
told where the store stands (REPLICA_SYNC_DONE); it answers REPLICA_SYNCED when the whole store
up to there is on its disk: only then is it in sync (and may take over).

A backup that goes, or that has not acknowledged within `call-timeout`, is dropped: the batches
waiting for it are confirmed, and the primary carries on alone (logged).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ..config import BrokerConfig
from ..errors import IllegalState, InvalidArgument, TandemError, Unauthorized
from ..protocol import native as p
from ..protocol.fileops import COPY, KINDS, FileOp
from ..store.records import STORE_FORMAT

log = logging.getLogger("tandem.ha")

CHUNK = 1 << 20  # bytes per frame of the initial copy
QUEUE_LIMIT = 512 << 20  # bytes of operations held for a syncing backup before it is dropped
CAUGHT_UP = 0.02  # s: a round of catching up this short leaves little for the first gated batch
CATCH_UP_ROUNDS = 20  # ... or at most this many rounds: the backup keeps up, if slowly


class DirectoryWriter(Protocol):
    """The one thread that changes a store directory (a journal's writer, the page writer): a
    backup's sync lists the directory on it, between two of its batches."""

    @property
    def directory(self) -> Path: ...

    def on_writer(self, fn: Callable[[], None]) -> asyncio.Future[None]: ...


class Link(Protocol):
    """The connection a backup replicates over (server/native.py's NativeConnection)."""

    peer: str
    closed: bool
    writable: bool
    replica: Any

    def write(self, data: bytes | bytearray) -> None: ...

    def write_now(self, data: bytes | bytearray) -> None:
        """Write at once, after what is buffered: a frame confirmations wait for goes out now,
        not at the end of the loop's next pass."""

    def write_from_threads(self) -> Callable[[bytes | bytearray], None] | None:
        """From now on every write goes out in order through a function any thread may call
        (None: it cannot, the loop writes)."""

    def send(self, packet: p.Packet) -> None: ...

    def close(self) -> None: ...

    async def drained(self) -> None: ...


def check_backup(cfg: BrokerConfig, pkt: p.ReplicaStart) -> None:
    """The cluster pair, and the group when the backup names one (raises, and says why)."""
    import hmac

    def same(a: str, b: str) -> bool:
        return hmac.compare_digest(a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass"))

    if not (same(cfg.cluster_user, pkt.user) & same(cfg.cluster_password, pkt.password)):
        raise Unauthorized("replication refused: wrong cluster-user or cluster-password")
    if pkt.group_name is not None and pkt.group_name != cfg.group_name:
        raise InvalidArgument(
            f"replication refused: the backup's group-name {pkt.group_name!r} is not this primary's {cfg.group_name!r}"
        )
    if pkt.store_format < STORE_FORMAT:
        raise InvalidArgument(
            f"replication refused: the backup reads store format {pkt.store_format}, this primary writes "
            f"{STORE_FORMAT} (page records holding runs of messages, decision 0086), which it would drop "
            "on taking over: upgrade the backup to this primary's version"
        )


class BackupStream:
    """One backup: its connection, what it has acknowledged, how far its sync is."""

    def __init__(self, source: ReplicationSource, link: Link, connector: str) -> None:
        self.source = source
        self.link = link
        self.connector = connector
        self.kinds: set[str] = set()  # directories whose operations go to it (guarded by the source's lock)
        self.queue: list[bytes | bytearray] | None = []  # frames held while the files are copied
        self.queued_bytes = 0
        self.overflowed = False
        self.gating = False  # confirmations wait for its acknowledgements
        self.floor = 0  # ... of positions above this one
        self.acked = 0
        self.last = 0  # the position of the last frame made for it (guarded by the source's lock)
        self.acks = asyncio.Event()  # set at each acknowledgement (the catch-up waits on it)
        self.synced = False
        self.wants_failback = False  # asked before its sync task saw REPLICA_SYNCED (same read)
        self.total = 0
        self.copied = 0
        self.sent_at: deque[tuple[int, float]] = deque()  # gated positions sent, not acknowledged yet
        # Replication lag in bytes (/metrics): the stream's bytes made for it, and those it acknowledged,
        # from (position, bytes made up to it) per frame (written per batch, popped per acknowledgement).
        self.sent_bytes = 0
        self.acked_bytes = 0
        self._marks: deque[tuple[int, int]] = deque()
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self.closed = False  # set under the source's lock
        self.files: list[tuple[str, str, int, int]] = []  # opened for the copy: kind, name, fd, size
        # Frames written from the journals' writer threads (under the source's lock) rather than
        # handed to the loop: the backup has them a loop pass sooner (decision 0042).
        self.direct: Callable[[bytes | bytearray], None] | None = None

    # -------------------------------------------------------- from the link
    def on_ack(self, position: int) -> None:
        if position > self.acked:
            self.acked = position
            self.acks.set()
            sent = self.sent_at
            while sent and sent[0][0] <= position:
                sent.popleft()
            marks = self._marks
            while marks and marks[0][0] <= position:
                self.acked_bytes = marks.popleft()[1]
            self.source._acked(self, position)

    def on_synced(self, position: int) -> None:
        if not self.done.done():
            self.done.set_result(position)

    def on_failback(self) -> None:
        self.source.failback(self)

    def link_closed(self) -> None:
        self.source.drop(self, "its connection closed", tell=False)

    # ------------------------------------------------------- the stream
    def deliver(self, position: int, frame: bytes | bytearray) -> None:
        """A frame the stream made for this backup: held while syncing, sent otherwise. On the
        loop, or with `direct` on a writer thread under the source's lock."""
        if self.closed:
            return
        self.sent_bytes += len(frame)
        self._marks.append((position, self.sent_bytes))
        if self.queue is not None:
            self.queue.append(frame)
            self.queued_bytes += len(frame)
            if self.queued_bytes > QUEUE_LIMIT and not self.overflowed:
                self.overflowed = True
                why = f"more than {QUEUE_LIMIT >> 20} MiB written while its sync ran"
                self.source.on_loop(self.source.drop, self, why)
            return
        if self.gating and position > self.floor:
            self.sent_at.append((position, time.monotonic()))
        if self.direct is not None:
            self.direct(frame)
        else:
            self.link.write_now(frame)

    def switch(self) -> None:
        """(Loop; under the source's lock with `direct`) the copy is sent: send what was held;
        from now on frames go out as they come."""
        if self.closed or self.queue is None:
            return
        for frame in self.queue:
            self.link.write(frame)
        self.queue = None
        self.queued_bytes = 0

    def sync_done(self, floor: int) -> None:
        """(Loop, or under the source's lock with `direct`; after every frame up to `floor`) say
        where the store stands."""
        if not self.closed:
            self.link.send(p.ReplicaSyncDone(floor))

    async def _catch_up(self, timeout: float) -> None:
        """Until the backup has acknowledged what was queued during the copy, and a round of
        catching up on what came meanwhile is short: nothing waits for it while it does."""
        for _ in range(CATCH_UP_ROUNDS):
            target = self.last
            t0 = time.monotonic()
            while self.acked < target:
                self.acks.clear()
                await asyncio.wait_for(self.acks.wait(), timeout)
                self._check_open()
            if time.monotonic() - t0 < CAUGHT_UP:
                return

    async def sync(self, writers: list[DirectoryWriter], data_dir: Path, timeout: float) -> None:
        """Copy every store file, then stream; done when the backup says it holds it all on disk."""
        try:
            by_kind = {j.directory.name: j for j in writers}
            for kind in KINDS:
                j = by_kind.get(kind)
                if j is not None:
                    # The journals' and the page writer's: listed between two of its batches, never
                    # between a change it made (a page transaction's file renamed at its commit) and
                    # its hand-over to the stream (test_replication_confirm_order.py).
                    await asyncio.wait_for(j.on_writer(partial(self._begin, j.directory)), timeout)
                    self._check_open()
                else:
                    # No writer thread: `large-messages/`, changed on the loop only (as this runs),
                    # each change emitted as it is made.
                    self._begin(data_dir / kind)
            files = self.files
            self.total = sum(f[3] for f in files)
            self.link.send(p.ReplicaSyncStart(len(files), self.total))
            log.info("backup %s: syncing %d files, %d bytes", self.connector, len(files), self.total)
            while files:
                kind, name, fd, size = files[0]
                await self._copy(kind, name, fd, size)
                files.pop(0)
                os.close(fd)
            self.source._go_live(self)
            await self._catch_up(timeout)
            floor = self.source._start_gating(self)
            position = await asyncio.wait_for(asyncio.shield(self.done), timeout)
            if position != floor:
                raise IllegalState(f"the backup reported in sync at {position}, not {floor}")
            self.synced = True
            log.warning("backup %s is in sync: replicating", self.connector)
            if self.wants_failback:
                self.source.failback(self)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            self.source.drop(self, f"the initial sync did not complete within {timeout:.0f} s")
        except (TandemError, OSError) as exc:
            self.source.drop(self, f"the initial sync failed: {exc}")
        finally:
            self._close_files()

    def _close_files(self) -> None:
        with self.source._lock:
            files, self.files = self.files, []
        for _k, _n, fd, _s in files:
            os.close(fd)

    def _check_open(self) -> None:
        """After an await: a backup dropped meanwhile gets nothing more (a cancellation can be lost
        by `wait_for` when its awaitable finished at the same moment)."""
        if self.closed:
            raise asyncio.CancelledError

    def _begin(self, directory: Path) -> None:
        """(Under the directory's writer) queue its operations for this backup from now on, and
        open every file it has: what the copy reads, whatever happens to the names later."""
        kind = directory.name
        lock = self.source._lock
        with lock:
            if self.closed:
                return
            self.kinds.add(kind)
        out: list[tuple[str, str, int, int]] = []
        if directory.is_dir():
            for path in sorted(directory.iterdir()):
                try:
                    fd = os.open(path, os.O_RDONLY)
                except (FileNotFoundError, IsADirectoryError):
                    continue
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    os.close(fd)
                    continue
                out.append((kind, path.name, fd, st.st_size))
        if not self._keep(out):  # dropped meanwhile: nobody copies these
            for _k, _n, fd, _s in out:
                os.close(fd)

    def _keep(self, files: list[tuple[str, str, int, int]]) -> bool:
        with self.source._lock:
            if self.closed:
                return False
            self.files.extend(files)
            return True

    async def _copy(self, kind: str, name: str, fd: int, size: int) -> None:
        off = 0
        while True:
            data = await asyncio.to_thread(os.pread, fd, min(CHUNK, size - off), off) if off < size else b""
            self._check_open()
            self.link.write(p.encode_ops(0, kind, [FileOp(COPY, name, off, data)]))
            off += len(data)
            self.copied += len(data)
            if not self.link.writable:
                await asyncio.wait_for(self.link.drained(), self.source.cfg.initial_replication_sync_timeout / 1000)
                self._check_open()
            if not data or off >= size:
                return

    def lag(self) -> tuple[int, int]:
        """Stream records and bytes made for this backup that it has not acknowledged yet."""
        return max(self.last - self.acked, 0), max(self.sent_bytes - self.acked_bytes, 0)

    def state(self) -> str:
        if self.synced:
            return "in-sync"
        pct = 100 * self.copied // self.total if self.total else 0
        return f"syncing {min(pct, 99)}%"


class ReplicationSource:
    """The stream of one replicating primary's store (its journals' `Tap`)."""

    def __init__(self, cfg: BrokerConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._position = 0
        self.backup: BackupStream | None = None
        self._waiters: list[tuple[int, int, Callable[[], None]]] = []
        self._counter = itertools.count()
        self._watchdog: asyncio.Task[None] | None = None
        self.node_id = ""  # the node the primary serves: its backup takes it on
        self.activation_sequence: Callable[[], int] = lambda: -1  # the coordinated value now (-1: none)
        # With a coordinator: called (on the loop) when a backup is dropped; every confirmation
        # waits until `release()` (the sequence is bumped) or for ever (the lock is lost).
        self.on_alone: Callable[[], None] | None = None
        self._held = False
        self._closed = False  # close() ran: nothing is confirmed any more
        # Called (on the loop) when the backup, in sync, asks for the node back (a returning primary).
        self.on_failback: Callable[[str], None] | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._watchdog is None:
            self._watchdog = self._loop.create_task(self._watch(), name="replication-watchdog")

    # ------------------------------------------------------------------ tap
    def emit(self, kind: str, ops: list[FileOp]) -> int:
        with self._lock:
            b = self.backup
            loop = self._loop
            if self._held:  # no backup (dropped), confirmations wait for the coordinator
                self._position += 1
                return self._position
            if b is None or loop is None or kind not in b.kinds:
                return 0
            self._position += 1
            position = b.last = self._position
            # Under the lock: frames go out (or reach the loop) in position order, whichever thread made them.
            if b.direct is not None:
                b.deliver(position, p.encode_ops(position, kind, ops))
            else:
                loop.call_soon_threadsafe(b.deliver, position, p.encode_ops(position, kind, ops))
            return position if b.gating else 0

    def on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn` on the loop soon (from a writer thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(fn, *args)

    def after_acked(self, position: int, cb: Callable[[], None]) -> None:
        b = self.backup
        if self._closed:
            return
        if self._held:
            heapq.heappush(self._waiters, (position, next(self._counter), cb))
        elif b is None or not b.gating or position <= b.acked or position <= b.floor:
            cb()
        else:
            heapq.heappush(self._waiters, (position, next(self._counter), cb))

    def _acked(self, b: BackupStream, position: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= position:
            _pos, _n, cb = heapq.heappop(waiters)
            _call(cb)

    def _go_live(self, b: BackupStream) -> None:
        """The copy is sent: the frames held for `b` follow it, then each frame as it comes."""
        with self._lock:
            if b.direct is not None:
                b.switch()
            else:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(b.switch)  # after every frame delivered so far

    def _start_gating(self, b: BackupStream) -> int:
        """From the next position on, confirmations wait for this backup; returns the last one that does not."""
        with self._lock:
            b.gating = True
            b.floor = self._position
            if b.direct is not None:
                b.sync_done(b.floor)
            else:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(b.sync_done, b.floor)  # after every frame up to the floor
            return b.floor

    # -------------------------------------------------------------- backups
    def accept(self, link: Link, pkt: p.ReplicaStart, writers: list[DirectoryWriter], data_dir: Path) -> None:
        """A backup asks to replicate: check it, take it on, and start its sync."""
        try:
            check_backup(self.cfg, pkt)
            if self._held:
                raise IllegalState("replication refused: the primary is recording that it carries on alone; retry")
            if self.backup is not None and not self.backup.closed:
                raise IllegalState(f"replication refused: this primary already has a backup ({self.backup.connector})")
        except TandemError as exc:
            log.warning("backup at %s (%s) refused: %s", link.peer, pkt.connector, exc.message)
            raise
        b = BackupStream(self, link, pkt.connector)
        link.replica = b
        b.direct = link.write_from_threads()
        with self._lock:
            self.backup = b
        # No bump is under way (refused above): the value includes every earlier drop, none of this link.
        link.send(p.ReplicaAccept(self.node_id, self.cfg.backup_fsync, self.activation_sequence()))
        timeout = self.cfg.initial_replication_sync_timeout / 1000
        b.task = asyncio.get_running_loop().create_task(b.sync(writers, data_dir, timeout), name="replication-sync")
        log.warning("backup %s (from %s) connected: initial sync", pkt.connector, link.peer)

    def drop(self, b: BackupStream, reason: str, tell: bool = True) -> None:
        """Stop replicating to `b`: whatever waited for it is confirmed, the primary goes on alone."""
        with self._lock:
            if b.closed:
                return
            b.closed = True
            if self.backup is b:
                self.backup = None
            if self.on_alone is not None:
                self._held = True
        was = b.state()
        if self._held:
            assert self.on_alone is not None
            self.on_alone()
        else:
            self._release_waiters()
        if b.task is not None and b.task is not asyncio.current_task():
            b.task.cancel()
        if not b.done.done():
            b.done.cancel()
        if tell and not b.link.closed:
            b.link.send(p.ReplicaStop(False, reason))
            b.link.close()
        log.warning("backup %s dropped (%s, was %s): carrying on without a backup", b.connector, reason, was)

    def failback(self, b: BackupStream) -> None:
        """The backup asks to take the node back: only one in sync may (it has every confirmed write)."""
        if b.closed or b is not self.backup:
            return
        if not b.synced:
            b.wants_failback = True  # it says it is in sync; the sync task has not seen it yet
        elif self.on_failback is not None:
            self.on_failback(b.connector)

    def in_sync_with(self, connector: str) -> bool:
        """True while the backup at `connector` is attached and in sync (may take the node over)."""
        b = self.backup
        return b is not None and not b.closed and b.synced and b.connector == connector

    def release(self) -> None:
        """The coordinator recorded that this primary carries on alone: confirm what waited."""
        with self._lock:
            self._held = False
        self._release_waiters()

    def _release_waiters(self) -> None:
        while self._waiters:
            _pos, _n, cb = heapq.heappop(self._waiters)
            _call(cb)

    def close(self, failover: bool) -> None:
        """The primary stops: tell the backup (it takes over only when in sync), and stop the watchdog."""
        with self._lock:
            b = self.backup
            self.backup = None
            if b is not None:
                if b.closed:
                    b = None
                else:
                    b.closed = True
        if b is not None:
            if not b.link.closed:
                b.link.send(p.ReplicaStop(failover, "the primary is stopping"))
                b.link.close()
            if b.task is not None:
                b.task.cancel()
        # The server has stopped serving and closed its store: what still waits was acknowledged
        # by no backup, so it is confirmed to nobody. (Run, it would act on the closed store: a
        # paged commit's journal records, chaos seed 1127302.) The same for anything asked later.
        self._closed = True
        self._waiters.clear()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    async def _watch(self) -> None:
        """Drop a backup that has not acknowledged a position within call-timeout."""
        limit = self.cfg.call_timeout / 1000
        while True:
            await asyncio.sleep(min(limit / 4, 1.0))
            b = self.backup
            try:
                oldest = b.sent_at[0][1] if b is not None else None
            except IndexError:  # acknowledged meanwhile (writer threads append, the loop pops)
                oldest = None
            if b is not None and oldest is not None and time.monotonic() - oldest > limit:
                self.drop(b, f"no acknowledgement within call-timeout ({self.cfg.call_timeout} ms)")

    def state(self) -> str:
        b = self.backup
        return b.state() if b is not None and not b.closed else "unreplicated"

    def lag(self) -> dict[str, Any] | None:
        """How far the backup is behind: frames sent and not acknowledged yet, their bytes, how
        long the oldest of those waiting for its acknowledgement has waited (s), and the bytes
        streamed to it so far. None: no backup."""
        b = self.backup
        if b is None or b.closed:
            return None
        records, nbytes = b.lag()
        oldest = b.sent_at[0][1] if b.sent_at else None
        return {
            "records": records,
            "bytes": nbytes,
            "oldest_unacknowledged_s": round(time.monotonic() - oldest, 3) if oldest is not None else 0.0,
            "streamed_bytes": b.sent_bytes,
        }

    @property
    def peer(self) -> str | None:
        b = self.backup
        return b.connector if b is not None and not b.closed else None


def _call(cb: Callable[[], None]) -> None:
    try:
        cb()
    except Exception:
        log.exception("replication callback failed")
