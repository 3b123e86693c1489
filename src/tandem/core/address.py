"""Addresses: where producers send; their queues are the bindings.

An address also keeps the memory its queued messages take, for
`max-size-bytes`, and adds it to the broker's `MemoryLimits` (`global-max-size`,
`global-max-messages`): with `address-full-policy = BLOCK` producers wait for
credit while it (or the broker) is full; with FAIL their sends fail with
AddressFull; with DROP they are dropped (counted and logged).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .message import Message, MessageRef, RoutingType
from .settings import AddressSettings

if TYPE_CHECKING:
    from .paging import AddressPager
    from .queue import Queue

log = logging.getLogger("tandem.address")

# Module constants: an enum member looked up on its class costs five times a local compare,
# and `route` compares for every queue of every message.
_ANYCAST = RoutingType.ANYCAST
_MULTICAST = RoutingType.MULTICAST


def physical_memory() -> int:
    """Bytes of physical memory (0 if the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def default_global_max_size() -> int:
    """Artemis's default for `global-max-size`: a quarter of the memory (here the machine's, not a heap's)."""
    total = physical_memory()
    return total // 4 if total > 0 else -1


# What a queued message holds in the broker's memory beyond its encoded bytes: the bytes
# object's and the Raw view's headers, the Message and MessageRef structs, the address name,
# its queue slot and journal index entry (measured: ~510-530 bytes of RSS per message, 100 B
# and 1 KiB bodies alike; docs/storage.md, "Memory accounting"; decision 0058).
MESSAGE_OVERHEAD = 512


class MemoryLimits:
    """The broker-wide limits on what queued messages may hold in memory (-1: no limit).

    Every address adds its queued bytes and messages here; while either total is at its limit
    every address counts as full, whatever its own `max-size-bytes`. `size` is memory, not
    message bytes: each message counts MESSAGE_OVERHEAD more (decision 0058), so that
    `global-max-size` bounds the process's RSS."""

    __slots__ = ("max_messages", "max_size", "messages", "size", "waiting")

    def __init__(self, max_size: int = -1, max_messages: int = -1) -> None:
        self.max_size = max_size
        self.max_messages = max_messages
        self.size = 0
        self.messages = 0
        self.waiting: set[Address] = set()  # addresses with producers blocked (maybe on these limits)

    @property
    def limited(self) -> bool:
        return self.max_size >= 0 or self.max_messages >= 0

    @property
    def full(self) -> bool:
        return (0 <= self.max_size <= self.size) or (0 <= self.max_messages <= self.messages)

    def changed(self, delta: int, count: int) -> None:
        self.size += delta + count * MESSAGE_OVERHEAD
        self.messages += count
        if delta < 0 and self.waiting and not self.full:
            for addr in list(self.waiting):
                addr.release_blocked()


UNLIMITED = MemoryLimits()


class Address:
    __slots__ = (
        "_rr",
        "auto_created",
        "blocked",
        "dropping",
        "id",
        "limits",
        "messages_dropped",
        "name",
        "pager",
        "queues",
        "routing_types",
        "settings",
        "size_bytes",
    )

    def __init__(
        self,
        aid: int,
        name: str,
        routing_types: set[RoutingType],
        auto_created: bool = False,
        settings: AddressSettings | None = None,
        limits: MemoryLimits = UNLIMITED,
    ) -> None:
        self.id = aid
        self.name = name
        self.routing_types = routing_types
        self.auto_created = auto_created
        self.settings = settings or AddressSettings()
        self.queues: dict[str, Queue] = {}
        self.size_bytes = 0
        # producers waiting for credit: (amount, grant, owner: the connection that asked)
        self.blocked: deque[tuple[int, Callable[[int], None], object]] = deque()
        self._rr = 0
        self.limits = limits
        self.pager: AddressPager | None = None  # created when the address first pages
        self.messages_dropped = 0  # by address-full-policy = DROP
        self.dropping = False  # dropping since the last time it was not full (one log line per episode)

    def route(self, message: Message) -> list[Queue]:
        """Anycast: one queue (round robin); multicast: every multicast queue; queue filters apply."""
        routing_type = message.routing_type
        queues = self.queues
        if len(queues) == 1:  # the common case: one queue, no filter, no lists to build
            for q in queues.values():
                if q.filter is None:
                    if q.routing_type == _MULTICAST:
                        return [q] if routing_type != _ANYCAST else []
                    return [q] if routing_type != _MULTICAST else []
        out: list[Queue] = []
        anycast: list[Queue] = []
        for q in self.queues.values():
            if q.filter is not None and not q.filter.matches(MessageRef(message, q, 0)):
                continue
            if q.routing_type == _MULTICAST:
                if routing_type != _ANYCAST:
                    out.append(q)
            elif routing_type != _MULTICAST:
                anycast.append(q)
        if anycast:
            if len(anycast) == 1:
                out.append(anycast[0])
            else:
                i = self._rr % len(anycast)
                self._rr = i + 1
                out.append(anycast[i])
        return out

    # ------------------------------------------------------------ full/blocking
    @property
    def full(self) -> bool:
        limit = self.settings.max_size_bytes
        return (limit >= 0 and self.size_bytes >= limit) or self.limits.full

    @property
    def bounded(self) -> bool:
        """Whether this address can ever be full (its own limit or the broker's)."""
        return self.settings.max_size_bytes >= 0 or self.limits.limited

    def size_changed(self, delta: int, count: int) -> None:
        self.size_bytes += delta
        self.limits.changed(delta, count)
        if delta < 0 and self.blocked and not self.full:
            self.release_blocked()

    @property
    def paging(self) -> bool:
        return self.pager is not None and self.pager.active

    def request_credit(self, amount: int, grant: Callable[[int], None], owner: object = None) -> bool:
        """Grant producer credit now, or when the address has room again (BLOCK policy): True
        when the request waits (`forget(owner)` takes it back)."""
        if self.settings.address_full_policy != "BLOCK" or not self.bounded:
            grant(-1)  # unlimited: nothing to wait for (FAIL and DROP act at send time)
        elif not self.full and not self.blocked:
            grant(amount)
        else:
            self.blocked.append((amount, grant, owner))
            self.limits.waiting.add(self)
            return True
        return False

    def release_blocked(self) -> None:
        while self.blocked and not self.full:
            amount, grant, _owner = self.blocked.popleft()
            grant(amount)
        if not self.blocked:
            self.limits.waiting.discard(self)

    def forget(self, owner: object) -> None:
        """`owner` is gone: its waiting requests (and, through their grants, the owner) go too."""
        if any(entry[2] is owner for entry in self.blocked):
            self.blocked = deque(entry for entry in self.blocked if entry[2] is not owner)
            if not self.blocked:
                self.limits.waiting.discard(self)

    def drop(self, message_id: int) -> None:
        """address-full-policy = DROP: count it; one log line each time the address starts dropping."""
        self.messages_dropped += 1
        if not self.dropping:
            self.dropping = True
            log.warning(
                "address full: dropping messages (address-full-policy = DROP)",
                extra={"address": self.name, "message_id": message_id, "size_bytes": self.size_bytes},
            )

    def stat(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "routing_types": sorted(rt.name.lower() for rt in self.routing_types),
            "auto_created": self.auto_created,
            "queues": sorted(self.queues),
            "size_bytes": self.size_bytes,
            "max_size_bytes": self.settings.max_size_bytes,
            "address_full_policy": self.settings.address_full_policy,
            "blocked_producers": len(self.blocked),
            "messages_dropped": self.messages_dropped,
            "paging": self.pager is not None and self.pager.active,
            "paged_bytes": self.pager.store.paged_bytes(self.id) if self.pager is not None else 0,
            "paged_messages": sum(self.pager.paged.values()) if self.pager is not None else 0,
        }
