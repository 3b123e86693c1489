"""A protocol-neutral session: sends, consumers and acknowledgements on behalf of one client session.

Native and STOMP connections both drive this; they only translate frames and
decide when to reply (after `Storage.after_durable` for anything durable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from ..errors import ConsumerDoesNotExist, IllegalState, InvalidArgument
from .consumer import Consumer, DeliverySink
from .message import Message

if TYPE_CHECKING:
    from .postoffice import PostOffice


class ServerSession:
    __slots__ = ("closed", "consumers", "default_window", "name", "owner", "postoffice")

    def __init__(self, postoffice: PostOffice, owner: object, name: str = "", default_window: int = 1 << 20) -> None:
        self.postoffice = postoffice
        self.owner = owner
        self.name = name
        self.default_window = default_window
        self.consumers: dict[int, Consumer] = {}
        self.closed = False

    # -------------------------------------------------------------- sending
    def send(self, raw: msgspec.Raw | bytes) -> bool:
        """Route one encoded message; True if a journal record was written (reply after sync)."""
        po = self.postoffice
        try:
            message = Message.decode(po.ids.next(), raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InvalidArgument(f"malformed message: {exc}") from None
        return self.send_message(message)

    def send_message(self, message: Message) -> bool:
        refs = self.postoffice.send(message)
        return message.durable_refs > 0 and bool(refs)

    # ------------------------------------------------------------ consumers
    def create_consumer(
        self,
        cid: int,
        queue_name: str,
        sink: DeliverySink,
        window: int = -2,
        filter_text: str | None = None,
        browse_only: bool = False,
    ) -> Consumer:
        if cid in self.consumers:
            raise IllegalState(f"consumer id {cid} is already in use on this session")
        if window == -2:
            window = self.default_window
        if window < -1:
            raise InvalidArgument(f"consumer window must be -1, 0 or a byte count, got {window}")
        filt = self.postoffice.compile_filter(filter_text) if filter_text else None  # before any side effect
        q = self.postoffice.queue_for_consumer(queue_name)
        if not browse_only and q.max_consumers >= 0 and len(q.consumers) >= q.max_consumers:
            raise IllegalState(f"queue {queue_name!r} already has its maximum of {q.max_consumers} consumer(s)")
        c = Consumer(cid, q, sink, window, filt, browse_only, owner=self)
        if window > 0:
            c.credits = window
        self.consumers[cid] = c
        q.add_consumer(c)
        return c

    def consumer(self, cid: int) -> Consumer:
        c = self.consumers.get(cid)
        if c is None:
            raise ConsumerDoesNotExist(f"consumer {cid} does not exist on this session")
        return c

    def close_consumer(self, cid: int) -> None:
        c = self.consumers.pop(cid, None)
        if c is None:
            raise ConsumerDoesNotExist(f"consumer {cid} does not exist on this session")
        c.queue.remove_consumer(c)

    def forget_consumer(self, consumer: Consumer) -> None:
        """The queue went away under the consumer; drop our handle."""
        self.consumers.pop(consumer.id, None)

    def flow(self, cid: int, credits: int) -> None:
        c = self.consumers.get(cid)
        if c is not None:  # a FLOW may cross a close on the wire
            c.add_credits(credits)

    def ack(self, cid: int, message_id: int, cumulative: bool) -> bool:
        """Acknowledge; True if a journal record was written (confirm after sync)."""
        c = self.consumer(cid)
        refs = c.take_acked(message_id, cumulative)
        q = c.queue
        q.acknowledge(refs)
        return q.durable and q.storage.persistent and any(r.message.durable for r in refs)

    def close(self) -> None:
        """Close every consumer; unacknowledged messages go back to their queues."""
        if self.closed:
            return
        self.closed = True
        for c in list(self.consumers.values()):
            c.queue.remove_consumer(c)
        self.consumers.clear()
