"""The post office: addresses, queues and routing (Artemis's PostOffice, much smaller)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import (
    AddressDoesNotExist,
    AddressExists,
    IllegalState,
    InvalidArgument,
    QueueDoesNotExist,
    QueueExists,
)
from .address import Address
from .consumer import Filter
from .ids import IdGenerator
from .message import Message, MessageRef, RoutingType
from .queue import Queue, Scheduler
from .storage import Storage

log = logging.getLogger("tandem.postoffice")

FilterCompiler = Callable[[str], Filter]


@dataclass(frozen=True)
class RoutingSettings:
    auto_create_queues: bool = True
    auto_create_addresses: bool = True
    default_routing_type: RoutingType = RoutingType.ANYCAST


def _no_filters(text: str) -> Filter:
    raise InvalidArgument("filters are not available in this broker")


def check_name(kind: str, name: str) -> None:
    if not name or len(name) > 1024 or any(ord(ch) < 32 for ch in name):
        raise InvalidArgument(f"invalid {kind} name {name!r}")


class PostOffice:
    def __init__(
        self,
        storage: Storage,
        ids: IdGenerator,
        schedule: Scheduler,
        settings: RoutingSettings,
        compile_filter: FilterCompiler = _no_filters,
    ) -> None:
        self.storage = storage
        self.ids = ids
        self.schedule = schedule
        self.settings = settings
        self.compile_filter = compile_filter
        self.addresses: dict[str, Address] = {}
        self.queues: dict[str, Queue] = {}
        self.queues_by_id: dict[int, Queue] = {}

    # ------------------------------------------------------------- addresses
    def create_address(
        self, name: str, routing_types: set[RoutingType], auto_created: bool = False, exists_ok: bool = False
    ) -> Address:
        check_name("address", name)
        addr = self.addresses.get(name)
        if addr is not None:
            if not exists_ok:
                raise AddressExists(f"address {name!r} already exists")
            if not routing_types <= addr.routing_types:
                addr.routing_types |= routing_types
                self.storage.store_address(addr)
            return addr
        addr = Address(self.ids.next(), name, set(routing_types), auto_created)
        self.addresses[name] = addr
        self.storage.store_address(addr)
        return addr

    def delete_address(self, name: str, force: bool = False) -> None:
        addr = self.addresses.get(name)
        if addr is None:
            raise AddressDoesNotExist(f"address {name!r} does not exist")
        if addr.queues and not force:
            raise IllegalState(f"address {name!r} still has queues: {', '.join(sorted(addr.queues))}")
        for qname in list(addr.queues):
            self.delete_queue(qname, force=True)
        del self.addresses[name]
        self.storage.delete_address(addr)

    # ---------------------------------------------------------------- queues
    def create_queue(
        self,
        name: str,
        address: str | None = None,
        routing_type: RoutingType = RoutingType.ANYCAST,
        durable: bool = True,
        filter_text: str | None = None,
        temporary: bool = False,
        auto_created: bool = False,
        max_consumers: int = -1,
        exists_ok: bool = False,
        auto_create_address: bool = True,
    ) -> Queue:
        check_name("queue", name)
        if routing_type == RoutingType.ANY:
            routing_type = RoutingType.ANYCAST
        address = address or name
        existing = self.queues.get(name)
        if existing is not None:
            if exists_ok and existing.address == address and existing.routing_type == routing_type:
                return existing
            raise QueueExists(f"queue {name!r} already exists")
        filt = self.compile_filter(filter_text) if filter_text else None
        addr = self.addresses.get(address)
        if addr is None:
            if not auto_create_address:
                raise AddressDoesNotExist(f"address {address!r} does not exist")
            addr = self.create_address(address, {routing_type}, auto_created=True)
        elif routing_type not in addr.routing_types:
            addr.routing_types.add(routing_type)
            self.storage.store_address(addr)
        if temporary:
            durable = False
        q = Queue(
            self.ids.next(),
            name,
            address,
            routing_type,
            durable,
            self.storage,
            self.schedule,
            filter_text=filter_text,
            filter=filt,
            temporary=temporary,
            auto_created=auto_created,
            max_consumers=max_consumers,
        )
        self._register(q, addr)
        if durable:
            self.storage.store_queue(q)
        return q

    def _register(self, q: Queue, addr: Address) -> None:
        self.queues[q.name] = q
        self.queues_by_id[q.id] = q
        addr.queues[q.name] = q

    def restore_queue(self, q: Queue) -> None:
        """Reload path: the queue's address must already be restored."""
        addr = self.addresses.get(q.address)
        if addr is None:
            addr = Address(self.ids.next(), q.address, {q.routing_type}, auto_created=True)
            self.addresses[q.address] = addr
            self.storage.store_address(addr)
        self._register(q, addr)

    def restore_address(self, addr: Address) -> None:
        self.addresses[addr.name] = addr

    def delete_queue(self, name: str, force: bool = False) -> int:
        """Delete a queue and its messages; returns how many messages went with it."""
        q = self.queues.get(name)
        if q is None:
            raise QueueDoesNotExist(f"queue {name!r} does not exist")
        if q.consumers and not force:
            raise IllegalState(f"queue {name!r} has {len(q.consumers)} consumer(s)")
        q.close_consumers(QueueDoesNotExist(f"queue {name!r} was deleted"))
        removed = q.purge()
        q.deleted = True
        del self.queues[name]
        del self.queues_by_id[q.id]
        addr = self.addresses.get(q.address)
        if addr is not None:
            addr.queues.pop(name, None)
        if q.durable:
            self.storage.delete_queue(q)
        return removed

    def queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise QueueDoesNotExist(f"queue {name!r} does not exist")
        return q

    def queue_for_consumer(self, name: str) -> Queue:
        """The queue a consumer attaches to, auto-created (anycast, durable) if allowed."""
        q = self.queues.get(name)
        if q is not None:
            return q
        if not self.settings.auto_create_queues:
            raise QueueDoesNotExist(f"queue {name!r} does not exist")
        return self.create_queue(name, name, RoutingType.ANYCAST, durable=True, auto_created=True)

    # --------------------------------------------------------------- routing
    def route(self, message: Message) -> list[Queue]:
        addr = self.addresses.get(message.address)
        if addr is None:
            addr = self._auto_address(message)
        return addr.route(message)

    def _auto_address(self, message: Message) -> Address:
        name = message.address
        if not self.settings.auto_create_addresses:
            raise AddressDoesNotExist(f"address {name!r} does not exist")
        rt = RoutingType(message.routing_type) if message.routing_type else self.settings.default_routing_type
        addr = self.create_address(name, {rt}, auto_created=True)
        if rt == RoutingType.ANYCAST and self.settings.auto_create_queues:
            self.create_queue(name, name, RoutingType.ANYCAST, durable=True, auto_created=True)
        return addr

    def send(self, message: Message, tx: list[object] | None = None) -> list[MessageRef]:
        """Route and store a message; returns its references (empty if nothing was bound).

        With `tx`, the journal records go into the transaction and the refs are
        returned for the caller to add to their queues at commit.
        """
        queues = self.route(message)
        if not queues:
            return []
        refs: list[MessageRef] = []
        persist = message.durable and self.storage.persistent
        drefs: list[tuple[int, int]] = []
        for q in queues:
            ref = MessageRef(message, q, q.next_seq())
            refs.append(ref)
            if persist and q.durable:
                drefs.append((q.id, ref.seq))
        if drefs:
            message.durable_refs = len(drefs)
            self.storage.store_message(message, drefs, tx)
        if tx is None:
            for ref in refs:
                ref.queue.add(ref)
        return refs

    def stat(self) -> dict[str, Any]:
        return {
            "addresses": len(self.addresses),
            "queues": len(self.queues),
            "messages": sum(q.message_count for q in self.queues.values()),
        }
