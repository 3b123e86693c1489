"""A paged address always holds what a cold load of its data directory rebuilds.

A stateful property test: hypothesis sends messages to an anycast and a multicast address with a
tiny memory limit and tiny page files (so they page, roll pages and stop paging again), in
transactions too (committed, or cut by a crash after their page writes; paged while open, then
committed, rolled back or cut by a crash, with other sends in between), consumes and
acknowledges from their queues, reads ranges of a reader-only queue (the Spark source's) and
acknowledges up to a sequence there, browses queues, purges, and restarts the broker's store
from its files. Runs of messages in page records (decision 0086) are sealed at 160 bytes here
(128 KiB in the broker), so that a loop pass's sends make several runs, across page rolls and
a transaction's files alike.
Range reads and browsers must return what the model holds, in order, whether it is in memory or
in pages, and browsing must leave the queue as it was. After
every step each queue's contents (in memory, then still in pages, in delivery order) must equal
the model's; after a restart, built by a cold load from the journal, the page files and the
cursors, they must still equal it.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import store_loop
from tandem.core.address import MemoryLimits
from tandem.core.consumer import Consumer
from tandem.core.ids import IdGenerator
from tandem.core.message import Message, MessageData, RoutingType
from tandem.core.postoffice import PostOffice
from tandem.core.queue import Queue
from tandem.core.session import Transaction
from tandem.core.settings import SettingsRepository
from tandem.journal import JournalSettings
from tandem.server.broker import restore_state
from tandem.store import pages
from tandem.store.journal_storage import JournalStorage

JOURNAL = JournalSettings(file_size=64 * 1024, min_files=2, pool_files=1, buffer_timeout_ns=0, datasync=False)
PATTERNS = {"#": {"max-size-bytes": 600, "address-full-policy": "PAGE", "page-size-bytes": 1024}}
SETTINGS = SettingsRepository({k: {n.replace("-", "_"): v for n, v in d.items()} for k, d in PATTERNS.items()})
QUEUES = {"work": "work", "t1": "news", "t2": "news", "r1": "news"}
READER = "r1"  # reader-only: read by range, acknowledged up to a sequence, never consumed
EXTRA = "t3"  # a subscription created and deleted while the address may be paging


def contents(q: Queue) -> list[int]:
    """Message ids in delivery order: what is in memory, then what the queue's cursor has ahead of it."""
    out = [r.message.id for r in q.iter_refs()]
    pager = q.addr.pager if q.addr is not None else None
    if pager is None or not pager.paged.get(q.id):
        return out
    page, idx = pager.cursors[q.id]
    for p in pager.pages:
        if p < page:
            continue
        records, _end = pager.store.read(q.addr.id, p, 0)  # type: ignore[union-attr]
        for i, r in enumerate(records):
            if p == page and i < idx:
                continue
            if r.tx in pager.tx_dead:
                continue  # a transaction cut by a crash: never visible
            if (p, i) in pager.acked_ahead.get(q.id, ()) or pager._purged(q.id, (p, i)):
                continue  # read back before a restart and acknowledged, or purged (decision 0063)
            if any(qid == q.id for qid, _seq in r.refs):
                out.append(r.mid)
    return out


class _Collect:
    """A browser's delivery sink: the ids it is given."""

    writable = True

    def __init__(self) -> None:
        self.ids: list[int] = []

    def deliver(self, consumer: Consumer, ref: Any) -> None:
        self.ids.append(ref.message.id)

    def consumer_closed(self, consumer: Consumer, error: Any) -> None:
        pass


class PagedStore(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.group_bytes, pages.GROUP_BYTES = pages.GROUP_BYTES, 160
        self.dir = Path(tempfile.mkdtemp(prefix="tandem-paging-"))
        self.loop = asyncio.new_event_loop()
        self.model: dict[str, list[int]] = {name: [] for name in QUEUES}
        self.consumed_seq: dict[str, int] = {}  # queue -> sequence of the last message consumed
        self.counts: dict[str, dict[int, int]] = {}  # queue -> message id -> failed deliveries
        self.storage: JournalStorage | None = None
        self.po = self._open(first=True)

    def _open(self, first: bool = False) -> PostOffice:
        storage = self.storage = JournalStorage(self.dir, JOURNAL)
        state = storage.load()
        self.loaded_txs = set(state.page_txs)

        async def start() -> None:
            storage.start()

        self._run(start())
        ids = IdGenerator(state.max_id + 1, state.id_reserved, storage.reserve_ids)
        po = PostOffice(storage, ids, self.loop.call_soon, SETTINGS, limits=MemoryLimits(), pages=storage.pages)
        restore_state(po, storage, state)
        if first:
            po.create_queue("work", "work", RoutingType.ANYCAST)
            po.create_queue("t1", "news", RoutingType.MULTICAST)
            po.create_queue("t2", "news", RoutingType.MULTICAST)
            po.create_queue(READER, "news", RoutingType.MULTICAST, reader_only=True)
        self._quiet()
        return po

    def _run(self, coro: Any) -> Any:
        return store_loop.run(self.loop, coro, 20)

    def _quiet(self) -> None:
        """Let every write finish (pages, then the journals) and the loop run its callbacks."""
        assert self.storage is not None
        store_loop.settle(self.loop, self.storage, 20)

    def teardown(self) -> None:
        try:
            store_loop.close(self.loop, self.storage, Path(self.dir), 20)
        finally:
            pages.GROUP_BYTES = self.group_bytes

    # ---------------------------------------------------------------- rules
    @rule(address=st.sampled_from(["work", "news"]), n=st.integers(1, 30), size=st.integers(1, 120))
    def send(self, address: str, n: int, size: int) -> None:
        for _ in range(n):
            m = Message.create(self.po.ids.next(), MessageData(address, body=b"b" * size))
            routed, _durable = self.po.send(m)
            assert routed
            for qname, addr in QUEUES.items():
                if addr == address:
                    self.model[qname].append(m.id)
            if address == "news" and EXTRA in self.model:
                self.model[EXTRA].append(m.id)
        self._quiet()

    @rule(address=st.sampled_from(["work", "news"]), n=st.integers(1, 30), size=st.integers(1, 120))
    def send_in_a_transaction(self, address: str, n: int, size: int) -> None:
        messages = [Message.create(self.po.ids.next(), MessageData(address, body=b"b" * size)) for _ in range(n)]
        assert self.po.commit_transaction(messages, [], None)
        for m in messages:
            for qname, addr in QUEUES.items():
                if addr == address:
                    self.model[qname].append(m.id)
            if address == "news" and EXTRA in self.model:
                self.model[EXTRA].append(m.id)
        self._quiet()

    @rule(address=st.sampled_from(["work", "news"]), n=st.integers(1, 30), size=st.integers(1, 120))
    def transaction_cut_by_a_crash(self, address: str, n: int, size: int) -> None:
        """What a crash between a transaction's page writes and its journal batch leaves: page
        records of a page transaction the journal never committed (a restart skips them)."""
        committed = set(self.po.page_txs)
        tx = self.po.ids.next()
        for _ in range(n):
            m = Message.create(self.po.ids.next(), MessageData(address, body=b"b" * size))
            queues = self.po.route(m)
            pager = self.po._pager_for(m, queues)
            if pager is not None:
                pager.page(m, queues, tx)
        self._restart(committed)

    @rule(
        address=st.sampled_from(["work", "news"]),
        n=st.integers(1, 30),
        size=st.integers(1, 120),
        between=st.integers(0, 3),
        outcome=st.sampled_from(["commit", "rollback", "crash"]),
    )
    def transaction_paged_while_open(self, address: str, n: int, size: int, between: int, outcome: str) -> None:
        """Decision 0055: a transaction's sends are paged as they arrive once its address pages
        (or it would fill it); what others send meanwhile comes first; a commit appends it whole,
        a rollback or a crash leaves nothing of it, not even its files."""
        tx = Transaction()
        messages = []
        for i in range(n):
            m = Message.create(self.po.ids.next(), MessageData(address, body=b"b" * size))
            self.po.hold(tx, m, self.po.route(m))
            messages.append(m)
            assert tx.held <= 600 + 120, "an open transaction holds more than its address's limit"
            if i == n // 2:
                for _ in range(between):  # not in the transaction: delivered before it
                    self.send(address, 1, size)
        if outcome == "commit":
            self.po.commit_transaction(tx.messages, tx.acks, None, tx.paged)
            self.po.release(tx, discard=False)
            for m in messages:
                for qname, addr in QUEUES.items():
                    if addr == address:
                        self.model[qname].append(m.id)
                if address == "news" and EXTRA in self.model:
                    self.model[EXTRA].append(m.id)
            self._quiet()
        elif outcome == "rollback":
            self.po.release(tx, discard=True)
            self._quiet()
        else:
            self._restart()
        assert self.po.tx_held_bytes == 0
        if outcome != "commit":
            left = [f.name for f in (self.dir / "paging").iterdir() if "-t" in f.name]
            assert not left, f"a transaction's files outlived it: {left}"

    @rule()
    def subscribe_or_unsubscribe(self) -> None:
        if EXTRA in self.model:
            self.po.delete_queue(EXTRA, force=True)
            del self.model[EXTRA]
            self.consumed_seq.pop(EXTRA, None)
        else:
            self.po.create_queue(EXTRA, "news", RoutingType.MULTICAST)
            self.model[EXTRA] = []
        self._quiet()

    @rule(queue=st.sampled_from([*sorted(QUEUES), EXTRA]), n=st.integers(1, 40))
    def consume(self, queue: str, n: int) -> None:
        if queue not in self.model or queue == READER:
            return
        q = self.po.queue(queue)
        for _ in range(n):
            pager = q.addr.pager if q.addr is not None else None
            for _try in range(100):  # pages are read in a worker thread: until one comes back
                if q.ready_count or pager is None or not pager.active:
                    break
                pager.refill(q)
                if q.ready_count or not pager.reading:
                    break
                self._run(asyncio.sleep(0.005))
            ref = q._pop()
            if ref is None:
                break
            assert ref.message.id == self.model[queue].pop(0)
            assert ref.seq > self.consumed_seq.get(queue, 0), "delivered out of sequence order"
            self.consumed_seq[queue] = ref.seq
            q.delivering_count += 1
            q.acknowledge([ref])
        self._quiet()

    def _take(self, q: Queue, n: int) -> list[Any]:
        """Up to `n` refs of `q` into delivery, as a consumer takes them (pages read back as needed)."""
        taken = []
        for _ in range(n):
            pager = q.addr.pager if q.addr is not None else None
            for _try in range(100):  # pages are read in a worker thread: until one comes back
                if q.ready_count or pager is None or not pager.active:
                    break
                pager.refill(q)
                if q.ready_count or not pager.reading:
                    break
                self._run(asyncio.sleep(0.005))
            ref = q._pop()
            if ref is None:
                break
            q.delivering_count += 1
            taken.append(ref)
        return taken

    @rule(
        queue=st.sampled_from([*sorted(QUEUES), EXTRA]),
        n=st.integers(1, 12),
        acked=st.lists(st.booleans(), min_size=12, max_size=12),
        how=st.sampled_from(["one by one, last first", "in a transaction"]),
        then=st.sampled_from(["cancel", "restart", "purge, then restart"]),
    )
    def consume_out_of_order(self, queue: str, n: int, acked: list[bool], how: str, then: str) -> None:
        """Take messages into delivery (read back from pages or not), acknowledge some of them out
        of order (one at a time from the last, or in one transaction), then give the rest back
        (a cancel: their delivery count grows) or restart the store with them still in delivery
        (after a purge of the queue, maybe): the acknowledged ones never come back, nor the
        purged ones, the rest do, first, in order, with their counts."""
        if queue not in self.model or queue == READER:
            return
        q = self.po.queue(queue)
        taken = self._take(q, n)
        counts = self.counts.setdefault(queue, {})
        assert [r.message.id for r in taken] == self.model[queue][: len(taken)]
        del self.model[queue][: len(taken)]
        done = [r for r, a in zip(taken, acked, strict=False) if a or counts.get(r.message.id, 0) >= 3]
        rest = [r for r in taken if r not in done]
        if done and how == "in a transaction":
            self.po.commit_transaction([], [(q, done)], None)
        else:
            for r in reversed(done):
                q.acknowledge([r])
        for r in done:
            counts.pop(r.message.id, None)
        back = [r.message.id for r in sorted(rest, key=lambda r: r.seq)]
        if then == "cancel":
            q.cancel(rest, redeliver_delay=False)
            for r in rest:
                counts[r.message.id] = counts.get(r.message.id, 0) + 1
            self._quiet()
        else:
            if then == "purge, then restart":  # (the purge takes what is queued and paged, not these)
                assert q.purge() == len(self.model[queue])
                self.model[queue] = []
                self._quiet()
            self._restart()
        self.model[queue][:0] = back

    def _read_range(self, start: int, end: int, limit: int) -> tuple[list[tuple[int, int]], int]:
        """READ_RANGE as the broker answers it: ([(seq, message id)], first sequence)."""
        q = self.po.queue(READER)
        done: asyncio.Future[tuple[list[tuple[int, int]], int]] = self.loop.create_future()
        q.read_range_soon(
            start, end, limit, lambda refs, first: done.set_result(([(r.seq, r.message.id) for r in refs], first))
        )
        return self._run(asyncio.shield(done))  # type: ignore[no-any-return]

    def _seqs(self) -> list[int]:
        """The reader queue's whole range, read as the model holds it: its sequences."""
        q = self.po.queue(READER)
        got, first = self._read_range(0, q.last_seq, -1)
        assert [mid for _seq, mid in got] == self.model[READER]
        seqs = [seq for seq, _mid in got]
        assert seqs == sorted(set(seqs))
        assert first == (seqs[0] if seqs else q.last_seq + 1)
        return seqs

    @rule(at=st.integers(0, 200), limit=st.integers(-1, 40))
    def range_read(self, at: int, limit: int) -> None:
        seqs = self._seqs()
        k = min(at, len(seqs))
        start = seqs[k - 1] if k else 0
        got, _first = self._read_range(start, self.po.queue(READER).last_seq, limit)
        expected = self.model[READER][k:] if limit < 0 else self.model[READER][k : k + limit]
        assert [mid for _seq, mid in got] == expected

    @rule(at=st.integers(0, 200))
    def ack_upto(self, at: int) -> None:
        seqs = self._seqs()
        k = min(at, len(seqs))
        if not k:
            return
        q = self.po.queue(READER)
        done: asyncio.Future[int] = self.loop.create_future()
        q.ack_upto_soon(seqs[k - 1], done.set_result)
        assert self._run(asyncio.shield(done)) == k
        del self.model[READER][:k]
        self._quiet()

    @rule(queue=st.sampled_from([*sorted(QUEUES), EXTRA]))
    def browse(self, queue: str) -> None:
        if queue not in self.model:
            return
        q = self.po.queue(queue)
        sink = _Collect()
        browser = Consumer(1, q, sink, -1, browse_only=True)
        q.add_consumer(browser)
        expected = self.model[queue]
        for _ in range(400):  # pages are read in a worker thread: until every message came
            self._run(asyncio.sleep(0.002))
            if len(sink.ids) >= len(expected) and not (q.addr and q.addr.pager and q.addr.pager.reading):
                break
        q.remove_consumer(browser)
        assert sink.ids == expected, queue

    @rule(queue=st.sampled_from([*sorted(QUEUES), EXTRA]))
    def purge(self, queue: str) -> None:
        if queue not in self.model:
            return
        removed = self.po.queue(queue).purge()
        assert removed == len(self.model[queue])
        self.model[queue] = []
        self._quiet()

    @rule()
    def restart(self) -> None:
        self._restart()  # page transactions with pages left: their records are journaled

    def _restart(self, committed: set[int] | None = None) -> None:
        """`committed`: the page transactions the journal must hold after the restart; by
        default those with pages left once the stop has run what waited for the disk (a page
        collected just before deletes its transaction's record then)."""
        assert self.storage is not None
        self._run(self.storage.stop())
        if committed is None:
            committed = set(self.po.page_txs)
        self.po = self._open()
        assert self.loaded_txs == committed  # none lost, none left behind once its pages are gone

    # ------------------------------------------------------------ invariants
    @invariant()
    def queues_hold_the_model(self) -> None:
        for name, expected in self.model.items():
            q = self.po.queue(name)
            assert contents(q) == expected, name
            assert q.message_count == len(expected), name
            counts = self.counts.get(name, {})
            got = {r.message.id: r.delivery_count for r in q.iter_refs()}
            assert got == {mid: counts.get(mid, 0) for mid in got}, f"{name}: delivery counts"

    @invariant()
    def sequences_follow_delivery_order(self) -> None:
        """What a queue holds is in sequence order (a reload sorts by it; range reads bisect it):
        a transaction paged while open takes its sequences at its commit."""
        for name in self.model:
            q = self.po.queue(name)
            seqs = [r.seq for r in q.iter_refs()]
            assert seqs == sorted(set(seqs)), name
            assert not seqs or seqs[-1] <= q.last_seq, name

    @invariant()
    def memory_stays_bounded(self) -> None:
        for addr in self.po.addresses.values():  # the limit, overshot by a message or two at most
            # (a message counts once per queue it is in: the overshoot grows with the queues past 3),
            # plus what a cancel gave back (a queue reads its share while messages are in delivery)
            back = sum(len(r.message.raw) for q in addr.queues.values() for r in q.iter_refs() if r.delivery_count)
            assert addr.size_bytes <= 600 + 2 * 200 * max(3, len(addr.queues)) // 3 + back, addr.name


TestPagedStore = PagedStore.TestCase
TestPagedStore.settings = settings(
    max_examples=30, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)
