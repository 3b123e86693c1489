"""What the journal's stateful property tests share: a model of the live set, the write rules
that drive a real journal, and the wait for a quiet journal.

tests/unit/test_follower_model.py (a follower tails the journal) and
tests/unit/test_replication_model.py (a backup applies its replication stream) subclass
`JournalWrites` and add their own rules and checks.
"""

from __future__ import annotations

import asyncio
import threading

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from tandem.journal import ADD, DELETE, UPDATE, Journal, LiveRecord, Op

Model = dict[int, tuple[int, bytes, tuple[tuple[int, bytes], ...]]]

bodies = st.binary(min_size=0, max_size=700)


def state_of(live: dict[int, LiveRecord]) -> Model:
    return {rid: (lr.user_type, lr.body, tuple(lr.updates or ())) for rid, lr in live.items()}


async def quiet(j: Journal) -> None:
    """Everything appended is on disk, a running compaction has swapped, dead files are retired.

    The writer retires dead files after it reports a batch: without the last wait a cold load
    and a reader's listing may see the directory before and after it."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    j.after_durable(lambda: fut.done() or fut.set_result(None))
    await fut
    while j._compacting:
        await asyncio.sleep(0.002)
    await asyncio.sleep(0)
    writer = j._writer
    if writer is not None:
        retired = threading.Event()
        writer.submit(retired.set)
        await asyncio.to_thread(retired.wait, 10)


class JournalWrites(RuleBasedStateMachine):
    """Random adds (coalesced or not), updates, deletes and atomic batches on `self.j`, mirrored
    in `self.model` (what a load must give once everything queued is on disk)."""

    j: Journal

    def __init__(self) -> None:
        super().__init__()
        self.model: Model = {}
        self.next_id = 1

    def _live_ids(self) -> list[int]:
        return sorted(self.model)

    @rule(body=bodies, utype=st.integers(1, 3), soon=st.booleans())
    def add(self, body: bytes, utype: int, soon: bool) -> None:
        rid = self.next_id
        self.next_id += 1
        (self.j.add_soon if soon else self.j.add)(rid, utype, body)
        self.model[rid] = (utype, body, ())

    @precondition(lambda self: self.model)
    @rule(data=st.data(), body=st.binary(max_size=60))
    def update(self, data: st.DataObject, body: bytes) -> None:
        rid = data.draw(st.sampled_from(self._live_ids()))
        self.j.update(rid, 7, body)
        utype, b, ups = self.model[rid]
        self.model[rid] = (utype, b, (*ups, (7, body)))

    @precondition(lambda self: self.model)
    @rule(data=st.data(), many=st.booleans())
    def delete(self, data: st.DataObject, many: bool) -> None:
        ids = data.draw(st.lists(st.sampled_from(self._live_ids()), min_size=1, max_size=8, unique=True))
        if many:
            self.j.delete_many(ids)
        else:
            for rid in ids:
                self.j.delete(rid)
        for rid in ids:
            del self.model[rid]

    @rule(data=st.data(), n_add=st.integers(0, 4))
    def transaction(self, data: st.DataObject, n_add: int) -> None:
        ops: list[Op] = []
        live = self._live_ids()
        gone = set(data.draw(st.lists(st.sampled_from(live), max_size=3, unique=True))) if live else set()
        for rid in sorted(gone):
            ops.append(Op(DELETE, 0, rid, b""))
        for rid in live:
            if rid not in gone and data.draw(st.booleans()) and len(ops) < 6:
                ops.append(Op(UPDATE, 8, rid, b"u"))
        for _ in range(n_add):
            ops.append(Op(ADD, 2, self.next_id, data.draw(st.binary(max_size=300))))
            self.next_id += 1
        self.j.batch(ops)
        for op in ops:
            if op.kind == DELETE:
                del self.model[op.id]
            elif op.kind == UPDATE:
                utype, b, ups = self.model[op.id]
                self.model[op.id] = (utype, b, (*ups, (op.user_type, op.body)))
            else:
                self.model[op.id] = (op.user_type, op.body, ())
