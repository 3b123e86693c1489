"""Moves, copies, retries and pauses leave queues that equal a cold load of their store.

A stateful property test: hypothesis sends messages (each with a serial number `n` and a colour)
to two paging addresses with tiny memory limits and page files, dead-letters some, moves or copies
them between the queues by selector and limit (core/queueops.py, through memory and pages),
retries the dead letters, pauses and resumes queues, consumes, and restarts the store from its
files. After every step each queue's contents (memory, then pages, in delivery order) must equal
the model's; a move must have moved the first matching messages in order, as many as asked
(paged ones acknowledged one by one where they are); after a restart the contents and the
paused flags must still equal the model's.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import store_loop
from tandem.core import queueops
from tandem.core.address import MemoryLimits
from tandem.core.consumer import Consumer
from tandem.core.ids import IdGenerator
from tandem.core.message import Message, MessageData, MessageRef, RoutingType
from tandem.core.postoffice import PostOffice
from tandem.core.queue import Queue
from tandem.core.selector import compile_selector
from tandem.core.settings import SettingsRepository
from tandem.journal import JournalSettings
from tandem.server.broker import restore_state
from tandem.store.journal_storage import JournalStorage

JOURNAL = JournalSettings(file_size=64 * 1024, min_files=2, pool_files=1, buffer_timeout_ns=0, datasync=False)
PATTERNS = {"#": {"max-size-bytes": 700, "address-full-policy": "PAGE", "page-size-bytes": 1024}}
SETTINGS = SettingsRepository({k: {n.replace("-", "_"): v for n, v in d.items()} for k, d in PATTERNS.items()})
QUEUES = ("src", "dst", "dlq")
COLOURS = ("red", "blue")


def serial(m: Message) -> int:
    return int((m.properties or {})["n"])


def colour(m: Message) -> str:
    return str((m.properties or {})["colour"])


def contents(q: Queue) -> list[int]:
    """Serial numbers in delivery order: memory, then what the queue's cursor has ahead of it."""
    out = [serial(r.message) for r in q.iter_refs()]
    pager = q.addr.pager if q.addr is not None else None
    if pager is None or not pager.paged.get(q.id):
        return out
    page, idx = pager.cursors[q.id]
    for p in pager.pages:
        if p < page:
            continue
        records, _end = pager.store.read(q.addr.id, p, 0)  # type: ignore[union-attr]
        for i, r in enumerate(records):
            if (p == page and i < idx) or r.tx in pager.tx_dead or r.tx in pager.tx_open:
                continue
            if (p, i) in pager.acked_ahead.get(q.id, ()):
                continue  # moved away on its own
            if any(qid == q.id for qid, _seq in r.refs):
                out.append(serial(Message.decode(r.mid, msgspec.Raw(r.raw))))
    return out


class _Sink:
    writable = True

    def __init__(self) -> None:
        self.got: list[MessageRef] = []

    def deliver(self, consumer: Consumer, ref: MessageRef) -> None:
        self.got.append(ref)

    def consumer_closed(self, consumer: Consumer, error: Any) -> None:
        pass


class QueueOps(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="tandem-queueops-"))
        self.loop = asyncio.new_event_loop()
        self.model: dict[str, list[int]] = {name: [] for name in QUEUES}
        self.colours: dict[int, str] = {}
        self.origin: list[str] = []  # the queue each dead letter came from (as model["dlq"])
        self.paused: dict[str, bool] = {name: False for name in QUEUES}
        self.next_n = 0
        self.storage: JournalStorage | None = None
        self.po = self._open(first=True)

    def _open(self, first: bool = False) -> PostOffice:
        storage = self.storage = JournalStorage(self.dir, JOURNAL)
        state = storage.load()

        async def start() -> None:
            storage.start()

        self._run(start())
        ids = IdGenerator(state.max_id + 1, state.id_reserved, storage.reserve_ids)
        po = PostOffice(
            storage,
            ids,
            self.loop.call_soon,
            SETTINGS,
            compile_filter=compile_selector,
            limits=MemoryLimits(),
            pages=storage.pages,
        )
        restore_state(po, storage, state)
        if first:
            for name in QUEUES:
                po.create_queue(name, name, RoutingType.ANYCAST)
        self.po = po
        self._quiet()
        return po

    def _run(self, coro: Any) -> Any:
        return store_loop.run(self.loop, coro, 30)

    def _quiet(self) -> None:
        """Let every write finish (pages, then the journals) and the loop run its callbacks."""
        assert self.storage is not None
        store_loop.settle(self.loop, self.storage, 30)

    def teardown(self) -> None:
        store_loop.close(self.loop, self.storage, Path(self.dir), 30)

    def _memory_head(self, q: Queue) -> MessageRef | None:
        """The queue's next message in memory, read back from its pages if need be."""
        pager = q.addr.pager if q.addr is not None else None
        for _try in range(200):
            if q.ready_count or pager is None or not pager.active:
                break
            pager.refill(q)
            if q.ready_count or not pager.reading:
                break
            self._run(asyncio.sleep(0.005))
        return q._pop()

    # ---------------------------------------------------------------- rules
    @rule(
        address=st.sampled_from(["src", "dst"]),
        n=st.integers(1, 80),
        size=st.integers(1, 100),
        colours=st.lists(st.sampled_from(COLOURS), min_size=1, max_size=3),
    )
    def send(self, address: str, n: int, size: int, colours: list[str]) -> None:
        for i in range(n):
            c = colours[i % len(colours)]
            props = {"n": self.next_n, "colour": c}
            m = Message.create(self.po.ids.next(), MessageData(address, properties=props, body=b"b" * size))
            routed, _durable = self.po.send(m)
            assert routed
            self.model[address].append(self.next_n)
            self.colours[self.next_n] = c
            self.next_n += 1
        self._quiet()

    @rule(queue=st.sampled_from(["src", "dst"]), n=st.integers(1, 10))
    def dead_letter(self, queue: str, n: int) -> None:
        """As max-delivery-attempts does: a copy to the dead-letter address, the original acknowledged."""
        q = self.po.queue(queue)
        for _ in range(n):
            ref = self._memory_head(q)
            if ref is None:
                break
            assert serial(ref.message) == self.model[queue].pop(0)
            self.po.move(ref, "dlq", "test", {})
            self.model["dlq"].append(serial(ref.message))
            self.origin.append(queue)
        self._quiet()

    def _transfer(self, t: queueops.Transfer) -> dict[str, Any]:
        done: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        t.start(done.set_result)
        result = self._run(done)
        self._quiet()
        return result  # type: ignore[no-any-return]

    @rule(
        frm=st.sampled_from(["src", "dst"]),
        selector=st.sampled_from([None, *COLOURS]),
        limit=st.one_of(st.none(), st.integers(0, 40)),
        copy=st.booleans(),
    )
    def move(self, frm: str, selector: str | None, limit: int | None, copy: bool) -> None:
        to = "dst" if frm == "src" else "src"
        q = self.po.queue(frm)
        accept = compile_selector(f"colour = '{selector}'").matches if selector else None
        t = queueops.Transfer(
            self.po, q, queueops.move_plan(self.po, q, to), accept, -1 if limit is None else limit, keep=copy
        )
        result = self._transfer(t)
        matching = [n for n in self.model[frm] if selector is None or self.colours[n] == selector]
        want = len(matching) if limit is None else min(limit, len(matching))
        assert result == {"moved": want, "left": 0}, result
        moved = matching[: result["moved"]]
        if not copy:
            self.model[frm] = self._without_first(self.model[frm], selector, len(moved))
        self.model[to].extend(moved)

    def _without_first(self, serials: list[int], selector: str | None, k: int) -> list[int]:
        """`serials` without its first `k` messages of colour `selector` (None: any); copies
        share a serial number, so by position."""
        out = []
        for n in serials:
            if k and (selector is None or self.colours[n] == selector):
                k -= 1
                continue
            out.append(n)
        return out

    @rule(selector=st.sampled_from([None, *COLOURS]))
    def retry(self, selector: str | None) -> None:
        q = self.po.queue("dlq")
        accept = compile_selector(f"colour = '{selector}'").matches if selector else None
        result = self._transfer(queueops.Transfer(self.po, q, queueops.retry_plan(self.po, q), accept))
        keep: list[tuple[int, str]] = []
        moved = 0
        for n, origin in zip(self.model["dlq"], self.origin, strict=True):
            if selector is None or self.colours[n] == selector:
                self.model[origin].append(n)  # back to the queue it was dead-lettered from
                moved += 1
            else:
                keep.append((n, origin))
        assert result == {"moved": moved, "left": 0}, result
        self.model["dlq"] = [n for n, _o in keep]
        self.origin = [o for _n, o in keep]

    @rule(queue=st.sampled_from(QUEUES), paused=st.booleans())
    def pause(self, queue: str, paused: bool) -> None:
        changed = self.po.queue(queue).set_paused(paused)
        assert changed == (paused != self.paused[queue])
        self.paused[queue] = paused
        self._quiet()

    @rule(queue=st.sampled_from(QUEUES), n=st.integers(1, 10))
    def consume(self, queue: str, n: int) -> None:
        """A consumer takes what it is given: nothing from a paused queue."""
        q = self.po.queue(queue)
        sink = _Sink()
        c = Consumer(1, q, sink, -1)
        q.add_consumer(c)
        for _ in range(50):
            self._run(asyncio.sleep(0.002))
            if q.paused or len(sink.got) >= min(n, len(self.model[queue])):
                break
        if q.paused:
            assert not sink.got, "a paused queue delivered"
        keep = sink.got[:n]
        for r in keep:
            c.delivering.pop(r.message.id)
        q.acknowledge(keep)
        q.remove_consumer(c, unseen={r.message.id for r in sink.got[n:]})
        for r in keep:
            assert serial(r.message) == self.model[queue].pop(0)
            if queue == "dlq":
                self.origin.pop(0)
        self._quiet()

    @rule()
    def recreate_dst(self) -> None:
        """Deleted (its paged records and their single acknowledgements go with it) and made again."""
        self.po.delete_queue("dst", force=True)
        self.po.create_queue("dst", "dst", RoutingType.ANYCAST)
        self.model["dst"] = []
        self.paused["dst"] = False
        self._quiet()

    @rule()
    def restart(self) -> None:
        assert self.storage is not None
        self._run(self.storage.stop())
        self.po = self._open()

    # ------------------------------------------------------------ invariants
    @invariant()
    def queues_hold_the_model(self) -> None:
        for name, expected in self.model.items():
            q = self.po.queue(name)
            assert contents(q) == expected, name
            assert q.message_count == len(expected), name
            assert q.delivering_count == 0, name
            assert q.paused == self.paused[name], name


TestQueueOps = QueueOps.TestCase
TestQueueOps.settings = settings(
    max_examples=30, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)


def test_a_move_through_pages_while_a_consumer_reads_them_moves_each_message_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The move walks the pages in small passes while the queue's consumer reads them back into
    memory between passes: every message ends up consumed, moved or still in the queue, once."""
    monkeypatch.setattr(queueops, "LOOK_PER_PASS", 7)
    m = QueueOps()
    try:
        for _ in range(6):
            m.send("src", 80, 40, ["red", "blue", "red"])
        total = m.next_n
        q = m.po.queue("src")
        assert q.paged_count > total // 2
        sink = _Sink()
        c = Consumer(1, q, sink, 3000)  # a byte window: it reads a little at a time
        q.add_consumer(c)
        accept = compile_selector("colour = 'red'").matches
        done: asyncio.Future[dict[str, Any]] = m.loop.create_future()
        t = queueops.Transfer(m.po, q, queueops.move_plan(m.po, q, "dst"), accept)
        t.start(done.set_result)
        acked = 0

        async def consume_while_moving() -> None:
            nonlocal acked
            for _ in range(2000):
                if done.done():
                    break
                new = sink.got[acked:]
                for r in new:
                    c.delivering.pop(r.message.id)
                if new:
                    q.acknowledge(list(new))
                    acked += len(new)
                c.add_credits(3000)
                await asyncio.sleep(0.001)
            await done

        m._run(consume_while_moving())
        held = {serial(r.message) for r in sink.got[acked:]}  # in delivery at the end: they stay
        q.remove_consumer(c, unseen={r.message.id for r in sink.got[acked:]})
        consumed = [serial(r.message) for r in sink.got[:acked]]
        m._quiet()
        m.restart()
        src, dst = contents(m.po.queue("src")), contents(m.po.queue("dst"))
        assert sorted(consumed + src + dst) == list(range(total))  # each exactly once
        assert all(m.colours[n] == "red" for n in dst) and dst == sorted(dst)
        assert all(m.colours[n] == "blue" or n in held for n in src)  # every red one left but those
        assert done.result()["moved"] == len(dst) > 0 and consumed
    finally:
        m.teardown()


def test_a_cursor_never_passes_a_paged_record_whose_move_is_not_journaled_yet() -> None:
    """A move's PAGE_ACK travels in its copy's transaction, which waits for the target's page
    writes when the target pages. Meanwhile the source's consumer reads on past the moved record:
    a cursor journaled past it before the move's batch, and a crash then, would leave the message
    in neither queue (the target's page transaction never committed). Here the move's transaction
    is held back, the source read past the record and its cursor written; a crash (the journals
    stopped with the move's batch never handed over) must find the message still in the source."""
    m = QueueOps()
    try:
        m.send("src", 40, 50, ["red"])
        q = m.po.queue("src")
        pager = q.addr.pager if q.addr is not None else None
        assert pager is not None and pager.paged.get(q.id)
        pos = list(pager.cursors[q.id])
        found = None
        for _try in range(200):
            found = pager.next_record(q, pos)
            if found is not True:
                break
            m._run(asyncio.sleep(0.005))
        assert isinstance(found, tuple)
        moved = serial(Message.decode(found[0].mid, msgspec.Raw(found[0].raw)))
        held: list[object] = []  # the move's transaction, never handed to the journal
        pager.acknowledge_record(q, pos[0], pos[1], held)
        consumed: list[int] = []
        for _ in range(len(m.model["src"])):  # a consumer reads and acknowledges past it
            ref = m._memory_head(q)
            if ref is None:
                break
            q.delivering_count += 1
            q.acknowledge([ref])
            consumed.append(serial(ref.message))
            if (pager.cursors[q.id][0], pager.cursors[q.id][1]) > (pos[0], pos[1]) and len(consumed) > 10:
                break
        assert moved not in consumed and (pager.cursors[q.id][0], pager.cursors[q.id][1]) > (pos[0], pos[1])
        m._quiet()
        m.restart()  # the move's batch was never written: as a crash before the target's pages were durable
        src = contents(m.po.queue("src"))
        assert moved in src, f"message {moved} lost: moved away by a transaction that never reached the journal"
        assert sorted(consumed + src) == sorted(m.model["src"])
    finally:
        m.teardown()


def test_moving_every_paged_message_away_ends_paging_and_deletes_the_pages() -> None:
    """The source's cursor never moved (nothing was read back): once the move's acknowledgements
    are journaled the address has nothing paged left, stops paging and its pages go."""
    m = QueueOps()
    try:
        m.send("src", 40, 50, ["red", "blue"])
        q = m.po.queue("src")
        pager = q.addr.pager if q.addr is not None else None
        assert pager is not None and pager.active and pager.pages and q.paged_count
        t = queueops.Transfer(m.po, q, queueops.move_plan(m.po, q, "dst"), None)
        assert m._transfer(t)["moved"] == 40
        assert not pager.active and not pager.pages and not pager.pending_ahead
        assert pager.store.paged_bytes(q.addr.id) == 0  # type: ignore[union-attr]
        m.restart()
        assert contents(m.po.queue("src")) == [] and contents(m.po.queue("dst")) == list(range(40))
    finally:
        m.teardown()


def test_a_deleted_queues_page_records_go_once_its_deletion_is_durable() -> None:
    """Its cursor and PAGE_ACK records deleted before the queue's deletion is in the bindings
    journal, a crash between the two would bring the queue back reading its pages from the start:
    its acknowledged and moved messages with it."""
    m = QueueOps()
    try:
        m.send("dst", 40, 50, ["red", "blue"])
        m.consume("dst", 10)
        m.consume("dst", 10)  # read back from the pages: a cursor record
        q = m.po.queue("dst")
        red = compile_selector("colour = 'red'").matches
        t = queueops.Transfer(m.po, q, queueops.move_plan(m.po, q, "src"), red, 4)
        assert m._transfer(t)["moved"] == 4
        storage = m.storage
        assert storage is not None
        m.po.delete_queue("dst", force=True)  # (its purge journals the cursor at the head first)
        held = [storage._cursor_rids[q.id], *storage._page_acks.get(q.id, {})]
        assert all(storage.messages.contains(rid) for rid in held)  # the deletion is not durable yet
        m._quiet()
        assert not any(storage.messages.contains(rid) for rid in held)
        m.model["dst"] = []
        m.po.create_queue("dst", "dst", RoutingType.ANYCAST)
        m.restart()
        assert contents(m.po.queue("dst")) == []
    finally:
        m.teardown()
