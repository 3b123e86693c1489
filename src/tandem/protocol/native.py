"""The native wire protocol (sans-IO): length-prefixed frames of msgpack packets.

A connection starts with the 4-byte magic ``TNDM`` from the client, then
frames flow both ways: ``u32 length`` + a msgpack array whose first element is
the packet tag (msgspec tagged unions do the dispatch in C).

Channel 0 is the connection itself; every session is a channel. Each client
command on a channel carries a monotonic command id. The server answers calls
with RESPONSE/EXCEPTION and confirms pipelined commands (SEND, ACK) with
CONFIRM(upto): every command id up to `upto` on that channel is done and
durable. These ids are what a later reattach replays from.
"""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import msgspec

from ..errors import ErrorCode, FrameTooLarge, ProtocolError, UnknownPacket, VersionMismatch
from .fileops import FileOp, problem

MAGIC = b"TNDM"
PROTOCOL_VERSION = 1
LENGTH = struct.Struct("<I")


class Packet(msgspec.Struct, array_like=True, gc=False, tag_field="t"):
    pass


# ---------------------------------------------------------------- connection
class Hello(Packet, tag=1):
    version: int
    client_id: str | None = None
    username: str | None = None
    password: str | None = None
    client_name: str = ""
    connection_ttl: int = -1  # ms; -1: the broker's connection-ttl
    # Reattachment (confirmation window on): the server keeps this connection's sessions for the
    # TTL after the socket fails, and confirms commands every `confirmation_window` bytes (RECEIVED).
    confirmation_window: int = -1
    connection_id: str = ""


class HelloOk(Packet, tag=2):
    version: int
    server_name: str
    node_id: str
    connection_ttl: int
    topology: list[Any] = []
    active: bool = True  # False: a waiting backup; it sends ACTIVATED if it takes over


class Ping(Packet, tag=3):
    pass


class Pong(Packet, tag=4):
    pass


class Error(Packet, tag=5):
    """Connection-fatal error; the sender closes the connection after it."""

    code: int
    message: str


class Disconnect(Packet, tag=6):
    pass


class Topology(Packet, tag=7):
    nodes: list[Any]


class Activated(Packet, tag=8):
    """A waiting server has taken over and now serves; the topology as it now stands."""

    nodes: list[Any]


# ------------------------------------------------------------------ sessions
class CreateSession(Packet, tag=10):
    channel: int
    cmd: int
    transacted: bool = False
    name: str = ""


class CloseSession(Packet, tag=11):
    channel: int
    cmd: int
    # consumer id -> ids of messages it received but never handed to the application: they
    # go back without counting as a failed delivery (see CloseConsumer)
    unseen: dict[int, list[int]] = {}
    # consumer id -> deliveries it received (-1 or absent: not said); those sent after are in flight
    received: dict[int, int] = {}


class Send(Packet, tag=12):
    channel: int
    cmd: int
    message: msgspec.Raw


class CreateConsumer(Packet, tag=13):
    channel: int
    cmd: int
    consumer_id: int
    queue: str
    filter: str | None = None
    window: int = -2  # -2: the broker's default-consumer-window-size
    browse_only: bool = False


class CloseConsumer(Packet, tag=14):
    channel: int
    cmd: int
    consumer_id: int
    unseen: list[int] = []  # still in the client's buffer: returned without a delivery count + 1
    received: int = -1  # deliveries it received; those sent after were in flight: unseen too (-1: not said)


class Flow(Packet, tag=15):
    channel: int
    consumer_id: int
    credits: int


class Ack(Packet, tag=16):
    channel: int
    cmd: int
    consumer_id: int
    message_id: int
    cumulative: bool = True


class Commit(Packet, tag=17):
    """Commit the session's transaction; a `dedup_id` already committed makes it a no-op
    (the RESPONSE's result is then True instead of None). `retry`: a client's retry_commit,
    after a commit under that id whose outcome it never learned. A retry with nothing in its
    transaction that takes the id is noted as such, and a later retry that finds it gets None
    (nothing of the first attempt applied), not True (decision 0084)."""

    channel: int
    cmd: int
    dedup_id: str | None = None
    retry: bool = False


class Rollback(Packet, tag=18):
    channel: int
    cmd: int


class Nack(Packet, tag=19):
    """Negative acknowledgement of one message: redelivery after a delay, or dead letter."""

    channel: int
    cmd: int
    consumer_id: int
    message_id: int


class RequestCredits(Packet, tag=21):
    """Producer flow control: answered with the bytes granted (-1: no limit on this address)."""

    channel: int
    cmd: int
    address: str
    amount: int


class ReadRange(Packet, tag=22):
    """Messages of `queue` with start < seq <= end, in order, not consumed (at most `limit`; -1: all)."""

    channel: int
    cmd: int
    queue: str
    start: int
    end: int
    limit: int = -1


class AckUpTo(Packet, tag=23):
    """Acknowledge every message of `queue` with a sequence up to `seq` (answered after fsync)."""

    channel: int
    cmd: int
    queue: str
    seq: int


class ReattachChannel(msgspec.Struct, array_like=True, gc=False):
    """What the client holds of one channel: the first command it still awaits an answer or a
    confirmation for (-1: none), and per consumer (id, deliveries received, credits granted)."""

    channel: int
    awaited_from: int = -1
    consumers: list[tuple[int, int, int]] = []


class Reattach(Packet, tag=24):
    """Sent right after HELLO: take over the sessions of the failed connection `connection_id`
    (answered by REATTACHED). See docs/decisions/0038-session-reattachment.md."""

    connection_id: str
    channels: list[ReattachChannel] = []


# Large messages (docs/protocol.md): a body over the client's min-large-message-size goes as
# LARGE_BEGIN (the message without its body), LARGE_CHUNKs numbered from 0, and LARGE_END, the
# one command of the three (confirmed like a SEND). One large send at a time per channel.
class LargeBegin(Packet, tag=25):
    channel: int
    message: msgspec.Raw  # MessageData with an empty body
    size: int = -1  # the body's size when known (-1: not known until LARGE_END)
    compressed: bool = False  # the chunks are a zlib stream (the client compressed the body)


class LargeChunk(Packet, tag=26):
    channel: int
    index: int  # 0, 1, 2...: a gap or repeat is a protocol error
    data: bytes


class LargeEnd(Packet, tag=27):
    """The body is complete: `chunks` chunks of `size` bytes in all (checked by the broker)."""

    channel: int
    cmd: int
    chunks: int
    size: int


class LargeAbort(Packet, tag=28):
    """The client gives up the large send in progress (its source failed): the broker discards it."""

    channel: int


class Manage(Packet, tag=20):
    """An administrative call: `op` names it, `args` are its keyword arguments."""

    channel: int
    cmd: int
    op: str
    args: dict[str, Any] = {}


# ------------------------------------------------------------ server replies
class Confirm(Packet, tag=30):
    channel: int
    upto: int


class Response(Packet, tag=31):
    channel: int
    cmd: int
    result: Any = None


class Exception_(Packet, tag=32):
    channel: int
    cmd: int
    code: int
    message: str


class Deliver(Packet, tag=33):
    channel: int
    consumer_id: int
    message_id: int
    delivery_count: int
    seq: int
    message: msgspec.Raw


class RangeResult(Packet, tag=35):
    """The answer to READ_RANGE: the queue's first and last sequence now, and [seq, id, delivery count, message].

    A large message is in `messages` with an empty body and named in `large` as (its index in
    `messages`, its body's bytes as stored, compressed); its body follows, in that order, as
    DELIVER_CHUNKs whose `consumer_id` is minus this READ_RANGE's `cmd`. `more`: the answer
    stopped early (after large bodies); the rest of the range is there to ask for."""

    channel: int
    cmd: int
    first_seq: int
    last_seq: int
    messages: list[tuple[int, int, int, msgspec.Raw]]
    large: list[tuple[int, int, bool]] = []
    more: bool = False


class Reattached(Packet, tag=36):
    """The answer to REATTACH. `ok`: the sessions are this connection's now, and `last` holds, per
    channel the client named, the last command id the server has received on it (0: none); the
    client replays the commands after it. Not ok: the sessions are gone (`reason`); start afresh."""

    ok: bool
    last: dict[int, int] = {}
    reason: str = ""


class Received(Packet, tag=37):
    """Every command up to `upto` on `channel` has reached the server (confirmation window): the
    client may drop them from its resend buffer. Sent each time the window's bytes have arrived."""

    channel: int
    upto: int


class DeliverLarge(Packet, tag=38):
    """A large message's header; its body follows as DELIVER_CHUNKs for the same consumer and
    message, before anything else for that consumer."""

    channel: int
    consumer_id: int
    message_id: int
    delivery_count: int
    seq: int
    message: msgspec.Raw  # MessageData with an empty body
    size: int  # the body's bytes as stored (compressed, if it is)
    compressed: bool = False


class DeliverChunk(Packet, tag=39):
    channel: int
    consumer_id: int
    message_id: int
    index: int
    data: bytes
    last: bool = False


class ConsumerClosed(Packet, tag=34):
    channel: int
    consumer_id: int
    code: int
    message: str


# --------------------------------------------------------------- replication
# A backup connects like a client (HELLO), then asks to replicate; the primary streams its
# store's file operations (journal/fileops.py) to it. See ha/replication.py and docs/ha.md.
class ReplicaStart(Packet, tag=40):
    """A backup asks to replicate this server's store (authenticated with the cluster pair)."""

    user: str
    password: str
    connector: str  # where clients reach the backup (the primary tells them)
    group_name: str | None = None
    store_format: int = 0  # the newest store format the backup reads (0: a backup from before decision 0086)


class ReplicaAck(Packet, tag=41):
    """The backup has applied (and, with backup-fsync, synced) the stream up to `position`."""

    position: int


class ReplicaSynced(Packet, tag=42):
    """The backup holds the whole store as of `position` (the end of the initial sync), on disk."""

    position: int


class ReplicaAccept(Packet, tag=43):
    """The primary takes the backup on; the initial sync follows."""

    node_id: str
    backup_fsync: bool = True
    # The primary's activation sequence as it takes the backup on (-1: no coordinator). Every
    # earlier drop is in it, no drop of this link is: the value an in-sync replica may hold.
    activation_sequence: int = -1


class ReplicaSyncStart(Packet, tag=44):
    """What the initial sync will copy: so many files, so many bytes (for `syncing N%`)."""

    files: int
    total_bytes: int


class ReplicaOps(Packet, tag=45):
    """File operations on one store directory (`kind`), in order; `ops` is a msgpack array of
    FileOp checked by `crc` (crc32c). `position` 0: part of the initial copy, nothing to acknowledge."""

    position: int
    kind: str
    crc: int
    ops: msgspec.Raw


class ReplicaSyncDone(Packet, tag=46):
    """Every file is copied and the stream caught up to `position`: answer REPLICA_SYNCED once it is on disk."""

    position: int


class ReplicaStop(Packet, tag=47):
    """The primary ends the replication: it stops (`failover`: the backup takes over), or it
    drops this backup (it carries on alone; the backup starts again from scratch)."""

    failover: bool
    reason: str


class ReplicaFailback(Packet, tag=48):
    """A returning primary, in sync as this server's backup, asks it to hand the node back (failback)."""


ClientPacket = (
    Hello
    | Ping
    | Pong
    | Error
    | Disconnect
    | CreateSession
    | CloseSession
    | Send
    | CreateConsumer
    | CloseConsumer
    | Flow
    | Ack
    | Manage
    | Commit
    | Rollback
    | Nack
    | RequestCredits
    | ReadRange
    | AckUpTo
    | Reattach
    | LargeBegin
    | LargeChunk
    | LargeEnd
    | LargeAbort
    | ReplicaStart
    | ReplicaAck
    | ReplicaSynced
    | ReplicaFailback
)
ServerPacket = (
    HelloOk
    | Ping
    | Pong
    | Error
    | Topology
    | Activated
    | Confirm
    | Response
    | Exception_
    | Deliver
    | DeliverLarge
    | DeliverChunk
    | ConsumerClosed
    | RangeResult
    | Reattached
    | Received
    | ReplicaAccept
    | ReplicaSyncStart
    | ReplicaOps
    | ReplicaSyncDone
    | ReplicaStop
)

CLIENT_TAGS = {c.__struct_config__.tag for c in ClientPacket.__args__}
SERVER_TAGS = {c.__struct_config__.tag for c in ServerPacket.__args__}


class _Head(msgspec.Struct, array_like=True):
    """A packet's tag alone (the fields after it are skipped): to name what was malformed."""

    tag: Any


_head_decoder = msgspec.msgpack.Decoder(_Head)


def bad_text(exc: UnicodeDecodeError) -> str:
    """The message for text that is not UTF-8 (msgpack strings must be; bytes go as bin)."""
    return f"a string is not valid UTF-8 ({exc.reason} at byte {exc.start})"


class FrameReader:
    """Splits a byte stream into packets; raises ProtocolError subclasses on bad input."""

    __slots__ = ("_buf", "_decoder", "_first_limit", "_known", "_need", "_need_magic", "_started", "max_frame_size")

    def __init__(
        self, packet_type: Any, max_frame_size: int, expect_magic: bool, first_frame_limit: int | None = None
    ) -> None:
        self._buf = bytearray()
        self._decoder = msgspec.msgpack.Decoder(packet_type)
        self._known = CLIENT_TAGS if packet_type is ClientPacket else SERVER_TAGS
        self._need_magic = expect_magic
        self._need = 0  # bytes the buffered partial frame needs before it is worth parsing
        self.max_frame_size = max_frame_size
        # The first frame (a server's HELLO, from a client not logged in yet) may be held to less.
        self._first_limit = min(first_frame_limit or max_frame_size, max_frame_size)
        self._started = False

    def feed(self, data: bytes) -> list[Any]:
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return []  # a large frame still arriving: no copy, no parse (else quadratic)
            data = bytes(buf)  # frames are sliced out of immutable bytes: one copy each
            buf.clear()
        self._need = 0
        pos = 0
        if self._need_magic:
            if len(data) < len(MAGIC):
                if not MAGIC.startswith(data):
                    raise ProtocolError("not a Tandem native client (bad magic)")
                buf += data
                return []
            if data[: len(MAGIC)] != MAGIC:
                raise ProtocolError("not a Tandem native client (bad magic)")
            pos = len(MAGIC)
            self._need_magic = False
        out: list[Any] = []
        end = len(data)
        unpack = LENGTH.unpack_from
        decode = self._decoder.decode
        full = self.max_frame_size
        limit = full if self._started else self._first_limit
        while end - pos >= 4:
            (n,) = unpack(data, pos)
            if n > limit:
                if limit == full:
                    raise FrameTooLarge(f"frame of {n} bytes exceeds max-frame-size {limit}")
                raise FrameTooLarge(f"frame of {n} bytes exceeds {limit}, the limit before the handshake")
            if n == 0:
                raise ProtocolError("empty frame")
            if end - pos - 4 < n:
                self._need = 4 + n
                break
            payload = data[pos + 4 : pos + 4 + n]
            pos += 4 + n
            try:
                out.append(decode(payload))
            except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
                raise self._classify(payload, exc) from None
            except RecursionError:
                raise ProtocolError("malformed frame: nested too deeply") from None
            limit = full
        if out:
            self._started = True
        if pos < end:
            buf += data[pos:] if pos else data
        return out

    def _classify(self, payload: bytes, exc: Exception) -> ProtocolError:
        detail = bad_text(exc) if isinstance(exc, UnicodeDecodeError) else str(exc)
        try:
            tag = _head_decoder.decode(payload).tag  # the rest is skipped, not decoded: it may be the bad part
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            return ProtocolError(f"malformed frame: {detail}")
        if isinstance(tag, int):
            if tag not in self._known:
                return UnknownPacket(f"unknown packet type {tag}")
            return ProtocolError(f"malformed packet type {tag}: {detail}")
        return ProtocolError(f"malformed frame: {detail}")

    @property
    def buffered(self) -> int:
        return len(self._buf)


_encoder = msgspec.msgpack.Encoder()
_pack_len = LENGTH.pack


_encode_into = _encoder.encode_into
_pack_len_into = LENGTH.pack_into


def encode(packet: Packet) -> bytearray:
    """One frame: the packet encoded straight after a 4-byte length, in one buffer."""
    buf = bytearray(4)
    _encode_into(packet, buf, 4)
    _pack_len_into(buf, 0, len(buf) - 4)
    return buf


def encode_many(packets: list[Packet]) -> bytes:
    parts: list[bytes] = []
    for p in packets:
        payload = _encoder.encode(p)
        parts.append(_pack_len(len(payload)))
        parts.append(payload)
    return b"".join(parts)


def check_version(hello: Hello) -> None:
    if hello.version != PROTOCOL_VERSION:
        raise VersionMismatch(f"client speaks version {hello.version}, server speaks {PROTOCOL_VERSION}")


def error_packet(code: ErrorCode | int, message: str) -> Error:
    return Error(int(code), message)


class SendData(Packet, tag=12):
    """Client-side twin of :class:`Send`: encodes the message struct in place, no second pass."""

    channel: int
    cmd: int
    message: Any


_ops_decoder = msgspec.msgpack.Decoder(list[FileOp])


def encode_ops(position: int, kind: str, ops: list[FileOp]) -> bytearray:
    """One REPLICA_OPS frame: the operations encoded once, checksummed, and framed."""
    blob = _encoder.encode(ops)
    return encode(ReplicaOps(position, kind, crc32c.crc32c(blob), msgspec.Raw(blob)))


def decode_ops(pkt: ReplicaOps) -> list[FileOp]:
    """The operations of a REPLICA_OPS, checked: its checksum, their types, and that each names
    a plain file of a known store directory (ProtocolError otherwise)."""
    if crc32c.crc32c(pkt.ops) != pkt.crc:
        raise ProtocolError(f"replication record for {pkt.kind!r} at position {pkt.position}: checksum mismatch")
    try:
        ops = _ops_decoder.decode(pkt.ops)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
        detail = bad_text(exc) if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise ProtocolError(f"malformed replication record: {detail}") from None
    except RecursionError:
        raise ProtocolError("malformed replication record: nested too deeply") from None
    for op in ops:
        why = problem(pkt.kind, op)
        if why is not None:
            raise ProtocolError(f"bad replication record: {why}")
    return ops
