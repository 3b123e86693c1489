"""An operator's actions on one queue's messages: look (browse), move or copy elsewhere, retry
dead letters (decision 0066). Pausing is the queue's own (`Queue.set_paused`, decision 0067).

Each works over memory and the address's pages and runs in bounded steps on the loop: a queue of
a million messages never holds the loop for long, and a page read is waited for (the pager's
`waiters`), never blocked on.

- Looking (`Peek`) reads page records where they are, as a browser does (decision 0054).
- Moving takes matching queued messages out of the queue as a delivery would, then, a chunk per
  loop pass, routes a copy of each and acknowledges the original in one transaction
  (`PostOffice.commit_transaction`: one journal batch, or a page transaction when the target
  pages): after a crash a message is in exactly one of the two queues. Paged messages are read
  back into the queue first, as its consumers would read them (journaled with the cursor), then
  moved the same way. Messages in delivery, or waiting out a redelivery delay, are not touched.
- Copying leaves the originals and reads pages in place, as looking does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import TandemError
from .message import Message, MessageData, MessageRef, RoutingType

if TYPE_CHECKING:
    from .paging import AddressPager
    from .postoffice import PostOffice
    from .queue import Queue

MAX_BROWSE = 1000  # messages one browse returns, at most
LOOK_PER_PASS = 2000  # messages (in memory or pages) one loop pass looks at
CHUNK = 200  # messages one transaction moves
CHUNK_BYTES = 256 * 1024  # ... or this many bytes of them
ORIGIN_PROPS = ("_AMQ_ORIG_ADDRESS", "_AMQ_ORIG_QUEUE", "_AMQ_ORIG_MESSAGE_ID", "_AMQ_REASON", "_AMQ_ACTUAL_EXPIRY")

Accept = Callable[[MessageRef], bool]
# Where a message goes: (its copy, id not set yet; the queues it is routed to); None: it stays.
Plan = Callable[[MessageRef], "tuple[Message, list[Queue]] | None"]


def _accept_all(ref: MessageRef) -> bool:
    return True


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Walk:
    """Visits a queue's queued messages in delivery order: those in memory (as they were at the
    start), then its paged records read in place (never moving its cursor), a bounded number
    per loop pass. `visit(ref, paged)` returns False to stop."""

    def __init__(
        self,
        po: PostOffice,
        q: Queue,
        visit: Callable[[MessageRef, bool], bool],
        pages_only: bool = False,
        on_yield: Callable[[], None] | None = None,
    ) -> None:
        self.po = po
        self.q = q
        self.visit = visit
        self.memory = [] if pages_only else list(q.iter_refs())
        self.i = 0
        self.pos: list[int] | None = None
        self.here = (0, 0)  # (page, index) of the paged record being visited
        self.on_yield = on_yield  # before the walk gives the loop back (a pass ends, or a wait)
        self.done_cb: Callable[[], None] = lambda: None
        self.finished = False

    def start(self, done: Callable[[], None]) -> None:
        self.done_cb = done
        self._step()

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.done_cb()

    def _later(self, pager: AddressPager | None = None) -> None:
        if self.on_yield is not None:
            self.on_yield()
        if pager is None:
            self.po.schedule(self._step)
        else:
            pager.waiters.append(self._step)

    def _pager(self) -> AddressPager | None:
        addr = self.q.addr
        return addr.pager if addr is not None else None

    def _step(self) -> None:
        if self.finished:
            return
        q = self.q
        looked = 0
        memory = self.memory
        while self.i < len(memory):
            if looked >= LOOK_PER_PASS:
                self._later()
                return
            ref = memory[self.i]
            self.i += 1
            looked += 1
            if not ref.removed and not self.visit(ref, False):
                self.finish()
                return
        pager = self._pager()
        if q.deleted or pager is None or not pager.paged.get(q.id) or q.id not in pager.cursors:
            self.finish()
            return
        if self.pos is None:
            self.pos = list(pager.cursors[q.id])
        now = 0
        while True:
            if looked >= LOOK_PER_PASS:
                self._later()
                return
            r = pager.next_record(q, self.pos)
            if r is True:  # a page read (or a page transaction's commit) is on its way
                self._later(pager)
                return
            if r is False:
                self.finish()
                return
            record, seq = r
            self.here = (self.pos[0], self.pos[1])
            self.pos[1] += 1
            looked += 1
            if record.expiration:
                now = now or _now_ms()
                if record.expiration <= now:
                    continue
            m = Message.decode(record.mid, msgspec.Raw(record.raw))
            if record.expiration:
                m.expiration = record.expiration
            if not self.visit(MessageRef(m, q, seq), True):
                self.finish()
                return


class Peek:
    """Up to `count` queued messages `accept` accepts, in delivery order, memory then pages:
    `done([(ref, paged)])`. Nothing moves."""

    def __init__(self, po: PostOffice, q: Queue, count: int, accept: Accept | None = None) -> None:
        self.count = max(0, min(count, MAX_BROWSE))
        self.accept = accept or _accept_all
        self.found: list[tuple[MessageRef, bool]] = []
        self.walk = _Walk(po, q, self._visit)

    def _visit(self, ref: MessageRef, paged: bool) -> bool:
        if len(self.found) >= self.count:
            return False
        if self.accept(ref):
            self.found.append((ref, paged))
        return len(self.found) < self.count

    def start(self, done: Callable[[list[tuple[MessageRef, bool]]], None]) -> None:
        if not self.count:
            done([])
            return
        self.walk.start(lambda: done(self.found))

    def stop(self) -> None:
        """Answer with what was found so far (a deadline)."""
        self.walk.finish()


def copy_data(ref: MessageRef, address: str, strip_origin: bool = False) -> MessageData:
    """A copy of `ref`'s message for `address`, naming where it came from (Artemis's properties,
    as a dead letter does); `strip_origin`: without them (a retried dead letter goes home)."""
    m = ref.message
    data = m.data()
    props = dict(data.properties or {})
    if strip_origin:
        for k in ORIGIN_PROPS:
            props.pop(k, None)
    else:
        props.update({"_AMQ_ORIG_ADDRESS": m.address, "_AMQ_ORIG_QUEUE": ref.queue.name, "_AMQ_ORIG_MESSAGE_ID": m.id})
    # No dedup id: the copy is not a resend of the original (and would be taken for one).
    return MessageData(
        address,
        data.durable,
        data.priority,
        m.expiration,
        data.timestamp,
        None,
        RoutingType.ANY,
        props,
        data.body,
    )


class Transfer:
    """Move (or copy, `keep`) the queued messages of `q` that `accept` accepts and `plan` routes,
    at most `limit` (< 0: all): `done(result)` with "moved" (how many), "left" (accepted but not
    routable: they stay) and "error" (why, for the first of those).

    Moving goes in three phases: the matching messages in memory; those in the pages, each
    acknowledged alone (a PAGE_ACK record in its copy's transaction) so nothing else is read
    back; then those the queue's consumers read from the pages into memory meanwhile."""

    def __init__(
        self,
        po: PostOffice,
        q: Queue,
        plan: Plan,
        accept: Accept | None = None,
        limit: int = -1,
        keep: bool = False,
    ) -> None:
        self.po = po
        self.q = q
        self.plan = plan
        self.accept = accept or _accept_all
        self.limit = limit
        self.keep = keep
        self.moved = 0
        self.left = 0
        self.error: str | None = None
        self.skip: set[int] = set()  # ids of messages that stay (not routable)
        self.taken: list[MessageRef] = []
        self.done_cb: Callable[[dict[str, Any]], None] = lambda r: None
        self.finished = False
        self.stopping = False
        self.walk: _Walk | None = None
        self.batch: list[MessageRef] = []
        self.phase = 0  # moving: 0 memory, 1 pages, 2 memory again
        self.paged_batch: list[tuple[MessageRef, tuple[int, int]]] = []

    # ------------------------------------------------------------- common
    def start(self, done: Callable[[dict[str, Any]], None]) -> None:
        self.done_cb = done
        if self.keep:
            self.walk = _Walk(self.po, self.q, self._copy_visit)
            self.walk.start(self._copy_done)
        else:
            self._round()

    def stop(self) -> None:
        """Stop at the next step (a deadline): what is done stays done, the rest stays put."""
        self.stopping = True
        if self.walk is not None:
            self.walk.finish()
        if not self.keep:
            self.po.schedule(self._round)  # (it may be waiting for a page read)

    def _room(self) -> int:
        return -1 if self.limit < 0 else max(0, self.limit - self.moved)

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        out: dict[str, Any] = {"moved": self.moved, "left": self.left}
        if self.error is not None:
            out["error"] = self.error
        self.done_cb(out)

    def _routes(self, ref: MessageRef) -> tuple[Message, list[Queue]] | None:
        """The copy of `ref` and its queues, or None (it stays: counted, the first reason kept)."""
        try:
            planned = self.plan(ref)
        except TandemError as exc:
            planned = None
            if self.error is None:
                self.error = exc.message
        if planned is None or not planned[1]:
            if planned is not None and self.error is None:
                self.error = f"address {planned[0].address!r} routes the message to no queue"
            self.left += 1
            self.skip.add(ref.message.id)
            return None
        nm, queues = planned
        nm.id = self.po.ids.next()
        nm.large = ref.message.large  # a large body's file is shared (kept while either needs it)
        return nm, queues

    def _commit(self, refs: list[MessageRef], where: list[tuple[int, int]] | None = None) -> list[MessageRef]:
        """One transaction: a copy of each of `refs` routed, and (moving) the originals
        acknowledged: in memory, or, given `where` they are in the pages, one by one there.
        Returns the refs that stay."""
        copies: list[Message] = []
        routes: list[list[Queue]] = []
        done: list[MessageRef] = []
        stay: list[MessageRef] = []
        ops: list[object] = []
        pager = self.q.addr.pager if self.q.addr is not None else None
        for i, ref in enumerate(refs):
            r = self._routes(ref)
            if r is None:
                stay.append(ref)
                continue
            copies.append(r[0])
            routes.append(r[1])
            done.append(ref)
            if where is not None:
                assert pager is not None
                pager.acknowledge_record(self.q, where[i][0], where[i][1], ops)
        if copies:
            acks = [] if self.keep or where is not None else [(self.q, done)]
            self.po.commit_transaction(copies, acks, None, routes=routes, ops=ops)
            self.moved += len(copies)
        return stay

    # ------------------------------------------------------------- copying
    def _copy_visit(self, ref: MessageRef, paged: bool) -> bool:
        if self.stopping or self._room() == 0:
            return False
        if ref.message.id in self.skip or not self.accept(ref):
            return True
        self.batch.append(ref)
        if len(self.batch) >= CHUNK or 0 <= self.limit <= self.moved + len(self.batch):
            batch, self.batch = self.batch, []
            self._commit(batch)
        return self._room() != 0

    def _copy_done(self) -> None:
        if self.batch:
            batch, self.batch = self.batch, []
            self._commit(batch)
        self._finish()

    # -------------------------------------------------------------- moving
    def _accepts(self, ref: MessageRef) -> bool:
        return ref.message.id not in self.skip and self.accept(ref)

    def _round(self) -> None:
        """Take what memory holds that is to move, move it a chunk per pass; then the pages."""
        if self.finished:
            return
        q = self.q
        if q.deleted or self.stopping:
            self._give_back_all()
            self._finish()
            return
        if self.taken:
            self._chunk()
            return
        if self._room() == 0 or self.phase == 1:
            if self._room() == 0:
                self._finish()
            return  # (phase 1: the page walk goes on by itself)
        self.taken = q.take(self._accepts, self._room())
        if self.taken:
            self._chunk()
            return
        pager = q.addr.pager if q.addr is not None else None
        if self.phase == 2 or pager is None or not pager.paged.get(q.id):
            self._finish()
            return
        self.phase = 1
        self.walk = _Walk(self.po, q, self._page_visit, pages_only=True, on_yield=self._commit_paged)
        self.walk.start(self._pages_done)

    def _page_visit(self, ref: MessageRef, paged: bool) -> bool:
        if self.stopping or self.q.deleted or self._room() == 0:
            return False
        if ref.message.id in self.skip or not self.accept(ref):
            return True
        assert self.walk is not None
        self.paged_batch.append((ref, self.walk.here))
        if len(self.paged_batch) >= CHUNK or 0 <= self.limit <= self.moved + len(self.paged_batch):
            self._commit_paged()
        return self._room() != 0

    def _commit_paged(self) -> None:
        """Move the paged records visited so far, before the loop is given back (a consumer may
        read pages into memory meanwhile: a record behind the cursor is no longer in the pages)."""
        batch, self.paged_batch = self.paged_batch, []
        pager = self.q.addr.pager if self.q.addr is not None else None
        if not batch or pager is None or self.q.deleted:
            return
        cur = pager.cursors.get(self.q.id)
        acked = pager.acked_ahead.get(self.q.id, ())
        live = [(r, pos) for r, pos in batch if cur is not None and pos >= (cur[0], cur[1]) and pos not in acked]
        if live:
            self._commit([r for r, _pos in live], [pos for _r, pos in live])

    def _pages_done(self) -> None:
        self._commit_paged()
        self.walk = None
        self.phase = 2
        self.po.schedule(self._round)

    def _chunk(self) -> None:
        q = self.q
        size = 0
        n = 0
        for ref in self.taken:
            n += 1
            size += ref.message.size
            if n >= CHUNK or size >= CHUNK_BYTES:
                break
        chunk, self.taken = self.taken[:n], self.taken[n:]
        stay = self._commit(chunk)
        if stay:
            q.give_back(stay)
        self.po.schedule(self._round)

    def _give_back_all(self) -> None:
        taken, self.taken = self.taken, []
        if not taken:
            return
        if self.q.deleted:  # its records go with the queue's at the next load; drop them now
            self.q.delivering_count -= len(taken)
            self.q._drop(taken)
        else:
            self.q.give_back(taken)


def move_plan(po: PostOffice, q: Queue, address: str) -> Plan:
    """To `address`, routed as a send there would be."""

    def plan(ref: MessageRef) -> tuple[Message, list[Queue]]:
        m = Message.create(0, copy_data(ref, address))
        return m, po.route(m)

    return plan


def retry_plan(po: PostOffice, q: Queue) -> Plan:
    """A dead letter (or expired message) back to where it came from, as Artemis's
    retryMessages: to its original queue if that still takes messages of its original address,
    otherwise to that address; a message that names no origin stays."""

    def plan(ref: MessageRef) -> tuple[Message, list[Queue]] | None:
        props = ref.message.properties or {}
        address = props.get("_AMQ_ORIG_ADDRESS")
        if not isinstance(address, str) or not address or address == q.address:
            return None
        m = Message.create(0, copy_data(ref, address, strip_origin=True))
        origin = props.get("_AMQ_ORIG_QUEUE")
        target = po.queues.get(origin) if isinstance(origin, str) else None
        if target is not None and target.address == address and not target.deleted:
            return m, [target]
        return m, po.route(m)

    return plan
