"""A queue's priority levels (core/reflevel.py): the same FIFO as a deque, and cheap for the
garbage collector however many messages wait."""

from __future__ import annotations

import gc

from tandem.core.message import Message, MessageRef, RoutingType
from tandem.core.queue import Queue
from tandem.store.journal_storage import NullStorage


def make_queue() -> Queue:
    return Queue(1, "q", "q", RoutingType.ANYCAST, True, NullStorage(), lambda fn: None)  # type: ignore[arg-type]


def _ref(q: object, seq: int, priority: int = 4) -> MessageRef:
    return MessageRef(Message(seq, "q", True, priority, 0, 0, None, None, b"x" * 10), q, seq)


def _walked_by_a_collection() -> int:
    """References a full collection follows: every tracked object's referents."""
    return sum(len(gc.get_referents(o)) for o in gc.get_objects())


def test_a_long_queue_leaves_the_collector_almost_nothing_to_walk() -> None:
    """A primary holding 1M messages ran full collections of ~135 ms: the collector walked every
    queued reference of each priority level's deque (a cache miss each), holding up the loop and
    so every confirmation. Queued references now sit in tuples the collector stops tracking."""
    q = make_queue()
    gc.collect()
    before = _walked_by_a_collection()
    for seq in range(1, 50_001):
        q.add(_ref(q, seq, priority=4 if seq % 10 else 9))
    for _ in range(1_000):  # consumed from the head too, as a primary serving and filling
        q._pop()
    gc.collect()
    walked = _walked_by_a_collection() - before
    assert q.ready_count == 49_000
    assert walked < 2_000, f"a full collection follows {walked} more references for 49,000 queued messages"
