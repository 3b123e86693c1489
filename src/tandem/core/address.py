"""Addresses: where producers send; their queues are the bindings."""

from __future__ import annotations

from typing import Any

from .message import Message, MessageRef, RoutingType
from .queue import Queue


class Address:
    __slots__ = ("_rr", "auto_created", "id", "name", "queues", "routing_types")

    def __init__(self, aid: int, name: str, routing_types: set[RoutingType], auto_created: bool = False) -> None:
        self.id = aid
        self.name = name
        self.routing_types = routing_types
        self.auto_created = auto_created
        self.queues: dict[str, Queue] = {}
        self._rr = 0

    def route(self, message: Message) -> list[Queue]:
        """Anycast: one queue (round robin); multicast: every multicast queue; queue filters apply."""
        routing_type = message.routing_type
        out: list[Queue] = []
        anycast: list[Queue] = []
        for q in self.queues.values():
            if q.filter is not None and not q.filter.matches(MessageRef(message, q, 0)):
                continue
            if q.routing_type == RoutingType.MULTICAST:
                if routing_type != RoutingType.ANYCAST:
                    out.append(q)
            elif routing_type != RoutingType.MULTICAST:
                anycast.append(q)
        if anycast:
            if len(anycast) == 1:
                out.append(anycast[0])
            else:
                i = self._rr % len(anycast)
                self._rr = i + 1
                out.append(anycast[i])
        return out

    def stat(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "routing_types": sorted(rt.name.lower() for rt in self.routing_types),
            "auto_created": self.auto_created,
            "queues": sorted(self.queues),
        }
