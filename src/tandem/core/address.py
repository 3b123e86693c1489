"""Addresses: where producers send; their queues are the bindings.

An address also keeps the memory its queued messages take, for
`max-size-bytes`: with `address-full-policy = BLOCK` producers wait for credit
while it is full; with FAIL their sends fail with AddressFull.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .message import Message, MessageRef, RoutingType
from .settings import AddressSettings

if TYPE_CHECKING:
    from .queue import Queue

# Module constants: an enum member looked up on its class costs five times a local compare,
# and `route` compares for every queue of every message.
_ANYCAST = RoutingType.ANYCAST
_MULTICAST = RoutingType.MULTICAST


class Address:
    __slots__ = ("_rr", "auto_created", "blocked", "id", "name", "queues", "routing_types", "settings", "size_bytes")

    def __init__(
        self,
        aid: int,
        name: str,
        routing_types: set[RoutingType],
        auto_created: bool = False,
        settings: AddressSettings | None = None,
    ) -> None:
        self.id = aid
        self.name = name
        self.routing_types = routing_types
        self.auto_created = auto_created
        self.settings = settings or AddressSettings()
        self.queues: dict[str, Queue] = {}
        self.size_bytes = 0
        self.blocked: deque[tuple[int, Callable[[int], None]]] = deque()  # producers waiting for credit
        self._rr = 0

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
        return limit >= 0 and self.size_bytes >= limit

    def size_changed(self, delta: int) -> None:
        self.size_bytes += delta
        if delta < 0 and self.blocked and not self.full:
            self.release_blocked()

    def request_credit(self, amount: int, grant: Callable[[int], None]) -> None:
        """Grant producer credit now, or when the address has room again (BLOCK policy)."""
        s = self.settings
        if s.max_size_bytes < 0 or s.address_full_policy != "BLOCK":
            grant(-1)  # unlimited: nothing to wait for (FAIL is checked at send time)
        elif not self.full and not self.blocked:
            grant(amount)
        else:
            self.blocked.append((amount, grant))

    def release_blocked(self) -> None:
        while self.blocked and not self.full:
            amount, grant = self.blocked.popleft()
            grant(amount)

    def stat(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "routing_types": sorted(rt.name.lower() for rt in self.routing_types),
            "auto_created": self.auto_created,
            "queues": sorted(self.queues),
            "size_bytes": self.size_bytes,
            "max_size_bytes": self.settings.max_size_bytes,
            "blocked_producers": len(self.blocked),
        }
