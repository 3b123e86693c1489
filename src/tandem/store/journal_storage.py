"""Persistence manager: broker operations ⇄ journal records (two journals, as in Artemis).

`bindings/` holds addresses, queues and counters; `journal/` holds messages,
acknowledgements and delivery counts. A message is one ADD record naming
every durable queue it was routed to; acknowledging it on one of several
queues is an UPDATE, on the last one a DELETE.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from ..core.address import Address
from ..core.message import Message, MessageRef
from ..core.queue import Queue
from ..errors import JournalError
from ..journal import ADD, DELETE, UPDATE, Journal, JournalSettings, LiveRecord, Op
from ..journal.storeio import Tap
from .large_messages import DIRECTORY as LARGE_DIRECTORY
from .large_messages import LargeMessageStore
from .pages import PageFiles
from .records import (
    COUNTER_RECORD_BASE,
    AckRecord,
    AddressRecord,
    CounterRecord,
    DeliveryCountRecord,
    DuplicateIdRecord,
    LargeRecord,
    MessageRecord,
    PageAckRecord,
    PageCursorRecord,
    PageDeliveryCountRecord,
    QueueRecord,
    QueueStatusRecord,
    RecordType,
    encoder,
)

log = logging.getLogger("tandem.store")

_dec_address = msgspec.msgpack.Decoder(AddressRecord)
# A PAGE_TX record's body: empty, or (queue id, first sequence, count) per queue when its records
# were written before the commit and so carry sequences relative to the commit's (decision 0055).
_dec_tx_seqs = msgspec.msgpack.Decoder(list[tuple[int, int, int]])
_dec_queue = msgspec.msgpack.Decoder(QueueRecord)
_dec_status = msgspec.msgpack.Decoder(QueueStatusRecord)
_dec_message = msgspec.msgpack.Decoder(MessageRecord)
_dec_ack = msgspec.msgpack.Decoder(AckRecord)
_dec_dc = msgspec.msgpack.Decoder(DeliveryCountRecord)
_dec_counter = msgspec.msgpack.Decoder(CounterRecord)
_dec_dedup = msgspec.msgpack.Decoder(DuplicateIdRecord)
_dec_cursor = msgspec.msgpack.Decoder(PageCursorRecord)
_dec_page_ack = msgspec.msgpack.Decoder(PageAckRecord)
_dec_page_dc = msgspec.msgpack.Decoder(PageDeliveryCountRecord)
_encode = encoder.encode

BINDINGS_FILE_SIZE = 1024 * 1024


class _TxAck:
    """A transaction's acknowledgement of `message` on queue `queue_id`, resolved into its journal
    operation (an ACK update, or the DELETE when no other durable queue holds the message) only
    when the transaction's batch is handed to the journal. Deciding earlier lowered the message's
    count at once: a plain ack on its other queue, meanwhile, saw no queue left and deleted the
    record, while the transaction (waiting for a page write, decision 0049) could still be cut
    by a crash, leaving the message gone from a queue that never acknowledged it."""

    __slots__ = ("message", "queue_id")

    def __init__(self, message: Message, queue_id: int) -> None:
        self.message = message
        self.queue_id = queue_id


@dataclass
class LoadedQueue:
    id: int
    record: QueueRecord
    seq_reserved: int = 0
    paused: bool = False


@dataclass
class LoadedMessage:
    message: Message
    refs: list[tuple[int, int, int]]  # (queue id, seq, delivery count)


@dataclass
class LoadedState:
    addresses: list[tuple[int, AddressRecord]] = field(default_factory=list)
    queues: list[LoadedQueue] = field(default_factory=list)
    id_reserved: int = 0
    max_id: int = 0
    messages: Iterator[LoadedMessage] = field(default_factory=lambda: iter(()))
    dedup: list[tuple[str, str, int]] = field(default_factory=list)  # (address, dedup id, record id), in order
    queue_refs: dict[int, list[MessageRef]] | None = None  # a follower's references per queue id (warm backup)
    page_cursors: dict[int, tuple[int, int]] = field(default_factory=dict)  # queue id -> (page, index)
    page_txs: set[int] = field(default_factory=set)  # committed page transactions (PAGE_TX records)
    page_tx_seqs: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)  # tx -> (queue, first, count)
    # Decision 0063: per queue id, the page records it acknowledged ahead of its cursor, and the
    # delivery counts of those it read back and had delivered without an acknowledgement.
    page_acks: dict[int, set[tuple[int, int]]] = field(default_factory=dict)
    page_counts: dict[int, dict[tuple[int, int], int]] = field(default_factory=dict)
    page_skips: dict[int, list[tuple[tuple[int, int], tuple[int, int]]]] = field(default_factory=dict)  # purged spans


class JournalStorage:
    persistent = True

    def __init__(self, data_dir: Path, settings: JournalSettings, tap: Tap | None = None) -> None:
        """`tap`: a replication stream that every change to the store's files goes to (a replicating primary)."""
        self.data_dir = Path(data_dir)
        bsettings = JournalSettings(
            file_size=min(settings.file_size, BINDINGS_FILE_SIZE),
            min_files=2,
            pool_files=2,
            buffer_timeout_ns=settings.buffer_timeout_ns,
            buffer_size=settings.buffer_size,
            compact_percentage=settings.compact_percentage,
            compact_min_files=settings.compact_min_files,
            datasync=settings.datasync,
        )
        self.bindings = Journal(self.data_dir / "bindings", "tandem-bindings", bsettings, tap)
        self._counter_rids: dict[tuple[RecordType, int], int] = {}
        self._next_counter_rid = COUNTER_RECORD_BASE
        self.messages = Journal(self.data_dir / "journal", "tandem-data", settings, tap)
        self._followed: tuple[dict[int, LiveRecord], dict[int, LiveRecord], Any] | None = None
        self._drop_at_start: list[int] = []  # records found broken before the journal ran
        self._leftovers: dict[int, LiveRecord] | None = None
        self._cursor_rids: dict[int, int] = {}  # queue id -> its PAGE_CURSOR record
        self._cursors: dict[int, tuple[int, int]] = {}  # queue id -> its journaled cursor
        # queue id -> PAGE_ACK record -> the last position it holds (decisions 0063, 0073)
        self._page_acks: dict[int, dict[int, tuple[int, int]]] = {}
        self._acks_loaded: dict[int, set[tuple[int, int]]] = {}  # (load only) qid -> acknowledged positions
        # queue id -> (page, index) -> its PAGE_DELIVERY_COUNT record
        self._page_dcs: dict[int, dict[tuple[int, int], int]] = {}
        self._page_skips: dict[int, dict[int, tuple[tuple[int, int], tuple[int, int]]]] = {}  # qid -> rid -> span
        self._dc_values: dict[int, int] = {}  # (load only) PAGE_DELIVERY_COUNT record -> its count
        (self.data_dir / "paging").mkdir(parents=True, exist_ok=True)
        self.large = LargeMessageStore(self.data_dir / LARGE_DIRECTORY, tap, self.messages.after_durable)
        self.pages = PageFiles(self.data_dir / "paging", settings.datasync, tap)

    @property
    def journals(self) -> list[Journal]:
        return [self.bindings, self.messages]

    @property
    def writers(self) -> list[Any]:
        """The store's writer threads, each with its directory (what a backup's sync lists on them)."""
        return [self.bindings, self.messages, self.pages]

    # ------------------------------------------------------------ lifecycle
    def load(self) -> LoadedState:
        if self._followed is not None:
            return self._load_followed()
        state = LoadedState()
        top_id = self._bindings_state(self.bindings.load(), state)
        live = self.messages.load()
        state.max_id = max(top_id, self.messages.max_id)
        for rid, lr in live.items():
            if lr.user_type == RecordType.DUPLICATE_ID:
                d = _dec_dedup.decode(lr.body)
                state.dedup.append((d.address, d.dedup_id, rid))
            elif lr.user_type == RecordType.PAGE_CURSOR:
                self._cursor_loaded(rid, lr.body, state)
            elif lr.user_type == RecordType.PAGE_TX:
                state.page_txs.add(rid)
                if lr.body:
                    state.page_tx_seqs[rid] = _dec_tx_seqs.decode(lr.body)
            elif lr.user_type in (RecordType.PAGE_ACK, RecordType.PAGE_DELIVERY_COUNT):
                self._page_record_loaded(rid, lr.user_type, lr.body)
        self._page_records_state(state)
        state.messages = self._iter_messages(live)
        return state

    def make_message(self, rid: int, rec: MessageRecord) -> Message:
        """The message of a MESSAGE record (its large body's handle too, counted as recorded)."""
        m = Message.decode(rec.message_id or rid, rec.message)
        if rec.message_id:
            m.rid = rid
        if rec.expiration:
            m.expiration = rec.expiration
        lg = rec.large
        if lg is not None:
            m.large = self.large.body(lg.file, lg.size, lg.compressed)
            self.large.recorded(rid, lg.file)
        return m

    def _whole(self, rid: int, m: Message) -> bool:
        """A large message whose file is not whole is never delivered: its record goes (logged)."""
        lg = m.large
        if lg is None or self.large.complete(lg.name, lg.size):
            return True
        log.error(
            "large message %s: its file %s is missing or not %d bytes long; the message is dropped",
            rid,
            lg.name,
            lg.size,
        )
        self.large.record_deleted(rid)
        if self.messages.started:
            self.messages.delete(rid)
        else:  # a warm load checks before the journal runs
            self._drop_at_start.append(rid)
        return False

    def _cursor_loaded(self, rid: int, body: bytes, state: LoadedState) -> None:
        c = _dec_cursor.decode(body)
        old = self._cursor_rids.get(c.queue_id)
        if old is None or old < rid:  # a replacement is added before its predecessor is deleted
            self._cursor_rids[c.queue_id] = rid
            state.page_cursors[c.queue_id] = (c.page, c.index)

    def _page_record_loaded(self, rid: int, utype: int, body: bytes) -> None:
        if utype == RecordType.PAGE_ACK:
            a = _dec_page_ack.decode(body)
            if a.end_page:
                self._page_skips.setdefault(a.queue_id, {})[rid] = ((a.page, a.index), (a.end_page, a.end_index))
            else:
                positions = [(a.page, a.index), *a.more]
                self._page_acks.setdefault(a.queue_id, {})[rid] = max(positions)
                self._acks_loaded.setdefault(a.queue_id, set()).update(positions)
        else:
            d = _dec_page_dc.decode(body)
            dcs = self._page_dcs.setdefault(d.queue_id, {})
            old = dcs.get((d.page, d.index))
            if old is None or old < rid:  # a replacement is added before its predecessor is deleted
                dcs[(d.page, d.index)] = rid
                self._dc_values[rid] = d.count

    def _page_records_state(self, state: LoadedState) -> None:
        """The loaded PAGE_ACK / PAGE_DELIVERY_COUNT records ahead of their queue's cursor (any
        behind it are left over from nothing: a cursor's batch deletes those it passes)."""
        self._cursors.update(state.page_cursors)
        state.page_acks.update(self._acks_loaded)
        self._acks_loaded = {}
        for qid, dcs in self._page_dcs.items():
            state.page_counts[qid] = {pos: self._dc_values[rid] for pos, rid in dcs.items()}
        for qid, spans in self._page_skips.items():
            state.page_skips[qid] = sorted(spans.values())
        self._dc_values.clear()

    def set_tap(self, tap: Tap | None) -> None:
        """Before `start`: stream every change from now on (a backup that took over replicates in turn)."""
        self.bindings.tap = tap
        self.messages.tap = tap
        self.large.set_tap(tap)
        self.pages.tap = tap

    def adopt_followed(self, bindings: dict[int, LiveRecord], messages: dict[int, LiveRecord], follower: Any) -> None:
        """Journals already read by a follower (store/follower.py): `load` builds from what it built."""
        self._followed = (bindings, messages, follower)

    def _load_followed(self) -> LoadedState:
        assert self._followed is not None
        blive, mlive, follower = self._followed
        self._followed = None
        state = LoadedState()
        top_id = self._bindings_state(blive, state)
        state.max_id = max(top_id, self.messages.max_id)
        state.dedup = [(a, d, rid) for rid, (a, d) in follower.dedup.items()]
        state.queue_refs = follower.by_queue
        for rid, lr in mlive.items():
            if lr.user_type == RecordType.PAGE_CURSOR:
                self._cursor_loaded(rid, lr.body, state)
            elif lr.user_type == RecordType.PAGE_TX:
                state.page_txs.add(rid)
                if lr.body:
                    state.page_tx_seqs[rid] = _dec_tx_seqs.decode(lr.body)
            elif lr.user_type in (RecordType.PAGE_ACK, RecordType.PAGE_DELIVERY_COUNT):
                self._page_record_loaded(rid, lr.user_type, lr.body)
        self._page_records_state(state)
        self._leftovers = mlive  # the follower's message objects carry on; its records are freed later
        self._check_followed_large(mlive)
        return state

    def _check_followed_large(self, mlive: dict[int, LiveRecord]) -> None:
        """A warm load's large messages: those without their whole file are dropped, unrecorded files removed."""
        for rid in list(self.large.records):
            lr = mlive.get(rid)
            refs = lr.obj if lr is not None else None
            if not refs:
                continue
            m = refs[0].message
            if not self._whole(rid, m):
                for r in refs:
                    r.removed = True
        self.large.clean()

    def take_leftovers(self) -> dict[int, LiveRecord] | None:
        """What a warm load no longer needs, for the caller to free once it serves (a chunk at a time)."""
        out, self._leftovers = self._leftovers, None
        return out

    def _bindings_state(self, live: dict[int, LiveRecord], state: LoadedState) -> int:
        """Addresses, queues and counters from the bindings journal; returns the highest broker id."""
        seqs: dict[int, int] = {}
        paused: set[int] = set()
        top_id = 0
        for rid, lr in live.items():
            if rid >= COUNTER_RECORD_BASE:
                self._next_counter_rid = max(self._next_counter_rid, rid + 1)
            else:
                top_id = max(top_id, rid)
            if lr.user_type == RecordType.ADDRESS:
                body = lr.updates[-1][1] if lr.updates else lr.body
                state.addresses.append((rid, _dec_address.decode(body)))
            elif lr.user_type == RecordType.QUEUE:
                state.queues.append(LoadedQueue(rid, _dec_queue.decode(lr.body)))
            elif lr.user_type == RecordType.QUEUE_SEQ:
                c = _dec_counter.decode(lr.body)
                seqs[c.owner] = max(seqs.get(c.owner, 0), c.value)
                self._counter_rids[(RecordType.QUEUE_SEQ, c.owner)] = rid
            elif lr.user_type == RecordType.QUEUE_STATUS:
                st = _dec_status.decode(lr.body)
                if st.paused:
                    paused.add(st.queue_id)
                self._counter_rids[(RecordType.QUEUE_STATUS, st.queue_id)] = rid
            elif lr.user_type == RecordType.ID_COUNTER:
                state.id_reserved = max(state.id_reserved, _dec_counter.decode(lr.body).value)
                self._counter_rids[(RecordType.ID_COUNTER, 0)] = rid
        for lq in state.queues:
            lq.seq_reserved = seqs.get(lq.id, 0)
            lq.paused = lq.id in paused
        if self.bindings.max_id >= COUNTER_RECORD_BASE:  # never reuse a deleted counter record's id
            self._next_counter_rid = max(self._next_counter_rid, self.bindings.max_id + 1)
        return top_id

    def _iter_messages(self, live: dict[int, LiveRecord]) -> Iterator[LoadedMessage]:
        msg_type = RecordType.MESSAGE
        decode = _dec_message.decode
        make = Message.decode
        broken: list[tuple[int, Message]] = []
        for rid, lr in live.items():
            if lr.user_type != msg_type:
                continue
            rec = decode(lr.body)
            if rec.large is not None:
                m = self.make_message(rid, rec)
                if not self.large.complete(rec.large.file, rec.large.size):
                    broken.append((rid, m))  # dropped after the walk (no journal change while iterating)
                    continue
            elif lr.updates is None and not rec.expiration and not rec.message_id:  # the common case
                yield LoadedMessage(make(rid, rec.message), [(qid, seq, 0) for qid, seq in rec.refs])
                continue
            else:
                m = self.make_message(rid, rec)
            counts: dict[int, int] = {}
            acked: set[int] = set()
            for utype, ubody in lr.updates or ():
                if utype == RecordType.ACK:
                    acked.add(_dec_ack.decode(ubody).queue_id)
                elif utype == RecordType.DELIVERY_COUNT:
                    dc = _dec_dc.decode(ubody)
                    counts[dc.queue_id] = dc.count
            refs = [(qid, seq, counts.get(qid, 0)) for qid, seq in rec.refs if qid not in acked]
            yield LoadedMessage(m, refs)
        live.clear()
        for rid, m in broken:
            self._whole(rid, m)
        del broken
        self.large.clean()

    def start(self) -> None:
        self.bindings.start()
        self.messages.start()
        self.large.start()
        drop, self._drop_at_start = self._drop_at_start, []
        for rid in drop:
            self.messages.delete(rid)
        self.pages.start()

    async def stop(self) -> None:
        await self.pages.stop()
        await self.messages.stop()
        await self.bindings.stop()
        self.large.close()

    def set_failure_handler(self, handler: Callable[[BaseException], None]) -> None:
        self.bindings.on_failure = handler
        self.messages.on_failure = handler
        self.pages.on_failure = handler
        self.large.on_failure = handler

    def halt(self, err: BaseException) -> None:
        """Write nothing more from now on (the store is no longer ours); what is pending is never confirmed."""
        self.pages.halt(err)
        self.messages.halt(err)
        self.bindings.halt(err)

    # -------------------------------------------------------------- bindings
    def store_address(self, address: Address) -> None:
        body = _encode(AddressRecord(address.name, sorted(int(r) for r in address.routing_types), address.auto_created))
        if self.bindings.contains(address.id):
            self.bindings.update(address.id, RecordType.ADDRESS, body)
        else:
            self.bindings.add(address.id, RecordType.ADDRESS, body)

    def delete_address(self, address: Address) -> None:
        self.bindings.delete(address.id)

    def store_queue(self, queue: Queue) -> None:
        rec = QueueRecord(
            queue.name,
            queue.address,
            int(queue.routing_type),
            queue.filter_text,
            queue.max_consumers,
            queue.auto_created,
            queue.exclusive,
            queue.last_value_key,
            queue.reader_only,
        )
        self.bindings.add(queue.id, RecordType.QUEUE, _encode(rec))

    def delete_queue(self, queue: Queue) -> None:
        ops = [Op(DELETE, 0, queue.id, b"")]
        for kind in (RecordType.QUEUE_SEQ, RecordType.QUEUE_STATUS):
            rid = self._counter_rids.pop((kind, queue.id), None)
            if rid is not None:
                ops.append(Op(DELETE, 0, rid, b""))
        self.bindings.batch(ops)
        self.bindings.after_durable(partial(self._queue_records_gone, queue.id))

    def _queue_records_gone(self, queue_id: int) -> None:
        """A deleted queue's deletion is durable: its page records may go (those of a broker
        stopping meanwhile go at its next start, as a reload deletes those of queues gone)."""
        if self.messages.started and self.messages.failed is None:
            self.delete_cursor_record(queue_id)

    def store_queue_status(self, queue: Queue) -> None:
        """Paused: a QUEUE_STATUS record (replacing any older one, atomically); resumed: none."""
        if queue.paused:
            self._store_counter_record(RecordType.QUEUE_STATUS, queue.id, _encode(QueueStatusRecord(queue.id)))
            return
        old = self._counter_rids.pop((RecordType.QUEUE_STATUS, queue.id), None)
        if old is not None:
            self.bindings.delete(old)

    def _store_counter(self, utype: RecordType, owner: int, value: int) -> None:
        """Replace a counter's record: add the new one and delete the old in one atomic batch."""
        self._store_counter_record(utype, owner, _encode(CounterRecord(value, owner)))

    def _store_counter_record(self, utype: RecordType, owner: int, body: bytes) -> None:
        rid = self._next_counter_rid
        self._next_counter_rid += 1
        ops = [Op(ADD, utype, rid, body)]
        old = self._counter_rids.get((utype, owner))
        if old is not None:
            ops.append(Op(DELETE, 0, old, b""))
        self._counter_rids[(utype, owner)] = rid
        self.bindings.batch(ops)

    def store_queue_seq(self, queue: Queue, reserved: int) -> None:
        self._store_counter(RecordType.QUEUE_SEQ, queue.id, reserved)

    def reserve_ids(self, upto: int) -> None:
        self._store_counter(RecordType.ID_COUNTER, 0, upto)

    def after_bindings_durable(self, cb: Callable[[], None]) -> None:
        self.bindings.after_durable(cb)

    # -------------------------------------------------------------- messages
    def store_depaged(
        self, queue: Queue, messages: list[tuple[Message, int]], cursor: tuple[int, int], rid: int
    ) -> None:
        """Messages a queue read from its pages, journaled as its own, and its new cursor (record
        `rid`, a broker id): one batch, so a restart finds each either in the journal or still
        ahead of the cursor, never both."""
        ops: list[Op] = []
        for m, seq in messages:
            raw = m.raw
            if type(raw) is not msgspec.Raw:
                raw = msgspec.Raw(raw)
            body = _encode(MessageRecord([(queue.id, seq)], raw, m.expiration or 0, message_id=m.id))
            ops.append(Op(ADD, RecordType.MESSAGE, m.rid or m.id, body))
        self._cursor_ops(queue.id, cursor, rid, ops)
        self.messages.batch(ops)

    def _cursor_ops(self, qid: int, cursor: tuple[int, int], rid: int, ops: list[Op]) -> None:
        """A queue's new cursor (record `rid`), replacing the previous one; the PAGE_ACK and
        PAGE_DELIVERY_COUNT records it passes go in the same batch (decision 0063)."""
        ops.append(Op(ADD, RecordType.PAGE_CURSOR, rid, _encode(PageCursorRecord(qid, cursor[0], cursor[1]))))
        old = self._cursor_rids.get(qid)
        if old is not None:
            ops.append(Op(DELETE, 0, old, b""))
        self._cursor_rids[qid] = rid
        self._cursors[qid] = cursor
        acks = self._page_acks.get(qid)
        if acks:  # a record goes once the cursor is past the last position it holds
            for arid in [arid for arid, last in acks.items() if last < cursor]:
                del acks[arid]
                ops.append(Op(DELETE, 0, arid, b""))
        dcs = self._page_dcs.get(qid)
        if dcs:
            for pos in [pos for pos in dcs if pos < cursor]:
                ops.append(Op(DELETE, 0, dcs.pop(pos), b""))
        spans = self._page_skips.get(qid)
        if spans:
            for srid in [srid for srid, (_start, end) in spans.items() if end <= cursor]:
                del spans[srid]
                ops.append(Op(DELETE, 0, srid, b""))

    def store_page_acks(
        self,
        queue: Queue,
        acks: list[tuple[int, int]],
        arid: int,
        cursor: tuple[int, int] | None,
        rid: int,
        tx: list[object] | None = None,
    ) -> None:
        """A queue acknowledged page records it read back (decision 0063): one PAGE_ACK record
        (`arid`) holding the positions `acks` its cursor does not pass, and, outside a
        transaction, its new cursor (record `rid`) when that moved, in one batch (decision 0073).
        In a transaction the record joins `tx`; the cursor moves once it is committed."""
        qid = queue.id
        ops: list[Op] = []
        dcs = self._page_dcs.get(qid)
        if dcs:
            for pos in acks:
                if pos in dcs:
                    ops.append(Op(DELETE, 0, dcs.pop(pos), b""))
        ahead = acks if cursor is None else [pos for pos in acks if pos >= cursor]
        if ahead:
            (page, index), more = ahead[0], ahead[1:]
            ops.append(Op(ADD, RecordType.PAGE_ACK, arid, _encode(PageAckRecord(qid, page, index, more=more))))
        mine = self._page_acks.setdefault(qid, {})
        if tx is not None:
            tx.extend(ops)
            if ahead:  # known once the transaction's batch is handed over
                tx.append(partial(mine.__setitem__, arid, max(ahead)))
            return
        if ahead:
            mine[arid] = max(ahead)
        if cursor is not None:
            self._cursor_ops(qid, cursor, rid, ops)
        if ops:
            self.messages.batch(ops)

    def store_page_skip(self, queue: Queue, start: tuple[int, int], end: tuple[int, int], rid: int) -> None:
        """A purge acknowledged every page record of `queue` from `start` up to `end` while its
        cursor is held behind them (by a message read back and in delivery): one PAGE_ACK record
        for the span, deleted once the cursor reaches its end."""
        qid = queue.id
        self._page_skips.setdefault(qid, {})[rid] = (start, end)
        self.messages.add(rid, RecordType.PAGE_ACK, _encode(PageAckRecord(qid, *start, *end)))

    def store_page_delivery_count(self, queue: Queue, pos: tuple[int, int], count: int, rid: int) -> None:
        """Failed deliveries of a page record read back (record `rid`, replacing the last one)."""
        if self.messages.failed is not None:  # advisory, as store_delivery_count
            return
        qid = queue.id
        dcs = self._page_dcs.setdefault(qid, {})
        ops = [Op(ADD, RecordType.PAGE_DELIVERY_COUNT, rid, _encode(PageDeliveryCountRecord(qid, *pos, count)))]
        old = dcs.get(pos)
        if old is not None:
            ops.append(Op(DELETE, 0, old, b""))
        dcs[pos] = rid
        self.messages.batch(ops)

    def delete_cursor(self, queue: Queue) -> None:
        """A queue deleted: its page records (cursor, PAGE_ACK, PAGE_DELIVERY_COUNT) go once its
        deletion is durable (`delete_queue`): gone before it, a crash would bring the queue back
        reading its pages from the start, acknowledged and moved records included (decision 0066)."""

    def store_page_tx(self, tx: int, ops: list[object], seqs: list[tuple[int, int, int]] | None = None) -> None:
        """The record that makes page transaction `tx`'s paged messages visible (decision 0049),
        into the transaction's batch; `seqs`: the sequences its records written before the commit
        take, (queue id, first, count) per queue (decision 0055)."""
        ops.append(Op(ADD, RecordType.PAGE_TX, tx, msgspec.msgpack.encode(seqs) if seqs else b""))

    def delete_page_tx(self, tx: int) -> None:
        """Its pages are all deleted: the record is no longer needed."""
        self.messages.delete(tx)

    def delete_cursor_record(self, queue_id: int) -> None:
        """A queue deleted (or, at a reload, gone): its cursor and its page acknowledgements."""
        rids = [*self._page_acks.pop(queue_id, {}), *self._page_dcs.pop(queue_id, {}).values()]
        rids += self._page_skips.pop(queue_id, {})
        old = self._cursor_rids.pop(queue_id, None)
        self._cursors.pop(queue_id, None)
        if old is not None:
            rids.append(old)
        if rids:
            self.messages.delete_many(rids)

    def page_record_queues(self) -> set[int]:
        """Queues with page records in the journal (a reload deletes those of queues gone)."""
        return set(self._cursor_rids) | set(self._page_acks) | set(self._page_dcs) | set(self._page_skips)

    def store_message(self, message: Message, refs: list[tuple[int, int]], tx: list[object] | None = None) -> None:
        raw = message.raw
        if type(raw) is not msgspec.Raw:
            raw = msgspec.Raw(raw)
        lg = message.large
        if lg is None:
            body = _encode(MessageRecord(refs, raw, message.expiration if message.expiration else 0))
        else:
            large = LargeRecord(lg.name, lg.size, lg.compressed)
            body = _encode(MessageRecord(refs, raw, message.expiration if message.expiration else 0, large))
            self.large.recorded(message.id, lg.name)
        if tx is None:
            self.messages.add_soon(message.id, RecordType.MESSAGE, body)
        else:
            tx.append(Op(ADD, RecordType.MESSAGE, message.id, body))

    def store_ack(self, message: Message, queue: Queue, tx: list[object] | None = None) -> None:
        if tx is not None:
            tx.append(_TxAck(message, queue.id))  # decided when the transaction is journaled
            return
        op = self._ack_op(message, queue.id)
        if op.kind == DELETE:
            self.messages.delete(op.id)
            if message.large is not None:
                self.large.record_deleted(message.id)
        else:
            self.messages.update(op.id, op.user_type, op.body)

    def _ack_op(self, message: Message, queue_id: int) -> Op:
        """The acknowledgement's operation, now: the last durable queue's deletes the record."""
        message.durable_refs -= 1
        rid = message.rid or message.id
        if message.durable_refs <= 0:
            return Op(DELETE, 0, rid, b"")
        return Op(UPDATE, RecordType.ACK, rid, _encode(AckRecord(queue_id)))

    def store_acks(self, messages: list[Message], queue: Queue, tx: list[object] | None = None) -> None:
        """Acknowledge many messages on one queue: the last queue's ack is a DELETE, all in one record."""
        if tx is not None:
            for m in messages:
                self.store_ack(m, queue, tx)
            return
        deletes: list[int] = []
        for m in messages:
            m.durable_refs -= 1
            if m.durable_refs <= 0:
                deletes.append(m.rid or m.id)
            else:
                self.messages.update(m.rid or m.id, RecordType.ACK, _encode(AckRecord(queue.id)))
        if deletes:
            self.messages.delete_many(deletes)
            if self.large.records:
                for mid in deletes:
                    self.large.record_deleted(mid)

    def store_delivery_count(self, message: Message, queue: Queue, count: int) -> None:
        # Advisory, and written as consumers close: a failed journal (the broker is stopping) skips it.
        rid = message.rid or message.id
        if self.messages.failed is None and self.messages.contains(rid):
            self.messages.update(rid, RecordType.DELIVERY_COUNT, _encode(DeliveryCountRecord(queue.id, count)))

    def store_dedup(
        self, address: str, dedup_id: str | None, rid: int, evicted: list[int], tx: list[object] | None
    ) -> None:
        """Remember a dedup id (record `rid`) and forget the evicted ones; atomically with `tx`."""
        if dedup_id is not None and rid in evicted:  # a cache of size 0 evicts what it just took
            evicted = [old for old in evicted if old != rid]
            dedup_id = None
        ops = [Op(DELETE, 0, old, b"") for old in evicted]
        if dedup_id is not None:
            ops.append(Op(ADD, RecordType.DUPLICATE_ID, rid, _encode(DuplicateIdRecord(address, dedup_id))))
        if tx is not None:
            tx.extend(ops)
        elif len(ops) > 1 and all(op.kind == DELETE for op in ops):
            self.messages.delete_many([op.id for op in ops])
        elif ops:
            self.messages.batch(ops)

    def commit(self, tx: list[object]) -> None:
        """One atomic batch of `tx`'s journal operations; then its callables, in order (what
        must follow the batch: a page cursor passing acknowledgements in it, decision 0063)."""
        ops: list[Op] = []
        after: list[object] = []
        for x in tx:
            if isinstance(x, Op):
                ops.append(x)
            elif isinstance(x, _TxAck):
                ops.append(self._ack_op(x.message, x.queue_id))
            elif callable(x):
                after.append(x)
            else:
                raise JournalError("transaction holds something that is not a journal operation")
        self.messages.batch(ops)
        if self.large.records:
            for op in ops:
                if op.kind == DELETE:
                    self.large.record_deleted(op.id)
        for f in after:
            f()  # type: ignore[operator]

    def delete_message(self, message_id: int) -> None:
        """Reload clean-up: a message none of whose queues still exist."""
        self.messages.delete(message_id)
        self.large.record_deleted(message_id)

    def after_durable(self, cb: Callable[[], None]) -> None:
        """Run `cb` once everything stored so far is on disk, in both journals.

        A message routed to a queue it auto-created depends on the bindings record: confirmed
        before that record is durable, a crash would reload the message without its queue (and
        drop it as an orphan). The bindings journal is idle nearly always; then this is the
        message journal's own wait.

        On a replicating primary "on disk" includes the backup's acknowledgement, also of what is
        written already here: an idle store may still have its last batch on its way to the
        backup (a paged send whose dedup id the original's page write has not journaled yet: a
        resend answered as a duplicate before the backup has that page would be lost at a
        takeover). `settled` says when nothing can be; otherwise each store's `after_durable`
        waits for its last position (at once when the backup has it)."""
        if not self.pages.settled:  # a paged message, or its dedup record that follows the page
            self.pages.after_durable(partial(self._after_journals, cb))
        else:
            self._after_journals(cb)

    def _after_journals(self, cb: Callable[[], None]) -> None:
        if self.bindings.settled:
            self.messages.after_durable(cb)
        else:
            self.bindings.after_durable(partial(self.messages.after_durable, cb))


class NullStorage:
    """`persistence-enabled = false`: nothing is written, everything is 'durable' at once."""

    persistent = False

    def __init__(self, large_dir: Path | None = None) -> None:
        """`large_dir`: where large messages' bodies go for as long as they live (None: none accepted)."""
        self.large: LargeMessageStore | None = LargeMessageStore(large_dir) if large_dir is not None else None

    def load(self) -> LoadedState:
        if self.large is not None:
            self.large.clean()  # nothing is recorded: every file is a previous run's
            self.large.start()
        return LoadedState()

    def take_leftovers(self) -> None:
        return None

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        if self.large is not None:
            self.large.close()

    def set_failure_handler(self, handler: Callable[[BaseException], None]) -> None:
        pass

    def halt(self, err: BaseException) -> None:
        pass

    def store_address(self, address: Address) -> None:
        pass

    def delete_address(self, address: Address) -> None:
        pass

    def store_queue(self, queue: Queue) -> None:
        pass

    def delete_queue(self, queue: Queue) -> None:
        pass

    def store_queue_seq(self, queue: Queue, reserved: int) -> None:
        pass

    def store_queue_status(self, queue: Queue) -> None:
        pass

    def reserve_ids(self, upto: int) -> None:
        pass

    def store_message(self, message: Message, refs: list[tuple[int, int]], tx: list[object] | None = None) -> None:
        pass

    def store_ack(self, message: Message, queue: Queue, tx: list[object] | None = None) -> None:
        pass

    def store_acks(self, messages: list[Message], queue: Queue, tx: list[object] | None = None) -> None:
        pass

    def store_delivery_count(self, message: Message, queue: Queue, count: int) -> None:
        pass

    def store_dedup(
        self, address: str, dedup_id: str | None, rid: int, evicted: list[int], tx: list[object] | None
    ) -> None:
        pass

    def commit(self, tx: list[object]) -> None:
        for f in tx:
            if callable(f):
                f()

    def delete_message(self, message_id: int) -> None:
        pass

    def store_depaged(
        self, queue: Queue, messages: list[tuple[Message, int]], cursor: tuple[int, int], rid: int
    ) -> None:
        pass

    def delete_cursor(self, queue: Queue) -> None:
        pass

    def store_page_acks(
        self,
        queue: Queue,
        acks: list[tuple[int, int]],
        arid: int,
        cursor: tuple[int, int] | None,
        rid: int,
        tx: list[object] | None = None,
    ) -> None:
        pass

    def store_page_delivery_count(self, queue: Queue, pos: tuple[int, int], count: int, rid: int) -> None:
        pass

    def store_page_skip(self, queue: Queue, start: tuple[int, int], end: tuple[int, int], rid: int) -> None:
        pass

    def store_page_tx(self, tx: int, ops: list[object], seqs: list[tuple[int, int, int]] | None = None) -> None:
        pass

    def delete_page_tx(self, tx: int) -> None:
        pass

    def after_durable(self, cb: Callable[[], None]) -> None:
        cb()

    def after_bindings_durable(self, cb: Callable[[], None]) -> None:
        cb()
