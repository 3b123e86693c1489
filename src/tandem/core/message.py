"""Messages as the broker holds them.

A message travels as one msgpack array (:class:`MessageData`) produced by the
client. The broker decodes only its header (:class:`MessageHeader`, the same
array without the body) and keeps the encoded bytes as they came, so the body
is never copied or decoded again: the same bytes go into the journal record
and into every delivery.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import msgspec

PropertyValue = str | int | float | bool | bytes
# msgpack keeps str and bin apart, so `Any` decodes each value to its own type.
Properties = dict[str, Any]
PROPERTY_TYPES = (str, int, float, bool, bytes)

DEFAULT_PRIORITY = 4


class RoutingType(IntEnum):
    ANY = 0  # let the address decide
    ANYCAST = 1
    MULTICAST = 2

    @classmethod
    def parse(cls, text: str) -> RoutingType:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"routing type must be anycast or multicast, got {text!r}") from None


class MessageData(msgspec.Struct, array_like=True, gc=False):
    """The encoded form of a message, as sent by producers and stored in the journal."""

    address: str
    durable: bool = True
    priority: int = DEFAULT_PRIORITY
    expiration: int = 0  # epoch milliseconds, 0 = never
    timestamp: int = 0  # epoch milliseconds
    dedup_id: str | None = None
    routing_type: int = RoutingType.ANY
    properties: Properties | None = None
    body: bytes = b""


class MessageHeader(msgspec.Struct, array_like=True, gc=False):
    """MessageData without its body: trailing fields are skipped when decoding. Stored messages
    are decoded with this (they were checked as a SentHeader when they came in): no check of
    its own, which on a reload or a depage would cost a Python call per message."""

    address: str
    durable: bool = True
    priority: int = DEFAULT_PRIORITY
    expiration: int = 0
    timestamp: int = 0
    dedup_id: str | None = None
    routing_type: int = RoutingType.ANY
    properties: Properties | None = None


def _no_body() -> memoryview:
    return memoryview(b"")


class SentHeader(MessageHeader):
    """A producer's MessageHeader, checked: its routing type, and that the body, which the header
    skips, is bytes (msgpack bin). Without this a body sent as text, nil or a number is accepted
    and stored, then fails every consumer that decodes the whole message. A view, not a copy of
    the body."""

    body: memoryview = msgspec.field(default_factory=_no_body)

    def __post_init__(self) -> None:
        if not 0 <= self.routing_type <= 2:
            raise ValueError(f"routing_type must be 0 (any), 1 (anycast) or 2 (multicast), got {self.routing_type}")


_header_decoder = msgspec.msgpack.Decoder(MessageHeader)
_sent_decoder = msgspec.msgpack.Decoder(SentHeader)
_data_encoder = msgspec.msgpack.Encoder()


class LargeBody:
    """A large message's body: a file of the store's (store/large_messages.py), not bytes.

    One per message object holding it; when the last such object is freed, `release` tells
    the store, which removes the file once no journal record names it either."""

    __slots__ = ("compressed", "name", "release", "size")

    def __init__(self, name: str, size: int, compressed: bool, release: Callable[[str], None] | None) -> None:
        self.name = name
        self.size = size  # bytes in the file (compressed ones, if the producer compressed)
        self.compressed = compressed
        self.release = release

    def __del__(self) -> None:
        release, self.release = self.release, None
        if release is not None:
            try:
                release(self.name)
            except Exception:  # a finalizer must not raise (interpreter shutdown); a start-up cleans up
                pass

    def __repr__(self) -> str:
        return f"LargeBody({self.name!r}, size={self.size})"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Message(msgspec.Struct, gc=False, eq=False):
    """A routed message: server-assigned id plus the client's encoded bytes.

    A broker holds millions of these, so it is a compact, untracked struct (no
    cycles: it refers only to strings, numbers, its properties and its bytes);
    rarely used header fields (timestamp) are read back from the bytes on demand.
    """

    id: int
    address: str
    durable: bool
    priority: int
    expiration: int
    routing_type: int
    dedup_id: str | None
    properties: Properties | None
    raw: msgspec.Raw | bytes
    durable_refs: int = 0
    large: LargeBody | None = None  # the body is a file; `raw` holds the message without it
    rid: int = 0  # its journal record's id when not `id` (a copy taken from a page file)

    @classmethod
    def decode(cls, mid: int, raw: msgspec.Raw | bytes, sent: bool = False) -> Message:
        """Build from encoded MessageData; raises msgspec errors on malformed input. `sent`: just
        received from a producer, so the body is checked too (what is stored was checked then)."""
        h = (_sent_decoder if sent else _header_decoder).decode(raw)
        p = h.priority
        prio = 0 if p < 0 else (9 if p > 9 else p)
        return cls(mid, h.address, h.durable, prio, h.expiration, h.routing_type, h.dedup_id, h.properties, raw)

    @classmethod
    def create(cls, mid: int, data: MessageData) -> Message:
        """Build from a MessageData made on the server (other protocols, dead letters)."""
        raw = msgspec.Raw(_data_encoder.encode(data))
        p = data.priority
        prio = 0 if p < 0 else (9 if p > 9 else p)
        return cls(
            mid,
            data.address,
            data.durable,
            prio,
            data.expiration,
            data.routing_type,
            data.dedup_id,
            data.properties,
            raw,
        )

    @property
    def size(self) -> int:
        return len(self.raw)

    @property
    def timestamp(self) -> int:
        return _header_decoder.decode(self.raw).timestamp

    def header(self) -> MessageHeader:
        return _header_decoder.decode(self.raw)

    def data(self) -> MessageData:
        return msgspec.msgpack.decode(self.raw, type=MessageData)

    def expired(self, now: int) -> bool:
        return self.expiration != 0 and now >= self.expiration

    def __repr__(self) -> str:
        return f"Message(id={self.id}, address={self.address!r}, size={self.size})"


class MessageRef(msgspec.Struct, gc=False, eq=False):
    """A message in one queue: its per-queue sequence and delivery count (failed deliveries so far).

    Not tracked by the collector: the queue refers to its refs and each ref to its queue,
    a cycle that queue deletion breaks by purging.
    """

    message: Message
    queue: Any
    seq: int
    delivery_count: int = 0
    removed: bool = False
    pos: tuple[int, int] | None = None  # read back from a page: (page, record index) (decision 0063)

    def __repr__(self) -> str:
        return f"MessageRef(seq={self.seq}, msg={self.message.id}, dc={self.delivery_count})"
