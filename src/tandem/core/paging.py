"""Paging: an address whose memory is full keeps accepting messages by writing them to page files.

Artemis's model, smaller (docs/storage.md, "Paging"; decisions 0043-0045, 0063):

- A PAGE address that is full (its `max-size-bytes` or the broker's `global-max-size` /
  `global-max-messages`) starts paging: from then on every message sent to it (a transaction's
  at its commit, decision 0049) goes to its current page file, once, whatever the number of queues it is routed
  to, with each queue's sequence number already assigned. Nothing of it stays in memory.
- Each queue reads the pages through its own cursor (page, record index) when it has consumers
  and little in memory (its share of the address's limit). A message it reads back stays a page
  record (decision 0063): its ref knows its position, and whatever removes it for good writes a
  PAGE_ACK record; the queue's journaled cursor is its oldest position read back and not
  acknowledged, and moves over the acknowledged prefix (deleting the PAGE_ACKs behind it). An
  operator's move takes records out of a queue's pages where they are, without reading them back
  (decision 0066): the same PAGE_ACK record, the same set of positions every reader skips.
- A page is deleted once every queue's journaled cursor is past it and those cursors are
  durable; the address stops paging when no queue has a message paged or read back and
  unacknowledged.

Order per queue holds across the boundary: while an address pages, nothing it receives enters
memory, and a queue reads its pages in order. A transaction's paged records are not read past
until its commit (PAGE_TX) is in the journal; an open transaction's sends are paged as they
arrive, to files of its own that its commit makes pages (core/txpaging.py). The broker's own
copies (dead letters, expiry) go to memory, counted against the limit.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Protocol

import msgspec

from .address import MESSAGE_OVERHEAD
from .message import Message, MessageRef

if TYPE_CHECKING:
    from .address import Address
    from .ids import IdGenerator
    from .queue import Queue
    from .storage import Storage

log = logging.getLogger("tandem.paging")

MAX_SCAN = 5000  # records one refill looks at, at most (a queue a filter routes few messages to)
# The most one page read brings into memory: pages are read in chunks, the next one while the
# queue still holds half of the last (docs/storage.md, "Reading back"), not whole pages.
READ_BYTES = 1 << 20
# What a queue whose consumers have no filter holds read back from its pages, at most, when its
# share of the limit is bigger (decision 0087): tens of MiB of messages waiting in memory cost
# the drain a fifth more CPU (their objects no longer fit the processor's caches), and buy
# nothing when every consumer takes the head.
DEPAGED_BYTES = 4 << 20


class PagedRecord(msgspec.Struct, array_like=True, gc=False):
    """One message in a page: (queue id, sequence) per queue it was routed to, its bytes, its id.

    Decoded straight from a page record's body (the layout of store/records.py's MessageRecord,
    field for field), its bytes a `Raw` over that body alone, and `mid` set from the record's
    header after: one object and one copy per record read back, no more."""

    refs: list[tuple[int, int]]
    raw: msgspec.Raw
    expiration: int = 0
    large: object = None  # (never set in a page: a large message's record stays in the journal)
    message_id: int = 0
    tx: int = 0  # its page transaction (0: none): readable once that is journaled
    mid: int = 0  # the record's id: the message's


class PageStore(Protocol):
    """The page files (store/pages.py)."""

    appended: int  # messages appended so far: a connection whose send added some is paced (decision 0085)

    def append(self, address_id: int, page: int, message: Message, refs: list[tuple[int, int]], tx: int = 0) -> int: ...
    def append_tx(self, address_id: int, tx: int, n: int, message: Message, refs: list[tuple[int, int]]) -> int: ...
    def adopt_tx(self, address_id: int, tx: int, n: int, page: int) -> None: ...
    def discard_tx(self, address_id: int, tx: int, n: int) -> None: ...
    def read(self, address_id: int, page: int, offset: int) -> tuple[list[PagedRecord], int]: ...
    def readable(self, address_id: int, page: int, offset: int) -> bool: ...
    def read_soon(
        self,
        address_id: int,
        page: int,
        offset: int,
        done: Callable[[list[PagedRecord], int, BaseException | None], None],
        limit: int = 0,
    ) -> None: ...
    def load(self, address_id: int, page: int) -> list[PagedRecord]: ...
    def remove(self, address_id: int, page: int) -> None: ...
    def after_durable(self, cb: Callable[[], None]) -> None: ...
    def paged_bytes(self, address_id: int) -> int: ...


class _Cached:
    """What has been read of one page: records `base` .. `base + len(records) - 1` (those
    before `base` every cursor is past, so they are dropped), read up to byte `offset`."""

    __slots__ = ("base", "last", "offset", "reading", "records")

    def __init__(self) -> None:
        self.records: list[PagedRecord] = []
        self.base = 0
        self.offset = 0
        self.last = 0  # records the last read brought: the next starts when half that is left
        self.reading = False  # a read of the next chunk is under way (worker thread)


class AddressPager:
    """The paging state of one address (loop thread)."""

    def __init__(
        self, addr: Address, store: PageStore, storage: Storage, ids: IdGenerator, loaded_upto: int = 0
    ) -> None:
        self.addr = addr
        self.store = store
        self.storage = storage
        self.ids = ids
        self.pages: list[int] = []  # existing pages, ascending
        self.counts: dict[int, int] = {}  # records per existing page
        self.write_page = 0  # the page being appended to (0: none)
        self.write_bytes = 0
        self.next_page = loaded_upto + 1
        self.loaded_upto = loaded_upto  # pages from before this start: their non-durable messages are gone
        self.cursors: dict[int, list[int]] = {}  # queue id -> [page, record index]: the next record to read
        # Decision 0063: a message read back stays a page record. Per queue id: every record
        # before `done` is done with (the journaled PAGE_CURSOR); `outstanding`, the positions read
        # into memory and not acknowledged yet, in order; `acked`, those of them acknowledged
        # (journaled) while one before them is not; `acked_ahead` and `counts_ahead`, acknowledged
        # positions and delivery counts loaded from the journal that the cursor has not reached.
        self.done: dict[int, tuple[int, int]] = {}
        self.outstanding: dict[int, deque[tuple[int, int]]] = {}
        self.acked: dict[int, set[tuple[int, int]]] = {}
        self.acked_ahead: dict[int, set[tuple[int, int]]] = {}
        # Positions acknowledged ahead of the cursor without being read back (an operator's move,
        # decision 0066) whose PAGE_ACK's transaction is not handed to the journal yet: in
        # `acked_ahead` already (no reader takes them), and the journaled cursor stays before them
        # until then (a cursor written before the move's batch would lose the message in a crash).
        self.pending_ahead: dict[int, set[tuple[int, int]]] = {}
        self.counts_ahead: dict[int, dict[tuple[int, int], int]] = {}
        self.spans_ahead: dict[int, list[tuple[tuple[int, int], tuple[int, int]]]] = {}  # purged (start, end)
        self.paged: dict[int, int] = {}  # queue id -> its messages still in pages
        self.cache: OrderedDict[int, _Cached] = OrderedDict()
        self.waiters: list[Callable[[], None]] = []  # range reads and acks waiting for page data
        self.range_hints: dict[int, tuple[int, int, int]] = {}  # queue id -> (seq, page, index) after it
        self.active = False
        self.messages_paged = 0
        # Page transactions (decision 0049): records of a transaction whose commit is not in the
        # journal yet are not read past; those of one that never was (a crash) are skipped.
        self.tx_open: set[int] = set()
        self.tx_dead: set[int] = set()
        self.page_txs: dict[int, set[int]] = {}  # page -> committed transactions with records in it
        # Transactions paged while open (decision 0055): their records hold 1, 2, ... per queue;
        # queue id -> its first sequence, taken at the commit.
        self.tx_seqs: dict[int, dict[int, int]] = {}
        self.tx_pages_added: Callable[[int], None] = lambda tx: None  # one more page holds records of `tx`
        self.on_tx_pages_gone: Callable[[int], None] = lambda tx: None  # one page of `tx` deleted

    # --------------------------------------------------------------- writing
    def page(self, message: Message, queues: list[Queue], tx: int = 0) -> bool:
        """Write `message` to the current page for `queues`; True if its confirmation waits for the
        disk. `tx`: its page transaction, not read past until `tx_committed`."""
        if not self.active:
            self.active = True
            log.info("address paging", extra={"address": self.addr.name, "size_bytes": self.addr.size_bytes})
        if self.write_page == 0 or self.write_bytes >= self.addr.settings.page_size_bytes:
            self._open_page()
        refs = [(q.id, q.next_seq()) for q in queues]
        page = self.write_page
        self.write_bytes += self.store.append(self.addr.id, page, message, refs, tx)
        self.counts[page] += 1
        if tx:
            self.tx_open.add(tx)
            txs = self.page_txs.setdefault(page, set())
            if tx not in txs:
                txs.add(tx)
                self.tx_pages_added(tx)
        paged = self.paged
        for q in queues:
            paged[q.id] = paged.get(q.id, 0) + 1
            q.messages_added += 1
        self.messages_paged += 1
        return message.durable and self.storage.persistent

    def tx_committed(self, tx: int) -> None:
        """`tx`'s commit is in the journal (queued, in order): its records may be read."""
        self.tx_open.discard(tx)
        self.wake()

    def wake(self) -> None:
        """More of the pages can be read (read back, durable, or committed): whoever waits reads on."""
        for q in self.addr.queues.values():
            if q.consumers or q.browsers:
                q.deliver_soon()
        if self.waiters:
            waiters, self.waiters = self.waiters, []
            for w in waiters:
                w()

    def adopt_tx(self, tx: int, files: list[int], per_queue: dict[int, int]) -> list[tuple[int, int, int]]:
        """An open transaction's files (`files`: records in each) become the next pages, read
        once `tx_committed(tx)`; each queue's sequences for them are taken now. Returns (queue
        id, first sequence, count) per queue (decision 0055)."""
        if not self.active:
            self.active = True
            log.info("address paging", extra={"address": self.addr.name, "size_bytes": self.addr.size_bytes})
        self.write_page = 0  # the page being written is closed: what comes next goes after these
        self.tx_open.add(tx)
        for n, count in enumerate(files, 1):
            page = self.next_page
            self.next_page += 1
            self.store.adopt_tx(self.addr.id, tx, n, page)
            self.pages.append(page)
            self.counts[page] = count
            self.page_txs[page] = {tx}
            self.tx_pages_added(tx)
        queues = {q.id: q for q in self.addr.queues.values()}
        out: list[tuple[int, int, int]] = []
        seqs = self.tx_seqs[tx] = {}
        for qid, count in per_queue.items():
            q = queues.get(qid)
            if q is None or qid not in self.paged:
                continue  # deleted since: its records are skipped
            first = seqs[qid] = q.next_seqs(count)
            out.append((qid, first, count))
            self.paged[qid] += count
            q.messages_added += count
        self.messages_paged += sum(files)
        return out

    def _open_page(self) -> None:
        page = self.next_page
        self.next_page += 1
        self.write_page = page
        self.write_bytes = 0
        self.pages.append(page)
        self.counts[page] = 0

    # -------------------------------------------------------------- queues
    def add_queue(self, q: Queue) -> None:
        """A queue created while the address pages: it starts at the head (older records are not its)."""
        if self.write_page:
            self.cursors[q.id] = [self.write_page, self.counts[self.write_page]]
        else:
            self.cursors[q.id] = [self.next_page, 0]
        self.done[q.id] = (self.cursors[q.id][0], self.cursors[q.id][1])
        self.paged[q.id] = 0

    def remove_queue(self, q: Queue) -> None:
        """A queue deleted: its paged messages go with it."""
        self.cursors.pop(q.id, None)
        self.paged.pop(q.id, None)
        self.range_hints.pop(q.id, None)
        for held in (
            self.done,
            self.outstanding,
            self.acked,
            self.acked_ahead,
            self.pending_ahead,
            self.counts_ahead,
            self.spans_ahead,
        ):
            held.pop(q.id, None)
        if q.durable:
            self.storage.delete_cursor(q)
        self._collect()

    def skip(self, q: Queue) -> int:
        """Drop every paged message of `q` (a purge): its cursor moves to the head."""
        n = self.paged.get(q.id, 0)
        if not n:
            return 0
        head = [self.write_page, self.counts[self.write_page]] if self.write_page else [self.next_page, 0]
        start = self.cursors[q.id]
        self.cursors[q.id] = head
        self.paged[q.id] = 0
        self.acked_ahead.pop(q.id, None)
        self.counts_ahead.pop(q.id, None)
        self.spans_ahead.pop(q.id, None)
        if self._held(q.id) and q.durable and self.storage.persistent:
            # The journaled cursor is held at a message in delivery: the purged span is recorded,
            # or a restart would read it again.
            self.storage.store_page_skip(q, (start[0], start[1]), (head[0], head[1]), self.ids.next())
        self._advance(q)
        return n

    # ------------------------------------------------- acknowledgements (0063)
    def acknowledged(self, q: Queue, refs: list[MessageRef], tx: list[object] | None = None) -> None:
        """`q` is done with `refs`, read back from its pages (acknowledged, expired, dead-lettered,
        replaced, purged): journaled as PAGE_ACK records, then its cursor moves over the
        acknowledged prefix. In a transaction the records join `tx`, and the positions count as
        acknowledged only once its batch is handed to the journal (the cursor, a batch of its
        own, must never pass an acknowledgement the journal may not get)."""
        positions = [ref.pos for ref in refs if ref.pos is not None]
        if q.durable and self.storage.persistent:
            acks = [ref.pos for ref in refs if ref.pos is not None and ref.message.durable]
            if tx is not None:
                if acks:
                    self.storage.store_page_acks(q, acks, self.ids.next(), None, 0, tx)
                tx.append(partial(self._acked, q, positions))
                return
            self._acked(q, positions, acks)
            return
        if tx is not None:
            tx.append(partial(self._acked, q, positions))
        else:
            self._acked(q, positions)

    def _acked(self, q: Queue, positions: list[tuple[int, int]], acks: list[tuple[int, int]] | None = None) -> None:
        """Mark `positions` acknowledged; journal `acks` (not yet journaled) with the new cursor."""
        out = self.outstanding.get(q.id)
        if out is None:  # the queue was deleted meanwhile
            return
        acked = self.acked.setdefault(q.id, set())
        acked.update(positions)
        while out and out[0] in acked:
            acked.discard(out.popleft())
        self._advance(q, acks)

    def acknowledge_record(self, q: Queue, page: int, index: int, tx: list[object]) -> None:
        """Record `index` of `page`, ahead of `q`'s cursor and never read back, leaves `q` (an
        operator's move, decision 0066): skipped by every reader from now on, its PAGE_ACK record
        in `tx` (the transaction that routes its copy), and the journaled cursor held before it
        until that transaction is handed to the journal."""
        pos = (page, index)
        self.acked_ahead.setdefault(q.id, set()).add(pos)
        self.pending_ahead.setdefault(q.id, set()).add(pos)
        self.paged[q.id] -= 1
        if q.durable and self.storage.persistent:
            self.storage.store_page_acks(q, [pos], self.ids.next(), None, 0, tx)
        tx.append(partial(self._ahead_acked, q, pos))

    def _ahead_acked(self, q: Queue, pos: tuple[int, int]) -> None:
        """The PAGE_ACK of `pos` is in the journal's queue: the cursor may pass it now."""
        pending = self.pending_ahead.get(q.id)
        if pending is None:  # the queue was deleted, or its address stopped paging meanwhile
            return
        pending.discard(pos)
        if not pending:
            del self.pending_ahead[q.id]
        self._advance(q)
        if not self.pending_ahead and not any(self.paged.values()):
            self._collect()  # (the cursor may not have moved: nothing is left to read)

    def _held(self, qid: int) -> bool:
        """Whether `qid`'s journaled cursor is held behind where it reads (a message read back and
        not acknowledged, or a move's acknowledgement not journaled yet)."""
        return bool(self.outstanding.get(qid)) or bool(self.pending_ahead.get(qid))

    def _advance(self, q: Queue, acks: list[tuple[int, int]] | None = None) -> None:
        """Journal `q`'s new cursor (the first position read back and not acknowledged, else where
        it reads next, but never past a move's acknowledgement not journaled yet) if it moved,
        with `acks`; then delete the pages every cursor is past."""
        out = self.outstanding.get(q.id)
        cur = self.cursors.get(q.id)
        if cur is None:
            return
        new = out[0] if out else (cur[0], cur[1])
        pending = self.pending_ahead.get(q.id)
        if pending:
            new = min(new, min(pending))
        old = self.done.get(q.id)
        moved = old is None or new > old
        if moved:
            self.done[q.id] = new
        if q.durable and self.storage.persistent and (moved or acks):
            ids = self.ids
            self.storage.store_page_acks(q, acks or [], ids.next() if acks else 0, new if moved else None, ids.next())
        if moved:
            self._collect()

    def _purged(self, qid: int, pos: tuple[int, int]) -> bool:
        """`pos` lies in a span of `qid` purged before a restart."""
        return any(start <= pos < end for start, end in self.spans_ahead.get(qid, ()))

    def delivery_counted(self, q: Queue, ref: MessageRef) -> None:
        """A failed delivery of `ref`, read back from a page: its count, kept by position."""
        if ref.pos is not None and q.durable and self.storage.persistent:
            self.storage.store_page_delivery_count(q, ref.pos, ref.delivery_count, self.ids.next())

    # -------------------------------------------------------------- reading
    def share(self) -> int:
        """What one queue may hold in memory before it stops reading pages."""
        addr = self.addr
        limit = addr.settings.max_size_bytes
        if limit < 0:
            limit = addr.limits.max_size if addr.limits.max_size >= 0 else addr.settings.page_size_bytes
        return max(limit // max(1, len(addr.queues)), 1)

    def refill(self, q: Queue) -> int:
        """Bring `q`'s next paged messages into memory, up to its share, once it holds less than
        half of that (so each batch, journaled with a cursor record, is a big one); how many
        records it read (those of other queues included: a caller reads on while that is not 0)."""
        if not self.paged.get(q.id):
            return 0
        share = self.share()
        if share > DEPAGED_BYTES and all(c.filter is None for c in q.consumers):
            share = DEPAGED_BYTES  # (a filter may need more in memory to find what it takes)
        # Under the broker's limit a message counts its objects too (decision 0058).
        per = MESSAGE_OVERHEAD if self.addr.settings.max_size_bytes < 0 and self.addr.limits.max_size >= 0 else 0
        have = q.ready_bytes + q.ready_count * per
        if q.ready_count and (2 * have >= share or self.addr.limits.full):
            return 0
        cur = self.cursors.get(q.id)
        if cur is None:
            cur = self.cursors[q.id] = [self.pages[0] if self.pages else self.next_page, 0]
        page, idx = cur
        qid = q.id
        taken: list[MessageRef] = []
        size = 0
        scanned = 0
        moved = False
        c: _Cached | None = None
        cpage = 0
        skip = self.acked_ahead.get(qid)
        counts = self.counts_ahead.get(qid)
        spans = self.spans_ahead.get(qid)
        tx_open, tx_dead, loaded_upto = self.tx_open, self.tx_dead, self.loaded_upto
        decode = Message.decode
        room = share - have  # bytes this refill may take
        while size < room and scanned < MAX_SCAN:
            count = self.counts.get(page)
            if count is None:  # deleted, or not written yet
                nxt = self._page_after(page)
                if nxt is None:
                    break
                page, idx, moved = nxt, 0, True
                continue
            if idx >= count:
                if page == self.write_page:
                    break
                nxt = self._page_after(page)
                if nxt is None:
                    break
                page, idx, moved = nxt, 0, True
                continue
            if c is None or cpage != page or idx - c.base >= len(c.records):
                c, cpage = self._records(page, idx), page
                if idx - c.base >= len(c.records):
                    break  # the rest of this page is not durable, or not read, yet (queues are woken then)
            # The records of this chunk up to the page's end, one after another.
            records, base = c.records, c.base
            stop = min(count, base + len(records), idx + MAX_SCAN - scanned)
            blocked = False
            for i in range(idx - base, stop - base):
                r = records[i]
                tx = r.tx
                if tx and tx in tx_open:
                    blocked = True  # its transaction's commit is not journaled yet: nothing after it either
                    break
                idx += 1
                moved = True
                scanned += 1
                refs = r.refs
                if not tx and refs and refs[0][0] == qid:
                    seq = refs[0][1]
                else:
                    seq = self._seq_in(r, qid)
                    if not seq or (tx and tx in tx_dead):
                        continue  # not this queue's, or of a transaction that never committed
                pos = (page, idx - 1)
                if skip and pos in skip:
                    skip.discard(pos)  # acknowledged before a restart
                    continue
                if spans and self._purged(qid, pos):
                    continue
                m = decode(r.mid, r.raw)  # Raw: sent on as it is, as a journaled one
                if not m.durable and page <= loaded_upto:
                    continue  # a non-durable message does not outlive the broker that took it
                if r.expiration:
                    m.expiration = r.expiration
                taken.append(MessageRef(m, q, seq, counts.pop(pos, 0) if counts else 0, False, pos))
                size += len(r.raw) + per
                if size >= room:
                    break
            if blocked:
                break
        if not moved:
            self._read_ahead(page, idx)
            return 0
        cur[0], cur[1] = page, idx
        self.paged[qid] -= len(taken)
        out = self.outstanding.setdefault(qid, deque())
        out.extend([ref.pos for ref in taken])  # type: ignore[misc]
        if taken:
            q.add_depaged(taken)
        self._trim()
        self._read_ahead(page, idx)
        self._advance(q)
        return scanned

    def _seq_in(self, r: PagedRecord, qid: int) -> int:
        """`r`'s sequence in queue `qid` (0: not that queue's). A transaction paged while open
        numbered its records 1, 2, ... per queue: they count from what its commit took."""
        for rqid, rseq in r.refs:
            if rqid == qid:
                if r.tx:
                    firsts = self.tx_seqs.get(r.tx)
                    if firsts is not None:
                        return rseq + firsts.get(qid, 1) - 1
                return rseq
        return 0

    def next_record(self, q: Queue, pos: list[int]) -> tuple[PagedRecord, int] | bool:
        """The first record of `q` at or after `pos` (page, index), without reading it into `q`:
        (record, its sequence in `q`), and `pos` moved to it. False: the pages hold nothing more
        for `q` now. True: not known yet (a page read is under way, or the commit of a page
        transaction is not journaled yet); the queue is woken when it is known.

        For readers that do not consume (browsers, range readers): reads through the same cache
        as `refill`, and never moves the queue's cursor."""
        cur = self.cursors.get(q.id)
        if cur is not None and (pos[0], pos[1]) < (cur[0], cur[1]):
            pos[0], pos[1] = cur  # what is behind the cursor was read back into the queue
        qid = q.id
        page, idx = pos
        try:
            while True:
                count = self.counts.get(page)
                if count is None or idx >= count:
                    if count is not None and page == self.write_page:
                        return False
                    nxt = self._page_after(page)
                    if nxt is None:
                        return False
                    page, idx = nxt, 0
                    continue
                c = self._records(page, idx)
                if idx - c.base >= len(c.records):
                    return True
                r = c.records[idx - c.base]
                if r.tx and r.tx in self.tx_open:
                    return True
                if (
                    not (r.tx and r.tx in self.tx_dead)
                    and (page, idx) not in self.acked_ahead.get(qid, ())
                    and not self._purged(qid, (page, idx))
                ):
                    seq = self._seq_in(r, qid)
                    if seq and (page > self.loaded_upto or Message.decode(r.mid, r.raw).durable):
                        return r, seq
                idx += 1
        finally:
            pos[0], pos[1] = page, idx

    def _page_after(self, page: int) -> int | None:
        for p in self.pages:
            if p > page:
                return p
        return None

    def _records(self, page: int, idx: int) -> _Cached:
        """The cache of `page`, with a read of its next chunk started if record `idx` is not in it."""
        c = self.cache.get(page)
        if c is None or idx < c.base:  # (dropped records a new cursor needs: read the page again)
            c = self.cache[page] = _Cached()
            while len(self.cache) > self.addr.settings.page_max_cache_size:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(page)
        if idx - c.base >= len(c.records):
            self._read(page, c)
        return c

    def _read(self, page: int, c: _Cached) -> None:
        if not c.reading and self.store.readable(self.addr.id, page, c.offset):
            c.reading = True
            self.store.read_soon(self.addr.id, page, c.offset, partial(self._read_done, page, c), READ_BYTES)

    def _read_ahead(self, page: int, idx: int) -> None:
        """Start reading what comes after record `idx` of `page` while the queue still has half
        of the last chunk to go: the next chunk of this page, or the first of the next page."""
        c = self.cache.get(page)
        if c is None or c.reading or len(c.records) - (idx - c.base) > c.last // 2:
            return
        if self.store.readable(self.addr.id, page, c.offset):
            self._read(page, c)
            return
        if page == self.write_page or self.addr.settings.page_max_cache_size < 2:
            return  # (one cached page: the next would push out the one being read)
        nxt = self._page_after(page)
        if nxt is not None and nxt not in self.cache:
            self._records(nxt, 0)
            self.cache.move_to_end(page)  # the page being read stays the last to go

    def _trim(self) -> None:
        """Drop the cached records every cursor is past (they are in memory now, or not wanted)."""
        if not self.cache or not self.cursors:
            return
        low_page, low_idx = min(self.cursors.values())
        for p in [p for p in self.cache if p < low_page]:
            del self.cache[p]
        c = self.cache.get(low_page)
        if c is not None and low_idx > c.base:
            k = min(low_idx - c.base, len(c.records))
            del c.records[:k]
            c.base += k

    @property
    def reading(self) -> bool:
        return any(c.reading for c in self.cache.values())

    def _read_done(
        self, page: int, c: _Cached, records: list[PagedRecord], offset: int, err: BaseException | None
    ) -> None:
        """(Loop) a page read is back: cached (unless the page left the cache meanwhile), and the
        queues that read on."""
        c.reading = False
        if err is not None:
            if not isinstance(err, FileNotFoundError):  # deleted meanwhile: every cursor is past it
                log.error("page %d of address %s could not be read: %s", page, self.addr.name, err)
            elif page not in self.counts:
                self.wake()  # a reader that waited for it finds its position behind the cursor
            return
        if self.cache.get(page) is not c:
            if self.waiters:  # they asked for it: they ask again
                self.wake()
            return
        if not records:  # durable bytes that hold no record: damage; reading again would spin
            log.error("page %d of address %s: no record where %d bytes are durable", page, self.addr.name, offset)
            return
        c.records.extend(records)
        c.offset = offset
        c.last = len(records)
        self.wake()

    # ------------------------------------------------------ range readers
    def read_range(
        self, q: Queue, start: int, end: int, limit: int, done: Callable[[list[MessageRef], int], None]
    ) -> None:
        """`q`'s paged messages with start < seq <= end, in order, at most `limit` (< 0: all), not
        expired, and the sequence of its first paged message (0: none): `done(refs, first)`, at
        once or, when pages must be read first, from the loop once they are. Nothing moves: the
        refs are not the queue's (a range reader acknowledges with `ack_upto`)."""
        out: list[MessageRef] = []
        first = -1
        head: list[int] | None = None
        pos: list[int] | None = None
        now = 0

        def go() -> None:
            nonlocal first, head, pos, now
            cur = self.cursors.get(q.id)
            if cur is None or not self.paged.get(q.id) or q.deleted:
                done(out, max(first, 0))
                return
            if first < 0:
                if head is None:
                    head = list(cur)
                r = self.next_record(q, head)
                if r is True:
                    self.waiters.append(go)
                    return
                first = r[1] if isinstance(r, tuple) else 0
                if not first or first > end or (limit >= 0 and len(out) >= limit):
                    done(out, first)
                    return
            if pos is None:
                hint = self.range_hints.get(q.id)
                pos = [hint[1], hint[2]] if hint is not None and hint[0] <= start else list(cur)
            while limit < 0 or len(out) < limit:
                r = self.next_record(q, pos)
                if r is True:
                    self.waiters.append(go)
                    return
                if r is False:
                    break
                record, seq = r
                if seq > end:
                    break
                pos[1] += 1
                if seq <= start:
                    continue
                self.range_hints[q.id] = (seq, pos[0], pos[1])
                if record.expiration:
                    if not now:
                        now = time.time_ns() // 1_000_000
                    if record.expiration <= now:
                        continue
                m = Message.decode(record.mid, record.raw)
                if record.expiration:
                    m.expiration = record.expiration
                out.append(MessageRef(m, q, seq))
            done(out, first)

        go()

    def ack_upto(self, q: Queue, seq: int, done: Callable[[int], None]) -> None:
        """Move `q`'s cursor past its paged messages with a sequence up to `seq` (a range reader's
        acknowledgement), journaled; `done(how many)`, at once or once the pages it needed are read.
        Progress is kept as it goes, so a span longer than the page cache never reads a page twice."""
        total = 0

        def go() -> None:
            nonlocal total
            cur = self.cursors.get(q.id)
            if cur is None or not self.paged.get(q.id) or q.deleted:
                done(total)
                return
            pos = list(cur)
            n = 0
            waiting = False
            while True:
                r = self.next_record(q, pos)
                if r is True:
                    waiting = True
                    break
                if r is False or r[1] > seq:
                    break
                pos[1] += 1
                n += 1
            if (pos[0], pos[1]) > (cur[0], cur[1]):  # kept even when waiting: never read twice
                if self._held(q.id) and q.durable and self.storage.persistent:
                    # The journaled cursor is held at a message in delivery: the span is recorded.
                    self.storage.store_page_skip(q, (cur[0], cur[1]), (pos[0], pos[1]), self.ids.next())
                cur[0], cur[1] = pos
                self.paged[q.id] = max(0, self.paged[q.id] - n)
                total += n
                ahead = self.acked_ahead.get(q.id)
                if ahead:
                    for p in [p for p in ahead if p < (pos[0], pos[1])]:
                        ahead.discard(p)
                self._advance(q)
            if waiting:
                self.waiters.append(go)
            else:
                done(total)

        go()

    # ------------------------------------------------------------ clean-up
    def _collect(self) -> None:
        """Delete the pages every cursor is past (once the cursors are durable); stop paging when
        no queue has a paged message left."""
        if not any(self.paged.values()) and not any(self.outstanding.values()) and not self.pending_ahead:
            done = self.pages
            self.pages = []
            self.counts.clear()
            self.cache.clear()
            self.write_page = 0
            for cur in self.cursors.values():
                cur[0], cur[1] = self.next_page, 0
            head = (self.next_page, 0)
            for q in self.addr.queues.values():
                # Journaled too: no PAGE_ACK ahead of a cursor may outlive its page (a later page
                # could take its number after a restart).
                if self.done.get(q.id, head) != head and q.durable and self.storage.persistent:
                    self.storage.store_page_acks(q, [], 0, head, self.ids.next())
                self.done[q.id] = head
            self.acked_ahead.clear()
            self.counts_ahead.clear()
            self.spans_ahead.clear()
            self.range_hints.clear()
            if self.active:
                self.active = False
                log.info("address stopped paging", extra={"address": self.addr.name})
        else:
            low = min((c[0] for c in self.done.values()), default=self.next_page)
            if not self.pages or self.pages[0] >= low:  # (in order: the common case, nothing to delete)
                return
            done = self.pages[: bisect_left(self.pages, low)]
            self.pages = self.pages[len(done) :]
            for p in done:
                self.counts.pop(p, None)
                self.cache.pop(p, None)
        if done:
            gone = [tx for p in done for tx in self.page_txs.pop(p, ())]
            if gone:
                self.storage.after_durable(partial(self._txs_gone, gone))
            self.storage.after_durable(partial(self._remove, done))

    def _txs_gone(self, txs: list[int]) -> None:
        for tx in txs:
            self.on_tx_pages_gone(tx)
            if tx in self.tx_seqs and not any(tx in held for held in self.page_txs.values()):
                del self.tx_seqs[tx]

    def _remove(self, pages: list[int]) -> None:
        for p in pages:
            self.store.remove(self.addr.id, p)

    # -------------------------------------------------------------- reload
    def load(
        self,
        pages: list[int],
        cursors: dict[int, tuple[int, int]],
        committed: set[int] | frozenset[int] = frozenset(),
        tx_seqs: dict[int, list[tuple[int, int, int]]] | None = None,
        acks: dict[int, set[tuple[int, int]]] | None = None,
        counts: dict[int, dict[tuple[int, int], int]] | None = None,
        spans: dict[int, list[tuple[tuple[int, int], tuple[int, int]]]] | None = None,
    ) -> list[Message]:
        """Rebuild from the page files and the journaled cursors; `committed`: the page
        transactions journaled (PAGE_TX); `tx_seqs`: their sequences, for those paged while open;
        `acks` and `counts`: per queue, the records acknowledged ahead of its cursor and the
        delivery counts of those read back before (decision 0063).
        Returns the paged messages that carry a dedup id (the caller makes sure the dedup cache
        knows them)."""
        queues = {q.id: q for q in self.addr.queues.values()}
        for tx, triples in (tx_seqs or {}).items():
            mine = {qid: first for qid, first, _n in triples if qid in queues}
            if mine:
                self.tx_seqs[tx] = mine
            for qid, first, n in triples:
                q = queues.get(qid)
                if q is not None:
                    q.seqs_used(first + n - 1)
        first = pages[0] if pages else self.next_page
        for qid in queues:
            page, idx = cursors.get(qid, (first, 0))
            self.cursors[qid] = [page, idx]
            self.done[qid] = (page, idx)
            self.paged[qid] = 0
            if acks and acks.get(qid):
                self.acked_ahead[qid] = {pos for pos in acks[qid] if pos >= (page, idx)}
            if counts and counts.get(qid):
                self.counts_ahead[qid] = {pos: n for pos, n in counts[qid].items() if pos >= (page, idx)}
            if spans and spans.get(qid):
                self.spans_ahead[qid] = [(a, b) for a, b in spans[qid] if b > (page, idx)]
        with_dedup: list[Message] = []
        for page in pages:
            records = self.store.load(self.addr.id, page)
            self.pages.append(page)
            self.counts[page] = len(records)
            for i, r in enumerate(records):
                # Ids a page holds are taken: the id counter's reservation written after them
                # (bindings journal) may have been cut by the crash, and the journals' highest
                # id does not count pages. A page transaction's id too: a new one given the id
                # of one cut before its commit would be taken for it.
                self.ids.seen(r.mid)
                if r.tx:
                    self.ids.seen(r.tx)
                    if r.tx not in committed:
                        self.tx_dead.add(r.tx)  # cut by a crash before its commit: never visible
                        continue
                    txs = self.page_txs.setdefault(page, set())
                    if r.tx not in txs:
                        txs.add(r.tx)
                        self.tx_pages_added(r.tx)
                for qid, _seq in r.refs:
                    # Its sequence is taken, whatever the reservation on disk says: one written
                    # after the page (QUEUE_SEQ, bindings journal) may have been cut by the crash.
                    # A queue gone (or cut with it) keeps its id: the record still names it.
                    q = queues.get(qid)
                    if q is not None:
                        q.seqs_used(self._seq_in(r, qid))
                    else:
                        self.ids.seen(qid)
                m = Message.decode(r.mid, r.raw)
                if not m.durable:
                    continue
                if m.dedup_id is not None:
                    with_dedup.append(m)
                for qid, _seq in r.refs:
                    cur = self.cursors.get(qid)
                    if cur is not None and (page, i) >= (cur[0], cur[1]):
                        if (page, i) not in self.acked_ahead.get(qid, ()) and not self._purged(qid, (page, i)):
                            self.paged[qid] += 1
        self.active = any(self.paged.values())
        self._collect()
        return with_dedup

    def stat(self) -> dict[str, object]:
        return {
            "paging": self.active,
            "pages": len(self.pages),
            "paged_bytes": self.store.paged_bytes(self.addr.id),
            "paged_messages": sum(self.paged.values()),
        }
