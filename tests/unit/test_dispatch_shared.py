"""Competing consumers without filters take the queue's batch path (`Queue._dispatch_shared`);
it must hand out exactly what the general loop, one message at a time, hands out: the same
messages to the same consumers in the same order, the same ones expired, the same ones left.

The general loop is made to run by giving each consumer a filter that accepts everything."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.core.consumer import Consumer, DeliveryAccount
from tandem.core.message import Message, MessageRef, RoutingType, now_ms
from tandem.core.queue import Queue
from tandem.store.journal_storage import NullStorage


class _Sink:
    writable = True

    def __init__(self, log: list[tuple[int, int]]) -> None:
        self.log = log

    def deliver(self, consumer: Consumer, ref: MessageRef) -> None:
        self.log.append((consumer.id, ref.message.id))


class _AcceptAll:
    def matches(self, ref: MessageRef) -> bool:
        return True


def _run(
    general: bool, messages: list[tuple[int, bool, int]], consumers: list[tuple[int, int, int]], passes: int
) -> tuple[list[tuple[int, int]], list[int], int]:
    pending: list[Any] = []
    q = Queue(1, "q", "q", RoutingType.ANYCAST, False, NullStorage(), pending.append)  # type: ignore[arg-type]
    expired = now_ms() - 1000
    for mid, (priority, dead, size) in enumerate(messages, 1):
        m = Message(mid, "q", False, priority, expired if dead else 0, 0, None, None, b"x" * size)
        q.add(MessageRef(m, q, mid))
    log: list[tuple[int, int]] = []
    accounts: dict[int, DeliveryAccount] = {}
    for cid, (window, credits, account_max) in enumerate(consumers, 1):
        c = Consumer(cid, q, _Sink(log), window, _AcceptAll() if general else None)  # type: ignore[arg-type]
        if window >= 0:
            c.credits = credits
        if account_max >= 0:  # consumers 1 and 2 share a connection's account, others have their own
            key = min(cid, 2)
            if key not in accounts:
                accounts[key] = DeliveryAccount(account_max, -1)
            c.account = accounts[key]
        q.consumers.append(c)
    for _ in range(passes):
        q._dispatch_some()
        for c in q.consumers:  # each pass, every consumer is granted a little more
            if c.window >= 0:
                c.credits += 1 if c.message_mode else 64
    left = [r.message.id for r in q.iter_refs()]
    return log, left, q.messages_expired


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.integers(1, 200)), max_size=300),
    consumers=st.lists(
        st.tuples(st.sampled_from([-1, 0, 100, 1000]), st.integers(0, 5), st.sampled_from([-1, 3, 50])),
        min_size=2,
        max_size=5,
    ),
    passes=st.integers(1, 4),
)
def test_competing_consumers_get_what_the_general_loop_gives(
    messages: list[tuple[int, bool, int]], consumers: list[tuple[int, int, int]], passes: int
) -> None:
    assert _run(False, messages, consumers, passes) == _run(True, messages, consumers, passes)


def test_the_batch_path_shares_messages_round_robin() -> None:
    log, left, _expired = _run(False, [(4, False, 10)] * 6, [(-1, 0, -1)] * 3, 1)
    assert log == [(1, 1), (2, 2), (3, 3), (1, 4), (2, 5), (3, 6)]
    assert left == []


def test_the_turn_carries_over_when_a_pass_uses_its_whole_budget() -> None:
    """A pass delivers at most MAX_PER_PASS (1,000): the next one goes on from where it stopped."""
    messages = [(4, False, 10)] * 2_500
    consumers = [(-1, 0, -1)] * 3
    assert _run(False, messages, consumers, 3) == _run(True, messages, consumers, 3)


class _StreamingSink:
    """Not writable while a large message's chunks go out (as the native session)."""

    def __init__(self, log: list[tuple[int, int]]) -> None:
        self.log = log
        self.streams: list[int] = []

    @property
    def writable(self) -> bool:
        return not self.streams

    def deliver(self, consumer: Consumer, ref: MessageRef) -> None:
        self.log.append((consumer.id, ref.message.id))
        if ref.message.large is not None:
            self.streams.append(1)


def test_a_large_message_does_not_hold_the_other_consumers_back() -> None:
    """The general loop goes on to the other consumers once one takes a large message (its sink
    is busy with the chunks); the batch path ends its pass there and asks for the next one."""

    def run(general: bool) -> list[tuple[int, int]]:
        pending: list[Any] = []
        q = Queue(1, "q", "q", RoutingType.ANYCAST, False, NullStorage(), pending.append)  # type: ignore[arg-type]
        for mid in range(1, 7):
            m = Message(mid, "q", False, 4, 0, 0, None, None, b"x" * 10)
            if mid == 1:
                m.large = object()  # type: ignore[assignment]
            q.add(MessageRef(m, q, mid))
        log: list[tuple[int, int]] = []
        for cid in (1, 2):
            q.consumers.append(Consumer(cid, q, _StreamingSink(log), -1, _AcceptAll() if general else None))  # type: ignore[arg-type]
        pending.clear()
        q._scheduled = False
        q._dispatch_some()
        for _ in range(5):  # the passes the queue asks for, and only those
            if not pending:
                break
            pending.clear()
            q._scheduled = False
            q._dispatch_some()
        return log

    assert run(False) == run(True) == [(1, 1), (2, 2), (2, 3), (2, 4), (2, 5), (2, 6)]
