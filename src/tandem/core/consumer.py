"""Consumers: credit-based flow control and the deliveries awaiting acknowledgement."""

from __future__ import annotations

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


class Consumer:
    """One subscriber on one queue.

    `window` > 0: credits are bytes, granted by the client as it consumes.
    `window` == 0: credits count messages (the client pulls one at a time).
    `window` < 0: no flow control.
    """

    __slots__ = (
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
        self.sink = sink
        self.window = window
        self.message_mode = window == 0
        self.credits = 0 if window >= 0 else 1
        self.filter = filter
        self.browse_only = browse_only
        self.owner = owner
        self.delivering: OrderedDict[int, MessageRef] = OrderedDict()
        self.delivered_bytes = 0  # bytes delivered and not yet acknowledged
        self.closed = False
        self.on_idle: Callable[[], None] | None = None

    @property
    def ready(self) -> bool:
        return not self.closed and (self.window < 0 or self.credits > 0) and self.sink.writable

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
            self.delivered_bytes += size
        self.sink.deliver(self, ref)

    def take_acked(self, message_id: int, cumulative: bool) -> list[MessageRef]:
        """Remove and return the deliveries an ack covers (in delivery order)."""
        d = self.delivering
        if message_id not in d:
            raise MessageDoesNotExist(f"message {message_id} is not awaiting an ack on consumer {self.id}")
        if not cumulative:
            ref = d.pop(message_id)
            self.delivered_bytes -= ref.message.size
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
        return out

    def take_all(self) -> list[MessageRef]:
        refs = list(self.delivering.values())
        self.delivering.clear()
        self.delivered_bytes = 0
        return refs

    def __repr__(self) -> str:
        return f"Consumer(id={self.id}, queue={self.queue.name!r}, credits={self.credits})"
