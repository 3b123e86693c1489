"""The post office: addresses, queues, routing, duplicate detection, dead letters.

Artemis's PostOffice, much smaller. Everything here runs on the event loop;
journal records go through `Storage`, atomically when several must agree
(a message and its dedup id; a dead-lettered copy and the original's ack).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import (
    AddressDoesNotExist,
    AddressExists,
    AddressFull,
    IllegalState,
    InvalidArgument,
    JournalIOError,
    QueueDoesNotExist,
    QueueExists,
)
from .address import UNLIMITED, Address, MemoryLimits
from .consumer import Filter
from .dedup import TX_CACHE, DuplicateIdCache, empty_retry_key
from .ids import IdGenerator
from .message import Message, MessageData, MessageRef, RoutingType
from .paging import AddressPager, PageStore
from .queue import Queue, Scheduler, now_ms
from .settings import AddressSettings, SettingsRepository
from .storage import Storage
from .txpaging import PagedTx

if TYPE_CHECKING:
    from .session import Transaction

log = logging.getLogger("tandem.postoffice")

FilterCompiler = Callable[[str], Filter]
Later = Callable[[float, Callable[[], None]], Any]


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
        settings: SettingsRepository | None = None,
        compile_filter: FilterCompiler = _no_filters,
        call_later: Later | None = None,
        persist_id_cache: bool = True,
        limits: MemoryLimits = UNLIMITED,
        pages: PageStore | None = None,
    ) -> None:
        self.storage = storage
        self.ids = ids
        self.schedule = schedule
        self.settings = settings or SettingsRepository()
        self.compile_filter = compile_filter
        self._call_later = call_later
        self.persist_id_cache = persist_id_cache and storage.persistent
        self.limits = limits
        self.pages = pages if storage.persistent else None  # None (no persistence): nothing is paged
        # (event, name) of what sends auto-created, for the server's audit log; None: not wanted
        self.auto_created: list[tuple[str, str]] | None = None
        self.addresses: dict[str, Address] = {}
        self.queues: dict[str, Queue] = {}
        self.queues_by_id: dict[int, Queue] = {}
        self.fresh_queues: set[int] = set()  # durable queues whose bindings record may not be on disk yet
        self.holding = 0  # copies waiting behind a bindings record, all queues (`_hold`)
        self.dedup: dict[str, DuplicateIdCache] = {}
        self.page_txs: dict[int, int] = {}  # page transaction -> pages holding records of it
        self.tx_held_bytes = 0  # bytes of messages open transactions hold until their commit

    def settings_for(self, address: str) -> AddressSettings:
        return self.settings.match(address)

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
        addr = Address(self.ids.next(), name, set(routing_types), auto_created, self.settings_for(name), self.limits)
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

    def restore_address(self, addr: Address) -> None:
        addr.settings = self.settings_for(addr.name)
        addr.limits = self.limits
        self.addresses[addr.name] = addr

    # ---------------------------------------------------------------- queues
    def new_queue(
        self,
        qid: int,
        name: str,
        address: str,
        routing_type: RoutingType,
        durable: bool,
        *,
        filter_text: str | None = None,
        temporary: bool = False,
        auto_created: bool = False,
        max_consumers: int = -1,
        exclusive: bool | None = None,
        last_value_key: str | None = None,
        reader_only: bool = False,
        next_seq: int = 1,
        seq_reserved: int = 0,
    ) -> Queue:
        """Build a queue with this post office's settings (used on create and on reload)."""
        s = self.settings_for(address)
        return Queue(
            qid,
            name,
            address,
            routing_type,
            durable,
            self.storage,
            self.schedule,
            settings=s,
            host=self,
            filter_text=filter_text,
            filter=self.compile_filter(filter_text) if filter_text else None,
            temporary=temporary,
            auto_created=auto_created,
            max_consumers=max_consumers,
            exclusive=s.default_exclusive_queue if exclusive is None else exclusive,
            last_value_key=last_value_key if last_value_key is not None else s.default_last_value_key,
            reader_only=reader_only,
            next_seq=next_seq,
            seq_reserved=seq_reserved,
        )

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
        exclusive: bool | None = None,
        last_value_key: str | None = None,
        reader_only: bool = False,
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
        if temporary:
            durable = False
        q = self.new_queue(  # compiles the filter first: a bad one creates nothing
            0,
            name,
            address,
            routing_type,
            durable,
            filter_text=filter_text,
            temporary=temporary,
            auto_created=auto_created,
            max_consumers=max_consumers,
            exclusive=exclusive,
            last_value_key=last_value_key,
            reader_only=reader_only,
        )
        addr = self.addresses.get(address)
        if addr is None:
            if not auto_create_address:
                raise AddressDoesNotExist(f"address {address!r} does not exist")
            addr = self.create_address(address, {routing_type}, auto_created=True)
        elif routing_type not in addr.routing_types:
            addr.routing_types.add(routing_type)
            self.storage.store_address(addr)
        q.id = self.ids.next()
        self._register(q, addr)
        if durable:
            self.storage.store_queue(q)
            self.fresh_queues.add(q.id)
            self.storage.after_bindings_durable(partial(self.fresh_queues.discard, q.id))
        return q

    def _register(self, q: Queue, addr: Address) -> None:
        self.queues[q.name] = q
        self.queues_by_id[q.id] = q
        addr.queues[q.name] = q
        q.addr = addr
        if addr.pager is not None:
            addr.pager.add_queue(q)

    def restore_queue(self, q: Queue) -> None:
        """Reload path: the queue's address must already be restored."""
        addr = self.addresses.get(q.address)
        if addr is None:
            addr = Address(
                self.ids.next(), q.address, {q.routing_type}, True, self.settings_for(q.address), self.limits
            )
            self.addresses[q.address] = addr
            self.storage.store_address(addr)
        self._register(q, addr)

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
            if addr.pager is not None:
                addr.pager.remove_queue(q)
            addr.release_blocked()
            if q.temporary and addr.auto_created and not addr.queues:
                # Created for the temporary queue: it goes with it (Artemis's auto-delete-addresses),
                # or every client that exits leaves an address behind.
                del self.addresses[addr.name]
                self.storage.delete_address(addr)
        if q.durable:
            self.storage.delete_queue(q)
        return removed

    def queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise QueueDoesNotExist(f"queue {name!r} does not exist")
        return q

    def queue_for_consumer(self, name: str) -> Queue:
        """The queue a consumer attaches to, auto-created (anycast, durable) if the settings allow."""
        q = self.queues.get(name)
        if q is not None:
            return q
        if not self.settings_for(name).auto_create_queues:
            raise QueueDoesNotExist(f"queue {name!r} does not exist")
        return self.create_queue(name, name, RoutingType.ANYCAST, durable=True, auto_created=True)

    # QueueHost ---------------------------------------------------------------
    def call_later(self, delay: float, fn: Callable[[], None]) -> Any:
        if self._call_later is None:
            self.schedule(fn)
            return None
        return self._call_later(delay, fn)

    def queue_idle(self, queue: Queue) -> None:
        """Auto-delete an auto-created queue once it has no consumers and no messages: once what
        emptied it is stored, and if it is still idle then. An acknowledgement empties the queue
        in memory at once, but it (in a commit, with the commit's sends to this very queue) is
        journaled after; the queue's deletion goes to the other journal, so deleted at once it
        could be on disk first, and a crash would take the unacknowledged message with it."""
        if self._idle(queue):  # (next turn: a commit acknowledging now hands its batch over first)
            self.schedule(partial(self.storage.after_durable, partial(self._delete_if_idle, queue)))

    @staticmethod
    def _idle(queue: Queue) -> bool:
        return (
            queue.auto_created
            and not queue.deleted
            and queue.settings.auto_delete_queues
            and not queue.consumers
            and not queue.message_count
        )

    def _delete_if_idle(self, queue: Queue) -> None:
        if self._idle(queue) and self.queues.get(queue.name) is queue:
            self.delete_queue(queue.name, force=True)
            addr = self.addresses.get(queue.address)
            if addr is not None and addr.auto_created and not addr.queues and addr.settings.auto_delete_addresses:
                self.delete_address(addr.name)

    def move(self, ref: MessageRef, target: str | None, reason: str, extra: dict[str, Any]) -> None:
        """Copy a message to `target` (dead letters, expiry) and acknowledge the original, atomically."""
        m = ref.message
        queue: Queue = ref.queue
        data = m.data()
        props = dict(data.properties or {})
        props.update(
            {
                "_AMQ_ORIG_ADDRESS": m.address,
                "_AMQ_ORIG_QUEUE": queue.name,
                "_AMQ_ORIG_MESSAGE_ID": m.id,
                "_AMQ_REASON": reason,
                **extra,
            }
        )
        expired = reason == "expired"
        copy = MessageData(
            target or "",
            data.durable,
            data.priority,
            0 if expired else m.expiration,
            data.timestamp,
            None,
            RoutingType.ANY,
            props,
            data.body,
        )
        nm = Message.create(self.ids.next(), copy)
        nm.large = m.large  # a large body's file is shared by the copy (kept while either needs it)
        ops: list[object] = []
        try:
            refs = self._store(nm, self.route(nm), ops)
        except Exception as exc:  # an address we may not create: drop, never loop
            log.warning("cannot move message %s to %r (%s): %s; dropping it", m.id, target, reason, exc)
            refs = []
        if not refs:
            log.warning("message dropped", extra={"message_id": m.id, "queue": queue.name, "reason": reason})
        queue._drop([ref], ops)
        self._journal_then_queue(ops, refs)

    def _journal_then_queue(self, ops: list[object], refs: list[MessageRef]) -> None:
        """Journal a send's, a move's or a commit's batch, then queue its copies. A copy for a queue whose
        bindings record may not be on disk yet (one this routing auto-created) makes the batch
        and the queueing wait for it: the two journals are written apart, and copies on disk
        before their queue would be dropped as orphans at a reload while the originals' DELETEs
        in the same batch stand. (A copy is queued only once journaled: nothing can acknowledge
        it before. Only then: a queue's last sequence would run ahead of what it holds, and a
        range reader's ACK_UP_TO could pass a message it never read.)"""
        if self._needs_bindings(refs) or any(r.queue.held for r in refs):
            # (With no ops too, and behind copies already waiting: each queue keeps its order.)
            _hold(refs, 1)
            self.holding += len(refs)
            self.storage.after_bindings_durable(partial(self._apply_commit, [], ops, [], refs, True))
            return
        if ops:
            self.storage.commit(ops)
        for r in refs:
            r.queue.add(r)

    # --------------------------------------------------------------- routing
    def route(self, message: Message) -> list[Queue]:
        addr = self.addresses.get(message.address)
        if addr is None:
            addr = self._auto_address(message)
        policy = addr.settings.address_full_policy
        if policy == "BLOCK" or policy == "PAGE":
            return addr.route(message)
        if not addr.full:
            addr.dropping = False
            return addr.route(message)
        if policy == "DROP":
            addr.drop(message.id)
            return []
        lim = self.limits
        raise AddressFull(
            f"address {addr.name!r} is full ({addr.size_bytes} of {addr.settings.max_size_bytes} bytes; "
            f"broker: {lim.size} of {lim.max_size} bytes, {lim.messages} of {lim.max_messages} messages)"
        )

    def _auto_address(self, message: Message) -> Address:
        name = message.address
        s = self.settings_for(name)
        if not s.auto_create_addresses:
            raise AddressDoesNotExist(f"address {name!r} does not exist")
        rt = RoutingType(message.routing_type) if message.routing_type else s.default_address_routing_type
        addr = self.create_address(name, {rt}, auto_created=True)
        made = self.auto_created
        if made is not None:
            made.append(("address.create", name))
        if rt == RoutingType.ANYCAST and s.auto_create_queues:
            self.create_queue(name, name, RoutingType.ANYCAST, durable=True, auto_created=True)
            if made is not None:
                made.append(("queue.create", name))
        return addr

    # ---------------------------------------------------------------- paging
    def _pager_for(
        self, message: Message, queues: list[Queue], pending: int = 0, pending_global: int = -1
    ) -> AddressPager | None:
        """The address's pager if `message` is to be paged: a PAGE address that pages already or is
        full (counting `pending` bytes more: a transaction's messages bound for memory before it;
        `pending_global`, if given, against the broker's limit instead)."""
        if not queues or self.pages is None:
            return None
        addr = queues[0].addr
        if addr is None or addr.settings.address_full_policy != "PAGE":
            return None
        if message.large is not None:
            return None  # its body is a file already, and a page record holds no file: it is journaled
        pager = addr.pager
        if pager is not None and pager.active:
            return pager
        if not addr.full:
            limit = addr.settings.max_size_bytes
            lim = addr.limits
            pg = pending if pending_global < 0 else pending_global
            if not (pending or pg) or not (
                (limit >= 0 and addr.size_bytes + pending >= limit) or 0 <= lim.max_size <= lim.size + pg
            ):
                return None
        if pager is None:
            pager = addr.pager = self._new_pager(addr, 0)
        return pager

    def _new_pager(self, addr: Address, loaded_upto: int) -> AddressPager:
        assert self.pages is not None
        pager = AddressPager(addr, self.pages, self.storage, self.ids, loaded_upto)
        pager.tx_pages_added = self._tx_page_added
        pager.on_tx_pages_gone = self._tx_page_gone
        for q in addr.queues.values():
            pager.add_queue(q)
        return pager

    def _page(self, pager: AddressPager, message: Message, queues: list[Queue], tx: int = 0) -> bool:
        s = queues[0].settings
        if not message.expiration and s.expiry_delay > 0:
            message.expiration = now_ms() + s.expiry_delay
        return pager.page(message, queues, tx)

    def pages_durable(self) -> None:
        """New page data is readable: queues waiting for it read on."""
        for addr in self.addresses.values():
            if addr.pager is not None and addr.pager.active:
                addr.pager.wake()

    def _tx_page_added(self, tx: int) -> None:
        self.page_txs[tx] = self.page_txs.get(tx, 0) + 1

    def _tx_page_gone(self, tx: int) -> None:
        """One page holding records of page transaction `tx` is deleted: its PAGE_TX record goes
        with the last (its cursors are durable past every record of it by then)."""
        n = self.page_txs.get(tx, 0) - 1
        if n > 0:
            self.page_txs[tx] = n
            return
        self.page_txs.pop(tx, None)
        self.storage.delete_page_tx(tx)

    def restore_paging(
        self,
        listing: dict[int, list[int]],
        cursors: dict[int, tuple[int, int]],
        page_txs: set[int] | frozenset[int] = frozenset(),
        page_tx_seqs: dict[int, list[tuple[int, int, int]]] | None = None,
        page_acks: dict[int, set[tuple[int, int]]] | None = None,
        page_counts: dict[int, dict[tuple[int, int], int]] | None = None,
        page_skips: dict[int, list[tuple[tuple[int, int], tuple[int, int]]]] | None = None,
    ) -> list[int]:
        """Reload: rebuild each address's paging state from its pages and the queues' cursors;
        `page_txs`: the committed page transactions (those with no page left are deleted).
        Returns the ids of queues gone whose cursor or page acknowledgements are journaled (the
        caller deletes those records)."""
        by_id = {a.id: a for a in self.addresses.values()}
        assert self.pages is not None
        # Page numbers never go back: a journaled cursor may name a page deleted since, and a new
        # page with that number would look read already.
        floor: dict[int, int] = {}
        for qid, (page, _idx) in cursors.items():
            q = self.queues_by_id.get(qid)
            if q is not None and q.addr is not None:
                floor[q.addr.id] = max(floor.get(q.addr.id, 0), page)
        for aid in floor:
            listing.setdefault(aid, [])
        missing: dict[str, dict[str, int]] = {}  # address -> paged messages' dedup ids not held -> message id
        for aid, pages in listing.items():
            addr = by_id.get(aid)
            if addr is None:  # its address was deleted: so are its pages
                for p in pages:
                    self.pages.remove(aid, p)
                continue
            pager = addr.pager = self._new_pager(addr, max(pages[-1] if pages else 0, floor.get(aid, 0)))
            for m in pager.load(pages, cursors, page_txs, page_tx_seqs, page_acks, page_counts, page_skips):
                assert m.dedup_id is not None
                if m.dedup_id not in self.dedup_cache(m.address):
                    missing.setdefault(m.address, {})[m.dedup_id] = m.id
        for address, found in missing.items():
            self._restore_paged_dedup(address, found)
        for tx in page_txs:
            if tx not in self.page_txs:
                self.storage.delete_page_tx(tx)  # its pages are all gone
        held = {*cursors, *(page_acks or ()), *(page_counts or ()), *(page_skips or ())}
        return [qid for qid in held if qid not in self.queues_by_id]

    def _restore_paged_dedup(self, address: str, found: dict[str, int]) -> None:
        """Dedup ids of paged messages the cache does not hold (`found`: id -> message id): the
        id's record, written after the page, may have been cut by a crash. Each takes its place
        in arrival order (message ids and record ids come from one counter) and only the newest
        `id-cache-size` stay: added at the newest end, ids pushed out long ago took the places
        of the latest sends' ids, whose resends were then stored again."""
        cache = self.dedup_cache(address)
        held = [(rid, d, False) for d, rid in cache.entries()]
        merged = sorted(held + [(mid, d, True) for d, mid in found.items()])
        keep = merged[len(merged) - cache.size :] if cache.size > 0 else []
        if not any(new for _k, _d, new in keep):
            return
        kept = {d for _k, d, _new in keep}
        ops: list[object] = []
        gone = [rid for rid, d, _new in held if d not in kept and rid]
        persist = self.persist_id_cache
        if gone and persist:
            self.storage.store_dedup(address, None, 0, gone, ops)
        entries: list[tuple[str, int]] = []
        for key, d, new in keep:
            rid = key
            if new:
                rid = self.ids.next() if persist else 0
                if persist:
                    self.storage.store_dedup(address, d, rid, [], ops)
            entries.append((d, rid))
        cache.reset(entries)
        if ops:
            self.storage.commit(ops)

    # --------------------------------------------------------------- storing
    def _store(self, message: Message, queues: list[Queue], ops: list[object] | None) -> list[MessageRef]:
        """Give the message its per-queue refs and journal it (into `ops` when given)."""
        if not queues:
            return []
        s = queues[0].settings
        if not message.expiration and s.expiry_delay > 0:
            message.expiration = now_ms() + s.expiry_delay
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
            self.storage.store_message(message, drefs, ops)
        return refs

    def send(self, message: Message) -> tuple[bool, bool]:
        """Route, journal and enqueue one message; returns (routed, confirm after the disk).

        A message whose dedup id the address has seen is confirmed but not routed: once what is
        stored so far is durable, because the original may still be on its way to the disk.
        """
        dedup_id = message.dedup_id
        if dedup_id is None:
            queues = self.route(message)
            pager = self._pager_for(message, queues)
            if pager is not None:
                return True, self._page(pager, message, queues)
            fresh = self.fresh_queues
            if (fresh or self.holding) and any(q.held or q.id in fresh for q in queues):  # behind waiting copies
                sops: list[object] = []
                refs = self._store(message, queues, sops)
                self._journal_then_queue(sops, refs)
                return bool(refs), bool(sops)
            refs = self._store(message, queues, None)
            for ref in refs:
                ref.queue.add(ref)
            return bool(refs), message.durable_refs > 0
        cache = self.dedup_cache(message.address)
        if dedup_id in cache:
            return False, message.durable and self.storage.persistent
        queues = self.route(message)
        pager = self._pager_for(message, queues)
        if pager is not None and self.pages is not None:
            durable = self._page(pager, message, queues)
            dops: list[object] = []
            self.remember(cache, dedup_id, dops if message.durable else None)
            if dops:
                # Journaled once the page is durable, never before: an id on disk whose message
                # is not would make the client's resend look like a duplicate (decision 0045).
                # Nor before the records of queues this routing created: a reload drops the
                # pages of an address it does not know.
                self.pages.after_durable(partial(self._apply_commit, [], dops, [pager], []))
            return True, durable or bool(dops)
        ops: list[object] = []
        refs = self._store(message, queues, ops)
        self.remember(cache, dedup_id, ops if message.durable else None)
        # Message and id wait for the records of queues this routing created: on disk before
        # them, the message would be dropped as an orphan at a reload and its id kept.
        self._journal_then_queue(ops, refs)
        return bool(refs), bool(ops)

    # ----------------------------------------------------- duplicate detection
    def dedup_cache(self, address: str) -> DuplicateIdCache:
        cache = self.dedup.get(address)
        if cache is None:
            cache = self.dedup[address] = DuplicateIdCache(address, self.settings_for(address).id_cache_size)
        return cache

    def remember(self, cache: DuplicateIdCache, dedup_id: str, ops: list[object] | None) -> None:
        """Add an id to a cache; journaled (with the evictions) into `ops` when persisting."""
        if ops is not None and self.persist_id_cache:
            rid = self.ids.next()
            evicted = cache.add(dedup_id, rid)
            self.storage.store_dedup(cache.address, dedup_id, rid, evicted, ops)
        else:
            evicted = cache.add(dedup_id, 0)
            if evicted and self.persist_id_cache:
                self.storage.store_dedup(cache.address, None, 0, evicted, None)

    def restore_dedup(self, address: str, dedup_id: str, rid: int) -> None:
        evicted = self.dedup_cache(address).add(dedup_id, rid)
        if evicted:  # the cache shrank since: forget the overflow for good
            self.storage.store_dedup(address, None, 0, evicted, None)

    def commit_transaction(
        self,
        messages: list[Message],
        acks: list[tuple[Queue, list[MessageRef]]],
        dedup_id: str | None,
        paged_tx: PagedTx | None = None,
        routes: list[list[Queue]] | None = None,
        ops: list[object] | None = None,
        empty_retry: bool = False,
    ) -> bool:
        """Apply a transaction atomically; returns whether journal records were written.
        `paged_tx`: what it paged while open (decision 0055); `routes`: the queues of each
        message when the caller routed them (an operator's move, core/queueops.py); `ops`:
        journal records of the caller's that go into the transaction's batch; `empty_retry`: a
        client's retry_commit with nothing in its transaction takes `dedup_id`, marked as such in
        the same batch (decision 0084).

        Raises DuplicateId (nothing applied) if a message repeats a dedup id.
        """
        from ..errors import DuplicateId

        seen: set[tuple[str, str]] = set()
        duplicates: list[tuple[str, str]] = []
        ids = [(m.address, m.dedup_id) for m in messages if m.dedup_id is not None]
        if paged_tx is not None:
            ids.extend((a, d) for a, d, _durable in paged_tx.dedup)
        for key in ids:
            if key in seen or key[1] in self.dedup_cache(key[0]):
                duplicates.append(key)
            seen.add(key)
        if duplicates:
            raise DuplicateId.of(duplicates)
        if routes is None:
            routes = [self.route(m) for m in messages]  # may raise: nothing applied yet
        if ops is None:
            ops = []
        added: list[MessageRef] = []
        paged: list[tuple[AddressPager, Message, list[Queue]]] = []
        pending: dict[int, int] = {}  # address id -> bytes of this commit bound for its memory
        for m, queues in zip(messages, routes, strict=True):
            addr = queues[0].addr if queues else None
            pager = self._pager_for(m, queues, pending.get(addr.id, 0)) if addr is not None else None
            if pager is not None:
                paged.append((pager, m, queues))
            else:
                added.extend(self._store(m, queues, ops))
                if addr is not None:
                    pending[addr.id] = pending.get(addr.id, 0) + m.size * len(queues)  # as memory counts it
            if m.dedup_id is not None:
                self.remember(self.dedup_cache(m.address), m.dedup_id, ops if m.durable else None)
        if paged_tx is not None:
            for address, did, durable in paged_tx.dedup:
                self.remember(self.dedup_cache(address), did, ops if durable else None)
        for q, refs in acks:
            q.acknowledge(refs, ops)
        if dedup_id is not None:
            self.remember(self.dedup_cache(TX_CACHE), dedup_id, ops)
            if empty_retry:
                self.remember(self.dedup_cache(TX_CACHE), empty_retry_key(dedup_id), ops)
        if paged or (paged_tx is not None and paged_tx.runs):
            return self._commit_paged(paged, ops, added, paged_tx)
        self._journal_then_queue(ops, added)
        return bool(ops)

    def _needs_bindings(self, refs: list[MessageRef], pagers: Sequence[AddressPager] = ()) -> bool:
        """Some of `refs` (or of the queues the paged addresses route to) are in queues whose
        bindings record may not be on disk yet."""
        fresh = self.fresh_queues
        if not fresh:
            return False
        return any(r.queue.id in fresh for r in refs) or any(
            q.id in fresh for p in pagers for q in p.addr.queues.values()
        )

    def _commit_paged(
        self,
        paged: list[tuple[AddressPager, Message, list[Queue]]],
        ops: list[object],
        added: list[MessageRef],
        paged_tx: PagedTx | None = None,
    ) -> bool:
        """A transaction some of whose messages go to pages (decision 0049): they are written there
        now, marked with a page transaction id; the rest of the transaction (its journal records
        and a PAGE_TX record naming that id) is journaled as one batch once those page writes are
        durable, and only then may its paged messages be read: a crash before leaves page records
        of a transaction the journal never committed, skipped at the restart."""
        assert self.pages is not None
        txs: list[int] = []
        pagers: list[AddressPager] = []
        if paged_tx is not None and paged_tx.runs:  # paged while open: its files become pages first
            pagers, seqs = paged_tx.commit()
            self.storage.store_page_tx(paged_tx.tx, ops, seqs)
            txs.append(paged_tx.tx)
        if paged:  # a page transaction of its own: its records carry their sequences (0055's count 1, 2, ...)
            tx = self.ids.next()
            for pager, m, queues in paged:
                self._page(pager, m, queues, tx)
            self.storage.store_page_tx(tx, ops)
            txs.append(tx)
        pagers = list({id(p): p for p in [*pagers, *(p for p, _m, _q in paged)]}.values())
        self.pages.after_durable(partial(self._apply_commit, txs, ops, pagers, added))
        return True

    def _apply_commit(
        self,
        txs: list[int],
        ops: list[object],
        pagers: list[AddressPager],
        added: list[MessageRef],
        held: bool = False,
    ) -> None:
        """Journal a commit's (or a move's, or a send's) batch, then queue its copies and make its
        page transactions readable: once what it waited for is durable (its page writes, decision
        0049; the bindings records of queues its copies name, `_journal_then_queue`). `held`: the
        copies count against their addresses' limits meanwhile (`_hold`), until queued."""
        if ops and self._needs_bindings(added, pagers):
            self.storage.after_bindings_durable(partial(self._apply_commit, txs, ops, pagers, added, held))
            return
        try:
            if ops:
                try:
                    self.storage.commit(ops)
                except JournalIOError:  # failed since the pages were written (the broker is stopping):
                    return  # not committed, so its messages are never queued (a restart skips their pages)
            for ref in added:
                if not ref.queue.deleted:
                    ref.queue.add(ref)
        finally:
            if held:
                _hold(added, -1)  # after they count as queued: no moment of room in between
                self.holding -= len(added)
        for pager in pagers:
            for tx in txs:
                pager.tx_committed(tx)

    # ------------------------------------------------ open transactions (0055)
    def hold(self, tx: Transaction, message: Message, queues: list[Queue]) -> None:
        """A transacted send, routed to `queues`: held in the session until the commit, or paged
        now when the address would be full counting what this transaction holds for it, or the
        broker counting what every open transaction holds, or, if the address pages already,
        once the transaction holds more for it than the address's `max-size-bytes` or
        `page-size-bytes`, the smaller (less is paged at the commit, as decision 0049 does:
        no file of its own per small transaction). Once a transaction pages to an address,
        everything it sends there is paged, what it held for it first (its order)."""
        size = message.size
        addr = queues[0].addr if queues else None
        if addr is not None and self.pages is not None:
            paged = tx.paged
            if paged is not None and paged.pages_to(addr.id) and message.large is None:
                assert addr.pager is not None
                paged.write(addr.pager, message, queues)
                return
            held = tx.held_by.get(addr.id, 0) + size * len(queues)
            pager = self._pager_for(message, queues, held, self.tx_held_bytes + size)
            if pager is not None and (pager.active or addr.full):
                limit = addr.settings.max_size_bytes
                small = addr.settings.page_size_bytes if limit < 0 else min(limit, addr.settings.page_size_bytes)
                lim = addr.limits
                if held <= small and not 0 <= lim.max_size <= lim.size + self.tx_held_bytes + size:
                    pager = None  # held, paged at the commit
            if pager is not None:
                if paged is None:
                    paged = tx.paged = PagedTx(self.ids.next())
                keep: list[Message] = []
                for m in tx.messages:  # what it held for this address goes first
                    if m.address == addr.name and m.large is None:
                        qs = self.route(m)
                        if qs and qs[0].addr is addr:
                            paged.write(pager, m, qs)
                            tx.held -= m.size
                            self.tx_held_bytes -= m.size
                            continue
                    keep.append(m)
                tx.messages = keep
                tx.held_by.pop(addr.id, None)
                paged.write(pager, message, queues)
                return
            tx.held_by[addr.id] = held
        tx.messages.append(message)
        tx.held += size
        self.tx_held_bytes += size

    def release(self, tx: Transaction, discard: bool) -> None:
        """A transaction is over: what it held no longer counts; rolled back (`discard`), what
        it paged is deleted."""
        self.tx_held_bytes -= tx.held
        tx.held = 0
        tx.held_by.clear()
        if discard and tx.paged is not None:
            tx.paged.discard()
            tx.paged = None

    def transaction_seen(self, dedup_id: str) -> bool:
        return dedup_id in self.dedup_cache(TX_CACHE)

    def taken_by_empty_retry(self, dedup_id: str) -> bool:
        """Whether a retry_commit with nothing in its transaction took this transaction id (then
        nothing of the first attempt was applied under it)."""
        return empty_retry_key(dedup_id) in self.dedup_cache(TX_CACHE)

    # ------------------------------------------------------------------ scan
    def expire_scan(self) -> int:
        now = now_ms()
        return sum(q.expire_scan(now) for q in list(self.queues.values()))

    def stat(self) -> dict[str, Any]:
        lim = self.limits
        return {
            "addresses": len(self.addresses),
            "queues": len(self.queues),
            "messages": sum(q.message_count for q in self.queues.values()),
            "consumers": sum(len(q.consumers) + len(q.browsers) for q in self.queues.values()),
            "temporary_queues": sum(1 for q in self.queues.values() if q.temporary),
            "memory_bytes": lim.size,
            "memory_messages": lim.messages,
            "transaction_bytes": self.tx_held_bytes,  # held by open transactions (not paged)
            "global_max_size": lim.max_size,
            "global_max_messages": lim.max_messages,
            # per address that holds anything in memory or has paged: bytes in memory, bytes paged, paging
            "address_memory": {
                a.name: {
                    "memory_bytes": a.size_bytes,
                    "paged_bytes": a.pager.store.paged_bytes(a.id) if a.pager is not None else 0,
                    "paging": a.paging,
                }
                for name, a in sorted(self.addresses.items())
                if a.size_bytes or a.pager is not None
            },
        }


def _hold(refs: list[MessageRef], sign: int) -> None:
    """Copies waiting for their queues' records (`_journal_then_queue`) count against their
    addresses' limits meanwhile (`sign` 1), as queued ones do, until queued (-1): a burst to a
    queue just created must not pass a BLOCK or FAIL address's max-size-bytes while it waits.
    Their queues count them too: a later copy waits behind them even once the record is stored
    (its callback may run for a later bindings batch), so a queue keeps its sequence order."""
    for r in refs:
        r.queue.held += sign
        a = r.queue.addr
        if a is not None:
            a.size_changed(sign * len(r.message.raw), sign)
