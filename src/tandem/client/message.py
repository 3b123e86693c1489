"""Messages as the application sees them."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from ..core.message import DEFAULT_PRIORITY, PROPERTY_TYPES, MessageData, Properties, RoutingType
from ..errors import InvalidArgument

if TYPE_CHECKING:
    from .large import LargeBody
    from .session import AsyncConsumer

_time_ns = time.time_ns
_ANY = int(RoutingType.ANY)


@dataclass
class Message:
    """An outgoing message. `ttl` (ms) sets `expiration` relative to the send time."""

    body: bytes | str = b""
    properties: Properties | None = None
    durable: bool = True
    priority: int = DEFAULT_PRIORITY
    expiration: int = 0
    ttl: int = 0
    dedup_id: str | None = None
    address: str | None = None
    routing_type: str | None = None

    def to_data(self, default_address: str | None) -> MessageData:
        address = self.address or default_address
        if not address:
            raise InvalidArgument("a message needs an address (producer default or message.address)")
        if self.properties:
            for key, value in self.properties.items():
                if not isinstance(key, str) or not isinstance(value, PROPERTY_TYPES):
                    raise InvalidArgument(
                        f"property {key!r}: values must be str, int, float, bool or bytes, got {type(value).__name__}"
                    )
        priority = self.priority
        if not 0 <= priority <= 9:
            raise InvalidArgument(f"priority must be 0-9, got {priority}")
        body = self.body
        if type(body) is not bytes:
            body = body.encode() if isinstance(body, str) else bytes(body)
        now = _time_ns() // 1_000_000
        ttl = self.ttl
        expiration = self.expiration or (now + ttl if ttl > 0 else 0)
        rt = _ANY if not self.routing_type else int(RoutingType.parse(self.routing_type))
        return MessageData(
            address, self.durable, priority, expiration, now, self.dedup_id, rt, self.properties or None, body
        )


@dataclass(eq=False)
class ReceivedMessage:
    """A delivered message. `ack()` acknowledges it (cumulatively in `client` ack mode)."""

    id: int
    _body: bytes
    address: str
    properties: dict[str, Any]
    durable: bool
    priority: int
    timestamp: int
    expiration: int
    dedup_id: str | None
    delivery_count: int
    seq: int
    size: int
    _consumer: AsyncConsumer | None = field(default=None, repr=False)
    _generation: int = field(default=0, repr=False)  # which connection delivered it (failover voids older ones)
    _large: LargeBody | None = field(default=None, repr=False)  # a large message's body (a spooled file)

    @property
    def body(self) -> bytes:
        """The whole body (a large message's is read from its spool file: prefer `body_stream()`)."""
        return self._body if self._large is None else self._large.read()

    @property
    def large(self) -> bool:
        """Whether the body came as a large message (in chunks, kept in a spooled file)."""
        return self._large is not None

    def body_stream(self) -> IO[bytes]:
        """The body as a binary file object from its start (for any message; large ones are not in memory)."""
        if self._large is None:
            return io.BytesIO(self._body)
        return self._large.stream()

    def save_body(self, path: str | os.PathLike[str]) -> int:
        """Write the body to `path`; returns its size in bytes."""
        if self._large is None:
            with open(path, "wb") as out:
                out.write(self._body)
            return len(self._body)
        return self._large.save(path)

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1

    @property
    def text(self) -> str:
        return self.body.decode()

    def ack(self) -> Awaitable[None]:
        """Acknowledge (asyncio API: await it to know the ack is durable)."""
        if self._consumer is None:
            from ..errors import IllegalState

            raise IllegalState("this message was not delivered by a consumer (browsed messages need no ack)")
        return self._consumer.ack_message(self)

    def nack(self) -> Awaitable[None]:
        """Negative acknowledgement: redelivered after the address's redelivery-delay, or dead-lettered."""
        if self._consumer is None:
            from ..errors import IllegalState

            raise IllegalState("this message was not delivered by a consumer")
        return self._consumer.nack_message(self)

    @classmethod
    def from_data(cls, d: MessageData, mid: int, delivery_count: int, seq: int, size: int) -> ReceivedMessage:
        return cls(
            mid,
            d.body,
            d.address,
            d.properties or {},
            d.durable,
            d.priority,
            d.timestamp,
            d.expiration,
            d.dedup_id,
            delivery_count,
            seq,
            size,
        )
