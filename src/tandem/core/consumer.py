"""Consumers: credit-based flow control and the deliveries awaiting acknowledgement."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..errors import MessageDoesNotExist, TandemError
from .message import MessageRef

if TYPE_CHECKING:
    from .queue import Queue


class Filter(Protocol):
    def matches(self, ref: MessageRef) -> bool: ...


class DeliverySink(Protocol):
    """The protocol side of a consumer (native or STOMP connection)."""

    @property
    def writable(self) -> bool: ...

    def deliver(self, consumer: Consumer, ref: MessageRef) -> None: ...

    def consumer_closed(self, consumer: Consumer, error: TandemError) -> None: ...


class DeliveryAccount:
    """Deliveries not acknowledged yet across all consumers of one connection, against its limits
    (`max-unacked-messages`, `max-unacked-bytes`; -1: none). A consumer whose account is full is not
    ready, whatever its window: a client with an unlimited window, or one that keeps opening
    consumers, cannot pull a queue (and its pages) into memory without acknowledging.
    `on_room` is called when a full account has room again (the connection asks its queues to deliver)."""

    __slots__ = ("bytes", "max_bytes", "max_messages", "messages", "on_room")

    def __init__(self, max_messages: int, max_bytes: int, on_room: Callable[[], None] | None = None) -> None:
        self.messages = 0
        self.bytes = 0
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.on_room = on_room

    @property
    def full(self) -> bool:
        return (0 <= self.max_messages <= self.messages) or (0 <= self.max_bytes <= self.bytes)

    def released(self, messages: int, size: int) -> None:
        was_full = self.full
        self.messages -= messages
        self.bytes -= size
        if was_full and not self.full and self.on_room is not None:
            self.on_room()


class Consumer:
    """One subscriber on one queue.

    `window` > 0: credits are bytes, granted by the client as it consumes.
    `window` == 0: credits count messages (the client pulls one at a time).
    `window` < 0: no flow control.
    """

    __slots__ = (
        "account",
        "browse_only",
        "closed",
        "credits",
        "delivered_bytes",
        "delivering",
        "filter",
        "id",
        "message_mode",
        "on_idle",
        "owner",
        "queue",
        "sent",
        "since",
        "sink",
        "window",
    )

    def __init__(
        self,
        cid: int,
        queue: Queue,
        sink: DeliverySink,
        window: int,
        filter: Filter | None = None,
        browse_only: bool = False,
        owner: object = None,
    ) -> None:
        self.id = cid
        self.queue = queue
        self.since = time.time()  # when it subscribed (the management API shows it)
        self.sink = sink
        self.window = window
        self.message_mode = window == 0
        self.credits = 0 if window >= 0 else 1
        self.filter = filter
        self.browse_only = browse_only
        self.owner = owner
        self.delivering: OrderedDict[int, MessageRef] = OrderedDict()
        self.sent = 0  # deliveries handed to the sink (a client that closes says how many it got)
        self.delivered_bytes = 0  # bytes delivered and not yet acknowledged
        self.closed = False
        self.on_idle: Callable[[], None] | None = None
        self.account: DeliveryAccount | None = None  # its connection's unacknowledged deliveries

    @property
    def ready(self) -> bool:
        a = self.account
        return (
            not self.closed
            and (self.window < 0 or self.credits > 0)
            and self.sink.writable
            and (a is None or self.browse_only or not a.full)
        )

    def add_credits(self, n: int) -> None:
        was_ready = self.credits > 0
        self.credits += n
        if not was_ready and self.credits > 0 and not self.closed:
            self.queue.deliver_soon()

    def accepts(self, ref: MessageRef) -> bool:
        f = self.filter
        return f is None or f.matches(ref)

    def deliver(self, ref: MessageRef) -> None:
        """Hand `ref` to the sink (the queue has already taken it out)."""
        m = ref.message
        size = len(m.raw)
        if self.window >= 0:
            self.credits -= 1 if self.message_mode else size
        if not self.browse_only:
            self.delivering[m.id] = ref
            self.sent += 1
            self.delivered_bytes += size
            a = self.account
            if a is not None:
                a.messages += 1
                a.bytes += size
        self.sink.deliver(self, ref)

    def in_flight(self, received: int) -> list[int]:
        """Ids of the deliveries a client that got `received` of them never had: the last ones
        sent (acknowledgements only ever remove earlier ones)."""
        n = min(self.sent - received, len(self.delivering))
        if received < 0 or n <= 0:
            return []
        return list(self.delivering)[-n:]

    def take_acked(self, message_id: int, cumulative: bool) -> list[MessageRef]:
        """Remove and return the deliveries an ack covers (in delivery order)."""
        d = self.delivering
        if message_id not in d:
            raise MessageDoesNotExist(f"message {message_id} is not awaiting an ack on consumer {self.id}")
        if not cumulative:
            ref = d.pop(message_id)
            self.delivered_bytes -= ref.message.size
            if self.account is not None:
                self.account.released(1, len(ref.message.raw))
            return [ref]
        out: list[MessageRef] = []
        append = out.append
        popitem = d.popitem
        released = 0
        while d:
            mid, ref = popitem(last=False)
            released += len(ref.message.raw)
            append(ref)
            if mid == message_id:
                break
        self.delivered_bytes -= released
        if self.account is not None:
            self.account.released(len(out), released)
        return out

    def take_all(self) -> list[MessageRef]:
        refs = list(self.delivering.values())
        self.delivering.clear()
        self.delivered_bytes = 0
        if self.account is not None and refs:
            self.account.released(len(refs), sum(len(r.message.raw) for r in refs))
        return refs

    def __repr__(self) -> str:
        return f"Consumer(id={self.id}, queue={self.queue.name!r}, credits={self.credits})"
