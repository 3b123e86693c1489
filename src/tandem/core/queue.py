"""Queues: priority-ordered message references, round-robin dispatch to consumers.

No task per message and no task per queue: adding a message or granting
credit schedules one dispatch pass (a loop callback) that delivers up to
MAX_PER_PASS messages and reschedules itself if more could go.

What happens to a message that is not acknowledged (consumer gone, rollback,
negative ack) follows the address settings: its delivery count goes up; at
`max-delivery-attempts` it moves to the dead-letter address, otherwise it
comes back after `redelivery-delay`. Expired messages are never delivered:
they move to the expiry address (or are dropped).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Collection, Iterator
from itertools import islice
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import IllegalState, TandemError
from .browse import Browse
from .consumer import Consumer, Filter
from .message import MessageRef, RoutingType
from .reflevel import RefLevel
from .settings import AddressSettings

if TYPE_CHECKING:
    from .address import Address
    from .storage import Storage

log = logging.getLogger("tandem.queue")

MAX_PER_PASS = 1000
NEVER = 1 << 62  # epoch ms later than any expiration
SEQ_BLOCK = 1 << 16
LEVELS = 10

Scheduler = Callable[[Callable[[], None]], Any]


class QueueHost(Protocol):
    """What a queue asks of the post office."""

    def move(self, ref: MessageRef, target: str | None, reason: str, extra: dict[str, Any]) -> None: ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> Any: ...

    def queue_idle(self, queue: Queue) -> None: ...


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Queue:
    def __init__(
        self,
        qid: int,
        name: str,
        address: str,
        routing_type: RoutingType,
        durable: bool,
        storage: Storage,
        schedule: Scheduler,
        *,
        settings: AddressSettings | None = None,
        host: QueueHost | None = None,
        filter_text: str | None = None,
        filter: Filter | None = None,
        temporary: bool = False,
        auto_created: bool = False,
        max_consumers: int = -1,
        exclusive: bool = False,
        last_value_key: str | None = None,
        reader_only: bool = False,
        next_seq: int = 1,
        seq_reserved: int = 0,
    ) -> None:
        self.id = qid
        self.name = name
        self.address = address
        self.routing_type = routing_type
        self.durable = durable
        self.storage = storage
        self.settings = settings or AddressSettings()
        self.host = host
        self.filter_text = filter_text
        self.filter = filter
        self.temporary = temporary
        self.auto_created = auto_created
        self.max_consumers = max_consumers
        self.exclusive = exclusive
        self.last_value_key = last_value_key
        self.reader_only = reader_only  # dedicated to range readers: ordinary consumers are refused
        self.owner: object = None
        self.addr: Address | None = None
        self._schedule = schedule
        self._levels: list[RefLevel] = [RefLevel() for _ in range(LEVELS)]
        # No queued message expires before this (epoch ms): the periodic expiry scan walks the
        # levels only from then on, not every period (a million refs is ~0.3 s of held loop).
        self._next_expiry = NEVER
        self._count = 0
        self._bytes = 0
        self._scheduled = False
        self.consumers: list[Consumer] = []
        self.browsers: dict[Consumer, Browse] = {}
        self._rr = 0
        self._last_values: dict[Any, MessageRef] = {}
        self._next_seq = next_seq
        self._seq_reserved = seq_reserved
        self.scheduled_count = 0  # waiting out a redelivery delay
        self.deleted = False
        self.paused = False  # receives and counts, delivers to no consumer (decision 0067)
        self.held = 0  # copies waiting to be queued behind a bindings record (PostOffice._journal_then_queue)
        # statistics
        self.messages_added = 0
        self.messages_acked = 0
        self.messages_expired = 0
        self.messages_killed = 0  # moved to the dead-letter address (or dropped there)
        self.delivering_count = 0

    # ----------------------------------------------------------- sequences
    def next_seq(self) -> int:
        """Per-queue sequence number; its high-water mark is reserved in the bindings journal."""
        n = self._next_seq
        self._next_seq = n + 1
        if self.durable and n >= self._seq_reserved - SEQ_BLOCK // 2:
            self._seq_reserved = n + SEQ_BLOCK
            self.storage.store_queue_seq(self, self._seq_reserved)
        return n

    def next_seqs(self, count: int) -> int:
        """`count` consecutive sequence numbers (a paged transaction's, at its commit); the first."""
        first = self._next_seq
        if count <= 0:
            return first
        last = first + count - 1
        self._next_seq = last + 1
        if self.durable and last >= self._seq_reserved - SEQ_BLOCK // 2:
            self._seq_reserved = last + SEQ_BLOCK
            self.storage.store_queue_seq(self, self._seq_reserved)
        return first

    def seqs_used(self, last: int) -> None:
        """Reload: sequences up to `last` are taken (a paged record's, or a committed paged
        transaction's, whose reservation may not have reached the disk before a crash)."""
        if last >= self._next_seq:
            self._next_seq = last + 1

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    # ------------------------------------------------------------ contents
    @property
    def message_count(self) -> int:
        """Messages in the queue, including those in delivery, waiting out a redelivery delay, or paged."""
        n = self._count + self.delivering_count + self.scheduled_count
        addr = self.addr
        if addr is not None and addr.pager is not None:
            n += addr.pager.paged.get(self.id, 0)
        return n

    @property
    def paged_count(self) -> int:
        addr = self.addr
        return addr.pager.paged.get(self.id, 0) if addr is not None and addr.pager is not None else 0

    @property
    def ready_count(self) -> int:
        return self._count

    @property
    def ready_bytes(self) -> int:
        return self._bytes

    def _account(self, size: int, count: int) -> None:
        addr = self.addr
        if addr is not None:
            addr.size_changed(size, count)

    def add(self, ref: MessageRef) -> None:
        m = ref.message
        if self.last_value_key is not None:
            self._replace_last_value(ref)
        self._levels[m.priority].append(ref)
        if m.expiration and m.expiration < self._next_expiry:
            self._next_expiry = m.expiration
        self._count += 1
        size = len(m.raw)
        self._bytes += size
        self._account(size, 1)
        self.messages_added += 1
        if self.browsers:
            for browse in self.browsers.values():
                browse.added(ref)
        if (self.consumers or self.browsers) and not self._scheduled:
            self._scheduled = True
            self._schedule(self._dispatch)

    def add_depaged(self, refs: list[MessageRef]) -> None:
        """Messages read back from a page file, in order (counted as added when they were paged);
        accounted once for the batch."""
        if self.last_value_key is not None:  # a replacement drops a queued one, counted: one by one
            for ref in refs:
                self._add_depaged([ref])
        else:
            self._add_depaged(refs)

    def _add_depaged(self, refs: list[MessageRef]) -> None:
        levels = self._levels
        size = 0
        if self.last_value_key is not None:
            for ref in refs:
                m = ref.message
                self._replace_last_value(ref)
                levels[m.priority].append(ref)
                if m.expiration and m.expiration < self._next_expiry:
                    self._next_expiry = m.expiration
                size += len(m.raw)
        else:
            prio = refs[0].message.priority if refs else 0
            mixed = False
            for ref in refs:
                m = ref.message
                if m.priority != prio:
                    mixed = True
                if m.expiration and m.expiration < self._next_expiry:
                    self._next_expiry = m.expiration
                size += len(m.raw)
            if mixed:
                for ref in refs:
                    levels[ref.message.priority].append(ref)
            else:  # one priority, the common case: one call for the batch
                levels[prio].extend(refs)
        self._count += len(refs)
        self._bytes += size
        self._account(size, len(refs))
        if self.browsers:
            for browse in list(self.browsers.values()):
                for ref in refs:
                    browse.added(ref, depaged=True)

    def add_loaded(self, ref: MessageRef) -> None:
        """Reload path: no dispatch, no statistics."""
        m = ref.message
        self._levels[m.priority].append(ref)
        if m.expiration and m.expiration < self._next_expiry:
            self._next_expiry = m.expiration
        self._count += 1
        self._bytes += m.size
        self._account(m.size, 1)
        if ref.seq >= self._next_seq:
            self._next_seq = ref.seq + 1

    def adopt(self, refs: list[MessageRef]) -> int:
        """Take the references a warm backup built while following; acknowledged ones are dropped."""
        levels = self._levels
        n = size = top = 0
        for r in refs:
            if not r.removed:
                r.queue = self
                m = r.message
                levels[m.priority].append(r)
                size += len(m.raw)
                if m.expiration and m.expiration < self._next_expiry:
                    self._next_expiry = m.expiration
                if r.seq > top:
                    top = r.seq
                n += 1
        self._count += n
        self._bytes += size
        self._account(size, n)
        if top >= self._next_seq:
            self._next_seq = top + 1
        return n

    def sort_loaded(self) -> None:
        for level in self._levels:
            if len(level) > 1:
                ordered = sorted(level, key=_seq_of)
                level.clear()
                level.extend(ordered)
        if self.last_value_key is not None:
            for ref in list(self.iter_refs()):
                self._replace_last_value(ref, loading=True)

    def iter_refs(self) -> Iterator[MessageRef]:
        """Queued references in delivery order (highest priority first, FIFO within one)."""
        for level in reversed(self._levels):
            yield from level

    def _pop(self) -> MessageRef | None:
        for level in reversed(self._levels):
            if level:
                ref = level.popleft()
                self._count -= 1
                self._bytes -= ref.message.size
                return ref
        return None

    def _push_front(self, refs: list[MessageRef]) -> None:
        """Put refs back at the head of their priority levels, keeping sequence order."""
        by_level: dict[int, list[MessageRef]] = {}
        for ref in refs:
            m = ref.message
            by_level.setdefault(m.priority, []).append(ref)
            self._count += 1
            self._bytes += m.size
            if m.expiration and m.expiration < self._next_expiry:  # back from a delivery
                self._next_expiry = m.expiration
        for prio, items in by_level.items():
            level = self._levels[prio]
            items.sort(key=_seq_of)
            top = items[-1].seq
            while level and level[0].seq < top:
                items.append(level.popleft())
            if len(items) > 1:
                items.sort(key=_seq_of)
            level.extendleft(reversed(items))

    def _remove_queued(self, ref: MessageRef) -> bool:
        level = self._levels[ref.message.priority]
        try:
            level.remove(ref)
        except ValueError:
            return False
        self._count -= 1
        self._bytes -= ref.message.size
        return True

    # -------------------------------------------------------- last value
    def _replace_last_value(self, ref: MessageRef, loading: bool = False) -> None:
        """A newer message with the same last-value key replaces the queued older one."""
        key = self.last_value_key
        props = ref.message.properties
        if key is None or not props or key not in props:
            return
        value = props[key]
        if isinstance(value, (bytearray, list, dict)):
            return
        old = self._last_values.get(value)
        self._last_values[value] = ref
        if old is not None and old is not ref and not old.removed and self._remove_queued(old):
            self._drop([old])
            self.messages_acked += 1

    def _forget_last_value(self, ref: MessageRef) -> None:
        key = self.last_value_key
        props = ref.message.properties
        if key is not None and props and key in props:
            value = props[key]
            if not isinstance(value, (bytearray, list, dict)) and self._last_values.get(value) is ref:
                del self._last_values[value]

    # ----------------------------------------------------------- consumers
    def add_consumer(self, consumer: Consumer) -> None:
        if consumer.browse_only:
            self.browsers[consumer] = Browse(self.iter_refs())
        else:
            self.consumers.append(consumer)
        self.deliver_soon()

    def remove_consumer(self, consumer: Consumer, unseen: Collection[int] = ()) -> None:
        """Detach a consumer; its unacknowledged messages return in order, delivery count + 1.

        Messages the client says it never handed to the application (`unseen`: still in its
        buffer when it closed cleanly) were not a failed delivery and keep their count.
        """
        consumer.closed = True
        if consumer.browse_only:
            self.browsers.pop(consumer, None)
            return
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        refs = consumer.take_all()
        if refs:
            self.cancel(refs, unseen=unseen)
        if self.consumers:
            self.deliver_soon()  # an exclusive queue's next consumer takes over
        elif self.host is not None:
            self.host.queue_idle(self)

    def deliver_soon(self) -> None:
        if not self._scheduled and not self.deleted:
            self._scheduled = True
            self._schedule(self._dispatch)

    def _dispatch(self) -> None:
        self._scheduled = False
        if self.deleted:
            return
        if self.paused:  # browsers only look: they go on (decision 0067)
            if self.browsers:
                self._dispatch_browsers()
            return
        addr = self.addr
        pager = addr.pager if addr is not None else None
        if pager is not None and pager.active and self.consumers:
            read = pager.refill(self)
            before = self._count
            self._dispatch_some()
            if not self._count and (read or before) and pager.paged.get(self.id):
                self.deliver_soon()  # emptied (delivered, or expired) with more in the pages: read on
            return
        self._dispatch_some()

    def _dispatch_some(self) -> int:
        delivered = 0
        if self.browsers:
            delivered += self._dispatch_browsers()
        consumers = self.consumers[:1] if self.exclusive else self.consumers
        if not consumers or not self._count:
            return delivered
        n = len(consumers)
        lvq = self.last_value_key is not None
        if not lvq and all(c.filter is None for c in consumers):
            if n == 1:
                delivered += self._dispatch_single(consumers[0], MAX_PER_PASS - delivered)
            else:
                delivered += self._dispatch_shared(consumers, MAX_PER_PASS - delivered)
            if delivered >= MAX_PER_PASS:
                self.deliver_soon()
            return delivered
        skipped: list[MessageRef] = []
        now = 0
        while self._count and delivered < MAX_PER_PASS:
            ref = self._pop()
            assert ref is not None
            exp = ref.message.expiration
            if exp:
                if not now:
                    now = now_ms()
                if exp <= now:
                    self._expire(ref)
                    continue
            chosen = None
            any_ready = False
            rr = self._rr
            for i in range(n):
                c = consumers[(rr + i) % n]
                if not c.ready:
                    continue
                any_ready = True
                if c.filter is None or c.filter.matches(ref):
                    chosen = c
                    self._rr = (rr + i + 1) % n
                    break
            if chosen is None:
                skipped.append(ref)
                if not any_ready:
                    break
                continue
            if lvq:
                self._forget_last_value(ref)
            self.delivering_count += 1
            chosen.deliver(ref)
            delivered += 1
        if skipped:
            self._push_front(skipped)
        if delivered >= MAX_PER_PASS:
            self.deliver_soon()
        return delivered

    def _dispatch_single(self, c: Consumer, budget: int) -> int:
        """The common case, one consumer without a filter: no round robin, no skipping, and
        each priority level drained in turn instead of searched for every message.

        Only the consumer's credit changes during the loop (its sink's writability changes
        when the sink flushes, after this pass), so the full readiness check is made once."""
        delivered = 0
        now = 0
        if not c.ready:
            return 0
        unlimited = c.window < 0
        account = None if c.browse_only else c.account
        for level in reversed(self._levels):
            while level:
                if delivered >= budget:
                    return delivered
                # Several at once (credit is in bytes, so a limited window takes a few at a time
                # and gives back what it could not send); expired ones use no budget or credit.
                refs = level.take(budget - delivered if unlimited else min(budget - delivered, 32))
                for k, ref in enumerate(refs):
                    if not (unlimited or c.credits > 0):
                        level.give_back(refs[k:])
                        return delivered
                    m = ref.message
                    self._count -= 1
                    self._bytes -= len(m.raw)
                    exp = m.expiration
                    if exp:
                        if not now:
                            now = now_ms()
                        if exp <= now:
                            self._expire(ref)
                            continue
                    self.delivering_count += 1
                    c.deliver(ref)
                    delivered += 1
                    if account is not None and account.full:  # its connection's unacked limit
                        level.give_back(refs[k + 1 :])
                        return delivered
                    if m.large is not None:
                        # Its chunks go out over several loop passes; the sink is not ready again
                        # until the last is out (it then asks for delivery again), so nothing
                        # overtakes it.
                        level.give_back(refs[k + 1 :])
                        return delivered
        return delivered

    def _dispatch_shared(self, consumers: list[Consumer], budget: int) -> int:
        """Several consumers without filters (competing consumers, the common case of a busy
        queue): round robin as the general loop does, the same result, but the levels drained
        in batches and each consumer's readiness checked in full once per pass. Within the pass
        only its credit and its connection's unacknowledged limit change (its sink's writability
        changes when the sink flushes, after this pass)."""
        n = len(consumers)
        rr = self._rr
        ready = [c.ready for c in consumers]
        delivered = 0
        now = 0
        for level in reversed(self._levels):
            while level:
                if delivered >= budget:
                    self._rr = rr
                    return delivered
                refs = level.take(min(budget - delivered, 64))
                for k, ref in enumerate(refs):
                    m = ref.message
                    exp = m.expiration
                    if exp:
                        if not now:
                            now = now_ms()
                        if exp <= now:
                            self._count -= 1
                            self._bytes -= len(m.raw)
                            self._expire(ref)
                            continue
                    for i in range(n):  # the next ready consumer after the last one chosen
                        j = (rr + i) % n
                        if ready[j]:
                            c = consumers[j]
                            a = c.account
                            if (c.window < 0 or c.credits > 0) and (a is None or c.browse_only or not a.full):
                                break
                            ready[j] = False
                    else:
                        level.give_back(refs[k:])
                        self._rr = rr
                        return delivered
                    rr = (j + 1) % n
                    self._count -= 1
                    self._bytes -= len(m.raw)
                    self.delivering_count += 1
                    c.deliver(ref)
                    delivered += 1
                    if m.large is not None:
                        # Its chunks go out over several passes and nothing of its consumer's may
                        # overtake it: the pass ends here, and the next one (its sink not ready
                        # then) serves the others, as the general loop would at once.
                        level.give_back(refs[k + 1 :])
                        self._rr = rr
                        self.deliver_soon()
                        return delivered
        self._rr = rr
        return delivered

    def _dispatch_browsers(self) -> int:
        """Browsers see memory and the address's pages (core/browse.py), reading nothing back."""
        delivered = 0
        pager = self.addr.pager if self.addr is not None else None
        for b, browse in self.browsers.items():
            delivered += browse.step(b, self, pager, MAX_PER_PASS - delivered)
        if delivered >= MAX_PER_PASS:
            self.deliver_soon()
        return delivered

    # ------------------------------------------- operator actions (decision 0066, 0067)
    def set_paused(self, paused: bool) -> bool:
        """Pause or resume delivery to consumers; journaled for a durable queue (the bindings
        journal, with the queue). Whether anything changed."""
        if paused == self.paused:
            return False
        self.paused = paused
        if self.durable and self.storage.persistent:
            self.storage.store_queue_status(self)
        if not paused:
            self.deliver_soon()
        return True

    def take(self, accept: Callable[[MessageRef], bool], limit: int = -1) -> list[MessageRef]:
        """Take the queued messages `accept` accepts (delivery order, at most `limit`; < 0: all)
        out of the queue as a delivery would: counted in delivery until acknowledged, or given back
        with `give_back`. Messages in delivery or waiting out a redelivery delay are not seen."""
        taken: list[MessageRef] = []
        for level in reversed(self._levels):
            if 0 <= limit <= len(taken):
                break
            if not level:
                continue
            keep: list[MessageRef] = []
            for r in level:
                if (limit < 0 or len(taken) < limit) and not r.removed and accept(r):
                    taken.append(r)
                else:
                    keep.append(r)
            if len(keep) < len(level):
                level.clear()
                level.extend(keep)
        lvq = self.last_value_key is not None
        for r in taken:
            self._count -= 1
            self._bytes -= r.message.size
            if lvq:
                self._forget_last_value(r)
        self.delivering_count += len(taken)
        return taken

    def give_back(self, refs: list[MessageRef]) -> None:
        """Refs `take` took come back as they were (not a failed delivery: counts unchanged)."""
        self.delivering_count -= len(refs)
        if not self.deleted:
            self._requeue([r for r in refs if not r.removed])

    # ----------------------------------------------------- acks and cancels
    def acknowledge(self, refs: list[MessageRef], tx: list[object] | None = None) -> bool:
        """Delivered refs are done with: forget them, durably. True if that wrote to the journal
        (or to `tx`): an answer that says so waits for the journal's sync."""
        self.delivering_count -= len(refs)
        self.messages_acked += len(refs)
        self._drop(refs, tx)
        if not self.consumers and self.host is not None and not self.message_count:
            self.host.queue_idle(self)
        return self.durable and self.storage.persistent and any(r.message.durable for r in refs)

    def _drop(self, refs: list[MessageRef], tx: list[object] | None = None) -> None:
        persist = self.durable and self.storage.persistent
        durable = []
        depaged: list[MessageRef] = []
        released = 0
        for ref in refs:
            ref.removed = True
            m = ref.message
            released += len(m.raw)
            if ref.pos is not None:
                depaged.append(ref)  # still a page record: acknowledged by position (decision 0063)
            elif persist and m.durable:
                durable.append(m)
        if durable:
            self.storage.store_acks(durable, self, tx)
        if depaged:
            pager = self.addr.pager if self.addr is not None else None
            if pager is not None:
                pager.acknowledged(self, depaged, tx)
        if released:
            self._account(-released, -len(refs))

    def cancel(self, refs: list[MessageRef], redeliver_delay: bool = True, unseen: Collection[int] = ()) -> None:
        """Delivered refs come back unacknowledged (consumer gone, rollback, negative ack)."""
        persist = self.durable and self.storage.persistent
        back: list[MessageRef] = []
        max_attempts = self.settings.max_delivery_attempts
        failed = 0  # the highest delivery count among refs that did fail (sets the delay)
        for ref in refs:
            self.delivering_count -= 1
            if unseen and ref.message.id in unseen:
                back.append(ref)  # never reached the application: not a failed delivery
                continue
            ref.delivery_count += 1
            failed = max(failed, ref.delivery_count)
            if max_attempts > 0 and ref.delivery_count >= max_attempts:
                self._kill(ref, f"delivery failed {ref.delivery_count} times (max-delivery-attempts)")
                continue
            if persist and ref.message.durable:
                if ref.pos is None:
                    self.storage.store_delivery_count(ref.message, self, ref.delivery_count)
                elif self.addr is not None and self.addr.pager is not None:
                    self.addr.pager.delivery_counted(self, ref)
            back.append(ref)
        if not back or self.deleted:
            return
        delay = self.settings.redelivery_delay_for(failed) if redeliver_delay and failed else 0
        if delay > 0 and self.host is not None:
            self.scheduled_count += len(back)
            self.host.call_later(delay / 1000, lambda: self._redeliver(back))
        else:
            self._requeue(back)

    def _redeliver(self, refs: list[MessageRef]) -> None:
        self.scheduled_count -= len(refs)
        if not self.deleted:
            self._requeue([r for r in refs if not r.removed])

    def _requeue(self, refs: list[MessageRef]) -> None:
        if self.last_value_key is not None:
            fresh = []
            for ref in refs:
                props = ref.message.properties
                key = self.last_value_key
                newer = props and key in props and self._last_values.get(props[key]) not in (None, ref)
                if newer:
                    self._drop([ref])  # a newer value arrived meanwhile: this one is superseded
                    self.messages_acked += 1
                else:
                    fresh.append(ref)
                    self._replace_last_value(ref)
            refs = fresh
        if refs:
            self._push_front(refs)
            self.deliver_soon()

    # ------------------------------------------------------ range readers
    def first_seq(self) -> int:
        """The lowest sequence still in the queue (last_seq + 1 when empty)."""
        heads = [level[0].seq for level in self._levels if level]
        return min(heads) if heads else self._next_seq

    def read_range(self, start: int, end: int, limit: int) -> list[MessageRef]:
        """Messages with start < seq <= end in sequence order, without consuming them (at most `limit`).

        Made for a reader that keeps its own offsets (the Spark source). Each priority level is
        kept in sequence order, so a read bisects to `start` and merges the levels lazily: a
        reader taking a long range in chunks pays for each chunk, not for what precedes it.
        """
        now = now_ms()

        def level_from(level: RefLevel) -> Iterator[MessageRef]:
            for ref in level.iter_after(start):
                if ref.seq > end:
                    return
                if not ref.removed:
                    exp = ref.message.expiration
                    if not exp or exp > now:
                        yield ref

        runs = [level_from(level) for level in self._levels if level and level[-1].seq > start]
        if not runs:
            return []
        merged = runs[0] if len(runs) == 1 else heapq.merge(*runs, key=_seq_of)
        return list(islice(merged, limit) if limit >= 0 else merged)

    def read_range_soon(self, start: int, end: int, limit: int, done: Callable[[list[MessageRef], int], None]) -> None:
        """`read_range` over memory and the address's pages (their records are read, never taken
        into the queue): `done(refs, first sequence still in the queue)`, at once or, when pages
        must be read first, later from the loop."""
        refs = self.read_range(start, end, limit)
        first = self.first_seq()
        pager = self.addr.pager if self.addr is not None else None
        if pager is None or not pager.paged.get(self.id):
            done(refs, first)
            return

        def paged(more: list[MessageRef], paged_first: int) -> None:
            merged = list(heapq.merge(refs, more, key=_seq_of)) if refs and more else refs or more
            if limit >= 0:
                del merged[limit:]
            done(merged, min(first, paged_first) if paged_first else first)

        pager.read_range(self, start, end, limit, paged)

    def ack_upto_soon(self, seq: int, done: Callable[[int], None]) -> None:
        """`ack_upto` over memory and the address's pages (the queue's page cursor moves past the
        paged messages it covers): `done(how many)`, at once or later from the loop."""
        n = self.ack_upto(seq)
        pager = self.addr.pager if self.addr is not None else None
        if pager is None or not pager.paged.get(self.id):
            done(n)
            return

        def paged(more: int) -> None:
            # what a consumer read back from the pages meanwhile is in memory now
            done(n + more + (self.ack_upto(seq) if more or self._count else 0))

        pager.ack_upto(self, seq, paged)

    def ack_upto(self, seq: int, tx: list[object] | None = None) -> int:
        """Acknowledge every queued message with a sequence up to `seq` (a range reader's commit)."""
        dropped: list[MessageRef] = []
        for level in self._levels:
            while level and level[0].seq <= seq:
                ref = level.popleft()
                self._count -= 1
                self._bytes -= ref.message.size
                if self.last_value_key is not None:
                    self._forget_last_value(ref)
                dropped.append(ref)
        if dropped:
            self.messages_acked += len(dropped)
            self._drop(dropped, tx)
        return len(dropped)

    # ----------------------------------------------------- expiry and DLQ
    def _expire(self, ref: MessageRef) -> None:
        self.messages_expired += 1
        target = self.settings.expiry_address
        extra = {"_AMQ_ACTUAL_EXPIRY": int(time.time() * 1000)}  # when it was expired, as Artemis records
        self._move_out(ref, target, "expired", extra)

    def _kill(self, ref: MessageRef, reason: str) -> None:
        self.messages_killed += 1
        self._move_out(ref, self.settings.dead_letter_address, reason, {})

    def _move_out(self, ref: MessageRef, target: str | None, reason: str, extra: dict[str, Any]) -> None:
        if self.host is not None and target and target != self.address:
            self.host.move(ref, target, reason, extra)  # routes a copy, then acknowledges ref durably
        else:
            log.warning(
                "dropping message",
                extra={"queue": self.name, "message_id": ref.message.id, "reason": reason, "target": target},
            )
            self._drop([ref])

    def expire_scan(self, now: int) -> int:
        """Move out every queued message whose expiration has passed (the periodic scan); walks
        the levels only once the earliest expiration held may have passed."""
        if now < self._next_expiry:
            return 0
        expired: list[MessageRef] = []
        earliest = NEVER
        for level in self._levels:
            if not level:
                continue
            keep: list[MessageRef] = []
            for r in level:
                exp = r.message.expiration
                if not exp:
                    keep.append(r)
                elif exp <= now:
                    expired.append(r)
                else:
                    keep.append(r)
                    if exp < earliest:
                        earliest = exp
            if len(keep) < len(level):
                level.clear()
                level.extend(keep)
        self._next_expiry = earliest
        for ref in expired:
            self._count -= 1
            self._bytes -= ref.message.size
            self._forget_last_value(ref)
            self._expire(ref)
        return len(expired)

    def purge(self) -> int:
        """Drop every queued (not in-delivery) message, paged ones included; returns how many."""
        addr = self.addr
        paged = addr.pager.skip(self) if addr is not None and addr.pager is not None else 0
        refs: list[MessageRef] = []
        for level in self._levels:
            refs.extend(level)
            level.clear()
        self._count = 0
        self._bytes = 0
        self._last_values.clear()
        self._drop(refs)
        return len(refs) + paged

    def close_consumers(self, error: TandemError) -> None:
        for c in [*self.consumers, *self.browsers]:
            self.remove_consumer(c)
            c.sink.consumer_closed(c, error)

    def check_owner(self, who: object) -> None:
        """A temporary queue is read only by the connection that made it (as JMS says of a
        temporary destination); anyone may send to it."""
        if self.temporary and self.owner is not None and who is not self.owner:
            raise IllegalState(f"temporary queue {self.name!r} belongs to another connection")

    def stat(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "routing_type": self.routing_type.name.lower(),
            "durable": self.durable,
            "temporary": self.temporary,
            "exclusive": self.exclusive,
            "last_value_key": self.last_value_key,
            "reader_only": self.reader_only,
            "first_seq": self.first_seq(),
            "filter": self.filter_text,
            "message_count": self.message_count,
            "paging": self.addr is not None and self.addr.paging,
            "paged_count": self.paged_count,
            "memory_bytes": self._bytes,
            "delivering_count": self.delivering_count,
            "scheduled_count": self.scheduled_count,
            "consumer_count": len(self.consumers),
            "paused": self.paused,
            "messages_added": self.messages_added,
            "messages_acknowledged": self.messages_acked,
            "messages_expired": self.messages_expired,
            "messages_killed": self.messages_killed,
            "last_seq": self.last_seq,
        }

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, count={self.message_count})"


_seq_of: Callable[[MessageRef], int] = attrgetter("seq")  # a C-level key: sorts a million refs at a reload
