"""Large messages on a native connection: a body received in chunks, a body delivered in chunks.

Receiving: LARGE_BEGIN opens an upload (a `.part` file, store/large_messages.py), each
LARGE_CHUNK is checked (protocol/large.py) and written at once, LARGE_END syncs and renames
the file and only then routes the message, one command confirmed like a SEND. Nothing of the
body stays in memory beyond the chunk being written.

Delivering: `ChunkPump` reads the file a chunk at a time and writes while the socket takes
it (the transport's high-water mark is the flow control); the session delivers nothing else
until the last chunk is out, so a consumer gets a large message's chunks in one run. A range
read's answer names its large messages, whose bodies follow it the same way (`range_pumps`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

import msgspec

from ..core.message import Message, MessageRef
from ..errors import IllegalState, InternalError, InvalidArgument, ProtocolError, TandemError
from ..protocol import native as p
from ..protocol.large import ChunkCounter
from .audit import created_by_send
from .pacing import UPLOAD

if TYPE_CHECKING:
    from ..core.consumer import Consumer
    from ..store.large_messages import LargeUpload
    from .native import NativeSession

log = logging.getLogger("tandem.native")

MAX_DELIVERY_CHUNK = 1 << 20
CHUNKS_PER_PASS = 8  # chunks a pump writes before the loop gets a turn


class Upload:
    """A large message arriving on one session (at most one at a time)."""

    __slots__ = ("compressed", "counter", "error", "file", "message")

    def __init__(self, message: Message | None, file: LargeUpload | None, size: int, compressed: bool) -> None:
        self.message = message
        self.file = file
        self.counter = ChunkCounter(size)
        self.compressed = compressed
        self.error: TandemError | None = None  # refused at BEGIN or failed since: END answers this

    def discard(self) -> None:
        f, self.file = self.file, None
        if f is not None:
            f.discard()


def begin(session: NativeSession, pkt: p.LargeBegin) -> None:
    if session.upload is not None:
        raise ProtocolError("LARGE_BEGIN while a large message is still being sent on this channel")
    storage = session.conn.broker.storage
    large = getattr(storage, "large", None)
    message: Message | None = None
    error: TandemError | None = None
    try:
        message = Message.decode(session.core.postoffice.ids.next(), pkt.message, True)
        if len(msgspec.msgpack.decode(pkt.message, type=_BodyOnly).body):  # the header only, please
            raise InvalidArgument("a large message's LARGE_BEGIN must carry an empty body (the chunks hold it)")
        if large is None:
            raise IllegalState("this broker does not take large messages (no data directory)")
        session.core.authorize_send(message)  # before its body fills a file (and again when routed)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        error = InvalidArgument(f"malformed message: {exc}")
    except UnicodeDecodeError as exc:
        error = InvalidArgument(f"malformed message: a string is not valid UTF-8 ({exc.reason})")
    except TandemError as exc:
        error = exc
    file = None
    if error is None and message is not None and large is not None:
        try:
            file = large.upload(message.id)
        except OSError as exc:  # the store's failure: the broker stops (IO_ERROR)
            error = large.fail(exc)
        except TandemError as exc:  # it has failed already
            error = exc
    tx = session.core.tx
    if error is not None and tx is not None:  # a refused send rolls its transaction back, as a small one does
        tx.failure = tx.failure or error
    up = Upload(message if error is None else None, file, pkt.size, pkt.compressed)
    up.error = error
    session.upload = up


def chunk(session: NativeSession, pkt: p.LargeChunk) -> None:
    up = session.upload
    if up is None:
        raise ProtocolError("LARGE_CHUNK without a LARGE_BEGIN")
    up.counter.chunk(pkt.index, len(pkt.data))
    if up.file is None:
        return  # refused: the chunks are counted and dropped, END answers the error
    try:
        up.file.write(pkt.data)
        session.conn.broker.pacer.wrote(session.conn, UPLOAD)
    except OSError as exc:
        up.error = up.file.store.fail(exc)
        up.discard()


def end(session: NativeSession, pkt: p.LargeEnd) -> None:
    up = session.upload
    if up is None:
        raise ProtocolError("LARGE_END without a LARGE_BEGIN")
    session.upload = None
    try:
        up.counter.end(pkt.chunks, pkt.size)
    except ProtocolError:
        up.discard()
        raise
    if up.error is not None or up.file is None or up.message is None:
        up.discard()
        session.conn.command_failed(pkt, up.error or InternalError("large message lost its file"))
        return
    message = up.message
    file, up.file = up.file, None
    up.message = None
    Seal(session, pkt, message, file, up.compressed).start()


class Seal:
    """A complete body made durable off the event loop, then routed: its file synced (a thread),
    renamed (the loop), the directory synced (a thread), and only then the message routed and
    its record written. The connection handles nothing after the END meanwhile (`hold`), so the
    order of a session's sends is kept."""

    __slots__ = ("compressed", "file", "message", "pkt", "session")

    def __init__(
        self, session: NativeSession, pkt: p.LargeEnd, message: Message, file: LargeUpload, compressed: bool
    ) -> None:
        self.session = session
        self.pkt = pkt
        self.message = message
        self.file = file
        self.compressed = compressed

    def start(self) -> None:
        conn = self.session.conn
        conn.hold()
        self.session.sealing = True
        conn.loop.run_in_executor(None, self.file.sync_body).add_done_callback(self._synced)

    def _gone(self) -> bool:
        """The connection went meanwhile: the message is not routed (never confirmed) and its file
        goes; the session stays `sealing`, so it is never reattached as if the END were done."""
        if not self.session.conn.closed:
            return False
        self.file.discard()
        return True

    def _synced(self, fut: asyncio.Future[None]) -> None:
        if fut.cancelled():  # the broker stops: the next start removes the unrecorded file
            return
        exc = fut.exception()
        if self._gone():
            return
        if exc is None:
            try:
                self.file.rename()
            except OSError as e:
                exc = e
        if exc is not None:
            self._failed(exc)
            return
        self.session.conn.loop.run_in_executor(None, self.file.sync_dir).add_done_callback(self._dir_synced)

    def _dir_synced(self, fut: asyncio.Future[None]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if self._gone():
            return
        if exc is not None:
            self._failed(exc)
            return
        session = self.session
        message = self.message
        message.large = self.file.body(self.compressed)
        try:
            durable = session.core.send_message(message)
            created_by_send(session.core.postoffice.auto_created, session.conn.subject, session.conn.peer, "native")
        except TandemError as e:  # not routed: the message goes, and its file with it
            session.conn.command_failed(self.pkt, e)
            self._done()
            return
        except Exception as e:  # a bug: answered, and the connection goes on (never left holding)
            log.exception("error routing a large message from %s", session.conn.peer)
            session.conn.command_failed(self.pkt, InternalError(f"internal error: {e!r}"))
            self._done()
            return
        session.completed(self.pkt.cmd, durable)
        self._done()

    def _failed(self, exc: BaseException) -> None:
        self.file.discard()
        if isinstance(exc, OSError):  # the store's failure: the broker stops (IO_ERROR)
            error: TandemError = self.file.store.fail(exc)
        else:
            log.error("cannot store a large message: %s", exc)
            error = InternalError(f"cannot store a large message: {exc}")
        self.session.conn.command_failed(self.pkt, error)
        self._done()

    def _done(self) -> None:
        self.session.sealing = False
        self.session.conn.release()


def abort(session: NativeSession, pkt: p.LargeAbort) -> None:
    up, session.upload = session.upload, None
    if up is not None:
        up.discard()


class _BodyOnly(msgspec.Struct, array_like=True):
    address: Any = None
    durable: Any = None
    priority: Any = None
    expiration: Any = None
    timestamp: Any = None
    dedup_id: Any = None
    routing_type: Any = None
    properties: Any = None
    body: bytes = b""


# -------------------------------------------------------------- delivery
class BodyPump:
    """Writes one large message's chunks while the socket takes them, as DELIVER_CHUNKs keyed by
    `key` (a consumer's id, or minus a READ_RANGE's command id)."""

    __slots__ = ("compressed", "fd", "index", "key", "message", "offset", "ready", "session", "size")

    def __init__(self, session: NativeSession, key: int, message: Message) -> None:
        lg = message.large
        assert lg is not None
        self.session = session
        self.key = key
        self.message = message  # holds the body (and its file) until the last chunk is out
        self.size = lg.size
        self.compressed = lg.compressed
        storage: Any = session.conn.broker.storage
        self.fd: int | None = os.open(storage.large.path(lg.name), os.O_RDONLY)
        self.offset = 0
        self.index = 0
        self.ready = True

    def _gone(self) -> bool:
        return False

    def pump(self) -> bool:
        """Write chunks while the socket takes them; True once the last is out (or the pump stopped)."""
        fd = self.fd
        if fd is None:
            return True
        if not self.ready:
            return False  # its header is not out yet: whoever makes it ready pumps again
        s = self.session
        conn = s.conn
        if conn.closed or self._gone():
            self.stop()
            return True
        step = min(conn.broker.config.min_large_message_size, MAX_DELIVERY_CHUNK)
        for _ in range(CHUNKS_PER_PASS):
            if not conn.writable:
                return False
            data = os.pread(fd, min(step, self.size - self.offset), self.offset)
            if self.offset + len(data) < self.size and not data:
                log.error("large message %s: its file ends at %d of %d bytes", self.message.id, self.offset, self.size)
                conn.fatal(InternalError(f"large message {self.message.id} cannot be read whole"))
                self.stop()
                return True
            self.offset += len(data)
            last = self.offset >= self.size
            conn.write_now(p.encode(p.DeliverChunk(s.channel, self.key, self.message.id, self.index, data, last)))
            self.index += 1
            if last:
                self.stop()
                return True
        s.pump_soon()
        return False

    def stop(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class ChunkPump(BodyPump):
    """One large message going to a consumer: its DELIVER_LARGE now, its chunks as the socket takes them."""

    __slots__ = ("consumer",)

    def __init__(self, session: NativeSession, consumer: Consumer, ref: MessageRef) -> None:
        super().__init__(session, consumer.id, ref.message)
        self.consumer = consumer
        m = ref.message
        lg = m.large
        assert lg is not None
        session.conn.write(
            p.encode(
                p.DeliverLarge(
                    session.channel,
                    consumer.id,
                    m.id,
                    ref.delivery_count + 1,
                    ref.seq,
                    _raw(m.raw),
                    lg.size,
                    lg.compressed,
                )
            )
        )

    def _gone(self) -> bool:
        return self.consumer.closed


# ---------------------------------------------------------- range reads
RANGE_LARGE_BYTES = 8 << 20  # large bodies one RANGE_RESULT carries (at least one, whatever its size)


def cut_range(refs: list[MessageRef]) -> tuple[list[MessageRef], bool]:
    """The refs one RANGE_RESULT carries: up to the large message whose body takes the answer's
    large bytes to RANGE_LARGE_BYTES; and whether refs were left for the next READ_RANGE."""
    total = 0
    for i, r in enumerate(refs):
        lg = r.message.large
        if lg is not None:
            total += lg.size
            if total >= RANGE_LARGE_BYTES:
                return refs[: i + 1], i + 1 < len(refs)
    return refs, False


class RangePump(BodyPump):
    """A large body following a range read's answer: ready once the answer is out. Nothing is
    lost if it stops half way (the link failed): the reader reads the range again."""

    __slots__ = ()

    def __init__(self, session: NativeSession, cmd: int, message: Message) -> None:
        super().__init__(session, -cmd, message)
        self.ready = False


def range_pumps(session: NativeSession, cmd: int, refs: list[MessageRef]) -> list[tuple[int, RangePump]]:
    """A pump (not ready yet) per large message of a range read's answer, with its index there;
    each holds the message, so its file stays while the body goes out (an ACK_UP_TO meanwhile
    removes it after the last chunk)."""
    pumps: list[tuple[int, RangePump]] = []
    try:
        for i, r in enumerate(refs):
            if r.message.large is not None:
                pumps.append((i, RangePump(session, cmd, r.message)))
    except OSError as exc:  # its file is gone: never a message without its body
        for _, pump in pumps:
            pump.stop()
        log.error("a large message cannot be read for a range read: %s", exc)
        raise InternalError(f"a large message of the range cannot be read: {exc}") from exc
    return pumps


def _raw(raw: msgspec.Raw | bytes) -> msgspec.Raw:
    return raw if isinstance(raw, msgspec.Raw) else msgspec.Raw(raw)
