"""Tandem: a highly available message broker, its client library and a PySpark connector.

`tandem.connect(url)` gives a blocking connection; `await tandem.aio.connect(url)`
an asyncio one. Errors are the typed exceptions of :mod:`tandem.errors`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .client.blocking import connect
from .client.message import Message, ReceivedMessage
from .errors import (
    AddressDoesNotExist,
    AddressFull,
    CallTimeout,
    ConnectionLost,
    DuplicateId,
    ErrorCode,
    InvalidArgument,
    InvalidSelector,
    QueueDoesNotExist,
    QueueExists,
    ResourceLimit,
    StaleAcknowledge,
    TandemError,
    TransactionOutcomeUnknown,
    TransactionRolledBack,
    Unauthorized,
    Unblocked,
)

__all__ = [
    "AddressDoesNotExist",
    "AddressFull",
    "CallTimeout",
    "ConnectionLost",
    "DuplicateId",
    "ErrorCode",
    "InvalidArgument",
    "InvalidSelector",
    "Message",
    "QueueDoesNotExist",
    "QueueExists",
    "ReceivedMessage",
    "ResourceLimit",
    "StaleAcknowledge",
    "TandemError",
    "TransactionOutcomeUnknown",
    "TransactionRolledBack",
    "Unauthorized",
    "Unblocked",
    "__version__",
    "connect",
]
