"""Node managers: who may be active on a data directory.

Two implementations behind one interface: `FileNodeManager` over `server.lock`
(byte-range OFD locks, so brokers in one process exclude each other too) and
`InMemoryNodeManager` for unit tests. Every operation is one non-blocking lock
or state access: the activations poll (a lock wait must be cancellable, and a
thread blocked in fcntl cannot be), and the pair's model test interleaves them.
"""

from __future__ import annotations

import threading
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

from .lockfile import FAILBACK, LIVE, LIVE_POS, NOT_STARTED, PAUSED, PRIMARY_POS, LockFile

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
    def try_primary(self) -> bool:
        """The primary lock: held by a primary from its start until it has written L."""

    @abstractmethod
    def release_primary(self) -> None: ...

    @abstractmethod
    def primary_waiting(self) -> bool:
        """True if another server holds the primary lock: a primary is alive and not yet live."""

    @abstractmethod
    def live_held_elsewhere(self) -> bool:
        """True if another server holds the live lock right now."""

    @abstractmethod
    def live_lock_lost(self) -> str | None:
        """Why the live lock we took no longer guards the store; None while it does."""

    @abstractmethod
    def state(self) -> bytes: ...

    @abstractmethod
    def set_state(self, state: bytes) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def set_node_id(self, node_id: str) -> None:
        """Serve another node id from now on (a replicating backup takes its primary's)."""


class FileNodeManager(NodeManager):
    def __init__(self, directory: Path) -> None:
        self._lock = LockFile(directory)
        self.node_id = self._lock.node_id()
        self.has_live = False
        self.has_backup = False
        self.has_primary = False

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

    def try_primary(self) -> bool:
        if not self.has_primary:
            self.has_primary = self._lock.try_lock_primary()
        return self.has_primary

    def release_primary(self) -> None:
        if self.has_primary:
            self._lock.unlock_primary()
            self.has_primary = False

    def primary_waiting(self) -> bool:
        return not self.has_primary and self._lock.is_locked(PRIMARY_POS)

    def live_held_elsewhere(self) -> bool:
        return not self.has_live and self._lock.is_locked(LIVE_POS)

    def live_lock_lost(self) -> str | None:
        if not self.has_live:
            return "the live lock was released"
        return self._lock.live_lock_lost()

    def state(self) -> bytes:
        return self._lock.read_state()

    def set_state(self, state: bytes) -> None:
        self._lock.write_state(state)

    def close(self) -> None:
        self._lock.close()  # releases any lock this description holds

    def set_node_id(self, node_id: str) -> None:
        self._lock.write_node_id(node_id)
        self.node_id = node_id


class SharedStore:
    """What a shared data directory's lock file holds, in memory."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.live: object | None = None
        self.backup: object | None = None
        self.primary: object | None = None
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

    def try_primary(self) -> bool:
        return self._take("primary")

    def release_primary(self) -> None:
        self._give("primary")

    def primary_waiting(self) -> bool:
        holder = self._store.primary
        return holder is not None and holder is not self

    def live_held_elsewhere(self) -> bool:
        holder = self._store.live
        return holder is not None and holder is not self

    def live_lock_lost(self) -> str | None:
        return None if self._store.live is self else "another server holds the live lock"

    def state(self) -> bytes:
        return self._store.state

    def set_state(self, state: bytes) -> None:
        self._store.state = state

    def set_node_id(self, node_id: str) -> None:
        self._store.node_id = self.node_id = node_id

    def close(self) -> None:
        """Like a process dying: every lock this server holds goes."""
        self.release_live()
        self.release_backup()
        self.release_primary()
