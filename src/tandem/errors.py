"""One exception hierarchy and one error-code enum, shared by server and client.

The server sends a code and a message; the client turns them back into the same
exception class with :func:`error_for`, so `except tandem.QueueDoesNotExist`
works the same on both sides of the wire.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Wire-stable error codes; never renumber."""

    INTERNAL = 1
    PROTOCOL = 2
    FRAME_TOO_LARGE = 3
    UNKNOWN_PACKET = 4
    VERSION_MISMATCH = 5
    INVALID_ARGUMENT = 6
    ILLEGAL_STATE = 7
    UNAUTHORIZED = 8
    RESOURCE_LIMIT = 9
    QUEUE_DOES_NOT_EXIST = 20
    QUEUE_EXISTS = 21
    ADDRESS_DOES_NOT_EXIST = 22
    ADDRESS_EXISTS = 23
    ADDRESS_FULL = 24
    CONSUMER_DOES_NOT_EXIST = 25
    SESSION_DOES_NOT_EXIST = 26
    MESSAGE_DOES_NOT_EXIST = 27
    CONNECTION_DOES_NOT_EXIST = 28
    DUPLICATE_ID = 30
    TRANSACTION_ROLLED_BACK = 31
    INVALID_SELECTOR = 32
    TRANSACTION_OUTCOME_UNKNOWN = 33
    STALE_ACKNOWLEDGE = 34
    CONNECTION_LOST = 40
    UNBLOCKED = 41
    TIMEOUT = 42
    NOT_CONNECTED = 43
    SHUTTING_DOWN = 44
    NOT_ACTIVE = 45
    CONFIG = 50
    JOURNAL = 51
    IO_ERROR = 52


class TandemError(Exception):
    """Base of every error Tandem raises on purpose; carries a wire code."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str = "", code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return f"[{self.code.name}] {self.message}"


class InternalError(TandemError):
    code = ErrorCode.INTERNAL


class ProtocolError(TandemError):
    code = ErrorCode.PROTOCOL


class FrameTooLarge(ProtocolError):
    code = ErrorCode.FRAME_TOO_LARGE


class UnknownPacket(ProtocolError):
    code = ErrorCode.UNKNOWN_PACKET


class VersionMismatch(ProtocolError):
    code = ErrorCode.VERSION_MISMATCH


class InvalidArgument(TandemError):
    code = ErrorCode.INVALID_ARGUMENT


class IllegalState(TandemError):
    code = ErrorCode.ILLEGAL_STATE


class Unauthorized(TandemError):
    code = ErrorCode.UNAUTHORIZED


class ResourceLimit(TandemError):
    """A limit that keeps one client from taking the broker's resources: too many connections
    (per acceptor, user or peer address), or a connection cut for not reading what it asked for."""

    code = ErrorCode.RESOURCE_LIMIT


class QueueDoesNotExist(TandemError):
    code = ErrorCode.QUEUE_DOES_NOT_EXIST


class QueueExists(TandemError):
    code = ErrorCode.QUEUE_EXISTS


class AddressDoesNotExist(TandemError):
    code = ErrorCode.ADDRESS_DOES_NOT_EXIST


class AddressExists(TandemError):
    code = ErrorCode.ADDRESS_EXISTS


class AddressFull(TandemError):
    code = ErrorCode.ADDRESS_FULL


class ConsumerDoesNotExist(TandemError):
    code = ErrorCode.CONSUMER_DOES_NOT_EXIST


class SessionDoesNotExist(TandemError):
    code = ErrorCode.SESSION_DOES_NOT_EXIST


class MessageDoesNotExist(TandemError):
    code = ErrorCode.MESSAGE_DOES_NOT_EXIST


class ConnectionDoesNotExist(TandemError):
    """No open connection of that id (`connection.close`)."""

    code = ErrorCode.CONNECTION_DOES_NOT_EXIST


class DuplicateId(TandemError):
    code = ErrorCode.DUPLICATE_ID
    _PREFIX = "duplicate message (dedup id already seen), [address, dedup id]: "

    @classmethod
    def of(cls, duplicates: list[tuple[str, str]]) -> DuplicateId:
        """The error for these (address, dedup id) pairs; `duplicates` reads them back on the client."""
        import json

        return cls(cls._PREFIX + json.dumps([list(d) for d in duplicates]))

    @property
    def duplicates(self) -> list[tuple[str, str]]:
        """Every (address, dedup id) of the refused send or transaction (so a caller can drop them and retry)."""
        import json

        _, sep, tail = self.message.partition(self._PREFIX)
        if not sep:
            return []
        try:
            return [(str(a), str(d)) for a, d in json.loads(tail)]
        except (ValueError, TypeError):
            return []


class TransactionRolledBack(TandemError):
    code = ErrorCode.TRANSACTION_ROLLED_BACK


class TransactionOutcomeUnknown(TandemError):
    """The commit may or may not have been applied: its answer was lost (connection failure,
    call timeout). Not a TransactionRolledBack, on purpose: retried under a new transaction id
    the work could be applied twice. `retry_commit()` commits again under the same id (the work
    done again, or nothing to learn the outcome): the broker answers "already committed" if the
    first attempt went through."""

    code = ErrorCode.TRANSACTION_OUTCOME_UNKNOWN

    def __init__(self, message: str = "", code: ErrorCode | None = None, dedup_id: str | None = None) -> None:
        super().__init__(message, code)
        self.dedup_id = dedup_id  # the transaction id a retry must reuse (None: no safe retry)


class StaleAcknowledge(TandemError):
    """An ack or nack of a message delivered before a failover (or reconnection): it did nothing,
    since the server that delivered it is gone; the new one delivers the message again (unless an
    earlier acknowledgement had covered it). Not an Unblocked: the outcome is known."""

    code = ErrorCode.STALE_ACKNOWLEDGE


class InvalidSelector(TandemError):
    code = ErrorCode.INVALID_SELECTOR


class ConnectionLost(TandemError):
    code = ErrorCode.CONNECTION_LOST


class Unblocked(ConnectionLost):
    """A call was in flight when its connection failed; its outcome is unknown."""

    code = ErrorCode.UNBLOCKED


class CallTimeout(TandemError):
    code = ErrorCode.TIMEOUT


class NotConnected(TandemError):
    code = ErrorCode.NOT_CONNECTED


class ShuttingDown(TandemError):
    code = ErrorCode.SHUTTING_DOWN


class NotActive(TandemError):
    """The server is a waiting backup (or stepping down): try its live server."""

    code = ErrorCode.NOT_ACTIVE


class LockLost(NotActive):
    """The server lost its live lock (its lock file went, or another server holds it): it stopped."""


class ConfigError(TandemError):
    code = ErrorCode.CONFIG


class JournalError(TandemError):
    code = ErrorCode.JOURNAL


class JournalIOError(JournalError):
    """The server's store hit an I/O error (a full or failing disk): it stopped, its backup takes over.

    Whatever was not confirmed before it may or may not have been stored."""

    code = ErrorCode.IO_ERROR


MAX_ERROR_TEXT = 1000  # characters of an error message sent to a client or logged


def clip(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """`text` cut in the middle to about `limit` characters, so that a client's 1 MB name is not
    sent back or logged whole; its start and its end (what went wrong) stay."""
    if len(text) <= limit:
        return text
    tail = limit // 4
    head = limit - tail
    return f"{text[:head]}...[{len(text) - limit} characters left out]...{text[-tail:]}"


def wire_text(exc: TandemError) -> str:
    """The message sent to a client for `exc`, clipped; a DuplicateId's is whole (the client reads
    the refused dedup ids back from it, and they are the client's own, bounded by its frame)."""
    return exc.message if isinstance(exc, DuplicateId) else clip(exc.message)


_BY_CODE: dict[ErrorCode, type[TandemError]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, TandemError) and _cls is not TandemError:
        # The first class defined for a code wins (a subclass that reuses a code is not picked).
        _BY_CODE.setdefault(_cls.code, _cls)


def error_for(code: int, message: str) -> TandemError:
    """Rebuild the typed exception for a code received from the wire."""
    try:
        ecode = ErrorCode(code)
    except ValueError:
        return TandemError(f"unknown error code {code}: {message}")
    cls = _BY_CODE.get(ecode, TandemError)
    return cls(message, ecode)
