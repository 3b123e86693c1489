"""Pipelined AMQP 0-9-1 benchmark driver (publisher confirms, manual acks).

The client is an ``asyncio.Protocol`` with no task or future per message.
pamqp encodes and decodes every frame of the handshake and all control
methods, and encodes the constant parts of a publish once; the four frames
of the hot path are handled with precompiled ``struct`` formats:

* producer: Basic.Publish + content header + body frames are written as one
  pre-encoded prefix, an 8-byte send stamp and a pre-encoded tail; every
  ``data_received`` call handles all Basic.Ack frames it holds (single and
  ``multiple=true``) and tops the window up with one ``transport.write``;
* consumer: Basic.Deliver, content header and body frames are parsed in
  place, and all acks for one ``data_received`` call go out in one write.

Each producer and consumer runs in its own process (see ``common.py``).

Example::

    python bench/drivers/amqp.py --host 127.0.0.1 --port 5672 \\
        --producers 1 --consumers 1 --count 100000 --size 1024 --window 256 --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import struct
import sys
import time
from array import array
from collections import deque
from pathlib import Path
from typing import Any, cast

try:
    from pamqp import commands, constants, frame, header
    from pamqp.base import Frame
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise SystemExit("bench/drivers/amqp.py needs pamqp: pip install pamqp==4.0.1") from exc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    SEQ_BYTES,
    STAMP_BYTES,
    ConsumerStats,
    ProducerStats,
    Worker,
    WorkerTimeout,
    add_common_args,
    main_guard,
    make_body_filler,
    print_report,
    run_benchmark,
    run_loop,
    wait_done,
)

from tandem.perf import Numbers

CLIENT = "tandem-amqp (asyncio.Protocol + pamqp 4, struct hot path)"
CHANNEL = 1
FRAME_MAX = 131072
FRAME_END = constants.FRAME_END
FRAME_END_BYTE = bytes([FRAME_END])
CONNECT_TIMEOUT_S = 30.0

_FRAME_HEADER = struct.Struct(">BHI")  # type, channel, payload size
_METHOD_ID = struct.Struct(">I")  # class id << 16 | method id
_U64 = struct.Struct(">Q")
_ACK_FRAME = struct.Struct(">BHIHHQBB")  # a complete Basic.Ack frame
_BASIC_ACK = (60 << 16) | 80
_BASIC_NACK = (60 << 16) | 120
_BASIC_DELIVER = (60 << 16) | 60
_CLIENT_PROPERTIES: dict[str, Any] = {
    "product": "tandem-bench",
    "capabilities": {
        "publisher_confirms": True,
        "consumer_cancel_notify": True,
        "basic.nack": True,
    },
}


def _text(value: object) -> str:
    """Render a server property (str or bytes) as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class AmqpError(Exception):
    """The broker closed the channel or connection, or spoke nonsense."""


class AmqpClient(asyncio.Protocol):
    """Minimal AMQP 0-9-1 client connection with one channel.

    Control methods go through :meth:`rpc`; subclasses handle the hot-path
    frames in :meth:`on_method` / :meth:`on_header` / :meth:`on_body` and
    flush their batched output in :meth:`after_batch`.
    """

    def __init__(self) -> None:
        """Set up an unconnected client."""
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiters: deque[tuple[tuple[type[Frame], ...], asyncio.Future[Frame]]] = deque()
        self.error: BaseException | None = None
        self.lost: asyncio.Future[None] = self.loop.create_future()
        self.server = ""
        self.frame_max = FRAME_MAX

    # -- transport callbacks -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Remember the transport."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail everything that still waits."""
        self.fail(exc or ConnectionError("connection closed by broker"))
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        """Split the stream into frames and dispatch them."""
        buf = self.buf
        buf += data
        size = len(buf)
        off = 0
        unpack_header = _FRAME_HEADER.unpack_from
        while size - off >= 8:
            ftype, _channel, psize = unpack_header(buf, off)
            end = off + 7 + psize
            if end >= size:
                break
            if buf[end] != FRAME_END:
                self.fail(AmqpError(f"bad frame end at offset {off}"))
                return
            if ftype == 1:
                self.on_method(buf, off + 7, end)
            elif ftype == 3:
                self.on_body(buf, off + 7, end)
            elif ftype == 2:
                self.on_header(buf, off + 7, end)
            off = end + 1
        del buf[:off]
        self.after_batch()

    # -- frame handlers (overridden for the hot path) --------------------

    def on_method(self, buf: bytearray, start: int, end: int) -> None:
        """Decode a method frame with pamqp and hand it to a waiter."""
        self.on_control(frame._unmarshal_method_frame(bytes(buf[start:end])))

    def on_header(self, buf: bytearray, start: int, end: int) -> None:
        """Content header frames only matter to consumers."""

    def on_body(self, buf: bytearray, start: int, end: int) -> None:
        """Content body frames only matter to consumers."""

    def after_batch(self) -> None:
        """Flush output batched during one ``data_received`` call."""

    def on_control(self, value: Frame) -> None:
        """Handle a decoded (non hot-path) method frame."""
        if isinstance(value, commands.Connection.Close):
            self.write_frame(commands.Connection.CloseOk(), 0)
            self.fail(AmqpError(f"connection closed: {value.reply_code} {value.reply_text}"))
            return
        if isinstance(value, commands.Channel.Close):
            self.write_frame(commands.Channel.CloseOk(), CHANNEL)
            self.fail(AmqpError(f"channel closed: {value.reply_code} {value.reply_text}"))
            return
        if isinstance(value, commands.Basic.Cancel):
            self.fail(AmqpError("consumer cancelled by broker"))
            return
        if self.waiters:
            expected, fut = self.waiters[0]
            if isinstance(value, expected):
                self.waiters.popleft()
                if not fut.done():
                    fut.set_result(value)
                return
        self.fail(AmqpError(f"unexpected {value.name}"))

    # -- helpers --------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """Record the first error, fail all waiters and drop the connection."""
        if self.error is None:
            self.error = exc
        while self.waiters:
            _, fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)
        self.on_failure(exc)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def on_failure(self, exc: BaseException) -> None:
        """Let subclasses fail their own completion futures."""

    def write_frame(self, value: Frame, channel: int) -> None:
        """Encode one method frame with pamqp and write it."""
        assert self.transport is not None
        self.transport.write(frame.marshal(value, channel))

    async def rpc(self, value: Frame | None, channel: int, *expect: type[Frame]) -> Frame:
        """Send ``value`` (if any) and wait for a reply of one of ``expect``."""
        if self.error is not None:
            raise self.error
        fut: asyncio.Future[Frame] = self.loop.create_future()
        self.waiters.append((expect, fut))
        if value is not None:
            self.write_frame(value, channel)
        return await asyncio.wait_for(fut, CONNECT_TIMEOUT_S)

    async def handshake(self, vhost: str = "/") -> None:
        """Run the connection handshake (PLAIN guest/guest, no heartbeats)."""
        assert self.transport is not None
        fut: asyncio.Future[Frame] = self.loop.create_future()
        self.waiters.append(((commands.Connection.Start,), fut))
        self.transport.write(header.ProtocolHeader().marshal())
        start = await asyncio.wait_for(fut, CONNECT_TIMEOUT_S)
        assert isinstance(start, commands.Connection.Start)
        props = start.server_properties or {}
        self.server = f"{_text(props.get('product', '?'))} {_text(props.get('version', ''))}".strip()
        tune = await self.rpc(
            commands.Connection.StartOk(
                client_properties=_CLIENT_PROPERTIES,
                mechanism="PLAIN",
                response="\0guest\0guest",
                locale="en_US",
            ),
            0,
            commands.Connection.Tune,
        )
        assert isinstance(tune, commands.Connection.Tune)
        self.frame_max = min(tune.frame_max or FRAME_MAX, FRAME_MAX)
        self.write_frame(
            commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=0),
            0,
        )
        await self.rpc(commands.Connection.Open(virtual_host=vhost), 0, commands.Connection.OpenOk)
        await self.rpc(commands.Channel.Open(), CHANNEL, commands.Channel.OpenOk)

    async def close(self) -> None:
        """Close the connection politely (bounded), then the socket."""
        if self.transport is None:
            return
        if self.error is None and not self.transport.is_closing():
            try:
                await asyncio.wait_for(
                    self.rpc(
                        commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
                        0,
                        commands.Connection.CloseOk,
                    ),
                    5,
                )
            except (TimeoutError, AmqpError, ConnectionError):
                pass
        self.transport.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.lost), 5)


async def connect(host: str, port: int, factory: type[AmqpClient], *args: Any) -> AmqpClient:
    """Open a TCP connection and run the AMQP handshake."""
    loop = asyncio.get_running_loop()
    _, proto = await asyncio.wait_for(loop.create_connection(lambda: factory(*args), host, port), CONNECT_TIMEOUT_S)
    assert isinstance(proto, AmqpClient)
    await proto.handshake()
    return proto


# -- producer ------------------------------------------------------------


class Producer(AmqpClient):
    """Publishes ``count`` persistent messages with at most ``window`` unconfirmed."""

    def __init__(self, queue: str, size: int, count: int, window: int, first: int = 0) -> None:
        """Pre-encode the constant parts of every publish."""
        super().__init__()
        self.first = first  # the number of this producer's first message (after the stamp, if the body has room)
        self.queue = queue
        self.size = size
        self.count = count
        self.window = window
        self.published = 0
        self.floor = 0  # every delivery tag <= floor is confirmed
        self.above: set[int] = set()  # single acks above the floor
        self.nacked = 0
        self.acked_in_batch = False
        self.first_send_ns = 0
        self.last_confirm_ns = 0
        self.sent_ns = array("q")  # the send time of delivery tag i + 1
        self.confirm_latencies = array("q")
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.prefix = b""
        self.tail = b""

    def encode_template(self) -> None:
        """Build prefix (publish, header, first body frame header) and tail."""
        publish = frame.marshal(commands.Basic.Publish(exchange="", routing_key=self.queue), CHANNEL)
        content = frame.marshal(
            header.ContentHeader(body_size=self.size, properties=commands.Basic.Properties(delivery_mode=2)),
            CHANNEL,
        )
        body = make_body_filler(self.size)
        chunk = self.frame_max - 8
        first_len = min(chunk, self.size)
        self.prefix = publish + content + _FRAME_HEADER.pack(3, CHANNEL, first_len)
        tail = [body[: first_len - STAMP_BYTES], FRAME_END_BYTE]
        for pos in range(first_len - STAMP_BYTES, len(body), chunk):
            part = body[pos : pos + chunk]
            tail += [_FRAME_HEADER.pack(3, CHANNEL, len(part)), part, FRAME_END_BYTE]
        self.tail = b"".join(tail)
        self.numbered = first_len >= STAMP_BYTES + SEQ_BYTES
        if self.numbered:
            self.tail = self.tail[SEQ_BYTES:]

    async def setup(self) -> None:
        """Enable publisher confirms."""
        await self.rpc(commands.Confirm.Select(), CHANNEL, commands.Confirm.SelectOk)
        self.encode_template()

    def start(self) -> None:
        """Fill the window."""
        self.first_send_ns = time.monotonic_ns()
        self.top_up()

    def top_up(self) -> None:
        """Publish until ``window`` messages are unconfirmed, in one write."""
        inflight = self.published - self.floor - len(self.above)
        n = min(self.window - inflight, self.count - self.published)
        if n <= 0 or self.transport is None:
            return
        prefix, tail, now, sent = self.prefix, self.tail, time.monotonic_ns, self.sent_ns
        parts: list[bytes] = []
        if self.numbered:
            seq = self.first + self.published
            for i in range(seq, seq + n):
                t = now()
                sent.append(t)
                parts += (prefix, t.to_bytes(8, "big"), i.to_bytes(8, "big"), tail)
        else:
            for _ in range(n):
                t = now()
                sent.append(t)
                parts += (prefix, t.to_bytes(8, "big"), tail)
        self.published += n
        self.transport.write(b"".join(parts))

    def on_method(self, buf: bytearray, start: int, end: int) -> None:
        """Fast path for Basic.Ack; everything else goes to pamqp."""
        method = _METHOD_ID.unpack_from(buf, start)[0]
        if method == _BASIC_ACK or method == _BASIC_NACK:
            tag = _U64.unpack_from(buf, start + 4)[0]
            multiple = buf[start + 12] & 1
            if method == _BASIC_NACK:
                self.nacked += 1
            now = time.monotonic_ns()
            if multiple:
                if tag > self.floor:
                    above, sent, lat = self.above, self.sent_ns, self.confirm_latencies
                    for t in range(self.floor + 1, tag + 1):
                        if t not in above:
                            lat.append(now - sent[t - 1])
                    self.floor = tag
                    if self.above:
                        self.above = {t for t in self.above if t > tag}
            elif tag == self.floor + 1:
                self.confirm_latencies.append(now - self.sent_ns[tag - 1])
                self.floor = tag
                above = self.above
                while above and self.floor + 1 in above:
                    self.floor += 1
                    above.discard(self.floor)
            elif tag > self.floor and tag not in self.above:
                self.confirm_latencies.append(now - self.sent_ns[tag - 1])
                self.above.add(tag)
            self.acked_in_batch = True
        else:
            super().on_method(buf, start, end)

    def after_batch(self) -> None:
        """Top up the window once per batch of acks; finish when all confirmed."""
        if not self.acked_in_batch:
            return
        self.acked_in_batch = False
        if self.floor + len(self.above) >= self.count:
            self.last_confirm_ns = time.monotonic_ns()
            if self.nacked:
                self.fail(AmqpError(f"{self.nacked} publishes were nacked"))
            elif not self.done.done():
                self.done.set_result(None)
            return
        self.top_up()

    def on_failure(self, exc: BaseException) -> None:
        """Fail the completion future."""
        if not self.done.done():
            self.done.set_exception(exc)


async def _producer_main(worker: Worker, stats: ProducerStats) -> None:
    """Connect, publish, wait for all confirms, close."""
    args = worker.args
    proto = await connect(
        args.host, args.port, Producer, args.queue, args.size, worker.count, args.window, worker.first
    )
    assert isinstance(proto, Producer)
    stats.server = proto.server
    try:
        await proto.setup()
        worker.ready()
        if not worker.wait_start():
            raise WorkerTimeout
        cpu0 = time.process_time()
        proto.start()
        try:
            await wait_done(proto.done, worker)
        finally:
            stats.cpu_s = time.process_time() - cpu0
            stats.sent = proto.published
            stats.confirmed = proto.floor + len(proto.above)
            stats.first_send_ns = proto.first_send_ns
            stats.last_confirm_ns = proto.last_confirm_ns
            stats.confirm_latencies = proto.confirm_latencies
    finally:
        await proto.close()


def producer(worker: Worker, stats: ProducerStats) -> None:
    """Producer process entry point."""
    run_loop(worker.args, _producer_main(worker, stats))


# -- consumer ------------------------------------------------------------


class Consumer(AmqpClient):
    """Consumes with manual acks until all consumers together got ``total``."""

    def __init__(self, worker: Worker, stats: ConsumerStats) -> None:
        """Prepare counters; latencies go straight into ``stats``."""
        super().__init__()
        self.worker = worker
        self.multiple_ack = worker.args.ack == "multiple"
        self.stats = stats
        self.latencies = self.stats.latencies
        self.received = 0
        self.body_left = 0
        self.want_stamp = False
        self.tag = 0
        self.acks: list[bytes] = []
        self.numbers = Numbers(worker.count) if getattr(worker.args, "verify", False) else None
        self.done: asyncio.Future[None] = self.loop.create_future()

    async def setup(self) -> None:
        """Set the prefetch and start consuming."""
        args = self.worker.args
        await self.rpc(commands.Basic.Qos(prefetch_count=args.prefetch), CHANNEL, commands.Basic.QosOk)
        await self.rpc(
            commands.Basic.Consume(queue=args.queue, consumer_tag=f"c{self.worker.index}", no_ack=False),
            CHANNEL,
            commands.Basic.ConsumeOk,
        )

    def on_method(self, buf: bytearray, start: int, end: int) -> None:
        """Fast path for Basic.Deliver; everything else goes to pamqp."""
        if _METHOD_ID.unpack_from(buf, start)[0] == _BASIC_DELIVER:
            pos = start + 5 + buf[start + 4]  # skip consumer tag
            self.tag = _U64.unpack_from(buf, pos)[0]
        else:
            super().on_method(buf, start, end)

    def on_header(self, buf: bytearray, start: int, end: int) -> None:
        """Remember the body size of the message being delivered."""
        self.body_left = _U64.unpack_from(buf, start + 4)[0]
        self.want_stamp = True
        if self.body_left == 0:
            self.message_done()

    def on_body(self, buf: bytearray, start: int, end: int) -> None:
        """Read the stamp from the first body frame; ack at the last one."""
        if self.want_stamp:
            self.want_stamp = False
            now = time.monotonic_ns()
            self.latencies.append(now - _U64.unpack_from(buf, start)[0])
            if self.numbers is not None:
                self.numbers.add(_U64.unpack_from(buf, start + STAMP_BYTES)[0])
            if not self.received:
                self.stats.first_recv_ns = now
            self.stats.last_recv_ns = now
        self.body_left -= end - start
        if self.body_left <= 0:
            self.message_done()

    def message_done(self) -> None:
        """Count the message and queue its ack."""
        self.received += 1
        if not self.multiple_ack:
            self.acks.append(_ACK_FRAME.pack(1, CHANNEL, 13, 60, 80, self.tag, 0, FRAME_END))

    def after_batch(self) -> None:
        """Send this batch's acks in one write and check for the end."""
        if self.multiple_ack:
            if self.tag and self.transport is not None:
                self.transport.write(_ACK_FRAME.pack(1, CHANNEL, 13, 60, 80, self.tag, 1, FRAME_END))
                self.tag = 0
        elif self.acks and self.transport is not None:
            self.transport.write(b"".join(self.acks))
            self.acks.clear()
        self.check_done()

    def check_done(self) -> None:
        """Finish once all consumers together received every message."""
        if not self.done.done() and self.worker.note_received(self.received):
            self.done.set_result(None)

    def on_failure(self, exc: BaseException) -> None:
        """Fail the completion future."""
        if not self.done.done():
            self.done.set_exception(exc)


async def _consumer_main(worker: Worker, stats: ConsumerStats) -> None:
    """Connect, consume until the run's total is reached, close."""
    args = worker.args
    proto = await connect(args.host, args.port, Consumer, worker, stats)
    assert isinstance(proto, Consumer)
    proto.stats.server = proto.server
    try:
        await proto.setup()
        worker.ready()
        cpu0 = time.process_time()
        if not worker.wait_start():
            raise WorkerTimeout
        loop = asyncio.get_running_loop()

        def poll() -> None:
            proto.check_done()
            if not proto.done.done():
                handle[0] = loop.call_later(0.01, poll)

        handle = [loop.call_later(0.01, poll)]
        try:
            await wait_done(proto.done, worker)
        finally:
            handle[0].cancel()
            proto.stats.cpu_s = time.process_time() - cpu0
            proto.stats.received = proto.received
            if proto.numbers is not None:
                proto.stats.numbers = bytes(proto.numbers.bits)
                proto.stats.duplicates = proto.numbers.duplicates
                proto.stats.strays = proto.numbers.strays
    finally:
        await proto.close()


def consumer(worker: Worker, stats: ConsumerStats) -> None:
    """Consumer process entry point."""
    run_loop(worker.args, _consumer_main(worker, stats))


# -- queue preparation ---------------------------------------------------


#: ``--queue-type``: the arguments each kind of queue is declared with.
QUEUE_ARGUMENTS: dict[str, dict[str, Any] | None] = {
    "classic": None,
    "quorum": {"x-queue-type": "quorum"},
    # Classic queue, version 2 storage, lazy: messages go to disk as they arrive (RabbitMQ 3.10+).
    "classic-v2-lazy": {"x-queue-mode": "lazy", "x-queue-version": 2},
}


async def _reset_queue(host: str, port: int, queue: str, queue_type: str = "classic") -> None:
    """Delete ``queue`` and declare it again as a durable queue of ``queue_type`` (QUEUE_ARGUMENTS)."""
    proto = await connect(host, port, AmqpClient)
    try:
        await proto.rpc(commands.Queue.Delete(queue=queue), CHANNEL, commands.Queue.DeleteOk)
        await proto.rpc(
            # Durable, not auto-delete, no arguments: a classic queue, exactly
            # what RabbitMQ's STOMP plugin itself declares for /queue/NAME.
            commands.Queue.Declare(queue=queue, durable=True, arguments=QUEUE_ARGUMENTS[queue_type]),
            CHANNEL,
            commands.Queue.DeclareOk,
        )
    finally:
        await proto.close()


def reset_queue(host: str, port: int, queue: str, queue_type: str = "classic") -> None:
    """Synchronous wrapper of :func:`_reset_queue` (used by the harness too)."""
    asyncio.run(_reset_queue(host, port, queue, queue_type))


async def _queue_depth(host: str, port: int, queue: str) -> int:
    proto = await connect(host, port, AmqpClient)
    try:
        ok = await proto.rpc(commands.Queue.Declare(queue=queue, passive=True), CHANNEL, commands.Queue.DeclareOk)
        assert isinstance(ok, commands.Queue.DeclareOk)
        return int(ok.message_count)
    finally:
        await proto.close()


def queue_depth(host: str, port: int, queue: str) -> int:
    """Messages ready in ``queue`` (a passive Queue.Declare): progress of a fill or a drain."""
    return asyncio.run(_queue_depth(host, port, queue))


def prepare(args: argparse.Namespace) -> None:
    """Make the queue fresh before the run unless ``--no-prepare``."""
    if not args.no_prepare:
        reset_queue(args.host, args.port, args.queue, args.queue_type)


def main() -> None:
    """Parse options, run the benchmark, print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, default_port=5672)
    parser.add_argument(
        "--ack",
        choices=("single", "multiple"),
        default="single",
        help="one Basic.Ack per message, or one multiple=true ack per read batch",
    )
    parser.add_argument("--no-prepare", action="store_true", help="do not delete/declare the queue first")
    parser.add_argument(
        "--queue-type",
        choices=tuple(QUEUE_ARGUMENTS),
        default="classic",
        help="quorum: x-queue-type quorum (replicated over the cluster's nodes); "
        "classic-v2-lazy: x-queue-mode lazy, x-queue-version 2",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="consumers check every message number 0..count-1 arrives exactly once (a bitmap)",
    )
    args = parser.parse_args()
    report = run_benchmark(args, CLIENT, producer, consumer, prepare)
    report["ack"] = args.ack
    print_report(args, report)


if __name__ == "__main__":
    main_guard(main)
