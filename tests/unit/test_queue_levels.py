"""A queue's priority levels (core/reflevel.py): the same FIFO as a deque, and cheap for the
garbage collector however many messages wait."""

from __future__ import annotations

import gc
from collections import deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tandem.core.message import Message, MessageRef, RoutingType, now_ms
from tandem.core.queue import Queue
from tandem.core.reflevel import CHUNK, RefLevel
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


class LevelMatchesDeque(RuleBasedStateMachine):
    """Every operation a queue makes on a level, against a deque doing the same."""

    def __init__(self) -> None:
        super().__init__()
        self.level = RefLevel()
        self.model: deque[MessageRef] = deque()
        self.seq = 0

    def _new(self, n: int) -> list[MessageRef]:
        out = []
        for _ in range(n):
            self.seq += 1
            out.append(_ref(None, self.seq))
        return out

    @rule(n=st.integers(1, 3 * CHUNK))
    def append(self, n: int) -> None:
        for r in self._new(n):
            self.level.append(r)
            self.model.append(r)

    @rule(n=st.integers(0, 2 * CHUNK))
    def extend(self, n: int) -> None:
        refs = self._new(n)
        self.level.extend(refs)
        self.model.extend(refs)

    @precondition(lambda self: self.model)
    @rule(n=st.integers(1, 2 * CHUNK))
    def popleft(self, n: int) -> None:
        for _ in range(min(n, len(self.model))):
            assert self.level.popleft() is self.model.popleft()

    @rule(n=st.integers(0, 3 * CHUNK), back=st.integers(0, 3 * CHUNK))
    def take_and_give_back(self, n: int, back: int) -> None:
        got = self.level.take(n)
        assert len(got) <= n and (got or not n or not self.model)
        assert got == [self.model.popleft() for _ in range(len(got))]
        rest = got[len(got) - min(back, len(got)) :]
        self.level.give_back(rest)
        self.model.extendleft(reversed(rest))

    @precondition(lambda self: self.model)
    @rule(n=st.integers(1, 40))
    def push_front(self, n: int) -> None:
        """As a requeue does: pop some from the head, put them back in front with new ones."""
        taken = [self.model.popleft() for _ in range(min(n, len(self.model)))]
        for r in taken:
            assert self.level.popleft() is r
        self.level.extendleft(reversed(taken))
        self.model.extendleft(reversed(taken))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from(list(self.model)))
        self.level.remove(r)
        self.model.remove(r)

    @rule()
    def remove_missing(self) -> None:
        try:
            self.level.remove(_ref(None, -1))
        except ValueError:
            return
        raise AssertionError("removing a ref not queued must raise ValueError")

    @rule()
    def clear_and_refill(self) -> None:
        keep = [r for r in self.model if r.seq % 3]
        self.level.clear()
        self.level.extend(keep)
        self.model.clear()
        self.model.extend(keep)

    @rule(start=st.integers(0, 2000))
    def iter_after(self, start: int) -> None:
        assert [r.seq for r in self.level.iter_after(start)] == [r.seq for r in self.model if r.seq > start]

    @invariant()
    def same(self) -> None:
        assert len(self.level) == len(self.model)
        assert bool(self.level) == bool(self.model)
        assert list(self.level) == list(self.model)
        if self.model:
            assert self.level[0] is self.model[0]
            assert self.level[-1] is self.model[-1]


LevelMatchesDeque.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLevelMatchesDeque = LevelMatchesDeque.TestCase


class _Unwalkable(RefLevel):
    """A level that fails the test if anything walks it."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("the expiry scan walked a level")


def test_the_expiry_scan_does_not_walk_queues_where_nothing_can_have_expired() -> None:
    """The periodic expiry scan walked every queued message on the loop: 150-500 ms every 30 s
    with 1M messages held (seen as a 343-506 ms confirmation gap on a primary, found by sampling
    its main thread). A queue knows the earliest expiration it holds; before that, no walk."""
    q = make_queue()
    q._levels = [_Unwalkable() for _ in q._levels]
    for seq in range(1, 20_001):
        q.add(_ref(q, seq))
    assert q.expire_scan(now_ms()) == 0  # nothing expires: no walk
    soon = now_ms() + 60_000
    m = Message(99_999, "q", True, 4, soon, 0, None, None, b"x")
    q.add(MessageRef(m, q, 20_001))
    assert q.expire_scan(now_ms()) == 0  # not yet: still no walk
    q._levels = [RefLevel(RefLevel.__iter__(level)) for level in q._levels]  # walking allowed from here on
    moved: list[MessageRef] = []
    q._expire = moved.append  # type: ignore[method-assign]
    assert q.expire_scan(soon) == 1
    assert [r.message.id for r in moved] == [99_999] and q.ready_count == 20_000
    q._levels = [_Unwalkable(RefLevel.__iter__(level)) for level in q._levels]  # ...and none again after it
    assert q.expire_scan(soon + 1) == 0
