"""The one seam between a store's writers and its disk: every run-time change to a directory.

The journal's writer thread and its compactor change their directory only through a `StoreIO`:
create a file, write at an offset, rename, remove, put a small file (the writer makes the
batches' writes itself, announcing them with `note_write`). Locally that is the system call and
nothing more. Given a `Tap` (a replicating primary, ha/replication.py), it
also notes each change as a `FileOp` and hands them over in order at `flush()`: one hand-over
per journal batch. The backup's `Applier` performs the same operations on its own directory,
so its files are the primary's, byte for byte, whatever kind of file they are.

A `StoreIO` belongs to one thread (the writer, or one compaction run): the tap orders what
several of them hand over.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from ..protocol.fileops import COPY, CREATE, PUT, RENAME, UNLINK, WRITE, FileOp, problem
from . import files as jf
from .faults import Faults


class Tap(Protocol):
    """Where a replicating store's file operations go (ha/replication.py's source)."""

    def emit(self, kind: str, ops: list[FileOp]) -> int:
        """Take `ops` (any thread, in the order they were done); the stream position that
        carries them, or 0 when no backup needs to acknowledge them."""
        ...

    def after_acked(self, position: int, cb: Callable[[], None]) -> None:
        """(Event loop) run `cb` once the backup has what the stream carried up to `position`
        (at once when it has, or when no backup is to wait for)."""
        ...


class StoreIO:
    __slots__ = ("directory", "kind", "ops", "tap")

    def __init__(self, directory: Path, tap: Tap | None = None) -> None:
        self.directory = directory
        self.kind = directory.name
        self.tap = tap
        self.ops: list[FileOp] | None = [] if tap is not None else None

    def open(self, name: str) -> int:
        return os.open(self.directory / name, os.O_RDWR)

    def create(self, name: str, size: int, key: int | None) -> None:
        """A new pre-allocated file of zeros, with a header for `key` unless None (synced)."""
        jf.create_zeroed(self.directory / name, size, key)
        if self.ops is not None:
            self.ops.append(FileOp(CREATE, name, size, key=-1 if key is None else key))

    def create_empty(self, name: str) -> int:
        """A new empty file, opened for writing (not synced: its writer syncs it when it is
        complete, as a large message's body is); the backup creates it too."""
        fd = os.open(self.directory / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        if self.ops is not None:
            self.ops.append(FileOp(CREATE, name, 0, key=-1))
        return fd

    def note_write(self, name: str, offset: int, buffers: Sequence[bytes]) -> None:
        """A write the caller is about to make itself (the journal's batches: the backup gets them
        first, see Writer.write_batch); only noted, and only with a tap."""
        if self.ops is not None:
            self.ops.append(FileOp(WRITE, name, offset, buffers[0] if len(buffers) == 1 else b"".join(buffers)))

    def write(self, fd: int, name: str, data: bytes, offset: int) -> None:
        _pwrite_all(fd, data, offset)
        if self.ops is not None:
            self.ops.append(FileOp(WRITE, name, offset, data))

    def rename(self, src: str, dst: str) -> None:
        os.rename(self.directory / src, self.directory / dst)
        if self.ops is not None:
            self.ops.append(FileOp(RENAME, src, to=dst))

    def unlink(self, name: str, missing_ok: bool = False) -> None:
        try:
            os.unlink(self.directory / name)
        except FileNotFoundError:
            if not missing_ok:
                raise
        if self.ops is not None:
            self.ops.append(FileOp(UNLINK, name))

    def put(self, name: str, data: bytes) -> None:
        """A small file written whole: aside first, synced, then renamed into place."""
        _put(self.directory, name, data)
        if self.ops is not None:
            self.ops.append(FileOp(PUT, name, data=data))

    def sync_dir(self) -> None:
        jf.fsync_dir(self.directory)

    def flush(self) -> int:
        """Hand what was noted since the last flush to the tap; its stream position (0: none)."""
        ops = self.ops
        if not ops or self.tap is None:
            return 0
        self.ops = []
        return self.tap.emit(self.kind, ops)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.EIO, f"write of {len(view)} bytes wrote nothing")
        view = view[n:]
        offset += n


def _put(directory: Path, name: str, data: bytes) -> None:
    tmp = (directory / name).with_suffix(".tmp")  # as create_zeroed: a start-up clears these
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, directory / name)


class ReplicaError(Exception):
    """A stream operation that cannot apply: the replica is not the primary's any more."""


class Applier:
    """Applies a stream's file operations to a data directory (a backup's; one thread).

    `sync()` makes everything applied so far durable: the files written and the directories
    whose entries changed."""

    MAX_OPEN = 256

    def __init__(self, root: Path) -> None:
        self.root = root
        self._faults = Faults.from_env("replica")  # tests only (journal/faults.py)
        self._fds: dict[tuple[str, str], int] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._dirty_dirs: set[str] = set()
        self.bytes_written = 0

    def _dir(self, kind: str) -> Path:
        d = self.root / kind
        if not d.is_dir():
            d.mkdir(parents=True, exist_ok=True)
            self._dirty_dirs.add(".")
        return d

    def _fd(self, kind: str, name: str, create: bool) -> int:
        fd = self._fds.get((kind, name))
        if fd is None:
            if len(self._fds) >= self.MAX_OPEN:
                self.sync()
                self.close()
            flags = os.O_RDWR | (os.O_CREAT if create else 0)
            try:
                fd = os.open(self._dir(kind) / name, flags, 0o644)
            except FileNotFoundError:
                raise ReplicaError(f"{kind}/{name} is missing on the backup") from None
            self._fds[(kind, name)] = fd
            if create:
                self._dirty_dirs.add(kind)
        return fd

    def _forget(self, kind: str, name: str) -> None:
        fd = self._fds.pop((kind, name), None)
        self._dirty.discard((kind, name))
        if fd is not None:
            os.close(fd)

    def apply(self, kind: str, ops: list[FileOp]) -> None:
        for op in ops:
            why = problem(kind, op)
            if why is not None:
                raise ReplicaError(why)
            code = op.op
            if self._faults is not None:
                self._faults.hit("write")
            if code == WRITE or code == COPY:
                fd = self._fd(kind, op.name, create=code == COPY)
                _pwrite_all(fd, op.data, op.offset)
                self._dirty.add((kind, op.name))
                self.bytes_written += len(op.data)
            elif code == CREATE:
                self._forget(kind, op.name)
                jf.create_zeroed(self._dir(kind) / op.name, op.offset, None if op.key < 0 else op.key)
                self._dirty_dirs.add(kind)
            elif code == RENAME:
                d = self._dir(kind)
                try:
                    os.rename(d / op.name, d / op.to)
                except FileNotFoundError:
                    raise ReplicaError(f"{kind}/{op.name} is missing on the backup (rename)") from None
                self._forget(kind, op.to)
                moved = self._fds.pop((kind, op.name), None)
                if moved is not None:
                    self._fds[(kind, op.to)] = moved
                    if (kind, op.name) in self._dirty:
                        self._dirty.discard((kind, op.name))
                        self._dirty.add((kind, op.to))
                self._dirty_dirs.add(kind)
            elif code == UNLINK:
                self._forget(kind, op.name)
                (self._dir(kind) / op.name).unlink(missing_ok=True)
                self._dirty_dirs.add(kind)
            elif code == PUT:
                self._forget(kind, op.name)
                _put(self._dir(kind), op.name, op.data)
                self._dirty_dirs.add(kind)

    def sync(self) -> None:
        if self._faults is not None:
            self._faults.hit("sync")
        for key in self._dirty:
            os.fdatasync(self._fds[key])
        self._dirty.clear()
        for kind in self._dirty_dirs:
            jf.fsync_dir(self.root if kind == "." else self.root / kind)
        self._dirty_dirs.clear()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._dirty.clear()
