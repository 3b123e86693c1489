"""What a browser (a consumer that only looks) has still to see of its queue.

A browser sees the queue as it was when it started, in delivery order, then what arrives after:
what was in memory (`snapshot`), then, in sequence order, the messages still in the address's
page files (read through the pager's cache, never into the queue) merged with those that entered
memory since (`fresh`: sent while the address did not page, or read back from the pages by the
queue's consumers). A message read back from a page the browser has already passed is not seen
twice: `last_seq` is the highest sequence it has had from the pages or from `fresh`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .message import Message, MessageRef

if TYPE_CHECKING:
    from .consumer import Consumer
    from .paging import AddressPager, PagedRecord
    from .queue import Queue

LOOK_PER_PASS = 5000  # messages one pass looks at, at most


class Browse:
    __slots__ = ("fresh", "last_seq", "pos", "snapshot")

    def __init__(self, refs: Iterable[MessageRef]) -> None:
        self.snapshot: deque[MessageRef] = deque(refs)
        self.fresh: deque[MessageRef] = deque()
        self.pos: list[int] | None = None  # where it reads the pages (page, index); None: not yet
        self.last_seq = 0

    def added(self, ref: MessageRef, depaged: bool = False) -> None:
        """`ref` entered the queue's memory; `depaged`: read back from a page."""
        if not depaged or ref.seq > self.last_seq:
            self.fresh.append(ref)

    def step(self, b: Consumer, q: Queue, pager: AddressPager | None, budget: int) -> int:
        """Deliver to `b` what it may have now, up to `budget` messages; how many were delivered."""
        delivered = 0
        snapshot = self.snapshot
        while snapshot and delivered < budget and b.ready:
            ref = snapshot.popleft()
            if not ref.removed and b.accepts(ref):
                b.deliver(ref)
                delivered += 1
        if snapshot:
            return delivered
        fresh = self.fresh
        looked = 0
        while delivered < budget and b.ready:
            looked += 1
            if looked > LOOK_PER_PASS:  # a selector that matches little: go on in the next pass
                q.deliver_soon()
                break
            paged: tuple[PagedRecord, int] | bool = False
            if pager is not None and q.id in pager.cursors:
                if self.pos is None:
                    self.pos = list(pager.cursors[q.id])
                paged = pager.next_record(q, self.pos)
            while fresh and fresh[0].removed:
                fresh.popleft()
            if fresh and (paged is False or (isinstance(paged, tuple) and fresh[0].seq < paged[1])):
                ref = fresh.popleft()
                if ref.seq > self.last_seq:
                    self.last_seq = ref.seq
            elif isinstance(paged, tuple):
                record, seq = paged
                assert self.pos is not None
                self.pos[1] += 1
                self.last_seq = seq
                m = Message.decode(record.mid, record.raw)
                if record.expiration:
                    m.expiration = record.expiration
                ref = MessageRef(m, q, seq)
            else:
                break  # nothing more now, or waiting for a page read (the queue is woken then)
            if not ref.removed and b.accepts(ref):
                b.deliver(ref)
                delivered += 1
        return delivered
