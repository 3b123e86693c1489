"""Native protocol connections: bytes in → packets → core; coalesced bytes out.

One `asyncio.Protocol` per client, no task per message. Everything a read
callback produces (confirms, responses, deliveries) is appended to one output
list and written with a single `transport.write` per loop pass.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import msgspec

from ..config import HANDSHAKE_FRAME_LIMIT
from ..core.consumer import Consumer, DeliveryAccount
from ..core.dedup import tx_key
from ..core.message import MessageRef
from ..core.permissions import Access, Permission
from ..core.session import ServerSession
from ..errors import (
    DuplicateId,
    ErrorCode,
    IllegalState,
    InternalError,
    ProtocolError,
    ResourceLimit,
    SessionDoesNotExist,
    TandemError,
    Unauthorized,
    clip,
    wire_text,
)
from ..protocol import native as p
from . import large
from .audit import audit, created_by_send
from .audit import enabled as audit_enabled
from .authorization import access_for
from .limits import REFUSED_LINGER, OutputWatch, abort_later
from .link_writer import LinkWriter
from .pacing import BACKUP_LINK, page_mark
from .reattach import (
    CLOSED_REPLIES_KEPT,
    COMMAND_SIZE,
    SEND_OVERHEAD,
    SERVER_CLOSED_KEPT,
    ChannelReplay,
    take_lost_deliveries,
    trim_closed,
)
from .security import ANONYMOUS, Subject
from .tls import cert_user

if TYPE_CHECKING:
    from ..core.address import Address
    from ..core.queue import Queue
    from .context import BrokerContext

log = logging.getLogger("tandem.native")

HIGH_WATER = 1 << 22  # bytes queued in the transport before we stop reading and delivering
LOW_WATER = 1 << 20
_SEND = p.Send
_LARGE_END = p.LargeEnd
MAX_CREDIT_WAITS = 256  # credit requests one connection may have waiting on one full address
PACKETS_PER_PASS = 128  # packets of one read handled before the loop gets a turn (see `_handle`)

_encode = p.encode
_pack_len = p.LENGTH.pack


class NativeSession:
    """Per-channel state: in-order confirmation of pipelined commands."""

    __slots__ = (
        "_pump_soon",
        "batch_upto",
        "channel",
        "conn",
        "core",
        "dirty",
        "pending_durable",
        "sealing",
        "storage",
        "streams",
        "sync",
        "upload",
    )

    def __init__(self, conn: NativeConnection, channel: int, core: ServerSession) -> None:
        self.conn = conn
        self.channel = channel
        self.core = core
        self.storage = conn.broker.storage
        self.sync = conn.broker.config.journal_sync_non_transactional
        self.batch_upto = 0
        self.pending_durable = 0
        self.dirty = False
        self.upload: large.Upload | None = None  # a large message arriving
        # A large body complete, its file being synced off the loop (or lost with the connection
        # before it was routed): a reattach cannot resume this session (its END would count as done).
        self.sealing = False
        self.streams: list[large.BodyPump] = []  # large messages going out (the first is writing)
        self._pump_soon = False

    # Confirmation ordering: a command is confirmed only after every earlier one.
    def completed(self, cmd: int, durable: bool) -> None:
        if (durable and self.sync) or self.pending_durable or self.batch_upto:
            self.batch_upto = cmd
            if not self.dirty:
                self.dirty = True
                self.conn.touched.append(self)
        else:
            self.conn.confirm(self.channel, cmd)

    def end_of_batch(self) -> None:
        self.dirty = False
        upto = self.batch_upto
        if upto:
            self.batch_upto = 0
            self.pending_durable += 1
            self.storage.after_durable(partial(self._durable_done, upto))

    def _durable_done(self, upto: int) -> None:
        self.pending_durable -= 1
        if not self.conn.closed:
            self.conn.confirm(self.channel, upto)

    # DeliverySink
    @property
    def writable(self) -> bool:
        return self.conn.writable and not self.streams  # a large message's chunks go out in one run

    def deliver(self, consumer: Consumer, ref: MessageRef) -> None:
        m = ref.message
        if m.large is not None:
            try:
                self.streams.append(large.ChunkPump(self, consumer, ref))
            except OSError as exc:  # its file is gone: never deliver part of a message
                log.error("large message %s cannot be delivered: %s", m.id, exc)
                self.conn.fatal(InternalError(f"large message {m.id} cannot be read: {exc}"))
                return
            self.pump_streams()
            return
        self.conn.write(
            _encode(p.Deliver(self.channel, consumer.id, m.id, ref.delivery_count + 1, ref.seq, m.raw))  # type: ignore[arg-type]
        )

    def pump_streams(self) -> None:
        """Write large messages' chunks while the socket takes them; the queues go on after the last."""
        self._pump_soon = False
        streams = self.streams
        while streams:
            if not streams[0].pump():
                return
            streams.pop(0)
        if not self.conn.closed:
            for c in self.core.consumers.values():
                c.queue.deliver_soon()

    def pump_soon(self) -> None:
        if not self._pump_soon:
            self._pump_soon = True
            self.conn.loop.call_soon(self.pump_streams)

    def drop_range_bodies(self) -> None:
        """A reattach: range reads' bodies still going out stop (their reader lost its link and
        reads again); a consumer's large delivery in transfer refuses the reattach instead."""
        kept = []
        for pump in self.streams:
            if isinstance(pump, large.RangePump):
                pump.stop()
            else:
                kept.append(pump)
        self.streams[:] = kept

    def drop_large(self) -> None:
        """The session ends: an upload in progress is discarded, deliveries in progress stop."""
        up, self.upload = self.upload, None
        if up is not None:
            up.discard()
        for pump in self.streams:
            pump.stop()
        self.streams.clear()

    def consumer_closed(self, consumer: Consumer, error: TandemError) -> None:
        self.core.forget_consumer(consumer)
        if not self.conn.closed:
            self.conn.write(_encode(p.ConsumerClosed(self.channel, consumer.id, int(error.code), wire_text(error))))


class TrackedSession(NativeSession):
    """A session of a reattachable connection: it counts deliveries sent and credit granted
    per consumer, so a reattach can tell what the client never got (server/reattach.py)."""

    __slots__ = ("flowed", "sent", "server_closed")

    def __init__(self, conn: NativeConnection, channel: int, core: ServerSession) -> None:
        super().__init__(conn, channel, core)
        self.sent: dict[int, int] = {}
        self.flowed: dict[int, int] = {}
        self.server_closed: OrderedDict[int, p.ConsumerClosed] = OrderedDict()  # may be lost on the wire

    def consumer_closed(self, consumer: Consumer, error: TandemError) -> None:
        self.server_closed[consumer.id] = p.ConsumerClosed(self.channel, consumer.id, int(error.code), wire_text(error))
        while len(self.server_closed) > SERVER_CLOSED_KEPT:
            self.server_closed.popitem(last=False)
        NativeSession.consumer_closed(self, consumer, error)

    def deliver(self, consumer: Consumer, ref: MessageRef) -> None:
        sent = self.sent
        sent[consumer.id] = sent.get(consumer.id, 0) + 1
        NativeSession.deliver(self, consumer, ref)

    def resume(self, consumers: list[tuple[int, int, int]]) -> None:
        """After a reattach: deliveries the client never received go back to their queue (not a
        failed delivery: their count stays), credit it granted in lost FLOWs is added."""
        for cid, received, flowed in consumers:
            c = self.core.consumers.get(cid)
            if c is None:
                closed = self.server_closed.get(cid)
                if closed is not None:  # the client still has it: it never heard
                    self.conn.write(_encode(closed))
                continue
            lost = self.sent.get(cid, 0) - received
            if lost > 0:
                self.sent[cid] = received
                refs = take_lost_deliveries(c, lost)
                if refs:
                    c.queue.cancel(refs, redeliver_delay=False, unseen={r.message.id for r in refs})
            extra = flowed - self.flowed.get(cid, 0)
            if extra > 0:
                self.flowed[cid] = flowed
                c.add_credits(extra)
            c.queue.deliver_soon()


class NativeConnection(asyncio.Protocol):
    def __init__(self, broker: BrokerContext, acceptor: str) -> None:
        self.broker = broker
        self.acceptor = acceptor
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.reader = p.FrameReader(
            p.ClientPacket, broker.config.max_frame_size, expect_magic=True, first_frame_limit=HANDSHAKE_FRAME_LIMIT
        )
        self.sessions: dict[int, NativeSession] = {}
        self.touched: list[NativeSession] = []
        self._rest: tuple[list[Any], int] | None = None  # packets of a read not handled yet
        self._slicing = False  # reading paused until `_rest` is handled
        self.holding = False  # a handler waits for a thread (a large body's sync): the packets after it wait too
        self.paced = False  # not read while a backup link is full (a large upload, server/pacing.py)
        self.handshaken = False
        self.closed = False
        self.writable = True
        self.peer = "?"
        self.cert_user: str | None = None  # the user a verified client certificate maps to
        self.client_id: str | None = None
        self.temp_queues: set[str] = set()
        self._out: list[bytes | bytearray] = []
        self._confirms: dict[int, int] = {}
        self._flush_scheduled = False
        self.last_received = self.loop.time()
        self.last_sent = self.last_received
        self.opened_at = self.last_received  # the handshake must be done by handshake-timeout after this
        self.partial_since: float | None = None  # when the packet not complete yet began to arrive
        self.ttl_ms = broker.config.effective_ttl_ms
        self.replica: Any = None  # a backup replicating over this connection (ha/source.py's BackupStream)
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._credit_waits: dict[Address, int] = {}  # credit requests waiting on full addresses
        self._writer: LinkWriter | None = None  # writes from threads (a backup's link), see write_from_threads
        self.username: str | None = None
        self.subject: Subject = ANONYMOUS  # who logged in (server/security.py), from HELLO
        self._login: asyncio.Task[Subject | None] | None = None  # HELLO's password check (held meanwhile)
        self.access: Access | None = None  # what the subject may do (None: security off), decision 0060
        # Reattachment (server/reattach.py): on with a confirmation window from the client.
        self.window = -1
        self.connection_id = ""
        self.replay: dict[int, ChannelReplay] = {}
        self.detached = False  # socket gone, sessions kept until the TTL expires
        self.top_channel = 0  # the highest session channel created: a lower one not in `replay` was forgotten
        self.successor: NativeConnection | None = None  # the connection that reattached our sessions
        cfg = broker.config
        # Limits (server/limits.py, decision 0062): unacknowledged deliveries across its consumers,
        # output a client does not read.
        self.delivery_account = DeliveryAccount(cfg.max_unacked_messages, cfg.max_unacked_bytes, self._room)
        self.output_watch = OutputWatch(cfg.slow_client_timeout / 1000)
        self.counted: tuple[str, str] | None = None  # (acceptor, peer host) in the broker's connection counts
        self.counted_user: str | None = None

    # ----------------------------------------------------------- transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        transport = self.transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.cert_user = cert_user(self.broker.config, transport)  # mutual TLS (server/tls.py)
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        refused = self.broker.limits.admit(self)
        if refused is not None:
            # ERROR at once; what the client sends meanwhile (its HELLO) is read and dropped, so the
            # close does not reset the connection before the client has read why.
            log.info("refused connection from %s: %s", self.peer, refused.message)
            self.closed = True
            transport.write(_encode(p.error_packet(refused.code, wire_text(refused))))
            self.loop.call_later(REFUSED_LINGER, transport.close)
            self.loop.call_later(2 * REFUSED_LINGER, transport.abort)
            return
        self.broker.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown(detach=True)

    def _room(self) -> None:
        """(DeliveryAccount) acknowledgements made room under the unacked limit: deliver again."""
        if self.closed:
            return
        for s in list(self.sessions.values()):
            for c in s.core.consumers.values():
                c.queue.deliver_soon()

    def pause_writing(self) -> None:
        self.writable = False
        if self.replica is not None:  # a backup's link: large uploads wait (server/pacing.py)
            self.broker.pacer.full(BACKUP_LINK, True)
        # A backup's acknowledgements are what frees the stream: keep reading them.
        if self.transport is not None and self.replica is None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writable = True
        if self.replica is not None:
            self.broker.pacer.full(BACKUP_LINK, False)
        waiters, self._drain_waiters = self._drain_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        if self.transport is not None and not self.closed and not self._slicing and not self.paced:
            self.transport.resume_reading()
        for s in list(self.sessions.values()):
            if s.streams:
                s.pump_streams()
                continue
            for c in s.core.consumers.values():
                c.queue.deliver_soon()

    async def drained(self) -> None:
        """Until the transport takes writes again (at once if it does)."""
        if self.writable or self.closed:
            return
        fut = self.loop.create_future()
        self._drain_waiters.append(fut)
        await fut

    # -------------------------------------------------------------- output
    def write(self, data: bytes | bytearray) -> None:
        if self._writer is not None:
            self._writer.write(data)
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def write_now(self, data: bytes | bytearray) -> None:
        self._out.append(data)
        self._flush()

    def write_from_threads(self) -> Callable[[bytes | bytearray], None] | None:
        """From now on every write of this connection goes out through a thread of its own
        (server/link_writer.py); returns the function any thread may write with. None when the
        transport still holds bytes (they would be overtaken): the loop keeps writing then."""
        if self._writer is None:
            t = self.transport
            if t is None or t.is_closing() or self.closed:
                return None
            self._flush()
            sock = t.get_extra_info("socket")
            if t.get_write_buffer_size() or sock is None or t.get_extra_info("ssl_object") is not None:
                return None
            self._writer = LinkWriter(
                sock.fileno(), self.loop, HIGH_WATER, LOW_WATER, self.pause_writing, self.resume_writing, self._failed
            )
        return self._writer.write

    def _failed(self, exc: OSError) -> None:
        if self.transport is not None:
            self.transport.abort()

    def send(self, packet: p.Packet) -> None:
        conn = self
        while conn.successor is not None:  # answers to commands taken over by a reattach
            conn = conn.successor
        if conn.window > 0:
            t = type(packet)
            if t is p.Response or t is p.Exception_ or t is p.RangeResult:
                r = conn.replay.get(packet.channel)  # type: ignore[attr-defined]
                if r is not None:
                    r.keep(packet.cmd, packet)  # type: ignore[attr-defined]
        if not conn.closed:
            conn.write(_encode(packet))

    def confirm(self, channel: int, upto: int) -> None:
        # Confirmations are cumulative, and may come out of order (a slice whose wait went through
        # the bindings journal runs after a later slice's): a lower one never undoes a higher one.
        # Each waited for everything stored before it, so the highest covers the lower ones.
        confirms = self._confirms
        if upto > confirms.get(channel, 0):
            confirms[channel] = upto
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if self._confirms:
            for ch, upto in self._confirms.items():
                out.append(_encode(p.Confirm(ch, upto)))
            self._confirms.clear()
        if self._writer is not None:
            for data in out:
                self._writer.write(data)
        elif out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)  # one writev: no joined copy of the pass's packets
            self.last_sent = self.loop.time()
        out.clear()

    # --------------------------------------------------------------- input
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_received = now = self.loop.time()
        try:
            packets = self.reader.feed(data)
        except ProtocolError as exc:
            self.fatal(exc)
            return
        except Exception as exc:  # a bug in the codec, not bad input: logged, and this client alone gets ERROR
            log.exception("error decoding packets from %s", self.peer)
            self.fatal(InternalError(f"internal error: {exc!r}"))
            return
        if not self.reader.buffered:
            self.partial_since = None
        elif packets or self.partial_since is None:  # a new packet began in this read
            self.partial_since = now
        if packets and not self.handshaken and self._login is None and type(packets[0]) is not p.Hello:
            self.fatal(ProtocolError(f"the first packet must be HELLO, got {type(packets[0]).__name__.upper()}"))
            return
        if self._rest is not None:  # read while a burst is still being worked through: after it
            self._rest[0].extend(packets)
            return
        self._handle(packets, 0)

    def _handle(self, packets: list[Any], start: int) -> None:
        """Handle up to PACKETS_PER_PASS packets, then let the loop run before the rest.

        A read can hold a producer's whole window (hundreds of sends). Handled in one go, their
        journal batch could only start syncing once the last was handled, and the producer's
        next burst only after that sync: handling and syncing would take turns. In slices, the
        journal syncs one slice while the next is handled, and other connections get a turn."""
        handlers = _HANDLERS
        n = len(packets)
        end = start + PACKETS_PER_PASS if n - start > PACKETS_PER_PASS else n
        if self.window > 0:
            end = self._note_commands(packets, start, end)
        i = start
        while i < end:
            pkt = packets[i]
            if self.is_closed():
                break
            t = type(pkt)
            if t is _SEND:  # a producer's burst: the SENDs of one channel go to the core as a run
                j = i + 1
                ch = pkt.channel
                while j < end and type(packets[j]) is _SEND and packets[j].channel == ch:
                    j += 1
                self._send_run(packets, i, j)
                i = j
                continue
            try:
                handlers[t](self, pkt)
            except TandemError as exc:
                self.command_failed(pkt, exc)
            except Exception as exc:
                log.exception("error handling %s from %s", type(pkt).__name__, self.peer)
                self.command_failed(pkt, InternalError(f"internal error: {exc!r}"))
            i += 1
            if self.holding:
                break
        if self.touched:
            for s in self.touched:
                s.end_of_batch()
            self.touched.clear()
        if self.holding and not self.closed:  # `release` handles the rest, in order
            self._rest = (packets, i)
            if not self._slicing and self.transport is not None:
                self._slicing = True
                self.transport.pause_reading()
            return
        if end < n and not self.closed:
            self._rest = (packets, end)
            if not self._slicing and self.transport is not None:
                self._slicing = True
                self.transport.pause_reading()
            self.loop.call_soon(self._continue)
        elif self._slicing:
            self._slicing = False
            if self.writable and not self.closed and not self.paced and self.transport is not None:
                self.transport.resume_reading()

    def _note_commands(self, packets: list[Any], start: int, end: int) -> int:
        """Reattachable: the last command id received per channel (these are all handled in this
        pass), and a RECEIVED each time the confirmation window's bytes have arrived. The pass
        ends after a LARGE_END (its handler may hold what follows: not counted until handled);
        returns where it ends."""
        replay = self.replay
        window = self.window
        for k in range(start, end):
            pkt = packets[k]
            cmd = getattr(pkt, "cmd", None)
            if cmd is None:
                continue
            if type(pkt) is _LARGE_END:
                end = k + 1
            ch = pkt.channel
            r = replay.get(ch)
            if r is None:
                r = replay[ch] = ChannelReplay()
            r.last_cmd = cmd
            r.unconfirmed += len(pkt.message) + SEND_OVERHEAD if type(pkt) is _SEND else COMMAND_SIZE
            if r.unconfirmed >= window:
                r.unconfirmed = 0
                self.write(_encode(p.Received(ch, cmd)))
            if k + 1 == end:
                break
        return end

    def _continue(self) -> None:
        rest, self._rest = self._rest, None
        if rest is not None and not self.closed:
            self._handle(*rest)

    def pace(self, paused: bool) -> None:
        """(Pacer, server/pacing.py) stop reading while a paced buffer is full; read again once none is."""
        self.paced = paused
        self._not_reading_since(self.loop.time())
        if self.transport is None or self.closed:
            return
        if paused:
            self.transport.pause_reading()
        elif self.writable and not self._slicing:
            self.transport.resume_reading()

    def _not_reading_since(self, now: float) -> None:
        """The broker, not the client, stops this connection's input: its silence and its
        half-read packet count from when reading resumes."""
        self.last_received = now
        if self.partial_since is not None:
            self.partial_since = now

    def hold(self) -> None:
        """(From a handler) handle nothing more of this connection until `release`."""
        self.holding = True

    def release(self) -> None:
        """The held handler is done: the packets after it are handled now, in order."""
        self.holding = False
        self._not_reading_since(self.loop.time())
        if self._rest is not None:
            self._continue()
        elif self.touched and not self.closed:
            for s in self.touched:
                s.end_of_batch()
            self.touched.clear()

    def is_closed(self) -> bool:
        return self.closed

    def command_failed(self, pkt: Any, exc: TandemError) -> None:
        channel = getattr(pkt, "channel", None)
        cmd = getattr(pkt, "cmd", None)
        if channel is None or cmd is None or not self.handshaken:
            self.fatal(exc)
            return
        self.send(p.Exception_(channel, cmd, int(exc.code), wire_text(exc)))

    def fatal(self, exc: TandemError) -> None:
        """Report a connection-level error, then close only this connection."""
        if self.closed:
            return
        text = wire_text(exc)
        log.info("closing connection from %s: [%s] %s", self.peer, exc.code.name, clip(text))
        self.send(p.error_packet(exc.code, text))
        self._flush()
        self.close()

    def close(self) -> None:
        """Close after what is written so far (a backup's last frames, a REPLICA_STOP)."""
        if self._out or self._confirms:
            self._flush()
        if self._writer is not None:
            self._writer.close()  # writes what is queued, then lets its descriptor go
        if self.transport is not None:
            self.transport.close()
            abort_later(self.loop, self.transport, self.broker.config.slow_client_timeout / 1000)
        self._teardown()

    def _teardown(self, detach: bool = False) -> None:
        """The connection is over; with `detach` (its socket failed) a reattachable one keeps its
        sessions, consumers and temporary queues until its TTL expires (check_alive)."""
        if self.closed:
            if self.detached and not detach:
                self._release()  # closed for good (broker stopping): no reattach any more
            return
        self.closed = True
        if self._login is not None:
            self._login.cancel()
        self.broker.limits.release(self)
        if self._writer is not None:
            self._writer.close()
        if self.replica is not None:  # a backup's link gone: no upload waits for it any more
            self.broker.pacer.full(BACKUP_LINK, False)
        if detach and self.window > 0 and self.successor is None and self.broker.active and self.sessions:
            self.detached = True
            self.writable = False  # the queues hold deliveries until a reattach
            log.info(
                "connection from %s lost: its %d session(s) wait %d ms for a reattach",
                self.peer,
                len(self.sessions),
                self.ttl_ms,
            )
            return
        self._release()

    def _release(self) -> None:
        self.detached = False
        self.broker.connections.discard(self)
        if self.connection_id and self.broker.reattachable.get(self.connection_id) is self:
            del self.broker.reattachable[self.connection_id]
        if self.successor is None:  # else its successor has them now
            for addr in self._credit_waits:  # its credit requests waiting on full addresses
                addr.forget(self)
            self._credit_waits.clear()
            for s in self.sessions.values():
                s.drop_large()
                s.core.close()
            if self.broker.active:
                for name in list(self.temp_queues):
                    try:
                        self.broker.postoffice.delete_queue(name, force=True)
                    except TandemError:
                        pass
        self.sessions = {}
        self.temp_queues = set()
        self.replay = {}
        self.broker.backup_gone(self)
        for fut in self._drain_waiters:
            if not fut.done():
                fut.set_result(None)
        self._drain_waiters.clear()
        replica, self.replica = self.replica, None
        if replica is not None:
            replica.link_closed()

    # ------------------------------------------------------------ handlers
    def _session(self, channel: int) -> NativeSession:
        s = self.sessions.get(channel)
        if s is None:
            raise SessionDoesNotExist(f"no session on channel {channel}")
        return s

    def on_hello(self, pkt: p.Hello) -> None:
        if self.handshaken or self._login is not None:
            raise ProtocolError("HELLO sent twice")
        p.check_version(pkt)
        if not self.broker.authenticator.enabled:
            self._accept_hello(pkt, ANONYMOUS)
            return
        # The password's hash is checked off the loop: nothing after HELLO is handled until it is done.
        self.hold()
        check = self.broker.authenticate(pkt.username, pkt.password, self.peer, "native", self.cert_user)
        self._login = self.loop.create_task(check)
        self._login.add_done_callback(lambda task: self._checked(pkt, task))

    def _checked(self, pkt: p.Hello, task: asyncio.Task[Subject | None]) -> None:
        self._login = None
        if task.cancelled():
            return
        task.exception()  # retrieved even when closed: asyncio would report it as never retrieved
        if self.closed:
            return
        try:
            subject = task.result()
            if subject is None:
                audit("login", None, self.peer, None, False, login=pkt.username, protocol="native")
                raise Unauthorized(f"authentication failed for user {pkt.username!r}")
            self._accept_hello(pkt, subject)
        except TandemError as exc:
            self.fatal(exc)
            return
        except Exception as exc:
            log.exception("error checking the login of %s", self.peer)
            self.fatal(InternalError(f"internal error: {exc!r}"))
            return
        self.release()

    def _accept_hello(self, pkt: p.Hello, subject: Subject) -> None:
        self.broker.limits.login(self, subject.user, subject.cluster)
        audit("login", subject, self.peer, None, True, protocol="native")
        self.subject = subject
        self.access = access_for(self.broker.authorizer, subject, self.peer)
        self.handshaken = True
        self.client_id = pkt.client_id
        self.username = pkt.username
        b = self.broker
        cfg = b.config
        if cfg.connection_ttl_override > 0:
            self.ttl_ms = cfg.connection_ttl_override
        elif pkt.connection_ttl > 0:
            self.ttl_ms = min(pkt.connection_ttl, cfg.connection_ttl_max)  # a client cannot pick "never"
        if pkt.confirmation_window > 0 and pkt.connection_id:
            self.window = pkt.confirmation_window
            self.connection_id = pkt.connection_id
            self.replay[0] = ChannelReplay()
            # A connection of that id still there is what a REATTACH will take over: it keeps the id.
            b.reattachable.setdefault(pkt.connection_id, self)
        self.send(p.HelloOk(p.PROTOCOL_VERSION, cfg.name, b.node_id, self.ttl_ms, b.topology(), b.active))

    def on_ping(self, pkt: p.Ping) -> None:
        self.send(p.Pong())

    def on_pong(self, pkt: p.Pong) -> None:
        pass

    def on_disconnect(self, pkt: p.Disconnect) -> None:
        self._flush()
        self.close()

    def on_error(self, pkt: p.Error) -> None:
        log.info("client %s reported error %s: %s", self.peer, pkt.code, pkt.message)
        self.close()

    def on_create_session(self, pkt: p.CreateSession) -> None:
        if pkt.channel in self.sessions or pkt.channel <= 0:
            raise IllegalState(f"channel {pkt.channel} is already in use or reserved")
        b = self.broker
        if len(self.sessions) >= b.config.max_sessions_per_connection:
            raise ResourceLimit(f"this connection has {len(self.sessions)} sessions open (max-sessions-per-connection)")
        core = ServerSession(b.require_active(), self, pkt.name, pkt.transacted, access=self.access)
        kind = NativeSession
        if self.window > 0:
            kind = TrackedSession
            self.top_channel = max(self.top_channel, pkt.channel)
            held = b.reattachable.get(self.connection_id)
            if held is None or held is self or held.owner == self.owner:  # never another user's id
                b.reattachable[self.connection_id] = self  # the client's current connection: a reattach takes this one
        self.sessions[pkt.channel] = kind(self, pkt.channel, core)
        self.send(p.Response(pkt.channel, pkt.cmd, None))

    def on_close_session(self, pkt: p.CloseSession) -> None:
        s = self.sessions.pop(pkt.channel, None)
        if s is not None:
            s.drop_large()
            unseen = {cid: set(ids) for cid, ids in pkt.unseen.items()}
            for cid, got in pkt.received.items():  # and what was still on its way to the client
                c = s.core.consumers.get(cid)
                if c is not None:
                    unseen.setdefault(cid, set()).update(c.in_flight(got))
            s.core.close(unseen)
        self.send(p.Response(pkt.channel, pkt.cmd, None))
        r = self.replay.get(pkt.channel)
        if r is not None:  # its last command id stays: a replayed CLOSE must not open it again
            while len(r.replies) > CLOSED_REPLIES_KEPT:
                r.drop_oldest()
            trim_closed(self.replay, self.sessions)

    @property
    def owner(self) -> tuple[str | None, bool, str | None]:
        """Who may take this connection's sessions over: who logged in (a certificate's user has no
        HELLO user name) and, with security off, the name it gave."""
        return (self.subject.user, self.subject.cluster, self.username)

    def on_reattach(self, pkt: p.Reattach) -> None:
        """Take over the sessions of the failed connection `pkt.connection_id` (see server/reattach.py)."""
        b = self.broker
        old: NativeConnection | None = b.reattachable.get(pkt.connection_id)
        why = ""
        gone = old is None or old is self or old.successor is not None or (old.closed and not old.detached)
        if self.window <= 0 or pkt.connection_id != self.connection_id:
            why = "this connection has no confirmation window under that id"
        elif gone or old is None:
            b.reattachable[pkt.connection_id] = self  # it starts afresh under the id
            why = "no such connection (its TTL expired, or the server restarted or failed over)"
        elif old.owner != self.owner:
            why = "the connection belongs to another user"
        elif not b.active:
            why = "the server is not active"
        elif self.sessions:
            why = "this connection has sessions of its own"
        elif not self._can_resume(old, pkt.channels):
            # The client's own sessions, but a reattach could not tell it everything: it starts
            # afresh, and the old sessions go now rather than at their TTL.
            why = "answers the client still waits for, or a closed session's ids, were not kept"
            if old.transport is not None:
                old.transport.abort()
            old._teardown()
            b.reattachable[pkt.connection_id] = self
        if why:
            self.send(p.Reattached(False, {}, why))
            return
        assert old is not None
        old.successor = self
        old._rest = None  # read but not handled: not counted as received, so the client replays them
        self.client_id = old.client_id
        self.top_channel = old.top_channel
        self.replay = old_replay = old.replay
        old_replay.setdefault(0, ChannelReplay())
        self.sessions = old.sessions
        # Its consumers keep counting against the account they were created with: ours now.
        self.delivery_account = old.delivery_account
        self.delivery_account.on_room = self._room
        self.temp_queues |= old.temp_queues
        for name in old.temp_queues:  # ours now: only we may read them
            tq = b.postoffice.queues.get(name)
            if tq is not None and tq.owner is old:
                tq.owner = self
        for s in self.sessions.values():
            s.conn = self
            s.drop_range_bodies()
        if old.transport is not None:
            old.transport.abort()
        old._teardown()  # closed for good; its state is ours now (it closes none of it)
        b.reattachable[pkt.connection_id] = self
        last = {rc.channel: (old_replay[rc.channel].last_cmd if rc.channel in old_replay else 0) for rc in pkt.channels}
        log.info("connection from %s reattached %d session(s)", self.peer, len(self.sessions))
        self.send(p.Reattached(True, last))
        for rc in pkt.channels:
            r = old_replay.get(rc.channel)
            if r is not None and rc.awaited_from >= 0:
                for reply in r.replies_from(rc.awaited_from):
                    self.write(_encode(reply))  # answers the client may have lost
            session = self.sessions.get(rc.channel)
            if session is None:
                continue
            if r is not None and not session.pending_durable and not session.batch_upto:
                self.confirm(rc.channel, r.last_cmd)  # every command received is done: confirmations lost
            if isinstance(session, TrackedSession):
                session.resume(rc.consumers)

    @staticmethod
    def _can_resume(old: NativeConnection, channels: list[p.ReattachChannel]) -> bool:
        """Whether `old` kept what the client's channels need: every answer it may still wait
        for, and the last command id of every session it ever created on them; and no large
        message in transfer either way (a chunk lost on the wire is not kept for a replay),
        but for a range read's (its reader reads again)."""
        if any(s.upload is not None or s.sealing or _consumer_streams(s) for s in old.sessions.values()):
            return False  # a large message in transfer: its lost chunks cannot be replayed
        for rc in channels:
            r = old.replay.get(rc.channel)
            if r is None:
                if 0 < rc.channel <= old.top_channel:
                    return False  # a session closed long ago: a replay could open it again
            elif not r.can_answer_from(rc.awaited_from):
                return False
        return True

    def _send_run(self, packets: list[Any], i: int, j: int) -> None:
        """SENDs packets[i:j], all on one channel: one session lookup, one core call; each
        still gets its own confirmation or error, in order."""
        s = self.sessions.get(packets[i].channel)
        if s is None:
            for k in range(i, j):
                self.command_failed(packets[k], SessionDoesNotExist(f"no session on channel {packets[k].channel}"))
            return
        pages = s.core.postoffice.pages
        mark = page_mark(pages)
        results = s.core.send_run([packets[k].message for k in range(i, j)])
        self.broker.pacer.paged(self, pages, mark)  # paged: wait while the page writer is behind
        if s.core.postoffice.auto_created:
            created_by_send(s.core.postoffice.auto_created, self.subject, self.peer, "native")
        completed = s.completed
        for k, r in zip(range(i, j), results, strict=True):
            if r is True or r is False:
                completed(packets[k].cmd, r)
            else:
                self.command_failed(packets[k], r)

    def on_create_consumer(self, pkt: p.CreateConsumer) -> None:
        s = self._session(pkt.channel)
        held = sum(len(x.core.consumers) for x in self.sessions.values())
        if held >= self.broker.config.max_consumers_per_connection:
            raise ResourceLimit(f"this connection has {held} consumers open (max-consumers-per-connection)")
        queues = s.core.postoffice.queues
        before = len(queues) if audit_enabled() else -1
        c = s.core.create_consumer(pkt.consumer_id, pkt.queue, s, pkt.window, pkt.filter, pkt.browse_only)
        q = c.queue
        if before >= 0 and len(queues) > before:  # auto-created for this consumer
            audit("queue.create", self.subject, self.peer, q.name, True, by="consumer", protocol="native")
        result = {"window": c.window, "queue": q.name, "address": q.address}
        self._reply_after_bindings(pkt.channel, pkt.cmd, result)

    def on_close_consumer(self, pkt: p.CloseConsumer) -> None:
        s = self._session(pkt.channel)
        unseen = set(pkt.unseen)
        c = s.core.consumers.get(pkt.consumer_id)
        if c is not None:  # and what was still on its way to the client
            unseen.update(c.in_flight(pkt.received))
        s.core.close_consumer(pkt.consumer_id, unseen)
        self.send(p.Response(pkt.channel, pkt.cmd, None))

    def on_flow(self, pkt: p.Flow) -> None:
        s = self.sessions.get(pkt.channel)
        if s is not None:
            if self.window > 0 and isinstance(s, TrackedSession):
                s.flowed[pkt.consumer_id] = s.flowed.get(pkt.consumer_id, 0) + pkt.credits
            s.core.flow(pkt.consumer_id, pkt.credits)

    def on_ack(self, pkt: p.Ack) -> None:
        s = self._session(pkt.channel)
        s.completed(pkt.cmd, s.core.ack(pkt.consumer_id, pkt.message_id, pkt.cumulative))

    def on_nack(self, pkt: p.Nack) -> None:
        s = self._session(pkt.channel)
        s.core.nack(pkt.consumer_id, pkt.message_id)
        s.completed(pkt.cmd, False)

    def on_commit(self, pkt: p.Commit) -> None:
        """Answers True when `dedup_id` was already committed (a retry after a lost answer): only
        once that first commit is on disk, so "already committed" never outlives a crash.

        A retry that finds the id taken by an earlier retry that had nothing in its transaction
        (a reconnect had rolled back what the session held; its answer was lost too) is not told
        "already": nothing of the first attempt was applied under the id (decision 0084)."""
        s = self._session(pkt.channel)
        po = s.core.postoffice
        key = None if pkt.dedup_id is None else tx_key(self.subject.user, pkt.dedup_id)
        seen = key is not None and po.transaction_seen(key)
        already = seen and not (pkt.retry and key is not None and po.taken_by_empty_retry(key))
        try:
            wrote = s.core.commit(key, retried=pkt.retry)
        except DuplicateId as exc:  # says the originals are stored: only once they are durable
            self.broker.storage.after_durable(partial(self._failed_unless_closed, pkt, exc))
            return
        self._reply(pkt.channel, pkt.cmd, True if already else None, after_journal=wrote or seen)

    def _failed_unless_closed(self, pkt: Any, exc: TandemError) -> None:
        if not self.closed or self.successor is not None or self.detached:
            self.command_failed(pkt, exc)

    def on_rollback(self, pkt: p.Rollback) -> None:
        s = self._session(pkt.channel)
        s.core.rollback()
        self.send(p.Response(pkt.channel, pkt.cmd, None))

    def on_request_credits(self, pkt: p.RequestCredits) -> None:
        session = self._session(pkt.channel)
        channel, cmd = pkt.channel, pkt.cmd

        po = self.broker.require_active()
        session.core.authorize_producer(pkt.address)  # a producer asks: it needs `send`
        addr = po.addresses.get(pkt.address)
        if addr is None:
            s = po.settings_for(pkt.address)
            bounded = s.max_size_bytes >= 0 or po.limits.limited
            self.send(p.Response(channel, cmd, pkt.amount if bounded and s.address_full_policy == "BLOCK" else -1))
            return
        waits = self._credit_waits
        if waits.get(addr, 0) >= MAX_CREDIT_WAITS:
            raise ResourceLimit(
                f"this connection already waits for credit on address {clip(addr.name, 200)!r} "
                f"{MAX_CREDIT_WAITS} times (the address is full)"
            )

        def grant(amount: int) -> None:
            left = waits.get(addr, 0) - 1
            if left > 0:
                waits[addr] = left
            else:
                waits.pop(addr, None)
            self.send(p.Response(channel, cmd, amount))

        waits[addr] = waits.get(addr, 0) + 1  # (taken back at once when granted now)
        addr.request_credit(max(pkt.amount, 1), grant, self)

    def _consumable(self, name: str) -> Queue:
        """Queue `name`, checked for `consume` first: whether it exists is told only to who may
        consume there (a missing queue's name stands for its address, as for queue.delete)."""
        po = self.broker.require_active()
        if self.access is not None:
            found = po.queues.get(name)
            self.access.check(Permission.CONSUME, found.address if found is not None else name)
        q = po.queue(name)
        q.check_owner(self)
        return q

    def on_read_range(self, pkt: p.ReadRange) -> None:
        s = self._session(pkt.channel)
        q = self._consumable(pkt.queue)  # a range reader (Spark's source) consumes
        q.read_range_soon(pkt.start, pkt.end, pkt.limit, partial(self._range_read, pkt, q, s))

    def _range_read(self, pkt: p.ReadRange, q: Queue, s: NativeSession, refs: list[MessageRef], first: int) -> None:
        """Answer READ_RANGE (at once, or once the paged messages it covers are read)."""
        try:
            self._answer_range_read(pkt, q, s, refs, first)
        except TandemError as exc:
            self.command_failed(pkt, exc)

    def _answer_range_read(
        self, pkt: p.ReadRange, q: Queue, s: NativeSession, refs: list[MessageRef], first: int
    ) -> None:
        refs, more = large.cut_range(refs)
        pumps = large.range_pumps(s, pkt.cmd, refs)
        # delivery_count as DELIVER counts it: this read is delivery number failed + 1
        items = [(r.seq, r.message.id, r.delivery_count + 1, _raw(r.message.raw)) for r in refs]
        big = [(i, pump.size, pump.compressed) for i, pump in pumps]
        result = p.RangeResult(pkt.channel, pkt.cmd, first, q.last_seq, items, big, more)
        # Only what is on disk may leave: a reader that keeps offsets (Spark) must never
        # process a message a crash could still take back (its producer would send it again).
        if not pumps:
            self._send_after(self.broker.storage.after_durable, result)
            return
        # The bodies follow the answer; queued now, so nothing of this session's consumers
        # overtakes them. Their chunks are not kept for a replay: a reattach stops them and the
        # reader reads again (client/range.py).
        s.streams.extend(pump for _, pump in pumps)

        def answer() -> None:
            self.send(result)
            for _, pump in pumps:
                pump.ready = True
            s.pump_streams()

        self.broker.storage.after_durable(answer)

    def on_ack_up_to(self, pkt: p.AckUpTo) -> None:
        self._session(pkt.channel)
        q = self._consumable(pkt.queue)
        channel, cmd = pkt.channel, pkt.cmd

        def acked(n: int) -> None:
            # Acknowledging nothing still says "acknowledged up to seq": an earlier ACK_UP_TO (a
            # retry's first attempt, another reader) may have removed those messages in a batch
            # not on disk yet, so the answer waits for the disk either way.
            self._reply(channel, cmd, {"acked": n}, after_journal=True)

        q.ack_upto_soon(pkt.seq, acked)

    def _reply(self, channel: int, cmd: int, result: Any, after_journal: bool) -> None:
        pkt = p.Response(channel, cmd, result)
        if after_journal:
            self._send_after(self.broker.storage.after_durable, pkt)
        else:
            self.send(pkt)

    def _send_after(self, when: Callable[[Callable[[], None]], None], pkt: p.Packet) -> None:
        """Send `pkt` once `when` (a store's after_durable) calls back, unless closed by then."""

        when(partial(self.send, pkt))  # send(): to the connection that reattached, if one did

    def on_manage(self, pkt: p.Manage) -> None:
        channel, cmd = pkt.channel, pkt.cmd

        def reply(result: Any) -> None:
            self.send(p.Response(channel, cmd, result))

        self.broker.admin.handle(pkt.op, pkt.args, self, reply)

    # --------------------------------------------------------- replication
    # ------------------------------------------------------ large messages
    def on_large_begin(self, pkt: p.LargeBegin) -> None:
        large.begin(self._session_or_fatal(pkt.channel), pkt)

    def on_large_chunk(self, pkt: p.LargeChunk) -> None:
        large.chunk(self._session_or_fatal(pkt.channel), pkt)

    def on_large_end(self, pkt: p.LargeEnd) -> None:
        large.end(self._session(pkt.channel), pkt)

    def on_large_abort(self, pkt: p.LargeAbort) -> None:
        s = self.sessions.get(pkt.channel)
        if s is not None:
            large.abort(s, pkt)

    def _session_or_fatal(self, channel: int) -> NativeSession:
        """BEGIN and CHUNK carry no command id to answer: a bad channel closes the connection."""
        s = self.sessions.get(channel)
        if s is None:
            raise ProtocolError(f"large message data for channel {channel}, which has no session")
        return s

    def on_replica_start(self, pkt: p.ReplicaStart) -> None:
        if self.replica is not None:
            raise ProtocolError("REPLICA_START sent twice")
        self.broker.replica_start(self, pkt)

    def _replica_of(self, pkt: Any) -> Any:
        if self.replica is None:
            raise ProtocolError(f"{type(pkt).__name__.upper()} outside a replication")
        return self.replica

    def on_replica_ack(self, pkt: p.ReplicaAck) -> None:
        self._replica_of(pkt).on_ack(pkt.position)

    def on_replica_synced(self, pkt: p.ReplicaSynced) -> None:
        self._replica_of(pkt).on_synced(pkt.position)

    def on_replica_failback(self, pkt: p.ReplicaFailback) -> None:
        self._replica_of(pkt).on_failback()

    def _reply_after_bindings(self, channel: int, cmd: int, result: Any) -> None:
        self._send_after(self.broker.storage.after_bindings_durable, p.Response(channel, cmd, result))

    # ---------------------------------------------------------- liveness
    @property
    def frame_deadline_ms(self) -> int:
        """A packet must arrive whole within this: the connection's TTL, or the broker's if longer."""
        return max(self.ttl_ms, self.broker.config.effective_ttl_ms)

    def check_alive(self, now: float) -> None:
        """Close a connection silent for longer than its TTL, not logged in by handshake-timeout, or
        with a packet not complete within its TTL; ping one we have not written to lately."""
        if self.closed:
            if self.detached and now - self.last_received > self.ttl_ms / 1000:
                log.info("connection from %s: no reattach within its TTL: its sessions close", self.peer)
                self._release()
            return
        ttl = self.ttl_ms / 1000
        ping_every = max(ttl / 4, 0.05)
        cfg = self.broker.config
        t = self.transport
        if (
            self.replica is None  # a backup's link has its own deadline (call-timeout)
            and self._writer is None
            and t is not None
            and self.output_watch.stuck(now, self.writable, t.get_write_buffer_size())
        ):
            self._cut_slow(t)
            return
        if self.paced or self.holding:  # we do not read it (a full backup link, a body's sync): not its silence
            self._not_reading_since(now)
        if now - self.last_received > ttl:
            self.fatal(TandemError(f"no packet for {ttl:.1f}s (connection-ttl)", ErrorCode.CONNECTION_LOST))
        elif not self.handshaken and (now - self.opened_at) * 1000 > cfg.handshake_timeout:
            self.fatal(ProtocolError(f"no HELLO accepted within handshake-timeout ({cfg.handshake_timeout} ms)"))
        elif self.partial_since is not None and (now - self.partial_since) * 1000 > self.frame_deadline_ms:
            # Each byte resets the silence check above: a client trickling bytes must not hold a packet open.
            self.fatal(
                ProtocolError(
                    f"a packet begun {now - self.partial_since:.1f}s ago is not complete: "
                    f"a packet must arrive within the connection's TTL ({self.frame_deadline_ms} ms)"
                )
            )
        elif self.handshaken and now - self.last_sent > ping_every:
            self.send(p.Ping())

    def _cut_slow(self, t: asyncio.Transport) -> None:
        """It reads none of its pending output: cut now, without waiting for the buffer to drain."""
        log.warning(
            "closing connection from %s: it has read none of its %d pending bytes for %d ms (slow-client-timeout)",
            self.peer,
            t.get_write_buffer_size(),
            self.broker.config.slow_client_timeout,
        )
        self.broker.limits.refused["slow-client"] += 1
        t.abort()
        self._teardown()


_HANDLERS: dict[type, Callable[[NativeConnection, Any], None]] = {
    p.Hello: NativeConnection.on_hello,
    p.Ping: NativeConnection.on_ping,
    p.Pong: NativeConnection.on_pong,
    p.Disconnect: NativeConnection.on_disconnect,
    p.Error: NativeConnection.on_error,
    p.CreateSession: NativeConnection.on_create_session,
    p.CloseSession: NativeConnection.on_close_session,
    p.CreateConsumer: NativeConnection.on_create_consumer,
    p.CloseConsumer: NativeConnection.on_close_consumer,
    p.Flow: NativeConnection.on_flow,
    p.Ack: NativeConnection.on_ack,
    p.Manage: NativeConnection.on_manage,
    p.Commit: NativeConnection.on_commit,
    p.Rollback: NativeConnection.on_rollback,
    p.Nack: NativeConnection.on_nack,
    p.RequestCredits: NativeConnection.on_request_credits,
    p.ReadRange: NativeConnection.on_read_range,
    p.AckUpTo: NativeConnection.on_ack_up_to,
    p.Reattach: NativeConnection.on_reattach,
    p.LargeBegin: NativeConnection.on_large_begin,
    p.LargeChunk: NativeConnection.on_large_chunk,
    p.LargeEnd: NativeConnection.on_large_end,
    p.LargeAbort: NativeConnection.on_large_abort,
    p.ReplicaStart: NativeConnection.on_replica_start,
    p.ReplicaAck: NativeConnection.on_replica_ack,
    p.ReplicaSynced: NativeConnection.on_replica_synced,
    p.ReplicaFailback: NativeConnection.on_replica_failback,
}


def _raw(raw: msgspec.Raw | bytes) -> msgspec.Raw:
    return raw if isinstance(raw, msgspec.Raw) else msgspec.Raw(raw)


def _consumer_streams(s: NativeSession) -> bool:
    return any(not isinstance(pump, large.RangePump) for pump in s.streams)
