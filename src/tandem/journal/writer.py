"""The journal's single I/O thread: writes each batch, syncs once, then reports back to the loop.

All decisions (which file, which offset, what to recycle) are made on the event
loop; this thread only performs them in order, so ordering is trivial.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from . import files as jf
from .faults import Faults
from .histogram import JournalMetrics
from .storeio import StoreIO

log = logging.getLogger("tandem.journal")

_RWF_DSYNC: int = getattr(os, "RWF_DSYNC", 0)
_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 16


@dataclass
class Batch:
    """Writes for one group commit: (file key, offset, bytes) in order, then recycles."""

    writes: list[tuple[int, int, bytes]] = field(default_factory=list)
    new_files: dict[int, int] = field(default_factory=dict)  # key -> size, created before writing
    recycle: list[tuple[int, Path, int]] = field(default_factory=list)  # (key, path, size)
    callbacks: list[Callable[[], None]] = field(default_factory=list)
    nbytes: int = 0
    position: int = 0  # where a replication stream carries it (0: no backup to wait for)


Job = Batch | Callable[[], None] | None
_T = TypeVar("_T")


def loop_job(loop: asyncio.AbstractEventLoop, fn: Callable[[], _T]) -> tuple[asyncio.Future[_T], Callable[[], None]]:
    """`fn` made a job for a writer thread, and the future on `loop` that gets its result or
    its error (a store's `on_writer`: work done between two of its batches)."""
    fut: asyncio.Future[_T] = loop.create_future()

    def settle(result: _T | None, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)  # type: ignore[arg-type]

    def job() -> None:
        try:
            result = fn()
        except Exception as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    return fut, job


class Writer:
    """Owns every file descriptor of one journal directory."""

    def __init__(
        self,
        directory: Path,
        prefix: str,
        file_size: int,
        pool_files: int,
        datasync: bool,
        free: list[Path],
        done: Callable[[Batch, BaseException | None], None],
        failed: Callable[[BaseException], None] | None = None,
        faults: Faults | None = None,
        io: StoreIO | None = None,
        metrics: JournalMetrics | None = None,
    ) -> None:
        self.directory = directory
        self.metrics = metrics or JournalMetrics()  # per batch, read by /metrics (decision 0068)
        self.io = io or StoreIO(directory)
        self.prefix = prefix
        self.file_size = file_size
        self.pool_files = pool_files
        self.datasync = datasync
        self.free = list(free)
        self._done = done
        self._failed = failed or (lambda exc: None)
        self.faults = faults
        self.dsync = datasync and _RWF_DSYNC != 0  # off for good once the kernel refuses it
        self._fds: dict[int, int] = {}
        self._paths: dict[int, Path] = {}
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._free_counter = 0
        self.failed: BaseException | None = None

    # -- control (loop thread) -------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"journal-{self.prefix}", daemon=True)
        self._thread.start()

    def submit(self, job: Batch | Callable[[], None]) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        self.close_all()

    def adopt(self, key: int, path: Path) -> None:
        """Open an existing data file for appending (start-up, before start())."""
        self._fds[key] = os.open(path, os.O_RDWR)
        self._paths[key] = path

    def close_all(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._paths.clear()

    # -- thread ---------------------------------------------------------------
    def _run(self) -> None:
        # No name here holds a job while the thread waits for the next: an idle journal would
        # keep its last batch (every record of it) alive, and with it the allocator's memory
        # around those records (docs/decisions/0057).
        while self._job(self._jobs.get()):
            pass

    def _job(self, job: Job) -> bool:
        """Every batch is reported back, the failed ones with their error: after an I/O error at
        any stage nothing more is written, and every later batch fails with that same error, so
        no append waits for ever (the broker stops and a backup takes over). False: stop."""
        if job is None:
            return False
        if isinstance(job, Batch):
            if self.failed is None:
                try:
                    self.write_batch(job)
                except BaseException as exc:  # an I/O error is fatal to the journal
                    self.failed = exc
            self._done(job, self.failed)  # confirmations go out now; retiring dead files can wait
            if self.failed is not None:
                return True
            try:
                self.recycle(job)
                if not self.free and self.pool_files > 0 and self._jobs.empty():
                    self._spare()
                self.io.flush()
            except BaseException as exc:
                self._fail(exc)
        elif self.failed is None:
            try:
                job()
                self.io.flush()
            except BaseException as exc:
                self._fail(exc)
        return True

    def _fail(self, exc: BaseException) -> None:
        self.failed = exc
        self._failed(exc)

    def _hit(self, stage: str) -> None:
        if self.faults is not None:
            self.faults.hit(stage)

    def write_batch(self, batch: Batch) -> None:
        """Create, write and sync as the batch says (runs on the writer thread).

        Each run of adjacent writes is one `pwritev` that is also the sync (`RWF_DSYNC`, the
        per-write O_DSYNC of Linux): one system call, so this thread waits for the interpreter
        lock once per run instead of once after the write and again after the `fdatasync`;
        a busy event loop holds that lock for up to a switch interval each time.

        Recycling is a separate step (`recycle`), done after the batch is reported: the files it
        retires hold only dead records, so the batch's confirmations need not wait for it.

        A replicating store's batch goes to the backup before it is written here (its position
        noted on the batch), so that the backup's write and sync overlap this one: the batch's
        confirmations wait for both anyway."""
        for key, size in batch.new_files.items():
            self._open_new(key, size)
        runs = _runs(batch.writes)
        io = self.io
        if io.ops is not None:
            paths = self._paths
            for key, off, buffers in runs:
                io.note_write(paths[key].name, off, buffers)
        batch.position = io.flush()
        touched: list[int] = []
        t0 = time.perf_counter_ns()
        for key, off, buffers in runs:
            self._write_run(key, buffers, off, touched)
        for key in touched:  # without RWF_DSYNC (another OS, or refused): sync each file written
            self._hit("sync")
            os.fdatasync(self._fds[key])
        m = self.metrics
        m.sync_ns.observe(time.perf_counter_ns() - t0)
        m.batch_bytes.observe(batch.nbytes)

    def _write_run(self, key: int, buffers: list[bytes], offset: int, touched: list[int]) -> None:
        fd = self._fds[key]
        self._hit("write")
        if self.dsync:
            self._hit("sync")
            try:
                self._hit("dsync")
                written = os.pwritev(fd, buffers, offset, _RWF_DSYNC)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                # Decision 0015's fallback: a kernel or filesystem without per-write O_DSYNC.
                log.warning("journal %s: RWF_DSYNC refused (%s): writing and syncing separately", self.prefix, exc)
                self.dsync = False
                self._write_run(key, buffers, offset, touched)
                return
        else:
            written = os.pwritev(fd, buffers, offset)
            if self.datasync and key not in touched:
                touched.append(key)
        expected = sum(len(b) for b in buffers)
        if written != expected:  # a short write (full disk): finish it, then sync it
            data = b"".join(buffers)[written:]
            while data:
                n = os.pwrite(fd, data, offset + written)
                if n <= 0:
                    raise OSError(errno.EIO, f"journal write of {len(data)} bytes wrote nothing")
                written += n
                data = data[n:]
            if self.datasync:
                self._hit("sync")
                os.fdatasync(fd)

    def recycle(self, batch: Batch) -> None:
        for key, path, size in batch.recycle:
            self._recycle(key, path, size)

    def _open_new(self, key: int, size: int) -> None:
        io = self.io
        name = jf.data_name(self.prefix, key)
        fd = -1
        self._hit("create")
        while size == self.file_size and self.free:
            src = self.free.pop()
            if os.stat(src).st_size != size:  # left from another journal-file-size
                io.unlink(src.name)
                continue
            fd = io.open(src.name)
            io.write(fd, src.name, jf.header_bytes(key), 0)
            os.fdatasync(fd)
            self._hit("rename")
            io.rename(src.name, name)
            break
        if fd < 0:
            io.create(name, size, key)
            fd = io.open(name)
        io.sync_dir()
        self._fds[key] = fd
        self._paths[key] = self.directory / name

    def _recycle(self, key: int, path: Path, size: int) -> None:
        io = self.io
        self._hit("recycle")
        fd = self._fds.pop(key, None)
        self._paths.pop(key, None)
        if fd is None:
            fd = io.open(path.name)
        try:
            if size == self.file_size and len(self.free) < self.pool_files:
                # Retire the header first so the old records can never replay; it keeps the old key
                # so that a later start never hands the same key out again.
                io.write(fd, path.name, jf.header_bytes(key, jf.FREE_MAGIC), 0)
                os.fdatasync(fd)
                dst = self.directory / jf.free_name(self.prefix, self._next_free_number())
                self._hit("rename")
                io.rename(path.name, dst.name)
                self.free.append(dst)
            else:
                io.unlink(path.name)
        finally:
            os.close(fd)
        io.sync_dir()

    def _next_free_number(self) -> int:
        while True:
            self._free_counter += 1
            if not (self.directory / jf.free_name(self.prefix, self._free_counter)).exists():
                return self._free_counter

    def _spare(self) -> None:
        """Pre-create one pooled file while idle so a roll-over does not wait for zero-filling.

        It fails like any other step: a disk that cannot take a spare file cannot take the next
        roll-over either."""
        self._hit("create")
        dst = self.directory / jf.free_name(self.prefix, self._next_free_number())
        self.io.create(dst.name, self.file_size, None)
        self.io.sync_dir()
        self.free.append(dst)

    def forget(self, key: int) -> None:
        """Close a file's descriptor (it is about to be replaced by compaction)."""
        fd = self._fds.pop(key, None)
        self._paths.pop(key, None)
        if fd is not None:
            os.close(fd)


def _runs(writes: list[tuple[int, int, bytes]]) -> list[tuple[int, int, list[bytes]]]:
    """Adjacent writes into one file joined: (file key, offset, buffers), one `pwritev` each."""
    runs: list[tuple[int, int, list[bytes]]] = []
    last_key = -1
    pending: list[bytes] = []
    pending_off = pending_end = 0
    for key, off, data in writes:
        if key == last_key and off == pending_end and len(pending) < _IOV_MAX:
            pending.append(data)
            pending_end += len(data)
            continue
        if pending:
            runs.append((last_key, pending_off, pending))
        last_key, pending_off, pending = key, off, [data]
        pending_end = off + len(data)
    if pending:
        runs.append((last_key, pending_off, pending))
    return runs
