"""Queue.read_range against a reference (filter and sort everything): priorities, gaps,
requeued messages, expiry and limits, for a reader that takes a long range in chunks."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.core.message import Message, MessageRef, RoutingType, now_ms
from tandem.core.queue import Queue
from tandem.store.journal_storage import NullStorage


def make_queue() -> Queue:
    return Queue(1, "q", "q", RoutingType.ANYCAST, True, NullStorage(), lambda fn: None)  # type: ignore[arg-type]


def put(q: Queue, mid: int, priority: int = 4, expiration: int = 0) -> MessageRef:
    m = Message(mid, "q", True, priority, expiration, 0, None, None, b"x" * 10)
    ref = MessageRef(m, q, q.next_seq())
    q.add(ref)
    return ref


def reference(refs: list[MessageRef], start: int, end: int, limit: int) -> list[int]:
    now = now_ms()
    seqs = sorted(
        r.seq
        for r in refs
        if start < r.seq <= end and not r.removed and not (r.message.expiration and r.message.expiration <= now)
    )
    return seqs[:limit] if limit >= 0 else seqs


def test_chunks_of_a_long_range_come_back_in_sequence_order_across_priorities() -> None:
    q = make_queue()
    rng = random.Random(7)
    refs = [put(q, i, priority=rng.choice([0, 4, 4, 4, 9])) for i in range(5000)]
    got: list[int] = []
    start = 0
    while True:
        chunk = q.read_range(start, refs[-1].seq, 700)
        if not chunk:
            break
        got += [r.seq for r in chunk]
        start = chunk[-1].seq
    assert got == [r.seq for r in refs]


@settings(max_examples=200, deadline=None)
@given(
    prios=st.lists(st.integers(0, 9), min_size=0, max_size=60),
    acked=st.integers(0, 70),
    taken=st.sets(st.integers(0, 59), max_size=10),
    expired=st.sets(st.integers(0, 59), max_size=10),
    start=st.integers(0, 70),
    span=st.integers(0, 70),
    limit=st.integers(-1, 20),
)
def test_read_range_matches_the_reference(
    prios: list[int], acked: int, taken: set[int], expired: set[int], start: int, span: int, limit: int
) -> None:
    q = make_queue()
    past = now_ms() - 1000
    refs = [put(q, i, p, past if i in expired else 0) for i, p in enumerate(prios)]
    q.ack_upto(acked)
    # messages handed out and given back (a consumer's rollback) keep their place in sequence order
    out = [r for r in refs if r.seq > acked and (r.seq - 1) in taken]
    for r in out:
        assert q._remove_queued(r)
    q._push_front(out)
    live = [r for r in refs if r.seq > acked]
    assert [r.seq for r in q.read_range(start, start + span, limit)] == reference(live, start, start + span, limit)
