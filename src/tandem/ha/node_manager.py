"""Node managers: who may be active on a data directory.

Two implementations behind one interface: `FileNodeManager` over `server.lock`
(byte-range OFD locks, so brokers in one process exclude each other too) and
`InMemoryNodeManager` for unit tests. Waiting is polling with a short period:
a lock wait must be cancellable, and a thread blocked in fcntl cannot be.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

from .lockfile import FAILBACK, LIVE, NOT_STARTED, PAUSED, LockFile

__all__ = [
    "FAILBACK",
    "LIVE",
    "NOT_STARTED",
    "PAUSED",
    "FileNodeManager",
    "InMemoryNodeManager",
    "NodeManager",
    "SharedStore",
]


class NodeManager(ABC):
    """Locks and state of one shared store, seen by one server."""

    node_id: str

    @abstractmethod
    def try_live(self) -> bool: ...

    @abstractmethod
    def release_live(self) -> None: ...

    @abstractmethod
    def try_backup(self) -> bool: ...

    @abstractmethod
    def release_backup(self) -> None: ...

    @abstractmethod
    def live_held_elsewhere(self) -> bool:
        """True if another server holds the live lock right now."""

    @abstractmethod
    def state(self) -> bytes: ...

    @abstractmethod
    def set_state(self, state: bytes) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    async def wait_live(self, poll: float) -> None:
        while not self.try_live():  # noqa: ASYNC110 - a file lock has no event to await
            await asyncio.sleep(poll)

    async def wait_backup(self, poll: float) -> None:
        """Take the backup lock, but never while a primary is asking for failback."""
        while True:
            if self.state() != FAILBACK and self.try_backup():
                if self.state() != FAILBACK:
                    return
                self.release_backup()
            await asyncio.sleep(poll)


class FileNodeManager(NodeManager):
    def __init__(self, directory: Path) -> None:
        self._lock = LockFile(directory)
        self.node_id = self._lock.node_id()
        self.has_live = False
        self.has_backup = False

    def try_live(self) -> bool:
        if not self.has_live:
            self.has_live = self._lock.try_lock_live()
        return self.has_live

    def release_live(self) -> None:
        if self.has_live:
            self._lock.unlock_live()
            self.has_live = False

    def try_backup(self) -> bool:
        if not self.has_backup:
            self.has_backup = self._lock.try_lock_backup()
        return self.has_backup

    def release_backup(self) -> None:
        if self.has_backup:
            self._lock.unlock_backup()
            self.has_backup = False

    def live_held_elsewhere(self) -> bool:
        return not self.has_live and self._lock.is_locked(1)

    def state(self) -> bytes:
        return self._lock.read_state()

    def set_state(self, state: bytes) -> None:
        self._lock.write_state(state)

    def close(self) -> None:
        self._lock.close()  # releases any lock this description holds


class SharedStore:
    """What a shared data directory's lock file holds, in memory."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.live: object | None = None
        self.backup: object | None = None
        self.state = NOT_STARTED
        self.node_id = str(uuid.uuid4())


class InMemoryNodeManager(NodeManager):
    """The same protocol without files: servers given one `SharedStore` share its locks."""

    def __init__(self, store: SharedStore) -> None:
        self._store = store
        self.node_id = store.node_id

    def _take(self, attr: str) -> bool:
        with self._store.mutex:
            holder = getattr(self._store, attr)
            if holder is None:
                setattr(self._store, attr, self)
                return True
            return holder is self

    def _give(self, attr: str) -> None:
        with self._store.mutex:
            if getattr(self._store, attr) is self:
                setattr(self._store, attr, None)

    def try_live(self) -> bool:
        return self._take("live")

    def release_live(self) -> None:
        self._give("live")

    def try_backup(self) -> bool:
        return self._take("backup")

    def release_backup(self) -> None:
        self._give("backup")

    def live_held_elsewhere(self) -> bool:
        holder = self._store.live
        return holder is not None and holder is not self

    def state(self) -> bytes:
        return self._store.state

    def set_state(self, state: bytes) -> None:
        self._store.state = state

    def close(self) -> None:
        """Like a process dying: every lock this server holds goes."""
        self.release_live()
        self.release_backup()
