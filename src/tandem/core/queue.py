"""Queues: priority-ordered message references, round-robin dispatch to consumers.

No task per message and no task per queue: adding a message or granting
credit schedules one dispatch pass (a loop callback) that delivers up to
MAX_PER_PASS messages and reschedules itself if more could go.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import TandemError
from .consumer import Consumer, Filter
from .message import MessageRef, RoutingType

if TYPE_CHECKING:
    from .storage import Storage

log = logging.getLogger("tandem.queue")

MAX_PER_PASS = 1000
SEQ_BLOCK = 1 << 16
LEVELS = 10

Scheduler = Callable[[Callable[[], None]], Any]


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
        filter_text: str | None = None,
        filter: Filter | None = None,
        temporary: bool = False,
        auto_created: bool = False,
        max_consumers: int = -1,
        next_seq: int = 1,
        seq_reserved: int = 0,
    ) -> None:
        self.id = qid
        self.name = name
        self.address = address
        self.routing_type = routing_type
        self.durable = durable
        self.storage = storage
        self.filter_text = filter_text
        self.filter = filter
        self.temporary = temporary
        self.auto_created = auto_created
        self.max_consumers = max_consumers
        self.owner: object = None
        self._schedule = schedule
        self._levels: list[deque[MessageRef]] = [deque() for _ in range(LEVELS)]
        self._count = 0
        self._bytes = 0
        self._scheduled = False
        self.consumers: list[Consumer] = []
        self.browsers: dict[Consumer, deque[MessageRef]] = {}
        self._rr = 0
        self._next_seq = next_seq
        self._seq_reserved = seq_reserved
        self.deleted = False
        # statistics
        self.messages_added = 0
        self.messages_acked = 0
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

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def restore_seq(self, next_seq: int) -> None:
        self._next_seq = max(self._next_seq, next_seq)

    # ------------------------------------------------------------ contents
    @property
    def message_count(self) -> int:
        """Messages in the queue, including those delivered and not yet acknowledged."""
        return self._count + self.delivering_count

    @property
    def ready_count(self) -> int:
        return self._count

    @property
    def ready_bytes(self) -> int:
        return self._bytes

    def add(self, ref: MessageRef) -> None:
        self._levels[ref.message.priority].append(ref)
        self._count += 1
        self._bytes += ref.message.size
        self.messages_added += 1
        if self.browsers:
            for pending in self.browsers.values():
                pending.append(ref)
        if (self.consumers or self.browsers) and not self._scheduled:
            self._scheduled = True
            self._schedule(self._dispatch)

    def add_loaded(self, ref: MessageRef) -> None:
        """Reload path: no dispatch, no statistics."""
        self._levels[ref.message.priority].append(ref)
        self._count += 1
        self._bytes += ref.message.size
        if ref.seq >= self._next_seq:
            self._next_seq = ref.seq + 1

    def sort_loaded(self) -> None:
        for level in self._levels:
            if len(level) > 1:
                ordered = sorted(level, key=_seq_of)
                level.clear()
                level.extend(ordered)

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
            by_level.setdefault(ref.message.priority, []).append(ref)
            self._count += 1
            self._bytes += ref.message.size
        for prio, items in by_level.items():
            level = self._levels[prio]
            items.sort(key=_seq_of)
            top = items[-1].seq
            while level and level[0].seq < top:
                items.append(level.popleft())
            if len(items) > 1:
                items.sort(key=_seq_of)
            level.extendleft(reversed(items))

    # ----------------------------------------------------------- consumers
    def add_consumer(self, consumer: Consumer) -> None:
        if consumer.browse_only:
            self.browsers[consumer] = deque(self.iter_refs())
        else:
            self.consumers.append(consumer)
        self.deliver_soon()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach a consumer; its unacknowledged messages return in order, delivery count + 1."""
        consumer.closed = True
        if consumer.browse_only:
            self.browsers.pop(consumer, None)
            return
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        refs = consumer.take_all()
        if refs:
            self.cancel(refs)

    def deliver_soon(self) -> None:
        if not self._scheduled and not self.deleted:
            self._scheduled = True
            self._schedule(self._dispatch)

    def _dispatch(self) -> None:
        self._scheduled = False
        if self.deleted:
            return
        delivered = 0
        if self.browsers:
            delivered += self._dispatch_browsers()
        consumers = self.consumers
        if not consumers or not self._count:
            return
        n = len(consumers)
        skipped: list[MessageRef] = []
        while self._count and delivered < MAX_PER_PASS:
            ref = self._pop()
            assert ref is not None
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
            self.delivering_count += 1
            chosen.deliver(ref)
            delivered += 1
        if skipped:
            self._push_front(skipped)
        if delivered >= MAX_PER_PASS:
            self.deliver_soon()

    def _dispatch_browsers(self) -> int:
        delivered = 0
        for b, pending in self.browsers.items():
            while pending and b.ready and delivered < MAX_PER_PASS:
                ref = pending.popleft()
                if ref.removed or not b.accepts(ref):
                    continue
                b.deliver(ref)
                delivered += 1
        if delivered >= MAX_PER_PASS:
            self.deliver_soon()
        return delivered

    # ----------------------------------------------------- acks and cancels
    def acknowledge(self, refs: list[MessageRef], tx: list[object] | None = None) -> None:
        """Delivered refs are done with: forget them, durably."""
        self.delivering_count -= len(refs)
        self.messages_acked += len(refs)
        self._drop(refs, tx)

    def _drop(self, refs: list[MessageRef], tx: list[object] | None = None) -> None:
        persist = self.durable and self.storage.persistent
        durable = []
        for ref in refs:
            ref.removed = True
            if persist and ref.message.durable:
                durable.append(ref.message)
        if durable:
            self.storage.store_acks(durable, self, tx)

    def cancel(self, refs: list[MessageRef]) -> None:
        """Return delivered refs to the queue (consumer closed, session ended)."""
        persist = self.durable and self.storage.persistent
        for ref in refs:
            ref.delivery_count += 1
            self.delivering_count -= 1
            if persist and ref.message.durable:
                self.storage.store_delivery_count(ref.message, self, ref.delivery_count)
        if not self.deleted:
            self._push_front(refs)
            self.deliver_soon()

    def purge(self) -> int:
        """Drop every queued (not in-delivery) message; returns how many."""
        refs: list[MessageRef] = []
        for level in self._levels:
            refs.extend(level)
            level.clear()
        self._count = 0
        self._bytes = 0
        self._drop(refs)
        return len(refs)

    def close_consumers(self, error: TandemError) -> None:
        for c in [*self.consumers, *self.browsers]:
            self.remove_consumer(c)
            c.sink.consumer_closed(c, error)

    def stat(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "routing_type": self.routing_type.name.lower(),
            "durable": self.durable,
            "temporary": self.temporary,
            "filter": self.filter_text,
            "message_count": self.message_count,
            "delivering_count": self.delivering_count,
            "consumer_count": len(self.consumers),
            "messages_added": self.messages_added,
            "messages_acknowledged": self.messages_acked,
            "last_seq": self.last_seq,
        }

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, count={self.message_count})"


def _seq_of(ref: MessageRef) -> int:
    return ref.seq
