"""Native protocol connections: bytes in → packets → core; coalesced bytes out.

One `asyncio.Protocol` per client, no task per message. Everything a read
callback produces (confirms, responses, deliveries) is appended to one output
list and written with a single `transport.write` per loop pass.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import msgspec

from ..config import HANDSHAKE_FRAME_LIMIT
from ..core.consumer import Consumer
from ..core.message import MessageRef
from ..core.session import ServerSession
from ..errors import (
    DuplicateId,
    ErrorCode,
    IllegalState,
    InternalError,
    ProtocolError,
    SessionDoesNotExist,
    TandemError,
    Unauthorized,
    clip,
    wire_text,
)
from ..protocol import native as p

if TYPE_CHECKING:
    from .context import BrokerContext

log = logging.getLogger("tandem.native")

HIGH_WATER = 1 << 22  # bytes queued in the transport before we stop reading and delivering
LOW_WATER = 1 << 20
_SEND = p.Send
PACKETS_PER_PASS = 128  # packets of one read handled before the loop gets a turn (see `_handle`)

_encode = p.encode
_pack_len = p.LENGTH.pack


class NativeSession:
    """Per-channel state: in-order confirmation of pipelined commands."""

    __slots__ = ("batch_upto", "channel", "conn", "core", "dirty", "pending_durable", "storage", "sync")

    def __init__(self, conn: NativeConnection, channel: int, core: ServerSession) -> None:
        self.conn = conn
        self.channel = channel
        self.core = core
        self.storage = conn.broker.storage
        self.sync = conn.broker.config.journal_sync_non_transactional
        self.batch_upto = 0
        self.pending_durable = 0
        self.dirty = False

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
        return self.conn.writable

    def deliver(self, consumer: Consumer, ref: MessageRef) -> None:
        m = ref.message
        self.conn.write(
            _encode(p.Deliver(self.channel, consumer.id, m.id, ref.delivery_count + 1, ref.seq, m.raw))  # type: ignore[arg-type]
        )

    def consumer_closed(self, consumer: Consumer, error: TandemError) -> None:
        self.core.forget_consumer(consumer)
        if not self.conn.closed:
            self.conn.write(_encode(p.ConsumerClosed(self.channel, consumer.id, int(error.code), wire_text(error))))


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
        self.handshaken = False
        self.closed = False
        self.writable = True
        self.peer = "?"
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

    # ----------------------------------------------------------- transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        transport = self.transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        self.broker.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown()

    def pause_writing(self) -> None:
        self.writable = False
        # A backup's acknowledgements are what frees the stream: keep reading them.
        if self.transport is not None and self.replica is None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writable = True
        waiters, self._drain_waiters = self._drain_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        if self.transport is not None and not self.closed and not self._slicing:
            self.transport.resume_reading()
        for s in self.sessions.values():
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
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def write_now(self, data: bytes | bytearray) -> None:
        self._out.append(data)
        self._flush()

    def send(self, packet: p.Packet) -> None:
        self.write(_encode(packet))

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
        if out and self.transport is not None and not self.transport.is_closing():
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
        if packets and not self.handshaken and type(packets[0]) is not p.Hello:
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
        if self.touched:
            for s in self.touched:
                s.end_of_batch()
            self.touched.clear()
        if end < n and not self.closed:
            self._rest = (packets, end)
            if not self._slicing and self.transport is not None:
                self._slicing = True
                self.transport.pause_reading()
            self.loop.call_soon(self._continue)
        elif self._slicing:
            self._slicing = False
            if self.writable and not self.closed and self.transport is not None:
                self.transport.resume_reading()

    def _continue(self) -> None:
        rest, self._rest = self._rest, None
        if rest is not None and not self.closed:
            self._handle(*rest)

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
        if self.transport is not None:
            self.transport.close()
        self._teardown()

    def _teardown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.broker.connections.discard(self)
        for s in self.sessions.values():
            s.core.close()
        self.sessions.clear()
        if self.broker.active:
            for name in list(self.temp_queues):
                try:
                    self.broker.postoffice.delete_queue(name, force=True)
                except TandemError:
                    pass
        self.temp_queues.clear()
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
        if self.handshaken:
            raise ProtocolError("HELLO sent twice")
        p.check_version(pkt)
        if not self.broker.authenticate(pkt.username, pkt.password, self.peer):
            raise Unauthorized(f"authentication failed for user {pkt.username!r}")
        self.handshaken = True
        self.client_id = pkt.client_id
        b = self.broker
        cfg = b.config
        if cfg.connection_ttl_override > 0:
            self.ttl_ms = cfg.connection_ttl_override
        elif pkt.connection_ttl > 0:
            self.ttl_ms = min(pkt.connection_ttl, cfg.connection_ttl_max)  # a client cannot pick "never"
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
        core = ServerSession(b.require_active(), self, pkt.name, pkt.transacted)
        self.sessions[pkt.channel] = NativeSession(self, pkt.channel, core)
        self.send(p.Response(pkt.channel, pkt.cmd, None))

    def on_close_session(self, pkt: p.CloseSession) -> None:
        s = self.sessions.pop(pkt.channel, None)
        if s is not None:
            s.core.close({cid: set(ids) for cid, ids in pkt.unseen.items()})
        self.send(p.Response(pkt.channel, pkt.cmd, None))

    def _send_run(self, packets: list[Any], i: int, j: int) -> None:
        """SENDs packets[i:j], all on one channel: one session lookup, one core call; each
        still gets its own confirmation or error, in order."""
        s = self.sessions.get(packets[i].channel)
        if s is None:
            for k in range(i, j):
                self.command_failed(packets[k], SessionDoesNotExist(f"no session on channel {packets[k].channel}"))
            return
        results = s.core.send_run([packets[k].message for k in range(i, j)])
        completed = s.completed
        for k, r in zip(range(i, j), results, strict=True):
            if r is True or r is False:
                completed(packets[k].cmd, r)
            else:
                self.command_failed(packets[k], r)

    def on_create_consumer(self, pkt: p.CreateConsumer) -> None:
        s = self._session(pkt.channel)
        c = s.core.create_consumer(pkt.consumer_id, pkt.queue, s, pkt.window, pkt.filter, pkt.browse_only)
        q = c.queue
        result = {"window": c.window, "queue": q.name, "address": q.address}
        self._reply_after_bindings(pkt.channel, pkt.cmd, result)

    def on_close_consumer(self, pkt: p.CloseConsumer) -> None:
        s = self._session(pkt.channel)
        s.core.close_consumer(pkt.consumer_id, set(pkt.unseen))
        self.send(p.Response(pkt.channel, pkt.cmd, None))

    def on_flow(self, pkt: p.Flow) -> None:
        s = self.sessions.get(pkt.channel)
        if s is not None:
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
        once that first commit is on disk, so "already committed" never outlives a crash."""
        s = self._session(pkt.channel)
        already = pkt.dedup_id is not None and s.core.postoffice.transaction_seen(pkt.dedup_id)
        try:
            wrote = s.core.commit(pkt.dedup_id)
        except DuplicateId as exc:  # says the originals are stored: only once they are durable
            self.broker.storage.after_durable(partial(self._failed_unless_closed, pkt, exc))
            return
        self._reply(pkt.channel, pkt.cmd, True if already else None, after_journal=wrote or already)

    def _failed_unless_closed(self, pkt: Any, exc: TandemError) -> None:
        if not self.closed:
            self.command_failed(pkt, exc)

    def on_rollback(self, pkt: p.Rollback) -> None:
        s = self._session(pkt.channel)
        s.core.rollback()
        self.send(p.Response(pkt.channel, pkt.cmd, None))

    def on_request_credits(self, pkt: p.RequestCredits) -> None:
        self._session(pkt.channel)
        channel, cmd = pkt.channel, pkt.cmd

        def grant(amount: int) -> None:
            if not self.closed:
                self.send(p.Response(channel, cmd, amount))

        po = self.broker.require_active()
        addr = po.addresses.get(pkt.address)
        if addr is None:
            s = po.settings_for(pkt.address)
            bounded = s.max_size_bytes >= 0 or po.limits.limited
            grant(pkt.amount if bounded and s.address_full_policy == "BLOCK" else -1)
        else:
            addr.request_credit(max(pkt.amount, 1), grant)

    def on_read_range(self, pkt: p.ReadRange) -> None:
        self._session(pkt.channel)
        q = self.broker.require_active().queue(pkt.queue)
        refs = q.read_range(pkt.start, pkt.end, pkt.limit)
        # delivery_count as DELIVER counts it: this read is delivery number failed + 1
        items = [(r.seq, r.message.id, r.delivery_count + 1, _raw(r.message.raw)) for r in refs]
        # Only what is on disk may leave: a reader that keeps offsets (Spark) must never
        # process a message a crash could still take back (its producer would send it again).
        self._send_after(
            self.broker.storage.after_durable, p.RangeResult(pkt.channel, pkt.cmd, q.first_seq(), q.last_seq, items)
        )

    def on_ack_up_to(self, pkt: p.AckUpTo) -> None:
        self._session(pkt.channel)
        q = self.broker.require_active().queue(pkt.queue)
        n = q.ack_upto(pkt.seq)
        self._reply(pkt.channel, pkt.cmd, {"acked": n}, after_journal=n > 0)

    def _reply(self, channel: int, cmd: int, result: Any, after_journal: bool) -> None:
        pkt = p.Response(channel, cmd, result)
        if after_journal:
            self._send_after(self.broker.storage.after_durable, pkt)
        elif not self.closed:
            self.send(pkt)

    def _send_after(self, when: Callable[[Callable[[], None]], None], pkt: p.Packet) -> None:
        """Send `pkt` once `when` (a store's after_durable) calls back, unless closed by then."""

        def send() -> None:
            if not self.closed:
                self.send(pkt)

        when(send)

    def on_manage(self, pkt: p.Manage) -> None:
        channel, cmd = pkt.channel, pkt.cmd

        def reply(result: Any) -> None:
            if not self.closed:
                self.send(p.Response(channel, cmd, result))

        self.broker.admin.handle(pkt.op, pkt.args, self, reply)

    # --------------------------------------------------------- replication
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
            return
        ttl = self.ttl_ms / 1000
        ping_every = max(ttl / 4, 0.05)
        cfg = self.broker.config
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
    p.ReplicaStart: NativeConnection.on_replica_start,
    p.ReplicaAck: NativeConnection.on_replica_ack,
    p.ReplicaSynced: NativeConnection.on_replica_synced,
    p.ReplicaFailback: NativeConnection.on_replica_failback,
}


def _raw(raw: msgspec.Raw | bytes) -> msgspec.Raw:
    return raw if isinstance(raw, msgspec.Raw) else msgspec.Raw(raw)
