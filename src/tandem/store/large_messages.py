"""Large-message bodies: one file each under `large-messages/`, never held whole in memory.

A body arrives in chunks (`LargeUpload`): they go to `<id>.part` as they come, through the
store's StoreIO so a replicating primary's backup gets them too. Complete, the file is synced
and renamed to `<id>.msg`; only then is the message routed, and its journal record (which names
the file and its size) written. So a record always finds its whole file, and a crash leaves at
worst a `.part` or an unrecorded `.msg`, both removed at the next start (`clean`).

A file lives while a journal record names it or a message object holds it (a `LargeBody`): the
last of the two to go removes it, after the record's deletion is on disk.

An I/O error creating, writing, syncing or renaming a body's file is a storage failure like a
journal's (`fail`): the broker stops, and its sender is told IO_ERROR (decision 0081).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from ..core.message import LargeBody
from ..errors import JournalIOError
from ..journal.faults import Faults
from ..journal.storeio import StoreIO, Tap

log = logging.getLogger("tandem.store")

DIRECTORY = "large-messages"
SYNC_EVERY = 8 << 20  # bytes written between background syncs (bounds the dirty pages of one upload)
FAULTS_PREFIX = "tandem-large"  # the fault seam's rules for these files (journal/faults.py)


def file_name(message_id: int) -> str:
    return f"{message_id}.msg"


class LargeMessageStore:
    """The `large-messages/` directory of one broker (used on its event loop only)."""

    def __init__(
        self,
        directory: Path,
        tap: Tap | None = None,
        after_durable: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.io = StoreIO(self.directory, tap)
        self._after_durable = after_durable  # the journal's: a record's deletion is on disk
        self.records: dict[int, str] = {}  # journal record id -> the file it names
        self._recorded: dict[str, int] = {}  # file -> live records naming it
        self._held: dict[str, int] = {}  # file -> LargeBody objects alive
        # False until the store is ours (`start`): a backup following a store it does not own yet
        # (store/follower.py) counts records and bodies but never removes a file.
        self.open = False
        self.removed = 0  # files removed since start (tests and stats)
        self.faults = Faults.from_env(FAULTS_PREFIX)  # tests only: create, write, sync, rename, recycle
        # The broker's storage failure (JournalStorage sets it): None, an error fails the one upload.
        self.on_failure: Callable[[BaseException], None] | None = None
        self.failed: BaseException | None = None

    def fail(self, exc: OSError) -> JournalIOError:
        """An upload's file could not be stored: the broker stops as for a failed journal (once,
        just after the sender is answered); what to answer its sender."""
        code = exc.errno
        what = f"{errno.errorcode[code]} {exc}" if code is not None and code in errno.errorcode else str(exc)
        log.error("cannot store a large message: %s", what)
        if self.on_failure is not None and self.failed is None:
            self.failed = exc
            try:
                asyncio.get_running_loop().call_soon(self.on_failure, exc)
            except RuntimeError:  # no loop (a test of the store alone)
                self.on_failure(exc)
        return JournalIOError(f"cannot store a large message: {what}")

    def hit(self, stage: str) -> None:
        if self.faults is not None:
            self.faults.hit(stage)

    def set_tap(self, tap: Tap | None) -> None:
        self.io = StoreIO(self.directory, tap)

    # ------------------------------------------------------------- bodies
    def body(self, name: str, size: int, compressed: bool) -> LargeBody:
        """The in-memory handle of a complete file (what a Message carries)."""
        self._held[name] = self._held.get(name, 0) + 1
        return LargeBody(name, size, compressed, self._released)

    def _released(self, name: str) -> None:
        """A LargeBody was freed (its message is gone from every queue, or the broker stops)."""
        n = self._held.get(name, 0) - 1
        if n > 0:
            self._held[name] = n
            return
        self._held.pop(name, None)
        if self.open and not self._recorded.get(name):
            self._remove_later(name)

    def recorded(self, record_id: int, name: str) -> None:
        """A journal record (written now, or found at load) names `name`."""
        self.records[record_id] = name
        self._recorded[name] = self._recorded.get(name, 0) + 1

    def record_deleted(self, record_id: int) -> None:
        name = self.records.pop(record_id, None)
        if name is None:
            return
        n = self._recorded.get(name, 0) - 1
        if n > 0:
            self._recorded[name] = n
            return
        self._recorded.pop(name, None)
        if self.open and name not in self._held:
            self._remove_later(name)

    def _remove_later(self, name: str) -> None:
        if self._after_durable is None:
            self._remove(name)
        else:
            self._after_durable(lambda: self._remove(name))

    def _remove(self, name: str) -> None:
        if not self.open or name in self._held or self._recorded.get(name):
            return  # taken up again meanwhile, or the broker stopped: the next start decides
        try:
            self.hit("recycle")
            self.io.unlink(name, missing_ok=True)
            self.io.flush()
            self.removed += 1
        except OSError as exc:
            log.warning("cannot remove large message file %s: %s", name, exc)

    def path(self, name: str) -> Path:
        return self.directory / name

    # ------------------------------------------------------------ uploads
    def upload(self, message_id: int) -> LargeUpload:
        if self.failed is not None:
            raise JournalIOError(f"large message files have failed: {self.failed}")
        return LargeUpload(self, message_id)

    # ------------------------------------------------------------- start-up
    def complete(self, name: str, size: int) -> bool:
        """Whether `name` is there whole (`size` bytes): a record without its whole file is never delivered."""
        try:
            return os.stat(self.directory / name).st_size == size
        except OSError:
            return False

    def clean(self) -> int:
        """Remove every file no journal record names (a `.part` always): what a crash left behind."""
        n = 0
        for path in sorted(self.directory.iterdir()):
            if path.name in self._recorded or not path.is_file():
                continue
            log.warning("removing large message file %s: no journal record names it (left by a crash)", path.name)
            self.io.unlink(path.name, missing_ok=True)
            n += 1
        self.io.flush()
        return n

    def start(self) -> None:
        self.open = True

    def close(self) -> None:
        self.open = False


class LargeUpload:
    """A body being received: chunks appended to `<id>.part`; `finish` makes it `<id>.msg`."""

    __slots__ = ("_error", "_fd", "_syncing", "_unsynced", "message_id", "name", "part", "renamed", "size", "store")

    def __init__(self, store: LargeMessageStore, message_id: int) -> None:
        self.store = store
        self.message_id = message_id
        self.name = file_name(message_id)
        self.part = f"{message_id}.part"
        self.size = 0
        self._unsynced = 0
        self._syncing = threading.Lock()  # held while a background sync runs
        self._error: OSError | None = None  # a background sync's: the final sync raises it
        self.renamed = False  # `part` is `name` now (`rename`)
        store.hit("create")
        self._fd: int | None = store.io.create_empty(self.part)

    def write(self, data: bytes) -> None:
        fd = self._fd
        assert fd is not None
        io = self.store.io
        self.store.hit("write")
        io.write(fd, self.part, data, self.size)
        io.flush()
        self.size += len(data)
        self._unsynced += len(data)
        if self._unsynced >= SYNC_EVERY and not self._syncing.locked():
            self._unsynced = 0
            self._background_sync(fd)

    def _background_sync(self, fd: int) -> None:
        """Sync what is written so far off the loop, so the final sync has little left to do.

        Its error is kept for the final sync to raise: the kernel reports a failed writeback once
        per open file, and the duplicate descriptor shares the upload's, so the final fdatasync
        could otherwise succeed over pages the disk never took."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._syncing.acquire()
        dup = os.dup(fd)  # this sync's own descriptor: the upload may close its own meanwhile

        def sync() -> None:
            try:
                self.store.hit("sync")
                os.fdatasync(dup)
            except OSError as exc:
                self._error = self._error or exc
            finally:
                os.close(dup)
                self._syncing.release()

        try:
            loop.run_in_executor(None, sync)
        except RuntimeError:  # the executor is shut down (the broker stops): the final sync does it all
            os.close(dup)
            self._syncing.release()

    def finish(self, compressed: bool) -> LargeBody:
        """The body is complete: synced, renamed into place, the directory synced; the handle a
        Message carries. All on the calling thread; the native server runs the two syncs on a
        thread of their own instead (server/large.py), in this order."""
        self.sync_body()
        self.rename()
        self.sync_dir()
        return self.body(compressed)

    def sync_body(self) -> None:
        """(Any thread: it waits for the disk) the body's bytes on disk; its descriptor closed."""
        fd, self._fd = self._fd, None
        assert fd is not None
        try:
            with self._syncing:  # a background sync done first, its error known
                pass
            if self._error is not None:
                raise self._error
            self.store.hit("sync")
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def rename(self) -> None:
        """(The store's loop) `<id>.part` becomes `<id>.msg`, here and, through the replication
        stream, on a backup: on the loop, so a backup's initial sync lists the directory either
        before the rename or after it, never between the rename and its operation."""
        self.store.hit("rename")
        self.store.io.rename(self.part, self.name)
        self.renamed = True
        self.store.io.flush()

    def sync_dir(self) -> None:
        """(Any thread) the rename on disk."""
        self.store.hit("sync")
        self.store.io.sync_dir()

    def body(self, compressed: bool) -> LargeBody:
        """(The store's loop, once synced and renamed) the handle a Message carries."""
        return self.store.body(self.name, self.size, compressed)

    def discard(self) -> None:
        """Give the upload up (aborted, failed, or its connection gone): its file goes."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        name = self.name if self.renamed else self.part
        try:
            self.store.hit("recycle")
            self.store.io.unlink(name, missing_ok=True)
            self.store.io.flush()
        except OSError as exc:
            log.warning("cannot remove large message file %s: %s", name, exc)
