"""Sends to a queue whose bindings record is not stored yet wait for it (PostOffice.
_journal_then_queue); a later send must not overtake one still waiting, even once that record
is stored: the waiting one's callback may belong to a later bindings batch (found in review).
A queue out of sequence order breaks FIFO, and a range reader could acknowledge past a message
it never read."""

from __future__ import annotations

from collections.abc import Callable

from tandem.core.ids import IdGenerator
from tandem.core.message import Message, RoutingType
from tandem.core.postoffice import PostOffice
from tandem.store.journal_storage import NullStorage


class _Bindings(NullStorage):
    """A persistent store whose bindings journal writes in batches the test completes."""

    persistent = True

    def __init__(self) -> None:
        super().__init__()
        self.writing = False  # something waits for the next bindings batch
        self.next: list[Callable[[], None]] = []
        self.in_flight: list[Callable[[], None]] | None = None

    def _write(self, *_args: object, **_kw: object) -> None:
        self.writing = True

    store_queue = store_queue_seq = store_address = reserve_ids = _write  # type: ignore[assignment]

    def store_message(self, message: object, refs: object, tx: list[object] | None = None) -> None:
        if tx is not None:
            tx.append(("message", refs))

    def commit(self, tx: list[object]) -> None:
        pass

    def after_bindings_durable(self, cb: Callable[[], None]) -> None:
        if self.writing:
            self.next.append(cb)
        elif self.in_flight is not None:
            self.in_flight.append(cb)
        else:
            cb()

    def hand_over(self) -> None:
        self.in_flight, self.next, self.writing = self.next, [], False

    def stored(self) -> None:
        done, self.in_flight = self.in_flight or [], None
        for cb in done:
            cb()


def test_a_send_does_not_overtake_one_waiting_for_a_later_bindings_batch() -> None:
    store = _Bindings()
    ids = IdGenerator(1, 0, store.reserve_ids)
    po = PostOffice(store, ids, lambda fn: None)
    po.create_address("a", {RoutingType.ANYCAST})
    po.create_address("b", {RoutingType.ANYCAST})
    store.hand_over()
    store.stored()
    q = po.create_queue("q", "a", RoutingType.ANYCAST, durable=True)

    def send() -> None:
        po.send(Message(ids.next(), "a", True, 4, 0, 0, None, None, b"x" * 10))

    send()  # waits for q's record: batch X
    store.hand_over()  # X is being written
    po.create_queue("q2", "b", RoutingType.ANYCAST, durable=True)  # batch Y pending
    send()  # q's record not stored yet: waits, for Y
    store.stored()  # X stored: q's record is on disk, the first send queued
    send()  # the second still waits: this one goes behind it
    store.hand_over()
    store.stored()
    assert [r.seq for r in q.iter_refs()] == [1, 2, 3]
    assert q.held == 0
