"""The asyncio client connection: one Protocol, channels with command ids, coalesced writes.

Pipelined commands (SEND, ACK) wait in a per-channel deque until the server's
CONFIRM(upto) covers them; calls wait for RESPONSE/EXCEPTION by command id.
A connection that fails unblocks everything waiting with `Unblocked` /
`ConnectionLost`: nothing waits forever.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, cast

import msgspec

from ..errors import (
    CallTimeout,
    ConnectionLost,
    IllegalState,
    NotConnected,
    ProtocolError,
    TandemError,
    Unblocked,
    error_for,
)
from ..protocol import native as p
from .options import ConnectOptions, parse_url

if TYPE_CHECKING:
    from .session import AsyncConsumer, AsyncSession

log = logging.getLogger("tandem.client")

Waiter = asyncio.Future[None] | Callable[[BaseException | None], None] | None


class FailureEvent(Enum):
    FAILOVER = "failover"
    RECONNECTED = "reconnected"
    DISCONNECT = "disconnect"


class Channel:
    __slots__ = ("calls", "confirms", "id", "next_cmd", "session")

    def __init__(self, cid: int) -> None:
        self.id = cid
        self.next_cmd = 1
        self.confirms: deque[tuple[int, Waiter]] = deque()
        self.calls: dict[int, asyncio.Future[Any]] = {}
        self.session: AsyncSession | None = None

    def cmd(self) -> int:
        n = self.next_cmd
        self.next_cmd = n + 1
        return n

    def confirm(self, upto: int) -> int:
        """Resolve pipelined commands up to `upto`; returns how many."""
        q = self.confirms
        n = 0
        while q and q[0][0] <= upto:
            _cmd, waiter = q.popleft()
            n += 1
            if waiter is None:
                continue
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_result(None)
            else:
                waiter(None)
        return n

    def fail_command(self, cmd: int, exc: TandemError) -> bool:
        fut = self.calls.pop(cmd, None)
        if fut is not None:
            if not fut.done():
                fut.set_exception(exc)
            return True
        for i, (c, waiter) in enumerate(self.confirms):
            if c == cmd:
                del self.confirms[i]
                _resolve(waiter, exc)
                return True
        return False

    def fail_all(self, exc: TandemError) -> None:
        for fut in self.calls.values():
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: nobody may be awaiting any more
        self.calls.clear()
        while self.confirms:
            _cmd, waiter = self.confirms.popleft()
            _resolve(waiter, exc)


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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        transport = self.transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        conn.last_received = conn.loop.time()
        try:
            packets = self.reader.feed(data)
        except ProtocolError as exc:
            conn._fail(exc)
            return
        handle = conn._handle
        try:
            for pkt in packets:
                handle(pkt)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            conn._fail(ProtocolError(f"malformed packet from {conn.server}: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._fail(ConnectionLost(f"connection to {self.conn.server} lost" + (f": {exc}" if exc else "")))

    def pause_writing(self) -> None:
        self.conn._writable.clear()

    def resume_writing(self) -> None:
        self.conn._writable.set()


class AsyncConnection:
    """A connection to one Tandem server (failover arrives with the HA client)."""

    def __init__(self, hosts: list[tuple[str, int]], options: ConnectOptions) -> None:
        self.hosts = hosts
        self.options = options
        self.loop = asyncio.get_running_loop()
        self.server = ""
        self.server_name = ""
        self.node_id = ""
        self.topology: list[Any] = []
        self.channels: dict[int, Channel] = {}
        self.control = Channel(0)
        self._next_channel = 1
        self._proto: _Protocol | None = None
        self._out: list[bytes | bytearray] = []
        self._flush_scheduled = False
        self._pending_acks: dict[AsyncConsumer, int] = {}
        self._hello: asyncio.Future[p.HelloOk] | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._pinger: asyncio.Task[None] | None = None
        self.closed = False
        self.error: TandemError | None = None
        self.failure_listeners: list[Callable[[FailureEvent, TandemError | None], None]] = []
        self.last_received = self.loop.time()
        self.last_sent = self.last_received
        self.ttl_ms = options.connection_ttl

    # ------------------------------------------------------------- connect
    @classmethod
    async def connect(cls, url: str, **options: Any) -> AsyncConnection:
        hosts, opts = parse_url(url, **options)
        conn = cls(hosts, opts)
        await conn._open()
        return conn

    async def _open(self) -> None:
        opts = self.options
        attempts = opts.initial_connect_attempts
        interval = opts.retry_interval / 1000
        last: BaseException | None = None
        n = 0
        while attempts < 0 or n < max(attempts, 1):
            for host, port in self.hosts:
                try:
                    await self._open_one(host, port)
                    return
                except (OSError, TimeoutError, TandemError) as exc:
                    if isinstance(exc, TandemError) and not isinstance(exc, (ConnectionLost, CallTimeout)):
                        raise
                    last = exc
            n += 1
            if attempts >= 0 and n >= max(attempts, 1):
                break
            await asyncio.sleep(interval)
            interval = min(interval * opts.retry_interval_multiplier, opts.max_retry_interval / 1000)
        where = ", ".join(f"{h}:{p}" for h, p in self.hosts)
        raise NotConnected(f"cannot connect to {where}: {last}")

    async def _open_one(self, host: str, port: int) -> None:
        timeout = self.options.connect_timeout / 1000
        transport, proto = await asyncio.wait_for(
            self.loop.create_connection(lambda: _Protocol(self), host, port), timeout
        )
        self._proto = proto
        self.server = f"{host}:{port}"
        self.closed = False
        self.error = None
        self._hello = self.loop.create_future()
        o = self.options
        hello = p.Hello(p.PROTOCOL_VERSION, o.client_id, o.username, o.password, "tandem-python", o.connection_ttl)
        transport.write(p.MAGIC + p.encode(hello))
        try:
            ok = await asyncio.wait_for(self._hello, timeout)
        except BaseException:
            transport.abort()
            raise
        self.server_name = ok.server_name
        self.node_id = ok.node_id
        self.ttl_ms = ok.connection_ttl  # the broker's decision (it may override ours)
        self.topology = list(ok.topology)
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
        if self._pending_acks:
            acks = self._pending_acks
            self._pending_acks = {}
            for consumer, mid in acks.items():
                consumer._emit_ack(mid)
        out = self._out
        if not out:
            return
        proto = self._proto
        if proto is not None and proto.transport is not None and not proto.transport.is_closing():
            proto.transport.write(b"".join(out) if len(out) > 1 else out[0])
            self.last_sent = self.loop.time()
        out.clear()

    def schedule_ack(self, consumer: AsyncConsumer, message_id: int) -> None:
        self._pending_acks[consumer] = message_id
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    async def drain(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        if not self._writable.is_set():
            await self._writable.wait()

    # --------------------------------------------------------- commands
    def new_channel(self) -> Channel:
        ch = Channel(self._next_channel)
        self._next_channel += 1
        self.channels[ch.id] = ch
        return ch

    def pipeline(self, ch: Channel, pkt: p.Packet, waiter: Waiter) -> None:
        """Send a confirmed command (its `cmd` already set from ch.cmd())."""
        self._write(p.encode(pkt))
        ch.confirms.append((pkt.cmd, waiter))  # type: ignore[attr-defined]

    async def call(
        self, ch: Channel, make: Callable[[int], p.Packet], timeout: float | None = None, forever: bool = False
    ) -> Any:
        """Send a command and wait for its answer (up to call_timeout, or `forever` until the connection fails)."""
        if self.closed:
            raise self._closed_error()
        cmd = ch.cmd()
        fut: asyncio.Future[Any] = self.loop.create_future()
        ch.calls[cmd] = fut
        self._write(p.encode(make(cmd)))
        if forever:
            return await fut
        t = self.options.call_timeout / 1000 if timeout is None else timeout
        try:
            return await asyncio.wait_for(fut, t)
        except TimeoutError:
            ch.calls.pop(cmd, None)
            raise CallTimeout(f"no answer from {self.server} within {t:.1f}s (call_timeout)") from None

    async def manage(self, op: str, **args: Any) -> Any:
        """Run a management operation (see `tandem admin`)."""
        return await self.call(self.control, lambda cmd: p.Manage(0, cmd, op, args))

    async def create_session(self, transacted: bool = False, ack_mode: str = "auto") -> AsyncSession:
        from .session import AsyncSession

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
        elif t is p.Confirm:
            ch = self.channels.get(pkt.channel) if pkt.channel else self.control
            if ch is not None:
                ch.confirm(pkt.upto)
        elif t is p.Response:
            ch = self.channels.get(pkt.channel) if pkt.channel else self.control
            fut = ch.calls.pop(pkt.cmd, None) if ch is not None else None
            if fut is not None and not fut.done():
                fut.set_result(pkt.result)
        elif t is p.Exception_:
            ch = self.channels.get(pkt.channel) if pkt.channel else self.control
            if ch is not None:
                ch.fail_command(pkt.cmd, error_for(pkt.code, pkt.message))
        elif t is p.Ping:
            self.send_packet(p.Pong())
        elif t is p.Pong:
            pass
        elif t is p.HelloOk:
            if self._hello is not None and not self._hello.done():
                self._hello.set_result(pkt)
        elif t is p.ConsumerClosed:
            ch = self.channels.get(pkt.channel)
            if ch is not None and ch.session is not None:
                ch.session._consumer_closed(pkt.consumer_id, error_for(pkt.code, pkt.message))
        elif t is p.Topology:
            self.topology = list(pkt.nodes)
        elif t is p.Error:
            err = error_for(pkt.code, pkt.message)
            if self._hello is not None and not self._hello.done():
                self._hello.set_exception(err)
            self._fail(err)

    # ------------------------------------------------------------ failure
    def _closed_error(self) -> TandemError:
        if self.error is not None:
            return ConnectionLost(f"connection is closed: {self.error.message}")
        return ConnectionLost("connection is closed")

    def _fail(self, exc: TandemError) -> None:
        if self.closed:
            return
        self.closed = True
        self.error = exc
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.abort()
        if self._pinger is not None:
            self._pinger.cancel()
        if self._hello is not None and not self._hello.done():
            self._hello.set_exception(exc)
            self._hello.exception()
        unblocked = Unblocked(f"{exc.message} (the call was in flight; its outcome is unknown)")
        for ch in [self.control, *self.channels.values()]:
            ch.fail_all(unblocked)
            if ch.session is not None:
                ch.session._connection_failed(exc)
        self._writable.set()
        for listener in list(self.failure_listeners):
            try:
                listener(FailureEvent.DISCONNECT, exc)
            except Exception:
                log.exception("failure listener raised")

    async def _ping_loop(self) -> None:
        period = self.options.client_failure_check_period / 1000
        ping_every = min(period / 2, self.ttl_ms / 2000)
        while not self.closed:
            await asyncio.sleep(ping_every)
            now = self.loop.time()
            if now - self.last_received > period:
                self._fail(ConnectionLost(f"no packet from {self.server} for {period:.1f}s"))
                return
            if now - self.last_sent >= ping_every:
                try:
                    self.send_packet(p.Ping())
                except TandemError:
                    return

    def add_failure_listener(self, listener: Callable[[FailureEvent, TandemError | None], None]) -> None:
        self.failure_listeners.append(listener)

    async def close(self) -> None:
        """Close sessions politely, then the socket."""
        if self.closed:
            return
        for ch in list(self.channels.values()):
            if ch.session is not None:
                try:
                    await ch.session.close()
                except TandemError:
                    pass
        if not self.closed:
            self._flush()
            try:
                self.send_packet(p.Disconnect())
                self._flush()
            except TandemError:
                pass
            self.closed = True
            if self._pinger is not None:
                self._pinger.cancel()
            if self._proto is not None and self._proto.transport is not None:
                self._proto.transport.close()
            for ch in [self.control, *self.channels.values()]:
                ch.fail_all(ConnectionLost("connection closed by the application"))

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


__all__ = ["AsyncConnection", "Channel", "FailureEvent", "IllegalState", "connect"]
