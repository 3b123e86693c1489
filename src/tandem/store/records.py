"""Journal record bodies for broker state (msgpack arrays; new fields go last with defaults)."""

from __future__ import annotations

from enum import IntEnum

import msgspec


class RecordType(IntEnum):
    # bindings journal
    ADDRESS = 1
    QUEUE = 2
    QUEUE_SEQ = 3
    ID_COUNTER = 4
    QUEUE_STATUS = 5  # a paused queue (decision 0067); no record: delivering
    # messages journal
    MESSAGE = 10
    ACK = 11
    DELIVERY_COUNT = 12
    DUPLICATE_ID = 13
    PAGE_CURSOR = 14  # where a queue reads its address's page files next
    PAGE_TX = 15  # a committed transaction's paged messages are visible (decision 0049)
    PAGE_ACK = 16  # one record of its pages left a queue, ahead of its cursor (decisions 0063, 0066)
    PAGE_DELIVERY_COUNT = 17  # failed deliveries of a page record read back by a queue (decision 0063)
    # page files (paging/)
    PAGED_MESSAGE = 20  # one message (pages written before decision 0086; still read)
    PAGED_MESSAGES = 21  # a run of messages appended together, one msgpack array (decision 0086)


# What a store written by this broker may hold that an older broker would misread: 1, page
# records holding runs of messages (PAGED_MESSAGES, decision 0086), which a broker from before
# would skip and then delete as read. A replicating backup must read it (ha/source.py).
STORE_FORMAT = 1


# Counter reservations (message ids, per-queue sequences) are written as a fresh record that
# deletes its predecessor in the same batch, so the journal holds one live record per counter
# and compaction drops the rest. Their record ids come from this range, apart from broker ids.
COUNTER_RECORD_BASE = 1 << 62


class AddressRecord(msgspec.Struct, array_like=True, gc=False):
    name: str
    routing_types: list[int]
    auto_created: bool = False


class QueueRecord(msgspec.Struct, array_like=True, gc=False):
    name: str
    address: str
    routing_type: int
    filter: str | None = None
    max_consumers: int = -1
    auto_created: bool = False
    exclusive: bool = False
    last_value_key: str | None = None
    reader_only: bool = False


class QueueStatusRecord(msgspec.Struct, array_like=True, gc=False):
    """A queue's operator state: paused (delivers to no consumer). Replaced, never updated."""

    queue_id: int
    paused: bool = True


class LargeRecord(msgspec.Struct, array_like=True, gc=False):
    """Where a large message's body is: a file of large-messages/, whole at `size` bytes."""

    file: str
    size: int
    compressed: bool = False


class MessageRecord(msgspec.Struct, array_like=True, gc=False):
    """A routed message: (queue id, per-queue sequence) for each durable queue, then its bytes."""

    refs: list[tuple[int, int]]
    message: msgspec.Raw
    expiration: int = 0  # set by the broker (expiry-delay) when the message carried none
    large: LargeRecord | None = None  # a large message: `message` has no body, the file has it
    message_id: int = 0  # the message's id when not the record's (a copy read from a page file)
    tx: int = 0  # page records only: the page transaction (its PAGE_TX record) that makes it visible


class DuplicateIdRecord(msgspec.Struct, array_like=True, gc=False):
    address: str
    dedup_id: str


class AckRecord(msgspec.Struct, array_like=True, gc=False):
    queue_id: int


class DeliveryCountRecord(msgspec.Struct, array_like=True, gc=False):
    queue_id: int
    count: int


class PageCursorRecord(msgspec.Struct, array_like=True, gc=False):
    """A queue has read its address's pages up to (not including) record `index` of `page`."""

    queue_id: int
    page: int
    index: int


class PageAckRecord(msgspec.Struct, array_like=True, gc=False):
    """Record `index` of `page` is no longer queue `queue_id`'s, ahead of its journaled cursor:
    read back and acknowledged (decision 0063), or moved away without being read back (decision
    0066); with `end_page`, every record of the queue from there up to (`end_page`, `end_index`): a purge
    while messages read back are in delivery. `more`: the other records one acknowledgement
    batch took (one record per batch, not per message: decision 0073)."""

    queue_id: int
    page: int
    index: int
    end_page: int = 0
    end_index: int = 0
    more: list[tuple[int, int]] = []  # further records (page, index) acknowledged in the same batch


class PageDeliveryCountRecord(msgspec.Struct, array_like=True, gc=False):
    """Failed deliveries so far of record `index` of `page` in a queue (replaced as it grows)."""

    queue_id: int
    page: int
    index: int
    count: int


class CounterRecord(msgspec.Struct, array_like=True, gc=False):
    value: int
    owner: int = 0  # the queue id for QUEUE_SEQ, 0 for ID_COUNTER


encoder = msgspec.msgpack.Encoder()
