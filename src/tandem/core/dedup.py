"""Duplicate detection: a circular cache of recent dedup ids per address (Artemis's DuplicateIDCache).

Each id in the cache has a journal record (when `persist-id-cache` is on) so
the cache comes back after a restart; an id pushed out of the circle has its
record deleted in the same atomic batch that adds the new one.
"""

from __future__ import annotations

from collections import deque

TX_CACHE = "$tandem.tx"  # the cache of whole-transaction dedup ids


def tx_key(user: str | None, dedup_id: str) -> str:
    """A transaction's dedup id as the cache keeps it: each user's ids apart (a retry comes from
    the same user), so no user can spend another's; unchanged with security off (`user` None)."""
    return dedup_id if user is None else f"{len(user)}:{user}:{dedup_id}"


def empty_retry_key(key: str) -> str:
    """The marker kept with a transaction id that an empty retry took (retry_commit with nothing
    in its transaction, decision 0084): a NUL first, which tx_key never starts with unless a
    client sends one itself."""
    return "\x00empty-retry:" + key


class DuplicateIdCache:
    __slots__ = ("_order", "address", "ids", "size")

    def __init__(self, address: str, size: int) -> None:
        self.address = address
        self.size = size
        self.ids: dict[str, int] = {}  # dedup id -> its journal record id (0: not persisted)
        self._order: deque[str] = deque()

    def __contains__(self, dedup_id: str) -> bool:
        return dedup_id in self.ids

    def add(self, dedup_id: str, record_id: int) -> list[int]:
        """Remember an id; returns the record ids of entries pushed out (to delete)."""
        evicted: list[int] = []
        if dedup_id in self.ids:
            return evicted
        self.ids[dedup_id] = record_id
        self._order.append(dedup_id)
        while len(self._order) > max(self.size, 0):
            old = self._order.popleft()
            rid = self.ids.pop(old, 0)
            if rid:
                evicted.append(rid)
        return evicted

    def entries(self) -> list[tuple[str, int]]:
        """(id, record id) of each id held, oldest first."""
        return [(d, self.ids[d]) for d in self._order]

    def reset(self, entries: list[tuple[str, int]]) -> None:
        """(Reload) hold exactly `entries`, (id, record id) oldest first."""
        self.ids = dict(entries)
        self._order = deque(d for d, _rid in entries)

    def __len__(self) -> int:
        return len(self.ids)
