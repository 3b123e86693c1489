"""STOMP connections: frames → the same core as the native protocol.

Destinations: `/queue/NAME` is anycast to NAME, `/topic/NAME` multicast; a plain name
follows the address settings. Message properties and STOMP headers map both ways;
bodies are untouched. A durable SEND's RECEIPT goes out only after the message is on
disk (group commit). Any bad input gets an ERROR frame and only this connection closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import msgspec

from ..config import HANDSHAKE_FRAME_LIMIT
from ..core.consumer import Consumer, DeliveryAccount
from ..core.message import Message, MessageData, MessageRef, RoutingType
from ..core.permissions import Access, Permission
from ..core.session import ServerSession, Transaction
from ..errors import AddressDoesNotExist, DuplicateId, ResourceLimit, TandemError, Unauthorized, clip
from ..protocol import stomp as st
from .audit import audit, created_by_send
from .audit import enabled as audit_enabled
from .authorization import access_for
from .limits import REFUSED_LINGER, OutputWatch, abort_later
from .pacing import UPLOAD, page_mark
from .security import ANONYMOUS, Subject
from .tls import cert_user

if TYPE_CHECKING:
    from ..store.large_messages import LargeUpload
    from .context import BrokerContext

log = logging.getLogger("tandem.stomp")

HIGH_WATER = 1 << 22
LOW_WATER = 1 << 20
# Frames of one read handled before the loop gets a turn. A read can hold a producer's whole
# window; handled in one go, its journal batch could only start syncing after the last frame,
# and handling and syncing would take turns. In slices, one slice syncs while the next is handled.
FRAMES_PER_PASS = 128
MAX_TRANSACTIONS = 100  # open (begun, not committed or aborted) transactions per connection
ACK_MODES = ("auto", "client", "client-individual")
# headers that are part of the frame, not of the message
_FRAME_HEADERS = frozenset(
    {"destination", "content-length", "receipt", "transaction", "persistent", "priority", "expires", "dedup-id",
     "_AMQ_DUPL_ID", "message-id", "subscription", "ack", "redelivered", "timestamp"}
)  # fmt: skip
_decode_data = msgspec.msgpack.Decoder(MessageData).decode
_UNSAFE_1_0 = re.compile(r"[:\r\n]")


class Subscription:
    """One SUBSCRIBE: a core consumer plus how its deliveries look as MESSAGE frames."""

    __slots__ = (
        "ack_header",
        "ack_mode",
        "conn",
        "consumer",
        "destination",
        "durable_queue",
        "head",
        "id",
        "prefetch",
        "temporary",
    )

    def __init__(self, conn: StompConnection, sid: str, destination: str, ack_mode: str, prefetch: int) -> None:
        self.conn = conn
        self.id = sid
        self.destination = destination
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.consumer: Consumer | None = None
        self.temporary: str | None = None  # a non-durable topic subscription's own queue
        self.durable_queue: str | None = None
        v = conn.version
        self.ack_header = v == "1.2" and ack_mode != "auto"  # MESSAGE frames carry `ack` (1.2)
        self.head = f"MESSAGE\nsubscription:{st.escape(sid, v)}\ndestination:{st.escape(destination, v)}\n"

    # DeliverySink
    @property
    def writable(self) -> bool:
        return self.conn.writable and self.conn.stream is None  # a large body goes out in one run

    def deliver(self, consumer: Consumer, ref: MessageRef) -> None:
        conn = self.conn
        m = ref.message
        data = _decode_data(m.raw)
        body = data.body
        lg = m.large
        # Built by hand (the hot path): only the subscription, destination and properties can need escaping.
        redelivered = "redelivered:true\n" if ref.delivery_count else ""
        ack = f"ack:{consumer.id}.{m.id}\n" if self.ack_header else ""
        parts = [
            self.head,
            f"message-id:{m.id}\npersistent:{'true' if data.durable else 'false'}\npriority:{data.priority}\n"
            f"expires:{data.expiration}\ntimestamp:{data.timestamp}\n{redelivered}{ack}",
        ]
        if data.properties:
            version = conn.version
            lines = _PROPERTY_LINES
            for k, v in data.properties.items():
                key = (k, v, type(v), version)
                line = lines.get(key)
                parts.append(_property_line(key) if line is None else line)
        if lg is not None:  # the body streams from its file after the head
            if lg.compressed:
                parts.append("tandem-compressed:zlib\n")  # compressed by its native producer: as stored
            parts.append(f"content-length:{lg.size}\n\n")
            try:
                conn.stream_body("".join(parts).encode(), m)
            except OSError as exc:  # its file is gone: never a frame with part of a body
                log.error("large message %s cannot be delivered: %s", m.id, exc)
                conn.close()
                return
        else:
            parts.append(f"content-length:{len(body)}\n\n")
            conn.write_frame("".join(parts).encode(), body)
        if self.ack_mode == "auto":  # acknowledged as it leaves (STOMP's auto mode)
            refs = consumer.take_acked(m.id, cumulative=False)
            consumer.queue.acknowledge(refs)
            if consumer.message_mode:
                consumer.credits += 1

    def consumer_closed(self, consumer: Consumer, error: TandemError) -> None:
        conn = self.conn
        conn.subscriptions.pop(self.id, None)
        conn._ack_prefixes.pop(str(consumer.id), None)
        if not conn.closed:
            conn.error(f"subscription {self.id} ended: {error.message}")


# Rendered property header lines by (name, value, type, version): most messages repeat the
# same few properties (content-type, a type tag), so escaping is done once per distinct pair.
_PROPERTY_LINES: dict[tuple[str, Any, type, str], str] = {}
_PROPERTY_LINES_MAX = 4096


def _property_line(key: tuple[str, Any, type, str]) -> str:
    """The header line of one property ("" when it cannot be a header), remembered."""
    k, v, _, version = key
    text = _text(v)
    if k in _FRAME_HEADERS:
        line = ""  # e.g. a native client's "content-length" property must not frame the body
    elif version == "1.0" and (_UNSAFE_1_0.search(k) or "\n" in text or "\r" in text):
        line = ""  # 1.0 has no escaping: such a header would break the frame
    else:
        line = f"{st.escape(k, version)}:{st.escape(text, version)}\n"
    if len(_PROPERTY_LINES) >= _PROPERTY_LINES_MAX:
        _PROPERTY_LINES.clear()
    _PROPERTY_LINES[key] = line
    return line


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class StompConnection(asyncio.Protocol):
    def __init__(self, broker: BrokerContext, acceptor: str) -> None:
        self.broker = broker
        self.acceptor = acceptor
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = st.StompParser(broker.config.max_frame_size, first_frame_limit=HANDSHAKE_FRAME_LIMIT)
        self.parser.stream_over = broker.config.min_large_message_size  # bigger SEND bodies: large messages
        self.version = "1.0"
        self.connected = False
        self.closed = False
        self.failing = False  # an ERROR is on its way: nothing more is read or handled
        self.writable = True
        self.handshaken = False  # for the broker's bookkeeping (native connections use it too)
        self.subject: Subject = ANONYMOUS  # who logged in (server/security.py), from CONNECT
        self._login: asyncio.Task[Subject | None] | None = None  # CONNECT's password check ("login" held)
        self.access: Access | None = None  # what the subject may do (None: security off), decision 0060
        self.peer = "?"
        self.cert_user: str | None = None  # the user a verified client certificate maps to
        self.client_id: str | None = None
        self.session: ServerSession | None = None
        self.subscriptions: dict[str, Subscription] = {}
        self.transactions: dict[str, Transaction] = {}
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._pending_durable = 0
        self._receipts: list[bytes] = []
        self._receipts_durable = False
        # Plain ACKs journaled since the last receipt that waited for the disk: the next receipt,
        # whatever it answers, waits too (it says every ACK before it is on disk).
        self._acks_unsynced = False
        self.last_received = self.loop.time()
        self.last_sent = self.last_received
        self.opened_at = self.last_received  # CONNECT must be accepted by handshake-timeout after this
        self.partial_since: float | None = None  # when the frame not complete yet began to arrive
        self.ttl_ms = broker.config.effective_ttl_ms
        self.send_beat_ms = 0  # how often we must send something (the client asked)
        self._beat_timer: asyncio.TimerHandle | None = None
        self._beat_period = 0.0
        self.temp_queues: set[str] = set()
        self._held: set[str] = set()  # why input is paused: "write" (backpressure), "full" (BLOCK), "error", "slice"
        self._backlog: deque[st.Frame] = deque()  # parsed frames not handled yet (held by a full address)
        self._destinations: dict[str, tuple[str, RoutingType]] = {}  # destination header -> (address, type)
        self._acked: dict[Consumer, list[MessageRef]] = {}  # taken by ACKs of this read, not journaled yet
        self._ack_prefixes: dict[str, Subscription] = {}  # "CID" of the 1.2 ack ids "CID.MID" -> subscription
        self.stream: BodyStream | None = None  # a large body going out: nothing else is written meanwhile
        self.upload: LargeSend | None = None  # a large SEND's body coming in
        cfg = broker.config
        # Limits (server/limits.py, decision 0062): unacknowledged deliveries across its
        # subscriptions, output a client does not read.
        self.delivery_account = DeliveryAccount(cfg.max_unacked_messages, cfg.max_unacked_bytes, self._room)
        self.output_watch = OutputWatch(cfg.slow_client_timeout / 1000)
        self.counted: tuple[str, str] | None = None  # (acceptor, peer host) in the broker's connection counts
        self.counted_user: str | None = None

    # ----------------------------------------------------------- transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.cert_user = cert_user(self.broker.config, transport)  # mutual TLS (server/tls.py)
        self.transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        refused = self.broker.limits.admit(self)
        if refused is not None:
            # ERROR at once; what the client sends meanwhile (its CONNECT) is read and dropped, so
            # the close does not reset the connection before the client has read why.
            log.info("refused STOMP connection from %s: %s", self.peer, refused.message)
            self.closed = True
            message = clip(refused.message, 500)
            headers = [("message", message), ("code", refused.code.name), ("content-type", "text/plain")]
            self.transport.write(st.encode("ERROR", headers, message.encode(), "1.0"))
            self.loop.call_later(REFUSED_LINGER, self.transport.close)
            self.loop.call_later(2 * REFUSED_LINGER, self.transport.abort)
            return
        self.broker.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown()

    def _room(self) -> None:
        """(DeliveryAccount) acknowledgements made room under the unacked limit: deliver again."""
        if self.closed:
            return
        for sub in self.subscriptions.values():
            if sub.consumer is not None:
                sub.consumer.queue.deliver_soon()

    def pause_writing(self) -> None:
        self.writable = False
        self._hold("write")

    def resume_writing(self) -> None:
        if self.failing:
            return  # an ERROR is on its way: stay quiet
        self.writable = True
        self._release("write")
        if self.stream is not None:
            self.stream.run()
            return
        for sub in self.subscriptions.values():
            if sub.consumer is not None:
                sub.consumer.queue.deliver_soon()

    def pace(self, paused: bool) -> None:
        """(Pacer, server/pacing.py) not read while a paced buffer is full."""
        if paused:
            self._hold("paced")
        else:
            self._release("paced")

    def _hold(self, reason: str) -> None:
        if not self._held and self.transport is not None:
            self.transport.pause_reading()
        self._held.add(reason)

    def _release(self, reason: str) -> None:
        self._held.discard(reason)
        if not self._held and self.transport is not None and not self.closed and not self.failing:
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        self._out.append(data)
        self._flush_soon()

    def write_all(self, frames: list[bytes]) -> None:
        self._out += frames
        self._flush_soon()

    def write_frame(self, head: bytes, body: bytes) -> None:
        """Head, body and NUL as they are: the one join in `_flush` is their only copy."""
        self._out += (head, body, b"\0")
        self._flush_soon()

    def _flush_soon(self) -> None:
        """Everything written in one loop pass goes out in one transport write."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def stream_body(self, head: bytes, message: Message) -> None:
        """Write a frame whose body is a large message's file: the head now, the body as the socket takes it."""
        stream = BodyStream(self, message)  # opens the file first: an error leaves nothing written
        self._out.append(head)
        self._flush()
        self.stream = stream
        stream.run()

    def stream_done(self) -> None:
        self.stream = None
        if self._out:
            self._flush_soon()
        for sub in self.subscriptions.values():
            if sub.consumer is not None:
                sub.consumer.queue.deliver_soon()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.stream is not None:
            return  # in the middle of a frame's body: what else was written waits for its end
        out = self._out
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])
            self.last_sent = self.loop.time()
        out.clear()

    def is_closed(self) -> bool:
        return self.closed or self.failing

    # --------------------------------------------------------------- input
    def data_received(self, data: bytes) -> None:
        if self.closed or self.failing:
            return
        self.last_received = now = self.loop.time()
        while True:
            try:
                frames = self.parser.feed(data)
            except TandemError as exc:
                self.error(exc.message)
                return
            except Exception as exc:  # a bug in the codec, not bad input: logged, and this client alone gets ERROR
                log.exception("error parsing STOMP frames from %s", self.peer)
                self.error(f"internal error: {exc!r}")
                return
            if not self.parser.buffered:
                self.partial_since = None
            elif frames or self.partial_since is None:  # a new frame began in this read
                self.partial_since = now
            self._backlog.extend(frames)
            self._run_backlog()
            # The parser stops after CONNECT so the rest is read with the negotiated version.
            if self.is_closed() or not frames or frames[-1].command not in ("CONNECT", "STOMP"):
                break
            data = b""

    def _run_backlog(self) -> None:
        """Handle parsed frames in order; a full address (BLOCK) holds the rest until it has room."""
        backlog = self._backlog
        held = self._held
        handlers = _HANDLERS
        budget = FRAMES_PER_PASS
        while backlog and "full" not in held and "sealing" not in held and "login" not in held:
            if self.closed or self.failing:
                return
            if not budget:
                # The rest after the loop's next turn (see FRAMES_PER_PASS); read nothing meanwhile.
                if "slice" not in held:
                    self._hold("slice")
                    self.loop.call_soon(self._next_slice)
                break
            budget -= 1
            frame = backlog.popleft()
            command = frame.command
            if self._acked and command != "ACK":
                self._flush_acks()
            try:
                if not self.connected and command not in ("CONNECT", "STOMP"):
                    raise st.StompError(f"{command} before CONNECT")
                handlers[command](self, frame)
            except TandemError as exc:
                # DuplicateId says the originals are stored: it waits until they are durable.
                self.error(
                    exc.message, frame.get("receipt"), after_disk=isinstance(exc, DuplicateId), code=_code_of(exc)
                )
            except Exception as exc:
                log.exception("error handling STOMP %s from %s", command, self.peer)
                self.error(f"internal error: {exc!r}", frame.get("receipt"))
        if self._acked:
            self._flush_acks()
        failed = self.parser.failed
        if failed is not None and not backlog and not self.is_closed():  # bad input after good frames
            self.error(failed.message)
            return
        if self._receipts and not self.closed:
            self._flush_receipts()

    def _next_slice(self) -> None:
        if not self.closed:
            self._release("slice")
            self._run_backlog()

    def fatal(self, exc: TandemError) -> None:
        """The server cannot go on (its store failed): ERROR now and close; owed receipts never come."""
        if self.closed:
            return
        self.failing = True
        message = clip(exc.message.replace("\n", " "), 500)
        headers = [("message", message), ("code", exc.code.name), ("content-type", "text/plain")]
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(st.encode("ERROR", headers, message.encode(), self.version))
        self.close()

    def error(
        self, message: str, receipt: str | None = None, after_disk: bool = False, code: str | None = None
    ) -> None:
        """Send ERROR and close this connection only (a `code` header when given: UNAUTHORIZED).

        Receipts owed for earlier frames go first (as on DISCONNECT): a client that sent good
        frames before a bad one learns which of them the broker kept.
        """
        if self.closed or self.failing:
            return
        self.failing = True
        if self._acked:
            self._flush_acks()  # ACKs before the bad frame stand
        message = clip(message)  # a client's 1 MB name is not sent back whole
        log.info("STOMP error for %s: %s", self.peer, message)
        headers = [("message", clip(message.replace("\n", " "), 500)), ("content-type", "text/plain")]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        if code is not None:
            headers.append(("code", code))
        frame = st.encode("ERROR", headers, message.encode(), self.version)
        if self._receipts:
            self._flush_receipts()

        def fail() -> None:
            if not self.closed:
                self.write(frame)
                self._flush()
                self.close()

        if self._pending_durable or after_disk:
            # Read nothing more and deliver nothing more while the receipts wait for the disk.
            self.writable = False
            self._hold("error")
            self.broker.storage.after_durable(fail)
        else:
            fail()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            abort_later(self.loop, self.transport, self.broker.config.slow_client_timeout / 1000)
        self._teardown()

    def _teardown(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._login is not None:
            self._login.cancel()
        self.broker.limits.release(self)
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.stop()
        upload, self.upload = self.upload, None
        if upload is not None:
            upload.discard()
        if self._beat_timer is not None:
            self._beat_timer.cancel()
            self._beat_timer = None
        self.broker.connections.discard(self)
        if "full" in self._held and self.session is not None:  # its wait for room on a full address
            for addr in self.session.postoffice.addresses.values():
                addr.forget(self)
        if self._acked:
            self._flush_acks()
        for tx in self.transactions.values():
            if self.session is not None:
                self.session.rollback(tx)
        self.transactions.clear()
        if self.session is not None:
            self.session.close()
        if self.broker.active:
            for name in list(self.temp_queues):
                try:
                    self.broker.postoffice.delete_queue(name, force=True)
                except TandemError:
                    pass
        self.temp_queues.clear()

    def check_alive(self, now: float) -> None:
        """Close a client silent past its heart-beat (or TTL), not connected by handshake-timeout, or
        with a frame not complete within its TTL; beat if we owe one."""
        if self.closed:
            return
        if "full" in self._held or "paced" in self._held or "sealing" in self._held:
            self.last_received = now  # we stopped reading, not the client: its beats wait unread
            if self.partial_since is not None:
                self.partial_since = now
        t = self.transport
        if t is not None and self.output_watch.stuck(now, self.writable or self.failing, t.get_write_buffer_size()):
            log.warning(
                "closing STOMP connection from %s: it has read none of its %d pending bytes for %d ms "
                "(slow-client-timeout)",
                self.peer,
                t.get_write_buffer_size(),
                self.broker.config.slow_client_timeout,
            )
            self.broker.limits.refused["slow-client"] += 1
            t.abort()
            self._teardown()
            return
        cfg = self.broker.config
        frame_ms = max(self.ttl_ms, cfg.effective_ttl_ms)  # the connection's TTL, or the broker's if longer
        if now - self.last_received > self.ttl_ms / 1000:
            self.error(f"no frame or heart-beat for {self.ttl_ms / 1000:.1f}s")
        elif not self.connected and (now - self.opened_at) * 1000 > cfg.handshake_timeout:
            # Bytes before CONNECT (stray EOLs too) do not count: only an accepted CONNECT does.
            self.error(f"no CONNECT accepted within handshake-timeout ({cfg.handshake_timeout} ms)")
        elif self.partial_since is not None and (now - self.partial_since) * 1000 > frame_ms:
            # Each byte resets the silence check above: a client trickling bytes must not hold a frame open.
            self.error(
                f"a frame begun {now - self.partial_since:.1f}s ago is not complete: "
                f"a frame must arrive within the connection's TTL ({frame_ms} ms)"
            )
        elif self.send_beat_ms and (now - self.last_sent) * 1000 >= self.send_beat_ms / 2:
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(b"\n")
                self.last_sent = now

    def _beat(self) -> None:
        if self.closed:
            return
        self.check_alive(self.loop.time())
        if not self.closed:
            self._beat_timer = self.loop.call_later(self._beat_period, self._beat)

    # ------------------------------------------------------------ handlers
    def _receipt(self, frame: st.Frame, durable: bool = False) -> None:
        """RECEIPT after the frame's effects (after the fsync of anything journaled, in order).

        Receipts of one read are sent together: one fsync callback covers them all.
        """
        rid = frame.get("receipt")
        if rid is None:
            return
        self._receipts.append(st.receipt(rid, self.version))
        self._receipts_durable = self._receipts_durable or durable

    def _flush_receipts(self) -> None:
        receipts, self._receipts = self._receipts, []
        if self._receipts_durable or self._pending_durable or self._acks_unsynced:
            self._receipts_durable = self._acks_unsynced = False
            self._pending_durable += 1

            def done() -> None:
                self._pending_durable -= 1
                if not self.closed:
                    self.write_all(receipts)

            self.broker.storage.after_durable(done)
        else:
            self.write_all(receipts)

    def on_connect(self, frame: st.Frame) -> None:
        if self.connected or self._login is not None:
            raise st.StompError("already connected")
        version = st.negotiate(frame.get("accept-version"))
        if version is None:
            raise st.StompError(f"no common STOMP version in accept-version {frame.get('accept-version')!r}")
        self.version = version
        self.parser.version = version
        b = self.broker
        if not b.authenticator.enabled:
            self._accept_connect(frame, version, ANONYMOUS)
            return
        # The passcode's hash is checked off the loop: the frames after CONNECT wait in the backlog.
        self._hold("login")
        check = b.authenticate(frame.get("login"), frame.get("passcode"), self.peer, "stomp", self.cert_user)
        self._login = self.loop.create_task(check)
        self._login.add_done_callback(lambda task: self._checked(frame, version, task))

    def _checked(self, frame: st.Frame, version: str, task: asyncio.Task[Subject | None]) -> None:
        self._login = None
        if task.cancelled():
            return
        task.exception()  # retrieved even when closed: asyncio would report it as never retrieved
        if self.is_closed():
            return
        try:
            subject = task.result()
            if subject is None:
                audit("login", None, self.peer, None, False, login=frame.get("login"), protocol="stomp")
                raise st.StompError(f"authentication failed for login {frame.get('login')!r}")
            self._accept_connect(frame, version, subject)
        except TandemError as exc:
            self.error(exc.message, frame.get("receipt"))
            return
        except Exception as exc:
            log.exception("error checking the login of %s", self.peer)
            self.error(f"internal error: {exc!r}", frame.get("receipt"))
            return
        self._release("login")
        self._run_backlog()

    def _accept_connect(self, frame: st.Frame, version: str, subject: Subject) -> None:
        b = self.broker
        b.limits.login(self, subject.user, subject.cluster)
        audit("login", subject, self.peer, None, True, protocol="stomp")
        self.subject = subject
        self.access = access_for(b.authorizer, subject, self.peer)
        po = b.require_active()
        self.client_id = frame.get("client-id")
        cx, cy = 0, 0
        beat = frame.get("heart-beat")
        if beat and version != "1.0":
            values = [v for v in (st.ascii_int(x.strip()) for x in beat.split(",")) if v is not None]
            if len(values) != 2 or beat.count(",") != 1:
                raise st.StompError(f"bad heart-beat header {beat!r}: two numbers (ms) expected, like 10000,10000")
            cx, cy = values
        # Beats slower than half of connection-ttl-max are not waited for: the client cannot pick "never".
        cap = b.config.connection_ttl_max // 2
        cx, cy = min(cx, cap), min(cy, cap)
        if cx > 0:
            self.ttl_ms = max(cx * 2, 500)  # tolerate one late beat
        self.send_beat_ms = max(cy, 100) if cy > 0 else 0
        self.session = ServerSession(po, self, "stomp", access=self.access)
        self.connected = True
        self.handshaken = True
        headers = [
            ("version", version),
            ("server", f"tandem/{_version()}"),
            ("session", f"{b.node_id}:{id(self):x}"),
        ]
        if version != "1.0":
            headers.append(("heart-beat", f"{self.send_beat_ms},{cx}"))
        self.write(st.encode("CONNECTED", headers, b"", version))
        if cx > 0 or self.send_beat_ms:
            # Negotiated beats need their own clock: the broker's housekeeping tick
            # (connection-check-period) is far coarser than a 100 ms heart-beat.
            periods = [p for p in (self.send_beat_ms / 2, self.ttl_ms / 4) if p > 0]
            self._beat_period = min(periods) / 1000
            self._beat_timer = self.loop.call_later(self._beat_period, self._beat)

    on_stomp = on_connect

    def on_disconnect(self, frame: st.Frame) -> None:
        # Receipts of earlier frames in this read go first, then this one, then the close.
        if self._receipts:
            self._flush_receipts()
        rid = frame.get("receipt")

        def bye() -> None:
            if not self.closed:
                if rid is not None:
                    self.write(st.receipt(rid, self.version))
                self._flush()
                self.close()

        if self._pending_durable or rid is not None:
            self.broker.storage.after_durable(bye)
        else:
            bye()

    # ---------------------------------------------------------------- send
    def _address(self, destination: str | None, command: str = "SEND") -> tuple[str, RoutingType]:
        """(address, routing type) of a destination header; remembered (every SEND asks)."""
        if destination:
            known = self._destinations.get(destination)
            if known is not None:
                return known
        found = self._parse_destination(destination, command)
        if destination and len(self._destinations) < 256:
            self._destinations[destination] = found
        return found

    def _parse_destination(self, destination: str | None, command: str) -> tuple[str, RoutingType]:
        if not destination:
            raise st.StompError(f"{command} needs a destination header")
        if destination.startswith("/queue/"):
            name, rt = destination[7:], RoutingType.ANYCAST
        elif destination.startswith("/topic/"):
            name, rt = destination[7:], RoutingType.MULTICAST
        else:
            name, rt = destination, RoutingType.ANY
        if not name:
            raise st.StompError(f"empty destination name in {destination!r}")
        return name, rt

    def _tx(self, frame: st.Frame) -> Transaction | None:
        name = frame.get("transaction")
        if name is None:
            return None
        tx = self.transactions.get(name)
        if tx is None:
            raise st.StompError(f"unknown transaction {name!r}")
        return tx

    def on_send(self, frame: st.Frame) -> None:
        h = frame.headers
        address, rt = self._address(h.get("destination"))
        priority_text = h.get("priority")
        expires_text = h.get("expires")
        try:
            priority = 4 if priority_text is None else int(priority_text)
            expires = 0 if expires_text is None else int(expires_text)
        except ValueError:
            raise st.StompError("priority and expires must be integers") from None
        if not 0 <= priority <= 9:
            raise st.StompError(f"priority must be 0-9, got {priority}")
        props: dict[str, Any] | None = None
        if not h.keys() <= _FRAME_HEADERS:
            props = {k: v for k, v in h.items() if k not in _FRAME_HEADERS}
        persistent = h.get("persistent")
        durable = persistent is not None and persistent.lower() == "true"
        data = MessageData(
            address,
            durable,
            priority,
            expires,
            time.time_ns() // 1_000_000,
            h.get("dedup-id") or h.get("_AMQ_DUPL_ID"),
            int(rt),
            props,
            frame.body,
        )
        tx = self._tx(frame) if "transaction" in h else None
        session = self.session
        assert session is not None
        message = Message.create(session.postoffice.ids.next(), data)
        if frame.streamed:  # its body follows in pieces (BODY_PART), straight to its file
            session.authorize_send(message)  # before the body fills a file (and again when routed)
            large = getattr(self.broker.storage, "large", None)
            if large is None:
                raise st.StompError("this broker does not take large messages (no data directory)")
            try:
                self.upload = LargeSend(message, large.upload(message.id), frame, tx)
            except OSError as exc:  # the store's failure: the broker stops (IO_ERROR)
                raise large.fail(exc) from None
            return
        self._sent(frame, message, tx)

    def on_body_part(self, frame: st.Frame) -> None:
        up = self.upload
        if up is None or up.file is None:
            raise st.StompError("body data without a SEND")
        try:
            up.file.write(frame.body)
            self.broker.pacer.wrote(self, UPLOAD)
        except OSError as exc:
            store = up.file.store
            up.discard()
            raise store.fail(exc) from None

    def on_body_end(self, frame: st.Frame) -> None:
        up, self.upload = self.upload, None
        if up is None or up.file is None:
            raise st.StompError("body end without a SEND")
        file, up.file = up.file, None
        # The body's syncs run on a thread (decision 0052); the frames after it wait ("sealing").
        self._hold("sealing")
        self.loop.run_in_executor(None, file.sync_body).add_done_callback(partial(self._body_synced, up, file))

    def _body_synced(self, up: LargeSend, file: LargeUpload, fut: asyncio.Future[None]) -> None:
        if fut.cancelled() or self._seal_gone(file):
            return
        exc = fut.exception()
        if exc is None:
            try:
                file.rename()
            except OSError as e:
                exc = e
        if exc is not None:
            self._seal_failed(up, file, exc)
            return
        self.loop.run_in_executor(None, file.sync_dir).add_done_callback(partial(self._body_sealed, up, file))

    def _body_sealed(self, up: LargeSend, file: LargeUpload, fut: asyncio.Future[None]) -> None:
        if fut.cancelled() or self._seal_gone(file):
            return
        exc = fut.exception()
        if exc is not None:
            self._seal_failed(up, file, exc)
            return
        up.message.large = file.body(False)
        try:
            self._sent(up.frame, up.message, up.tx)
        except TandemError as e:
            self.error(e.message, up.frame.get("receipt"), after_disk=isinstance(e, DuplicateId), code=_code_of(e))
            return
        except Exception as e:
            log.exception("error routing a STOMP large message from %s", self.peer)
            self.error(f"internal error: {e!r}", up.frame.get("receipt"))
            return
        self._release("sealing")
        self._run_backlog()

    def _seal_gone(self, file: LargeUpload) -> bool:
        """The connection went while the body synced: never routed (never receipted); its file goes."""
        if not self.is_closed():
            return False
        file.discard()
        return True

    def _seal_failed(self, up: LargeSend, file: LargeUpload, exc: BaseException) -> None:
        file.discard()
        if isinstance(exc, OSError):  # the store's failure: the broker stops (IO_ERROR)
            e = file.store.fail(exc)
            self.error(e.message, up.frame.get("receipt"))
            return
        log.error("cannot store a large message: %s", exc)
        self.error(f"cannot store a large message: {exc}", up.frame.get("receipt"))

    def _sent(self, frame: st.Frame, message: Message, tx: Transaction | None) -> None:
        """Route a SEND's message (now, or at its transaction's commit), its receipt after."""
        h = frame.headers
        session = self.session
        assert session is not None
        address = message.address
        pages = session.postoffice.pages
        mark = page_mark(pages)
        wrote = session.send_message(message, tx)
        self.broker.pacer.paged(self, pages, mark)  # paged: wait while the page writer is behind
        created_by_send(session.postoffice.auto_created, self.subject, self.peer, "stomp")
        if "receipt" in h:
            self._receipt(frame, durable=wrote)
        if tx is None:
            addr = session.postoffice.addresses.get(address)
            if addr is not None and addr.bounded:  # only a bounded address can fill
                self._block_if_full(address)

    def _block_if_full(self, address: str) -> None:
        """`address-full-policy = BLOCK` for a protocol without producer credit (as Artemis does
        for STOMP): read nothing more from this connection until the address has room again."""
        assert self.session is not None
        addr = self.session.postoffice.addresses.get(address)
        if addr is None or "full" in self._held or addr.settings.address_full_policy != "BLOCK" or not addr.full:
            return
        self._hold("full")

        def room(_: int) -> None:
            # Called from inside the acknowledgement that made room: resume on the next loop
            # pass, not in the middle of that queue's bookkeeping.
            self.loop.call_soon(resume)

        def resume() -> None:
            if not self.closed:
                self.last_received = self.loop.time()
                self._release("full")
                self._run_backlog()

        addr.request_credit(1, room, self)

    # ----------------------------------------------------------- subscribe
    def on_subscribe(self, frame: st.Frame) -> None:
        assert self.session is not None
        destination = frame.get("destination")
        address, rt = self._address(destination, "SUBSCRIBE")
        sid = frame.get("id") or (destination if self.version == "1.0" else None)
        if sid is None:
            raise st.StompError("SUBSCRIBE needs an id header")
        if sid in self.subscriptions:
            raise st.StompError(f"subscription id {sid!r} is already in use")
        ack = frame.get("ack", "auto")
        if ack not in ACK_MODES:
            raise st.StompError(f"ack must be one of {', '.join(ACK_MODES)}, got {ack!r}")
        prefetch_text = frame.get("prefetch-count") or frame.get("activemq.prefetchSize")
        try:
            prefetch = int(prefetch_text) if prefetch_text else self.broker.config.stomp_prefetch_count
        except ValueError:
            raise st.StompError(f"prefetch-count must be a number, got {prefetch_text!r}") from None
        po = self.session.postoffice
        if len(self.subscriptions) >= self.broker.config.max_consumers_per_connection:
            raise ResourceLimit(
                f"this connection has {len(self.subscriptions)} subscriptions (max-consumers-per-connection)"
            )
        queues_before = set(po.queues) if audit_enabled() else None
        sub = Subscription(self, sid, destination or address, ack, prefetch)
        durable_name = frame.get("durable-subscription-name") or frame.get("activemq.subscriptionName")
        selector = frame.get("selector")
        if rt == RoutingType.MULTICAST or (rt == RoutingType.ANY and _is_multicast(po, address)):
            if self.access is not None:  # before its queue is made (create_consumer checks again)
                self.access.check(Permission.CONSUME, address)
            if address not in po.addresses and not po.settings_for(address).auto_create_addresses:
                raise AddressDoesNotExist(f"address {address!r} does not exist (auto-create-addresses is off)")
            if durable_name:
                if not self.client_id:
                    raise st.StompError("a durable subscription needs a client-id on CONNECT")
                qname = f"{self.client_id}.{durable_name}"
                if qname not in po.queues:
                    self.session.authorize_queue(qname, address, durable=True)
                po.create_queue(
                    qname, address, RoutingType.MULTICAST, durable=True, filter_text=selector, exists_ok=True
                )
                sub.durable_queue = qname
            else:
                qname = f"{address}.stomp.{id(self):x}.{sid}"
                self.session.authorize_queue(qname, address, durable=False)
                po.create_queue(
                    qname, address, RoutingType.MULTICAST, durable=False, filter_text=selector, temporary=True
                )
                self.temp_queues.add(qname)
                sub.temporary = qname
        else:
            qname = address
        window = 0 if prefetch > 0 else -1
        cid = len(self.subscriptions) + 1
        while cid in self.session.consumers:
            cid += 1
        consumer = self.session.create_consumer(cid, qname, sub, window, selector)
        if prefetch > 0:
            consumer.add_credits(prefetch)
        if queues_before is not None:
            for name in po.queues.keys() - queues_before:  # created by this SUBSCRIBE
                audit("queue.create", self.subject, self.peer, name, True, by="subscribe", protocol="stomp")
        sub.consumer = consumer
        self.subscriptions[sid] = sub
        self._ack_prefixes[str(cid)] = sub
        self._receipt(frame)

    def on_unsubscribe(self, frame: st.Frame) -> None:
        assert self.session is not None
        sid = frame.get("id") or (frame.get("destination") if self.version == "1.0" else None)
        sub = self.subscriptions.get(sid or "")
        if sub is None:
            raise st.StompError(f"no subscription with id {sid!r}")
        po = self.session.postoffice
        ends = sub.durable_queue is not None and (
            frame.get("durable-subscription-name") or frame.get("activemq.subscriptionName")
        )
        if ends and self.access is not None and sub.durable_queue in po.queues:
            self.access.check(Permission.DELETE_DURABLE_QUEUE, po.queues[sub.durable_queue].address)
        del self.subscriptions[sid or ""]
        if sub.consumer is not None:
            self._ack_prefixes.pop(str(sub.consumer.id), None)
            self.session.close_consumer(sub.consumer.id)
        if sub.temporary is not None:
            self.temp_queues.discard(sub.temporary)
            po.delete_queue(sub.temporary, force=True)
        elif sub.durable_queue is not None and ends:
            po.delete_queue(sub.durable_queue, force=True)  # unsubscribing by name ends the durable subscription
            audit("queue.delete", self.subject, self.peer, sub.durable_queue, True, by="unsubscribe", protocol="stomp")
        self._receipt(frame)

    # --------------------------------------------------------------- acks
    def _ack_target(self, frame: st.Frame) -> tuple[Subscription, int]:
        if self.version == "1.2":
            ack_id = frame.get("id")
            cid_text, dot, mid_part = (ack_id or "").partition(".")
            if not dot:
                raise st.StompError(f"ACK/NACK needs the id of a MESSAGE's ack header, got {ack_id!r}")
            sub = self._ack_prefixes.get(cid_text)  # the id as this broker wrote it: "CID.MID"
            if sub is not None and mid_part.isdecimal():
                return sub, int(mid_part)
            try:  # written some other way ("01.5"): the same numbers
                cid, mid = int(cid_text), int(mid_part)
            except ValueError:
                raise st.StompError(f"unknown ack id {ack_id!r}") from None
            sub = self._ack_prefixes.get(str(cid))
            if sub is None:
                raise st.StompError(f"unknown ack id {ack_id!r}")
            return sub, mid
        mid_text = frame.get("message-id")
        sid = frame.get("subscription")
        try:
            mid = int(mid_text or "")
        except ValueError:
            raise st.StompError(f"ACK/NACK needs a message-id, got {mid_text!r}") from None
        if sid is not None:
            named = self.subscriptions.get(sid)
            if named is None:
                raise st.StompError(f"no subscription with id {sid!r}")
            return named, mid
        for sub in self.subscriptions.values():  # 1.0: find it
            if sub.consumer is not None and mid in sub.consumer.delivering:
                return sub, mid
        raise st.StompError(f"message {mid} is not awaiting an ack")

    def on_ack(self, frame: st.Frame) -> None:
        assert self.session is not None
        sub, mid = self._ack_target(frame)
        consumer = sub.consumer
        if consumer is None or sub.ack_mode == "auto":
            raise st.StompError(f"subscription {sub.id} does not take acks (ack:auto)")
        if mid not in consumer.delivering:
            raise st.StompError(f"message {mid} is not awaiting an ack on subscription {sub.id}")
        cumulative = sub.ack_mode == "client"
        h = frame.headers
        if "transaction" not in h and "receipt" not in h:
            # The common case, one ACK per MESSAGE: taken now (a repeated ACK fails at once),
            # journaled with the other ACKs of this read as one record (`_flush_acks`).
            refs = consumer.take_acked(mid, cumulative)
            pending = self._acked.get(consumer)
            if pending is None:
                self._acked[consumer] = refs
            else:
                pending.extend(refs)
            return
        self._flush_acks()
        before = len(consumer.delivering)
        wrote = self.session.ack(consumer.id, mid, cumulative, self._tx(frame))
        if consumer.message_mode:
            consumer.add_credits(before - len(consumer.delivering))
        self._receipt(frame, durable=wrote)

    def _flush_acks(self) -> None:
        """Acknowledge what the plain ACKs of this read took: one journal record per queue."""
        acked, self._acked = self._acked, {}
        for consumer, refs in acked.items():
            if consumer.queue.acknowledge(refs):
                self._acks_unsynced = True
            if consumer.message_mode:
                consumer.add_credits(len(refs))

    def on_nack(self, frame: st.Frame) -> None:
        assert self.session is not None
        if self.version == "1.0":
            raise st.StompError("NACK is STOMP 1.1 and later")
        sub, mid = self._ack_target(frame)
        consumer = sub.consumer
        if consumer is None or mid not in consumer.delivering:
            raise st.StompError(f"message {mid} is not awaiting an ack on subscription {sub.id}")
        # A transactional NACK is checked and applied at once: on COMMIT or ABORT
        # the message would go back to its queue all the same.
        self._tx(frame)
        self.session.nack(consumer.id, mid)
        if consumer.message_mode:
            consumer.add_credits(1)
        self._receipt(frame)

    # -------------------------------------------------------- transactions
    def on_begin(self, frame: st.Frame) -> None:
        name = frame.get("transaction")
        if not name:
            raise st.StompError("BEGIN needs a transaction header")
        if name in self.transactions:
            raise st.StompError(f"transaction {name!r} is already open")
        if len(self.transactions) >= MAX_TRANSACTIONS:
            raise st.StompError(
                f"too many open transactions: at most {MAX_TRANSACTIONS} per connection (COMMIT or ABORT one first)"
            )
        self.transactions[name] = Transaction()
        self._receipt(frame)

    def on_commit(self, frame: st.Frame) -> None:
        assert self.session is not None
        tx = self._tx(frame)
        if tx is None:
            raise st.StompError("COMMIT needs a transaction header")
        del self.transactions[frame.headers["transaction"]]
        addresses = {m.address for m in tx.messages}
        pages = self.session.postoffice.pages
        mark = page_mark(pages)
        wrote = self.session.commit(tx=tx)
        self.broker.pacer.paged(self, pages, mark)  # what it held, paged at the commit
        self._receipt(frame, durable=wrote)
        for address in sorted(addresses):
            self._block_if_full(address)

    def on_abort(self, frame: st.Frame) -> None:
        assert self.session is not None
        tx = self._tx(frame)
        if tx is None:
            raise st.StompError("ABORT needs a transaction header")
        del self.transactions[frame.headers["transaction"]]
        # Credit came back when the ACKs were made; the messages now return to their queues.
        self.session.rollback(tx)
        self._receipt(frame)


_HANDLERS: dict[str, Callable[[StompConnection, st.Frame], None]] = {
    command: getattr(StompConnection, f"on_{command.lower()}") for command in st.CLIENT_COMMANDS
}
_HANDLERS[st.BODY_PART] = StompConnection.on_body_part
_HANDLERS[st.BODY_END] = StompConnection.on_body_end


def _code_of(exc: TandemError) -> str | None:
    """The ERROR frame's `code` header: a denied operation says UNAUTHORIZED."""
    return exc.code.name if isinstance(exc, Unauthorized) else None


def _is_multicast(po: Any, address: str) -> bool:
    """A plain destination subscribes pub/sub when its address is multicast only, or, not
    created yet, when its address settings make new addresses multicast (as a SEND would)."""
    addr = po.addresses.get(address)
    if addr is None:
        return bool(po.settings_for(address).default_address_routing_type == RoutingType.MULTICAST)
    return RoutingType.MULTICAST in addr.routing_types and RoutingType.ANYCAST not in addr.routing_types


def _version() -> str:
    from .. import __version__

    return __version__


# ------------------------------------------------------------ large messages
STREAM_CHUNKS_PER_PASS = 8


class BodyStream:
    """A large message's body going out as a MESSAGE frame's body, from its file, then the NUL."""

    __slots__ = ("conn", "fd", "message", "offset", "size")

    def __init__(self, conn: StompConnection, message: Message) -> None:
        lg = message.large
        assert lg is not None
        storage: Any = conn.broker.storage
        self.fd: int | None = os.open(storage.large.path(lg.name), os.O_RDONLY)
        self.conn = conn
        self.message = message  # holds the body (and its file) until the NUL is out
        self.size = lg.size
        self.offset = 0

    def run(self) -> None:
        conn = self.conn
        fd = self.fd
        transport = conn.transport
        if fd is None or transport is None or transport.is_closing():
            self.stop()
            return
        step = min(conn.broker.config.min_large_message_size, 1 << 20)
        for _ in range(STREAM_CHUNKS_PER_PASS):
            if not conn.writable:
                return  # resume_writing runs us again
            data = os.pread(fd, min(step, self.size - self.offset), self.offset) if self.offset < self.size else b""
            if not data and self.offset < self.size:
                log.error("large message %s: its file ends at %d of %d bytes", self.message.id, self.offset, self.size)
                self.stop()
                conn.close()  # never a frame with part of a body: the client sees the connection end
                return
            self.offset += len(data)
            if self.offset >= self.size:
                transport.write(data)
                transport.write(b"\0")
                conn.last_sent = conn.loop.time()
                self.stop()
                conn.stream_done()
                return
            transport.write(data)
            conn.last_sent = conn.loop.time()
        conn.loop.call_soon(self.run)

    def stop(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class LargeSend:
    """A SEND whose body (over min-large-message-size) streams into a large message's file."""

    __slots__ = ("file", "frame", "message", "tx")

    def __init__(self, message: Message, file: LargeUpload, frame: st.Frame, tx: Transaction | None) -> None:
        self.message = message
        self.file: LargeUpload | None = file
        self.frame = frame
        self.tx = tx

    def discard(self) -> None:
        f, self.file = self.file, None
        if f is not None:
            f.discard()
