"""The asyncio client connection: one Protocol, channels with command ids, coalesced writes, failover.

Pipelined commands (SEND, ACK) wait in a per-channel deque until the server's
CONFIRM(upto) covers them; calls wait for RESPONSE/EXCEPTION by command id.

When the socket fails the connection either gives up (DISCONNECT) or, with
reconnection enabled, unblocks every call in flight (`Unblocked`), reconnects
by the retry policy — to the backup the topology names first — recreates
sessions, consumers and temporary queues, resends the sends that carry a dedup
id and were never confirmed, and tells listeners FAILOVER or RECONNECTED.
Nothing waits forever: every wait ends with an answer, a timeout or an error.

With a confirmation window (`confirmation_window_size` > 0) every command of a
channel is also kept, encoded, until the server says RECEIVED; when the socket
fails the connection first tries to reattach to its sessions on the same server
(they wait there for the connection TTL): nothing in flight fails, the commands
the server never got are replayed, and listeners hear REATTACHED. If the server
no longer has them, the reconnection goes on as above.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
import uuid
import zlib
from collections import deque
from collections.abc import Callable
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import msgspec

from ..connecting import within
from ..errors import (
    CallTimeout,
    ConnectionLost,
    NotActive,
    NotConnected,
    ProtocolError,
    TandemError,
    Unblocked,
    error_for,
)
from ..protocol import native as p
from .options import ConnectOptions, parse_url
from .tls import client_context, split_server

if TYPE_CHECKING:
    from .session import AsyncConsumer, AsyncSession

log = logging.getLogger("tandem.client")

Waiter = asyncio.Future[None] | Callable[[BaseException | None], None] | None


class FailureEvent(Enum):
    FAILOVER = "failover"  # reconnected to another server (the backup)
    RECONNECTED = "reconnected"  # reconnected to the same server
    DISCONNECT = "disconnect"  # gave up: the connection is closed
    REATTACHED = "reattached"  # back on the same server's sessions: nothing was lost or failed


class Pending(msgspec.Struct):
    """A pipelined command waiting for CONFIRM; `resend` is the message to send again after failover.

    `unsent`: a send without a dedup id made while the client held its bytes (between links),
    kept with its message: no server can have it, so a reattach's replay or a restore sends it
    once; once written it is not replayable (a second copy could be stored). Decision 0078."""

    cmd: int
    waiter: Waiter
    resend: Any = None
    unsent: bool = False


class Channel:
    __slots__ = ("calls", "confirms", "id", "kept", "next_cmd", "session")

    def __init__(self, cid: int, keep: bool = False) -> None:
        self.id = cid
        self.next_cmd = 1
        self.confirms: deque[Pending] = deque()
        self.calls: dict[int, asyncio.Future[Any]] = {}
        self.session: AsyncSession | None = None
        # Confirmation window on: (command id, encoded frame) of every command not yet RECEIVED.
        self.kept: deque[tuple[int, bytes | bytearray]] | None = deque() if keep else None

    def received(self, upto: int) -> None:
        """The server has every command up to `upto`: no need to replay them."""
        kept = self.kept
        if kept is not None:
            while kept and kept[0][0] <= upto:
                kept.popleft()

    def awaited_from(self) -> int:
        """The lowest command id still waiting for an answer or a confirmation (-1: none)."""
        low = min(self.calls, default=-1)
        if self.confirms:
            first = self.confirms[0].cmd
            low = first if low < 0 else min(low, first)
        return low

    def cmd(self) -> int:
        n = self.next_cmd
        self.next_cmd = n + 1
        return n

    def confirm(self, upto: int) -> int:
        """Resolve pipelined commands up to `upto`; returns how many."""
        q = self.confirms
        n = 0
        while q and q[0].cmd <= upto:
            waiter = q.popleft().waiter
            if type(waiter) is partial:  # a producer's callback (the common case: no future)
                waiter(None)
            else:
                _resolve(waiter, None)
            n += 1
        return n

    def fail_command(self, cmd: int, exc: TandemError) -> bool:
        fut = self.calls.pop(cmd, None)
        if fut is not None:
            if not fut.done():
                fut.set_exception(exc)
            return True
        for i, pend in enumerate(self.confirms):
            if pend.cmd == cmd:
                del self.confirms[i]
                _resolve(pend.waiter, exc)
                return True
        return False

    def fail_all(self, exc: TandemError) -> None:
        for fut in self.calls.values():
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: nobody may be awaiting any more
        self.calls.clear()
        while self.confirms:
            _resolve(self.confirms.popleft().waiter, exc)

    def take_resendable(self, exc: TandemError) -> list[Pending]:
        """Transport lost: calls and commands that cannot be replayed fail; the rest come back."""
        for fut in self.calls.values():
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()
        self.calls.clear()
        keep: list[Pending] = []
        while self.confirms:
            pend = self.confirms.popleft()
            if pend.resend is not None:
                keep.append(pend)
            else:
                _resolve(pend.waiter, exc)
        return keep


def _resolve(waiter: Waiter, exc: BaseException | None) -> None:
    if waiter is None:
        return
    if isinstance(waiter, asyncio.Future):
        if not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)
                waiter.exception()
    else:
        waiter(exc)


class _Protocol(asyncio.Protocol):
    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.reader = p.FrameReader(p.ServerPacket, conn.options.max_frame_size, expect_magic=False)
        self.transport: asyncio.Transport | None = None
        self.hello: asyncio.Future[p.HelloOk] = conn.loop.create_future()
        self.activated: asyncio.Future[None] = conn.loop.create_future()
        self.reattached: asyncio.Future[p.Reattached] = conn.loop.create_future()
        self.lost = False
        self.gone = asyncio.Event()  # connection_lost was called: the socket is closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if self.lost:
            return
        conn.last_received = conn.loop.time()
        try:
            packets = self.reader.feed(data)
        except ProtocolError as exc:
            self.abort(exc)
            return
        try:
            for pkt in packets:
                t = type(pkt)
                if t is p.Deliver or t is p.Confirm:  # the stream's bulk: straight through
                    if conn._proto is self:
                        conn._handle(pkt)
                elif t is p.HelloOk:
                    if not self.hello.done():
                        self.hello.set_result(pkt)
                elif t is p.Reattached:
                    if not self.reattached.done():
                        self.reattached.set_result(pkt)
                elif t is p.Activated:
                    conn.topology = list(pkt.nodes)
                    if not self.activated.done():
                        self.activated.set_result(None)
                elif t is p.Error and not self.hello.done():
                    self.hello.set_exception(error_for(pkt.code, pkt.message))
                    self.hello.exception()
                elif conn._proto is self:
                    conn._handle(pkt)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self.abort(ProtocolError(f"malformed packet from {conn.server}: {exc}"))
        except ProtocolError as exc:  # e.g. a large message's chunks out of order
            self.abort(exc)
        except (OSError, zlib.error) as exc:  # a large body's spool file, or its decompression
            self.abort(ProtocolError(f"cannot take a large message from {conn.server}: {exc}"))

    def abort(self, exc: TandemError) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._lost(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone.set()
        self._lost(ConnectionLost(f"connection to {self.conn.server} lost" + (f": {exc}" if exc else "")))

    def _lost(self, exc: TandemError) -> None:
        if self.lost:
            return
        self.lost = True
        for fut in (self.hello, self.activated, self.reattached):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()
        if self.conn._proto is self:
            self.conn._transport_lost(exc)

    def pause_writing(self) -> None:
        self.conn._writable.clear()

    def resume_writing(self) -> None:
        self.conn._writable.set()


TLS_CLOSE_WAIT = 1.0  # s: for the server's side of a TLS close before the socket is cut


async def _let_tls_close() -> None:
    """asyncio closes a failed TLS connection's socket in callbacks a few loop passes later: let
    them run, or a blocking connect that gives up stops its loop with the socket still open."""
    for _ in range(4):
        await asyncio.sleep(0)


class AsyncConnection:
    """A connection to a Tandem server, or to a primary/backup pair with automatic failover."""

    def __init__(self, hosts: list[tuple[str, int]], options: ConnectOptions, explicit: frozenset[str] = frozenset()):
        self.hosts = hosts
        self.options = options
        self.explicit = explicit
        self.loop = asyncio.get_running_loop()
        self.client_uuid = uuid.uuid4().hex
        self.server = ""
        self.server_name = ""
        self.node_id = ""
        self.topology: list[Any] = []
        self._tls: ssl.SSLContext | None = None  # made on the first TLS connection (client/tls.py)
        self._tls_servers: set[tuple[str, int]] = set()  # the topology's tcps:// servers
        self.channels: dict[int, Channel] = {}
        self.window = options.confirmation_window_size
        self.control = Channel(0, self.window > 0)
        if self.window > 0:
            self.pipeline = self._pipeline_kept  # type: ignore[method-assign]  # off: no per-send cost
        self.generation = 0  # +1 on every (re)connection: messages of older ones are stale
        self.losses = 0  # +1 on every link failure (a reattach keeps `generation`, not this)
        self.drops = 0  # +1 each time the sessions are given up with a link (`_unblock`): a restore follows
        self._next_channel = 1
        self._proto: _Protocol | None = None
        self._out: list[bytes | bytearray] = []
        self._flush_scheduled = False
        self._pending_acks: dict[AsyncConsumer, int] = {}
        self._writable = asyncio.Event()
        self._writable.set()
        self._ready = asyncio.Event()
        self._pinger: asyncio.Task[None] | None = None
        self._reconnector: asyncio.Task[None] | None = None
        self._closed_event = asyncio.Event()
        self.closed = False
        self.error: TandemError | None = None
        self.failure_listeners: list[Callable[[FailureEvent, TandemError | None], None]] = []
        self.last_received = self.loop.time()
        self.last_sent = self.last_received
        self.ttl_ms = options.connection_ttl

    # ------------------------------------------------------------- connect
    @classmethod
    async def connect(cls, url: str, **options: Any) -> AsyncConnection:
        hosts, opts, explicit = parse_url(url, explicit=True, **options)
        conn = cls(hosts, opts, explicit)
        await conn._open()
        return conn

    @property
    def reconnect_attempts(self) -> int:
        """Artemis's knob, with one departure: a topology that names a backup turns HA on."""
        o = self.options
        if o.ha or "reconnect_attempts" in self.explicit or "ha" in self.explicit:
            return o.reconnect_attempts
        if any(n.get("backup") for n in self.topology if isinstance(n, dict)):
            return -1
        return o.reconnect_attempts

    async def _open(self) -> None:
        opts = self.options
        last = await self._attempts(self.hosts, opts.initial_connect_attempts, wait_active=False)
        if last is not None and opts.allow_passive:
            last = await self._attempts(self.hosts, opts.initial_connect_attempts, wait_active=None)
        if last is not None:
            where = ", ".join(f"{h}:{p}" for h, p in self.hosts)
            raise NotConnected(f"cannot connect to {where}: {last}")
        self._ready.set()

    async def _attempts(
        self,
        candidates: Callable[[], list[tuple[str, int]]] | list[tuple[str, int]],
        attempts: int,
        wait_active: bool | None,
    ) -> BaseException | None:
        """Try every candidate, `attempts` rounds (-1: for ever) with the retry policy; None on success."""
        opts = self.options
        interval = opts.retry_interval / 1000
        last: BaseException | None = None
        n = 0
        while attempts < 0 or n < max(attempts, 1):
            for host, port in candidates() if callable(candidates) else candidates:
                if self.closed:
                    return last or ConnectionLost("connection closed by the application")
                try:
                    await self._open_one(host, port, wait_active)
                    return None
                except (OSError, TimeoutError, TandemError) as exc:
                    if isinstance(exc, TandemError) and not isinstance(
                        exc, (ConnectionLost, CallTimeout, NotActive, ProtocolError)
                    ):
                        raise
                    last = exc
            n += 1
            if attempts >= 0 and n >= max(attempts, 1):
                break
            await asyncio.sleep(interval)
            interval = min(interval * opts.retry_interval_multiplier, opts.max_retry_interval / 1000)
        return last or NotConnected("no server to connect to")

    async def _open_one(self, host: str, port: int, wait_active: bool | None) -> None:
        """Connect and say HELLO. A waiting backup: skip it (False), wait for it to take over (True),
        or keep it (None: management of the backup itself)."""
        timeout = self.options.connect_timeout / 1000
        tls: dict[str, Any] = {}
        # TLS when our URL says so, or the topology does for this server: never plain text instead.
        if self.options.ssl or (host, port) in self._tls_servers:
            if self._tls is None:
                self._tls = client_context(self.options)
            tls = {"ssl": self._tls, "server_hostname": host, "ssl_handshake_timeout": timeout}
        try:
            _transport, proto = await within(
                timeout,
                lambda: self.loop.create_connection(lambda: _Protocol(self), host, port, **tls),
                lambda made: made[0].abort(),
            )
        except ssl.SSLError:
            await _let_tls_close()
            raise
        assert proto.transport is not None
        o = self.options
        hello = p.Hello(
            p.PROTOCOL_VERSION,
            o.client_id,
            o.username,
            o.password,
            "tandem-python",
            o.connection_ttl,
            self.window,
            self.client_uuid if self.window > 0 else "",
        )
        try:
            if proto.transport.is_closing():
                # Reset as soon as accepted: a write now raises RuntimeError under uvloop.
                raise ConnectionLost(f"{host}:{port} closed the connection at once")
            proto.transport.write(p.MAGIC + p.encode(hello))
            ok = await asyncio.wait_for(asyncio.shield(proto.hello), timeout)
            if not ok.active and wait_active is not None:
                if not wait_active:
                    raise NotActive(f"{host}:{port} is a waiting backup")
                # A backup: it tells us the moment it takes over (shared store: within its lock poll).
                await asyncio.wait_for(asyncio.shield(proto.activated), max(o.retry_interval / 1000, 5.0))
        except BaseException as exc:
            proto.lost = True
            if proto.transport is not None:
                proto.transport.abort()
            if tls and not isinstance(exc, asyncio.CancelledError):
                await _let_tls_close()
                if isinstance(exc, ConnectionLost) and proto.hello.done() and proto.hello.exception():
                    raise ConnectionLost(
                        f"{host}:{port} closed the TLS connection before answering: it may want a client "
                        f"certificate (cert=, key=) from a CA it trusts ({exc})"
                    ) from None
            raise
        self._proto = proto
        self.generation += 1
        self.server = f"{host}:{port}"
        self.server_name = ok.server_name
        self.node_id = ok.node_id
        self.ttl_ms = ok.connection_ttl  # the broker's decision (it may override ours)
        self.topology = list(ok.topology) if ok.active else self.topology or list(ok.topology)
        self.last_received = self.last_sent = self.loop.time()
        self._pinger = self.loop.create_task(self._ping_loop(), name="tandem-client-ping")

    # ------------------------------------------------------------- output
    def _write(self, data: bytes | bytearray) -> None:
        if self.closed:
            raise self._closed_error()
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def send_packet(self, pkt: p.Packet) -> None:
        self._write(p.encode(pkt))

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._pending_acks and self._ready.is_set():
            acks = self._pending_acks
            self._pending_acks = {}
            for consumer, mid in acks.items():
                consumer._emit_ack(mid)
        out = self._out
        if not out:
            return
        proto = self._proto
        if proto is None or self.holding:
            return  # reconnecting: hold the bytes (they are rebuilt or dropped on reconnect)
        if proto.transport is not None and not proto.transport.is_closing():
            proto.transport.write(b"".join(out) if len(out) > 1 else out[0])
            self.last_sent = self.loop.time()
        out.clear()

    # The link whose sessions are being restored: what is written goes straight to it. Not a
    # flag: a restore cut short by a second loss may still run while the next link reattaches,
    # and that link must hold its bytes for the reattach's replay (or they go twice).
    _restoring: _Protocol | None = None

    def schedule_ack(self, consumer: AsyncConsumer, message_id: int) -> None:
        self._pending_acks[consumer] = message_id
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    @property
    def writable(self) -> bool:
        """False while the socket's send buffer is over its high-water mark (see `drain`)."""
        return self._writable.is_set()

    async def drain(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        if not self._writable.is_set():
            await self._writable.wait()

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until connected (a reconnection may be under way); ConnectionLost if it gives up."""
        if self._ready.is_set():
            return
        self.check_open()
        t = self.options.call_timeout / 1000 if timeout is None else timeout
        closed = asyncio.ensure_future(self._closed_event.wait())
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait({closed, ready}, timeout=t, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            ready.cancel()
        self.check_open()
        if not self._ready.is_set():
            raise CallTimeout(f"not reconnected within {t:.1f}s (call_timeout)")

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    # --------------------------------------------------------- commands
    def new_channel(self) -> Channel:
        ch = Channel(self._next_channel, self.window > 0)
        self._next_channel += 1
        self.channels[ch.id] = ch
        return ch

    @property
    def holding(self) -> bool:
        """What is written now stays in the client: no link, or one that is neither ready nor a
        restore's. It reaches a server only by a reattach's replay (or not at all)."""
        proto = self._proto
        return proto is None or (not self._ready.is_set() and self._restoring is not proto)

    def pipeline(self, ch: Channel, pkt: p.Packet, waiter: Waiter, resend: Any = None, unsent: bool = False) -> None:
        """Send a confirmed command (its `cmd` already set from ch.cmd())."""
        self._write(p.encode(pkt))
        ch.confirms.append(Pending(pkt.cmd, waiter, resend, unsent))  # type: ignore[attr-defined]

    def _pipeline_kept(
        self, ch: Channel, pkt: p.Packet, waiter: Waiter, resend: Any = None, unsent: bool = False
    ) -> None:
        """`pipeline` with a confirmation window: the frame is kept until the server has it."""
        frame = p.encode(pkt)
        cmd: int = pkt.cmd  # type: ignore[attr-defined]
        if ch.kept is not None:
            ch.kept.append((cmd, frame))
        self._write(frame)
        ch.confirms.append(Pending(cmd, waiter, resend, unsent))

    def pipeline_after(self, ch: Channel, before: list[bytes | bytearray], pkt: p.Packet, waiter: Waiter) -> None:
        """`pipeline` of a command that must follow frames without a command id (a large
        message's BEGIN and chunks), kept with them as one frame: a reattach replays all of them
        or none, in order. Never sent again after a failover (the send fails with Unblocked)."""
        frame = b"".join([*before, p.encode(pkt)])
        cmd: int = pkt.cmd  # type: ignore[attr-defined]
        if ch.kept is not None:
            ch.kept.append((cmd, frame))
        self._write(frame)
        ch.confirms.append(Pending(cmd, waiter, None))

    async def call(
        self,
        ch: Channel,
        make: Callable[[int], p.Packet],
        timeout: float | None = None,
        forever: bool = False,
        keep: bool = False,
    ) -> Any:
        """Send a command and wait for its answer (up to call_timeout, or `forever` until the connection fails)."""
        await self.wait_ready(timeout)
        session = ch.session
        if session is not None and not session._callable.is_set():  # (no coroutine for the usual case)
            await self.wait_session(ch, timeout)
        return await self._call_now(ch, make, timeout, forever, keep)

    async def wait_session(self, ch: Channel, timeout: float | None = None) -> None:
        """Ready, yet the channel's session not restored: the link reattached to a restore still
        under way, which has not made it yet (the server would refuse a call on it). Wait until
        its restore has begun (up to call_timeout), or the connection fails."""
        session = ch.session
        if session is None or session._callable.is_set():
            return
        t = self.options.call_timeout / 1000 if timeout is None else timeout
        try:
            await asyncio.wait_for(session._callable.wait(), t)
        except TimeoutError:
            raise CallTimeout(f"the session was not restored within {t:.1f}s (call_timeout)") from None

    async def _call_now(
        self,
        ch: Channel,
        make: Callable[[int], p.Packet],
        timeout: float | None = None,
        forever: bool = False,
        keep: bool = False,
    ) -> Any:
        """`keep`: a COMMIT or ROLLBACK stays among the kept commands when its call times out, so a
        reattach has the broker execute it if it never got it. Dropped, the transaction's work
        would stay in the broker's session (it lives on across a reattach) and the next commit
        would apply it with whatever that one carries."""
        if self.closed:
            raise self._closed_error()
        cmd = ch.cmd()
        fut: asyncio.Future[Any] = self.loop.create_future()
        ch.calls[cmd] = fut
        frame = p.encode(make(cmd))
        if ch.kept is not None:
            ch.kept.append((cmd, frame))
        self._write(frame)
        if forever:
            return await fut
        t = self.options.call_timeout / 1000 if timeout is None else timeout
        try:
            return await asyncio.wait_for(fut, t)
        except TimeoutError:
            ch.calls.pop(cmd, None)
            if ch.kept is not None and not keep:  # given up: a reattach must not execute it later behind our back
                for i, (kept_cmd, _) in enumerate(ch.kept):
                    if kept_cmd == cmd:
                        del ch.kept[i]
                        break
            raise CallTimeout(f"no answer from {self.server} within {t:.1f}s (call_timeout)") from None

    async def manage(self, op: str, **args: Any) -> Any:
        """Run a management operation (see `tandem admin`)."""
        return await self.call(self.control, lambda cmd: p.Manage(0, cmd, op, args))

    async def create_session(self, transacted: bool = False, ack_mode: str = "auto") -> AsyncSession:
        from .session import AsyncSession

        await self.wait_ready()
        ch = self.new_channel()
        session = AsyncSession(self, ch, transacted, ack_mode)
        ch.session = session
        try:
            await self.call(ch, lambda cmd: p.CreateSession(ch.id, cmd, transacted))
        except BaseException:
            self.channels.pop(ch.id, None)
            raise
        return session

    # ------------------------------------------------------------ inbound
    def _handle(self, pkt: Any) -> None:
        t = type(pkt)
        if t is p.Deliver:
            ch = self.channels.get(pkt.channel)
            if ch is not None and ch.session is not None:
                ch.session._deliver(pkt)
        elif t is p.DeliverChunk:
            ch = self.channels.get(pkt.channel)
            if ch is not None and ch.session is not None:
                ch.session._deliver_chunk(pkt)
        elif t is p.DeliverLarge:
            ch = self.channels.get(pkt.channel)
            if ch is not None and ch.session is not None:
                ch.session._deliver_large(pkt)
        elif t is p.Confirm:
            ch = self.channels.get(pkt.channel) if pkt.channel else self.control
            if ch is not None:
                ch.confirm(pkt.upto)
        elif t is p.Response:
            ch = self.channels.get(pkt.channel) if pkt.channel else self.control
            fut = ch.calls.pop(pkt.cmd, None) if ch is not None else None
            if fut is not None and not fut.done():
                fut.set_result(pkt.result)
        elif t is p.RangeResult:
            ch = self.channels.get(pkt.channel)
            if ch is not None and ch.session is not None:
                ch.session._range_answer(pkt)  # its large bodies' chunks follow it at once
            fut = ch.calls.pop(pkt.cmd, None) if ch is not None else None
            if fut is not None and not fut.done():
                fut.set_result(pkt)
        elif t is p.Exception_:
            ch = self.channels.get(pkt.channel) if pkt.channel else self.control
            if ch is not None:
                ch.fail_command(pkt.cmd, error_for(pkt.code, pkt.message))
        elif t is p.Received:
            ch = self.channels.get(pkt.channel) if pkt.channel else self.control
            if ch is not None:
                ch.received(pkt.upto)
        elif t is p.Ping:
            self.send_packet(p.Pong())
        elif t is p.Pong:
            pass
        elif t is p.ConsumerClosed:
            ch = self.channels.get(pkt.channel)
            if ch is not None and ch.session is not None:
                ch.session._consumer_closed(pkt.consumer_id, error_for(pkt.code, pkt.message))
        elif t is p.Topology:
            self.topology = list(pkt.nodes)
        elif t is p.Error:
            err = error_for(pkt.code, pkt.message)
            proto = self._proto
            if proto is not None:
                proto.abort(err)

    # ------------------------------------------------------------ failure
    def _closed_error(self) -> TandemError:
        if self.error is not None:
            return ConnectionLost(f"connection is closed: {self.error.message}")
        return ConnectionLost("connection is closed")

    def _transport_lost(self, exc: TandemError) -> None:
        """The socket of the current server failed: reconnect, or give up."""
        if self.closed:
            return
        self._link_gone(exc)
        if self.reconnect_attempts == 0:
            self._fail(exc)
            return
        sessions = [ch.session for ch in self.channels.values() if ch.session is not None]
        if self.window > 0 and sessions and not any(s.large_open for s in sessions):
            # Everything stays as it is: a reattach replays it, or `_unblock` fails it later.
            log.warning("connection to %s lost (%s): reattaching", self.server, exc.message)
            self._out.clear()
            self._writable.set()
            if self._reattaching is None:  # else lost again while reattaching: the first failure counts
                self._reattaching = (self.server, self.node_id, self.generation)
            self._start_reconnect(exc)
            return
        log.warning("connection to %s lost (%s): reconnecting", self.server, exc.message)
        self._restore_on_a_new_link(exc)

    def _link_gone(self, exc: TandemError) -> None:
        """The current link is no longer the client's: not ready, no pings, and range reads whose
        large bodies were arriving on it are asked again."""
        self._proto = None
        self._ready.clear()
        self.losses += 1
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None
        for ch in self.channels.values():
            if ch.session is not None:
                ch.session._range_link_lost(exc)

    def _restore_on_a_new_link(self, exc: TandemError, failed: tuple[str, str] | None = None) -> None:
        """The sessions are given up with the link (`_unblock`) and reconnected to without a
        reattach: the next link's restore makes them all again. Also after a loss while
        reattaching: what follows `_unblock` is a restore, never a reattach."""
        self._reattaching = None
        self._out.clear()  # nothing written for the lost link may reach the next one
        self._writable.set()
        self._unblock(exc)
        self._start_reconnect(exc, failed)

    def _start_reconnect(self, cause: TandemError, failed: tuple[str, str] | None = None) -> None:
        self._reconnector = task = self.loop.create_task(self._reconnect(cause, failed), name="tandem-reconnect")
        task.add_done_callback(self._reconnect_done)

    def _reconnect_done(self, task: asyncio.Task[None]) -> None:
        """An error the failover did not expect (a bug) gives the connection up, as a refusal
        does: left alone, it would end the task and leave the client not ready for ever."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("failover failed: %r", exc, exc_info=exc)
        self._fail(NotConnected(f"failover failed: {exc!r}"))

    _reattaching: tuple[str, str, int] | None = None  # the failed server, node and generation

    async def until_reattached(self) -> None:
        """While a reattach is under way, wait for it (the sessions may still be there to close)."""
        if self._reattaching is not None and not self.closed:
            try:
                await self.wait_ready()
            except TandemError:
                pass

    def _unblock(self, exc: TandemError) -> None:
        """The sessions are lost with the connection: calls in flight fail, sends with a dedup id
        wait to be sent again, consumers drop what the old server delivered."""
        self._pending_acks.clear()
        self.drops += 1
        unblocked = Unblocked(f"{exc.message} (the call was in flight; its outcome is unknown)")
        self.control.take_resendable(unblocked)
        if self.control.kept is not None:
            self.control.kept.clear()
        for ch in list(self.channels.values()):
            resend = ch.take_resendable(unblocked)
            if ch.kept is not None:
                ch.kept.clear()
            if ch.session is not None:
                ch.session._transport_lost(unblocked, resend)

    def _candidates(self, failed: str, first: bool = False) -> list[tuple[str, int]]:
        """The backup the topology names for our node first, the failed server last (`first`:
        the failed server first, for a reattach: only it has our sessions)."""
        order: list[str] = [failed] if first else []
        for n in self.topology:
            if isinstance(n, dict) and n.get("node_id") == self.node_id:
                order += [x for x in (n.get("backup"), n.get("live")) if x]
        order += [f"{h}:{p}" for h, p in self.hosts]
        order += [x for n in self.topology if isinstance(n, dict) for x in (n.get("live"), n.get("backup")) if x]
        seen: list[str] = []
        for x in order:
            if x not in seen and (x != failed or first):
                seen.append(x)
        if failed not in seen:
            seen.append(failed)
        out = []
        for x in seen:
            server = split_server(x)
            if server is not None:
                host, port, tls = server
                if tls:
                    self._tls_servers.add((host, port))
                out.append((host, port))
        return out

    async def _reconnect(self, cause: TandemError, failed: tuple[str, str] | None = None) -> None:
        failed_server, failed_node = failed or (self.server, self.node_id)
        if self._reattaching is not None:
            failed_server, failed_node, _ = self._reattaching
        try:
            rounds = itertools.count()  # a reattach tries the failed server first, in the first round only:
            # one that accepts and never answers (a zombie) then costs one connect_timeout, not one a round
            reattach = self._reattaching is not None
            last = await self._attempts(
                lambda: self._candidates(failed_server, reattach and next(rounds) == 0),
                self.reconnect_attempts,
                True,
            )
        except TandemError as exc:  # a server refused us for good (authentication, version)
            self._fail(exc)
            return
        except asyncio.CancelledError:
            return
        if last is not None:
            self._fail(NotConnected(f"failover gave up: {last}"))
            return
        proto = self._proto
        if self._reattaching is not None:
            generation = self._reattaching[2]
            try:
                done = self.node_id == failed_node and await self._reattach()
            except asyncio.CancelledError:
                return
            if self._proto is not proto or self.closed:
                return  # lost again meanwhile: that loss started a new reconnection
            self._reattaching = None
            if done:
                self.generation = generation  # deliveries from before the failure stay valid
                self._ready.set()
                # Nothing is parked on a session the server has: a restore takes what it parked
                # (and fails or gives up its link when it cannot send it: decision 0074).
                self._flush()
                log.warning("reattached to %s (node %s)", self.server, self.node_id)
                self._notify(FailureEvent.REATTACHED, cause)
                return
            self._unblock(cause)
        self._out.clear()  # nothing written for the old server may reach the new one
        for ch in self.channels.values():
            if ch.kept is not None:
                # Nor by a reattach to this restore (if its link is lost): what was written
                # since the loss is each session's restore's to send again or fail, and a
                # session not restored yet has no channel on this server.
                ch.kept.clear()
        self._restoring = proto
        drops = self.drops
        try:
            for ch in sorted(self.channels.values(), key=lambda c: c.id):
                if ch.session is not None and not ch.session.closed:  # closed while it waited: skipped
                    await ch.session._restore(drops)
        except TandemError as exc:
            if self.drops != drops or self.closed:
                return  # lost again while restoring, the sessions with it: that loss's reconnection restores them all
            if self._proto is proto:
                self._fail(exc)  # refused, or not answered, on its own link: the failover failed (as Artemis's)
                return
            # Its link was lost meanwhile and the client is reattaching, or has reattached, to
            # what it made: no restore follows a reattach, and the sessions after the failing one
            # are not on the server. That link is given up and every session restored afresh.
            self._restore_afresh(exc, failed_server, failed_node)
            return
        except asyncio.CancelledError:
            return
        finally:
            if self._restoring is proto:
                self._restoring = None
        kind = FailureEvent.RECONNECTED if self.server == failed_server else FailureEvent.FAILOVER
        if self._proto is not proto:
            # Lost again, yet restored: its answers came on the next link, which reattached to
            # this restore's sessions. That link's reconnection makes the client ready: its
            # reattach replays what was written meanwhile (a flush here would send it twice).
            self._notify(kind, cause)
            return
        self._ready.set()
        self._flush()
        log.warning("%s: now connected to %s (node %s, was %s)", kind.value, self.server, self.node_id, failed_node)
        self._notify(kind, cause)

    def _restore_afresh(self, exc: TandemError, failed_server: str, failed_node: str) -> None:
        """A restore failed after its link was lost (decision 0074): give up the link that is
        reattaching, or has reattached, to what it made (a live one is told DISCONNECT, so the
        broker drops those sessions now, not after the TTL: they would hold their consumers),
        and reconnect without reattaching: every session is restored on a fresh link. What was
        in flight fails with `Unblocked`; sends with a dedup id go again in that restore."""
        reconnector = self._reconnector
        if reconnector is not None and reconnector is not asyncio.current_task():
            reconnector.cancel()  # the later link's reconnection, reattaching to this restore
        proto = self._proto
        self._link_gone(exc)
        if proto is not None:
            proto.lost = True
            transport = proto.transport
            if transport is not None and not transport.is_closing():
                transport.write(p.encode(p.Disconnect()))
                transport.close()
        log.warning(
            "restoring the sessions on %s failed after its link was lost (%s): restoring them all on a new link",
            self.server,
            exc.message,
        )
        self._restore_on_a_new_link(exc, (failed_server, failed_node))

    async def _reattach(self) -> bool:
        """Ask the server for our sessions back; on success replay what it never received."""
        proto = self._proto
        assert proto is not None and proto.transport is not None
        chans = [self.control, *sorted(self.channels.values(), key=lambda c: c.id)]
        consumers = [c for ch in chans if ch.session is not None for c in ch.session.consumers.values()]
        reported = {c: c.flowed for c in consumers}
        req = p.Reattach(
            self.client_uuid,
            [
                p.ReattachChannel(
                    ch.id,
                    ch.awaited_from(),
                    [c._reattach_state() for c in ch.session.consumers.values()] if ch.session is not None else [],
                )
                for ch in chans
            ],
        )
        proto.transport.write(p.encode(req))
        try:
            ok = await asyncio.wait_for(asyncio.shield(proto.reattached), self.options.connect_timeout / 1000)
        except (TimeoutError, TandemError) as exc:
            log.warning("reattach to %s failed: %s", self.server, exc)
            if self._proto is proto:
                proto.abort(ConnectionLost(f"no answer to REATTACH from {self.server}"))
            return False
        if not ok.ok:
            log.warning("cannot reattach to %s: %s; starting new sessions", self.server, ok.reason)
            return False
        self._out.clear()  # written while away: every command of it is in a channel's kept frames
        for ch in chans:
            ch.received(ok.last.get(ch.id, 0))
            if ch.kept:
                self._out.extend(frame for _, frame in ch.kept)  # in order, each exactly once
            for pend in ch.confirms:
                if pend.unsent:  # written now, by the replay: from here on as any send without an id
                    pend.unsent = False
                    pend.resend = None
        for c, flowed in reported.items():  # credit granted since the REATTACH went out (its FLOW was dropped)
            if c.flowed > flowed and not c.closed:
                self._out.append(p.encode(p.Flow(c.session.channel.id, c.id, c.flowed - flowed)))
        return True

    def _notify(self, kind: FailureEvent, cause: TandemError | None) -> None:
        for listener in list(self.failure_listeners):
            try:
                listener(kind, cause)
            except Exception:
                log.exception("failure listener raised")

    def _fail(self, exc: TandemError) -> None:
        """Give up for good: everything waiting gets an error, listeners hear DISCONNECT."""
        if self.closed:
            return
        self.closed = True
        self.error = exc
        self._ready.clear()
        proto, self._proto = self._proto, None
        if proto is not None:
            proto.lost = True
            if proto.transport is not None:
                proto.transport.abort()
        if self._pinger is not None:
            self._pinger.cancel()
        unblocked = Unblocked(f"{exc.message} (the call was in flight; its outcome is unknown)")
        for ch in [self.control, *self.channels.values()]:
            ch.fail_all(unblocked)
            if ch.session is not None:
                ch.session._connection_failed(exc)
        self._writable.set()
        self._closed_event.set()
        self._notify(FailureEvent.DISCONNECT, exc)

    async def _ping_loop(self) -> None:
        period = self.options.client_failure_check_period / 1000
        ping_every = min(period / 2, self.ttl_ms / 2000)
        proto = self._proto
        while not self.closed and self._proto is proto and proto is not None:
            await asyncio.sleep(ping_every)
            now = self.loop.time()
            if now - self.last_received > period:
                proto.abort(ConnectionLost(f"no packet from {self.server} for {period:.1f}s"))
                return
            if now - self.last_sent >= ping_every and proto.transport is not None:
                proto.transport.write(p.encode(p.Ping()))
                self.last_sent = now

    def add_failure_listener(self, listener: Callable[[FailureEvent, TandemError | None], None]) -> None:
        """`listener(FailureEvent, cause)` on REATTACHED, FAILOVER, RECONNECTED or DISCONNECT."""
        self.failure_listeners.append(listener)

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    async def close(self) -> None:
        """Close sessions politely, then the socket."""
        if self.closed:
            return
        reconnector = self._reconnector
        if reconnector is not None and not reconnector.done():
            reconnector.cancel()
            if reconnector is not asyncio.current_task():
                # Let it end here: a blocking client stops its loop right after close, and a task
                # left cancelling is destroyed pending (its socket unclosed).
                await asyncio.wait([reconnector], timeout=1.0)
        if self._ready.is_set():
            for ch in list(self.channels.values()):
                if ch.session is not None:
                    try:
                        await ch.session.close()
                    except TandemError:
                        pass
        if not self.closed:
            self._flush()
            proto = self._proto
            if proto is not None and proto.transport is not None:
                proto.transport.write(p.encode(p.Disconnect()))
                proto.lost = True
                proto.transport.close()
                if proto.transport.get_extra_info("ssl_object") is not None:
                    # A TLS close waits for the server's close_notify: a blocking client stops its
                    # loop right after this, so wait here (bounded), then cut it.
                    try:
                        await asyncio.wait_for(proto.gone.wait(), TLS_CLOSE_WAIT)
                    except TimeoutError:
                        proto.transport.abort()
                        await _let_tls_close()
            self.closed = True
            self._proto = None
            if self._pinger is not None:
                self._pinger.cancel()
            for ch in [self.control, *self.channels.values()]:
                ch.fail_all(ConnectionLost("connection closed by the application"))
                if ch.session is not None:
                    ch.session._connection_failed(ConnectionLost("connection closed by the application"))
            self._closed_event.set()

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def check_open(self) -> None:
        if self.closed:
            raise self._closed_error()


async def connect(url: str, **options: Any) -> AsyncConnection:
    """Open an asyncio connection: `await tandem.aio.connect("tcp://127.0.0.1:61616")`."""
    return await AsyncConnection.connect(url, **options)


__all__ = ["AsyncConnection", "Channel", "FailureEvent", "connect"]
