"""Decision 0063: a message read back from a page stays a page record, acknowledged by position.

A data directory written by the journaling read-back of decision 0044 (MESSAGE records with the
original message id, and the PAGE_CURSOR past them) still loads, and its messages are acknowledged
the old way while those read back since are acknowledged by position; the journal keeps no record
of either once the queue is drained.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_paging_model import SETTINGS

from tandem.core.address import MemoryLimits
from tandem.core.ids import IdGenerator
from tandem.core.message import Message, MessageData, RoutingType
from tandem.core.postoffice import PostOffice
from tandem.core.queue import Queue
from tandem.journal import JournalSettings
from tandem.server.broker import restore_state
from tandem.store.journal_storage import JournalStorage
from tandem.store.records import RecordType

JOURNAL = JournalSettings(file_size=64 * 1024, min_files=2, pool_files=1, buffer_timeout_ns=0, datasync=False)


class Broker:
    """A post office over a journal storage in `dir`, run on a loop of its own."""

    def __init__(self, data: Path) -> None:
        self.dir = data
        self.loop = asyncio.new_event_loop()
        self.storage = JournalStorage(data, JOURNAL)
        state = self.storage.load()
        self.run(self._start())
        ids = IdGenerator(state.max_id + 1, state.id_reserved, self.storage.reserve_ids)
        self.po = PostOffice(
            self.storage, ids, self.loop.call_soon, SETTINGS, limits=MemoryLimits(), pages=self.storage.pages
        )
        restore_state(self.po, self.storage, state)
        self.settle()

    async def _start(self) -> None:
        self.storage.start()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 20))

    def settle(self) -> None:
        async def go() -> None:
            for _ in range(3):
                done: asyncio.Future[None] = self.loop.create_future()
                self.storage.after_durable(lambda fut=done: fut.done() or fut.set_result(None))  # type: ignore[misc]
                await done
                await asyncio.sleep(0)

        self.run(go())

    def close(self) -> None:
        try:
            self.run(self.storage.stop())
        finally:
            self.loop.close()

    def take(self, q: Queue, n: int) -> list[Any]:
        """Up to `n` refs of `q` into delivery, reading pages back as a consumer would."""
        out = []
        for _ in range(n):
            pager = q.addr.pager if q.addr is not None else None
            for _try in range(200):
                if q.ready_count or pager is None or not pager.active:
                    break
                pager.refill(q)
                if q.ready_count or not pager.reading:
                    break
                self.run(asyncio.sleep(0.005))
            ref = q._pop()
            if ref is None:
                break
            q.delivering_count += 1
            out.append(ref)
        return out

    def page_records(self) -> int:
        """PAGE_ACK and PAGE_DELIVERY_COUNT records live in the journal now."""
        st = self.storage
        return sum(len(v) for v in st._page_acks.values()) + sum(len(v) for v in st._page_dcs.values())


def live_types(data: Path) -> list[int]:
    """The user types of the message journal's live records, as a cold load finds them."""
    j = JournalStorage(data, JOURNAL)
    return [lr.user_type for lr in j.messages.load().values()]


@pytest.fixture
def data() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tandem-page-acks-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _send(b: Broker, n: int) -> list[int]:
    ids = []
    for _ in range(n):
        m = Message.create(b.po.ids.next(), MessageData("work", body=b"x" * 100))
        assert b.po.send(m)[0]
        ids.append(m.id)
    b.settle()
    return ids


def _old_read_back(b: Broker, q: Queue, k: int) -> list[int]:
    """What decision 0044's read-back journaled for the first `k` paged messages of `q`: each a
    MESSAGE record of a fresh id naming the message's own, and the cursor past them, in one batch
    (then the broker stopped before it delivered them)."""
    pager = q.addr.pager  # type: ignore[union-attr]
    assert pager is not None
    page = pager.pages[0]
    records, _end = pager.store.read(q.addr.id, page, 0)  # type: ignore[union-attr]
    out = []
    depaged = []
    for r in records[:k]:
        m = Message.decode(r.mid, msgspec.Raw(r.raw))
        m.rid = b.po.ids.next()
        depaged.append((m, r.refs[0][1]))
        out.append(r.mid)
    b.storage.store_depaged(q, depaged, (page, k), b.po.ids.next())
    b.settle()
    return out


def test_a_store_written_by_the_journaling_read_back_still_loads(data: Path) -> None:
    b = Broker(data)
    b.po.create_queue("work", "work", RoutingType.ANYCAST)
    b.settle()  # its record stored: sends to it are not held for it
    sent = _send(b, 40)
    q = b.po.queue("work")
    in_memory = [r.message.id for r in q.iter_refs()]
    assert 0 < len(in_memory) < 20
    for ref in b.take(q, len(in_memory)):  # memory emptied; the rest is in pages
        q.acknowledge([ref])
    b.settle()
    old = _old_read_back(b, q, 5)
    assert old == sent[len(in_memory) : len(in_memory) + 5]
    b.close()

    b = Broker(data)  # the journaled copies load into memory, the rest from the pages after them
    q = b.po.queue("work")
    rest = sent[len(in_memory) :]
    taken = b.take(q, len(rest))
    assert [r.message.id for r in taken] == rest
    assert [r.pos is None for r in taken[:5]] == [True] * 5  # journaled: acknowledged the old way
    assert all(r.pos is not None for r in taken[5:])
    for ref in reversed(taken[3:]):  # out of order, across both kinds
        q.acknowledge([ref])
    b.settle()
    b.close()

    b = Broker(data)
    q = b.po.queue("work")
    taken = b.take(q, 40)
    assert [r.message.id for r in taken] == rest[:3]
    for ref in taken:
        q.acknowledge([ref])
    b.settle()
    b.close()

    b = Broker(data)
    q = b.po.queue("work")
    assert b.take(q, 40) == []
    b.close()
    types = live_types(data)
    assert RecordType.MESSAGE not in types and RecordType.PAGE_ACK not in types, types


def test_acknowledgements_ahead_of_the_cursor_are_kept_until_it_passes_them(data: Path) -> None:
    b = Broker(data)
    b.po.create_queue("work", "work", RoutingType.ANYCAST)
    b.settle()  # its record stored: sends to it are not held for it
    sent = _send(b, 60)
    q = b.po.queue("work")
    taken = b.take(q, 30)
    depaged = [r for r in taken if r.pos is not None]
    assert len(depaged) >= 10
    for ref in taken:
        if ref is not depaged[0]:
            q.acknowledge([ref])
    b.settle()
    assert b.page_records() == len(depaged) - 1  # (the cursor is held at the first)
    q.cancel([depaged[0]], redeliver_delay=False)
    b.settle()
    assert b.page_records() == len(depaged)  # and its delivery count
    b.close()

    b = Broker(data)
    q = b.po.queue("work")
    again = b.take(q, 60)
    assert [r.message.id for r in again] == [depaged[0].message.id, *sent[30:]]
    assert again[0].delivery_count == 1
    for ref in again:
        q.acknowledge([ref])
    b.settle()
    assert b.page_records() == 0
    b.close()
    types = live_types(data)
    assert not {RecordType.MESSAGE, RecordType.PAGE_ACK, RecordType.PAGE_DELIVERY_COUNT} & set(types), types


def test_a_purge_while_messages_read_back_are_in_delivery_survives_a_restart(data: Path) -> None:
    """The cursor is held at a message in delivery: the purged span is journaled, not read again."""
    b = Broker(data)
    b.po.create_queue("work", "work", RoutingType.ANYCAST)
    b.settle()  # its record stored: sends to it are not held for it
    sent = _send(b, 60)
    q = b.po.queue("work")
    taken = b.take(q, 20)
    held = [r for r in taken if r.pos is not None][:2]
    assert len(held) == 2
    for ref in taken:
        if ref not in held:
            q.acknowledge([ref])
    assert q.purge() == 40
    b.settle()
    b.close()

    b = Broker(data)
    q = b.po.queue("work")
    again = b.take(q, 60)
    assert [r.message.id for r in again] == [r.message.id for r in held]
    for ref in again:
        q.acknowledge([ref])
    b.settle()
    b.close()
    assert sent
    types = live_types(data)
    assert not {RecordType.MESSAGE, RecordType.PAGE_ACK, RecordType.PAGE_DELIVERY_COUNT} & set(types), types


def test_ack_up_to_past_messages_in_delivery_survives_a_restart(data: Path) -> None:
    """ACK_UP_TO on a queue whose oldest message read back is in delivery: the paged messages it
    acknowledges are journaled as a span and not delivered again after a restart."""
    b = Broker(data)
    b.po.create_queue("work", "work", RoutingType.ANYCAST)
    b.settle()  # its record stored: sends to it are not held for it
    sent = _send(b, 60)
    q = b.po.queue("work")
    taken = b.take(q, 20)
    held = [r for r in taken if r.pos is not None][:1]
    assert held
    for ref in taken:
        if ref not in held:
            q.acknowledge([ref])
    b.settle()
    upto = sent[49]
    seq = None
    pager = q.addr.pager  # type: ignore[union-attr]
    for p in pager.pages:
        for r in pager.store.read(q.addr.id, p, 0)[0]:  # type: ignore[union-attr]
            if r.mid == upto:
                seq = r.refs[0][1]
    assert seq is not None
    done: asyncio.Future[int] = b.loop.create_future()
    q.ack_upto_soon(seq, done.set_result)
    acked = b.run(asyncio.shield(done))
    assert acked > 0
    b.settle()
    b.close()

    b = Broker(data)
    q = b.po.queue("work")
    again = [r.message.id for r in b.take(q, 60)]
    assert again == [held[0].message.id, *sent[50:]], "an acknowledged message came back, or one is missing"
    b.close()


def test_one_acknowledgement_batch_ahead_of_the_cursor_is_one_record_until_the_cursor_passes_its_last(
    data: Path,
) -> None:
    """Decision 0073: the positions one acknowledgement takes share one PAGE_ACK record; a restart
    skips each of them; the record goes only when the cursor is past the last one."""
    b = Broker(data)
    b.po.create_queue("work", "work", RoutingType.ANYCAST)
    b.settle()  # its record stored: sends to it are not held for it
    sent = _send(b, 60)
    q = b.po.queue("work")
    taken = b.take(q, 40)
    depaged = [r for r in taken if r.pos is not None]
    assert len(depaged) >= 12
    held, early, later = depaged[0], depaged[1:6], depaged[6:]
    q.acknowledge([r for r in taken if r.pos is None])
    q.acknowledge(later)  # one batch, ahead of the cursor (held at `held`)
    q.acknowledge(early)  # another
    b.settle()
    assert b.page_records() == 2
    b.close()

    b = Broker(data)  # the positions of both records are skipped; the held one comes back
    q = b.po.queue("work")
    again = b.take(q, 60)
    assert [r.message.id for r in again] == [held.message.id, *sent[40:]]
    assert b.page_records() == 2
    q.acknowledge(again[:1])  # the cursor passes both records' last positions
    b.settle()
    assert b.page_records() == 0
    q.acknowledge(again[1:])
    b.settle()
    b.close()
    types = live_types(data)
    assert RecordType.PAGE_ACK not in types, types
