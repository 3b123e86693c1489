"""A backup's live view of a store it does not own yet: both journals followed, messages decoded.

While passive, the backup applies every journal operation as it appears
(journal/follower.py) and builds the broker's message objects as it goes:
each message with its per-queue references, acknowledged ones marked. When
it takes over, only the tail is left to read; `JournalStorage.load_followed`
then hands the references to the queues instead of decoding the journal again.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import msgspec

from ..core.message import MessageRef
from ..journal import ADD, DELETE, UPDATE, JournalSettings, LiveRecord
from ..journal.follower import JournalFollower
from .journal_storage import JournalStorage
from .records import AckRecord, DeliveryCountRecord, DuplicateIdRecord, MessageRecord, RecordType

_dec_message = msgspec.msgpack.Decoder(MessageRecord)
_dec_ack = msgspec.msgpack.Decoder(AckRecord)
_dec_dc = msgspec.msgpack.Decoder(DeliveryCountRecord)
_dec_dedup = msgspec.msgpack.Decoder(DuplicateIdRecord)

COMPACT_AFTER = 50_000  # drop acknowledged references from a queue's list once this many pile up


class StoreFollower:
    def __init__(self, data_dir: Path, settings: JournalSettings) -> None:
        self.storage = JournalStorage(data_dir, settings)
        self.bindings = JournalFollower(self.storage.bindings)
        self.messages = JournalFollower(self.storage.messages, self._on_message)
        self.by_queue: dict[int, list[MessageRef]] = defaultdict(list)
        self.removed: dict[int, int] = defaultdict(int)
        self.dedup: dict[int, tuple[str, str]] = {}  # record id -> (address, dedup id), in order
        # Messages read but not built yet (record id -> its body and live record): built at the end
        # of each poll, so one deleted within the same poll (acknowledged at once, the common case
        # with consumers keeping up) is never decoded at all.
        self._unbuilt: dict[int, tuple[bytes, LiveRecord]] = {}
        self._built_or_held = 0
        self.caught_up = False  # has read everything there was at least once (warm from then on)

    def poll(self) -> bool | None:
        """True: caught up; None: more to read; False: cannot follow any more (start over)."""
        b = self.bindings.poll()
        if b is False:
            return False
        m = self.messages.poll()
        if m is False:
            return False
        self._build()
        if b is None or m is None:
            return None
        self.caught_up = True
        return True

    @property
    def messages_seen(self) -> int:
        """Messages read so far, those the journal follower skipped (deleted as soon as read) included."""
        return self._built_or_held + self.messages.cancelled.get(RecordType.MESSAGE, 0)

    @property
    def problem(self) -> str | None:
        return self.bindings.problem or self.messages.problem

    def _on_message(self, kind: int, utype: int, rid: int, body: bytes, lr: LiveRecord) -> None:
        if kind == ADD:
            if utype == RecordType.MESSAGE and lr.obj is None and rid not in self._unbuilt:
                self._unbuilt[rid] = (body, lr)
                self._built_or_held += 1
            elif utype == RecordType.DUPLICATE_ID:
                d = _dec_dedup.decode(body)
                self.dedup[rid] = (d.address, d.dedup_id)
        elif kind == UPDATE:
            if rid in self._unbuilt:
                self._build()  # (all of them: the references stay in journal order)
            if lr.obj is None:
                return
            if utype == RecordType.ACK:
                qid = _dec_ack.decode(body).queue_id
                for r in lr.obj:
                    if r.queue == qid and not r.removed:
                        r.removed = True
                        r.message.durable_refs -= 1
                        self._removed(qid)
            elif utype == RecordType.DELIVERY_COUNT:
                dc = _dec_dc.decode(body)
                for r in lr.obj:
                    if r.queue == dc.queue_id:
                        r.delivery_count = dc.count
        elif kind == DELETE:
            self.storage.large.record_deleted(rid)
            if self._unbuilt.pop(rid, None) is not None:
                return  # added and deleted within one poll: never built
            if lr.obj is not None:
                for r in lr.obj:
                    if not r.removed:
                        r.removed = True
                        self._removed(r.queue)
            self.dedup.pop(rid, None)

    def _build(self) -> None:
        """Build the messages read so far, in journal order (a queue's references stay in order)."""
        unbuilt = self._unbuilt
        if not unbuilt:
            return
        by_queue = self.by_queue
        for rid, (body, lr) in unbuilt.items():
            rec = _dec_message.decode(body)
            m = self.storage.make_message(rid, rec)  # a large one's file is checked at takeover
            refs = tuple(MessageRef(m, qid, seq) for qid, seq in rec.refs)  # a tuple: untracked by the GC
            m.durable_refs = len(refs)
            lr.obj = refs
            for r in refs:
                by_queue[r.queue].append(r)
        unbuilt.clear()

    def _removed(self, qid: int) -> None:
        n = self.removed[qid] + 1
        refs = self.by_queue[qid]
        if n >= COMPACT_AFTER and n * 2 >= len(refs):
            self.by_queue[qid] = [r for r in refs if not r.removed]
            n = 0
        self.removed[qid] = n

    def finish(self) -> JournalStorage | None:
        """Read the rest and hand over a storage ready to start; None: load cold instead."""
        blive = self.bindings.finish()
        if blive is None:
            return None
        mlive = self.messages.finish()
        if mlive is None:
            return None
        self._build()
        self.storage.adopt_followed(blive, mlive, self)
        return self.storage
