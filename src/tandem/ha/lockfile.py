"""`server.lock`: the node manager's file (layout from the shared-store failback design).

    byte 0      state: N not started, L live, P paused after a clean stop, F failback requested
    byte 1      live lock (byte-range lock, held by the active server)
    byte 2      backup lock (held by the backup first in line)
    bytes 3-18  node id (16 bytes, created on first start and kept)
    byte 19     primary lock (a lock only, past the file's end): held by a primary from its
                start until it has written L, so a failback request (F) stands only while
                the primary that wrote it is alive

Locks are Linux open-file-description (OFD) locks: they belong to an open file,
not to a process, so two brokers in one process exclude each other for real.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import uuid
from pathlib import Path

STATE_POS = 0
LIVE_POS = 1
BACKUP_POS = 2
ID_POS = 3
ID_LEN = 16
FILE_SIZE = ID_POS + ID_LEN
PRIMARY_POS = FILE_SIZE

NOT_STARTED = b"N"
LIVE = b"L"
PAUSED = b"P"
FAILBACK = b"F"

_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
_F_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)
_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_FLOCK = struct.Struct("hhqqi4x")


def _flock(kind: int, pos: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, pos, 1, 0)


class LockFile:
    """One open description of `server.lock`; each instance holds its own locks."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "server.lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size < FILE_SIZE:
            self._init_file()

    def _init_file(self) -> None:
        # Take the state byte lock while initialising so two starters do not race.
        self._lock(STATE_POS, wait=True)
        try:
            if os.fstat(self.fd).st_size < FILE_SIZE:
                os.pwrite(self.fd, NOT_STARTED + b"\0\0" + uuid.uuid4().bytes, 0)
                os.fsync(self.fd)
        finally:
            self._unlock(STATE_POS)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases every lock of this description
            self.fd = -1

    # ----------------------------------------------------------------- locks
    def _lock(self, pos: int, wait: bool) -> bool:
        try:
            fcntl.fcntl(self.fd, _F_OFD_SETLKW if wait else _F_OFD_SETLK, _flock(fcntl.F_WRLCK, pos))
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise

    def _unlock(self, pos: int) -> None:
        fcntl.fcntl(self.fd, _F_OFD_SETLK, _flock(fcntl.F_UNLCK, pos))

    def try_lock_live(self) -> bool:
        return self._lock(LIVE_POS, wait=False)

    def lock_live(self) -> None:
        self._lock(LIVE_POS, wait=True)

    def unlock_live(self) -> None:
        self._unlock(LIVE_POS)

    def try_lock_backup(self) -> bool:
        return self._lock(BACKUP_POS, wait=False)

    def unlock_backup(self) -> None:
        self._unlock(BACKUP_POS)

    def try_lock_primary(self) -> bool:
        return self._lock(PRIMARY_POS, wait=False)

    def unlock_primary(self) -> None:
        self._unlock(PRIMARY_POS)

    def live_lock_lost(self) -> str | None:
        """Why our live lock no longer guards the store (None while it does).

        The lock belongs to the file we opened: if that file was removed or replaced, a
        server opening `server.lock` now locks another file; on a network file system the
        server may also have given the lock to another client (then re-asserting it fails)."""
        try:
            on_disk = os.stat(self.path)
            mine = os.fstat(self.fd)
            if (on_disk.st_dev, on_disk.st_ino) != (mine.st_dev, mine.st_ino):
                return f"{self.path} was replaced by another file"
            if not self._lock(LIVE_POS, wait=False):  # a no-op for the holder
                return "another server holds the live lock"
        except FileNotFoundError:
            return f"{self.path} was removed"
        except OSError as exc:
            return f"{self.path} cannot be checked: {exc}"
        return None

    def is_locked(self, pos: int) -> bool:
        """True if another open description holds the lock at `pos`."""
        res = fcntl.fcntl(self.fd, _F_OFD_GETLK, _flock(fcntl.F_WRLCK, pos))
        kind = _FLOCK.unpack(res)[0]
        return bool(kind != fcntl.F_UNLCK)

    # ----------------------------------------------------------------- state
    def read_state(self) -> bytes:
        return os.pread(self.fd, 1, STATE_POS)

    def write_state(self, state: bytes) -> None:
        os.pwrite(self.fd, state, STATE_POS)
        os.fsync(self.fd)

    def write_node_id(self, node_id: str) -> None:
        os.pwrite(self.fd, uuid.UUID(node_id).bytes, ID_POS)
        os.fsync(self.fd)

    def node_id(self) -> str:
        return str(uuid.UUID(bytes=os.pread(self.fd, ID_LEN, ID_POS)))
