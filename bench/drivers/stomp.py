"""Pipelined STOMP 1.2 benchmark driver over ``asyncio.Protocol``.

Hand-written minimal framing, no task or future per message:

* producer: SEND with ``persistent:true`` and a ``receipt`` on every frame;
  at most ``--window`` receipts outstanding; every ``data_received`` call
  handles all RECEIPT frames it holds and tops the window up with one write;
* consumer: SUBSCRIBE with ``ack:client-individual`` and
  ``prefetch-count:--prefetch`` (plus any ``--subscribe-header``, e.g.
  ``activemq.prefetchSize:{prefetch}`` for ActiveMQ Classic, which ignores
  ``prefetch-count``); one ACK per MESSAGE, all ACKs of one
  ``data_received`` call in one write.

Works against RabbitMQ's STOMP plugin and Tandem's STOMP acceptor; the
destination is ``/queue/NAME`` (RabbitMQ declares that as a durable classic
queue). Before the run the queue is made fresh: with ``--amqp-port`` it is
deleted and re-declared durable over AMQP (RabbitMQ); otherwise a unique
queue name is used for the run (any broker), unless ``--no-prepare``.

Example::

    python bench/drivers/stomp.py --host 127.0.0.1 --port 61613 \\
        --producers 1 --consumers 1 --count 100000 --size 1024 --window 256 --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import struct
import sys
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
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

CLIENT = "tandem-stomp (asyncio.Protocol, hand-written STOMP 1.2 framing)"
CONNECT_TIMEOUT_S = 30.0
_U64 = struct.Struct(">Q")
_EOL = (10, 13)


class StompError(Exception):
    """The broker sent an ERROR frame or broke the framing."""


class StompClient(asyncio.Protocol):
    """A STOMP connection: frame splitting plus control-frame waiting.

    Subclasses handle MESSAGE / RECEIPT frames in :meth:`on_frame` and flush
    their batched output in :meth:`after_batch`.
    """

    def __init__(self) -> None:
        """Set up an unconnected client."""
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.error: BaseException | None = None
        self.server = ""
        self.connected: asyncio.Future[None] = self.loop.create_future()
        self.receipt_waiters: dict[bytes, asyncio.Future[None]] = {}
        self.lost: asyncio.Future[None] = self.loop.create_future()

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
        """Split the byte stream into frames and dispatch each one."""
        buf = self.buf
        buf += data
        size = len(buf)
        pos = 0
        while True:
            while pos < size and buf[pos] in _EOL:  # heart-beats / frame EOLs
                pos += 1
            cmd_end = buf.find(b"\n", pos)
            if cmd_end < 0:
                break
            crlf = buf[cmd_end - 1] == 13
            sep = b"\r\n\r\n" if crlf else b"\n\n"
            hdr_end = buf.find(sep, cmd_end - 1 if crlf else cmd_end)
            if hdr_end < 0:
                break
            body_start = hdr_end + len(sep)
            cl = buf.find(b"\ncontent-length:", cmd_end - 1, hdr_end + 1)
            if cl >= 0:
                eol = buf.find(b"\n", cl + 16)
                body_end = body_start + int(buf[cl + 16 : eol])
                if body_end >= size:
                    break
                if buf[body_end] != 0:
                    self.fail(StompError("frame body not followed by NUL"))
                    return
            else:
                body_end = buf.find(b"\0", body_start)
                if body_end < 0:
                    break
            command = bytes(buf[pos : cmd_end - 1 if crlf else cmd_end])
            self.on_frame(command, buf, cmd_end, body_start, body_start, body_end)
            pos = body_end + 1
        del buf[:pos]
        self.after_batch()

    # -- frames ----------------------------------------------------------

    @staticmethod
    def header(buf: bytearray, start: int, end: int, key: bytes) -> bytes | None:
        """Return the first value of the header ``key`` (b"\\nname:") in a frame."""
        at = buf.find(key, start, end)
        if at < 0:
            return None
        vstart = at + len(key)
        eol = buf.find(b"\n", vstart, end)
        value = bytes(buf[vstart:eol])
        return value[:-1] if value.endswith(b"\r") else value

    def on_frame(self, command: bytes, buf: bytearray, hs: int, he: int, bs: int, be: int) -> None:
        """Handle control frames; subclasses add MESSAGE/RECEIPT fast paths."""
        if command == b"RECEIPT":
            rid = self.header(buf, hs, he, b"\nreceipt-id:") or b""
            fut = self.receipt_waiters.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif command == b"CONNECTED":
            self.server = (self.header(buf, hs, he, b"\nserver:") or b"?").decode(errors="replace")
            if not self.connected.done():
                self.connected.set_result(None)
        elif command == b"ERROR":
            msg = (self.header(buf, hs, he, b"\nmessage:") or b"").decode(errors="replace")
            body = bytes(buf[bs:be]).decode(errors="replace").strip()
            self.fail(StompError(f"ERROR frame: {msg} {body[:500]}".strip()))
        else:
            self.fail(StompError(f"unexpected {command!r} frame"))

    def after_batch(self) -> None:
        """Flush output batched during one ``data_received`` call."""

    # -- helpers --------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """Record the first error, fail all waiters, drop the connection."""
        if self.error is None:
            self.error = exc
        waiters = [self.connected, *self.receipt_waiters.values()]
        self.receipt_waiters.clear()
        for fut in waiters:
            if not fut.done():
                fut.set_exception(exc)
        self.on_failure(exc)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def on_failure(self, exc: BaseException) -> None:
        """Let subclasses fail their own completion futures."""

    def write(self, data: bytes) -> None:
        """Write raw bytes."""
        assert self.transport is not None
        self.transport.write(data)

    async def request(self, frame: bytes, receipt: bytes) -> None:
        """Send a frame carrying ``receipt:<receipt>`` and wait for its RECEIPT."""
        if self.error is not None:
            raise self.error
        fut: asyncio.Future[None] = self.loop.create_future()
        self.receipt_waiters[receipt] = fut
        self.write(frame)
        await asyncio.wait_for(fut, CONNECT_TIMEOUT_S)

    async def handshake(self, vhost: str = "/") -> None:
        """CONNECT (guest/guest, no heart-beats) and wait for CONNECTED."""
        self.write(
            b"CONNECT\naccept-version:1.2\nhost:"
            + vhost.encode()
            + b"\nlogin:guest\npasscode:guest\nheart-beat:0,0\n\n\0"
        )
        await asyncio.wait_for(self.connected, CONNECT_TIMEOUT_S)

    async def close(self) -> None:
        """DISCONNECT with a receipt (bounded wait), then close the socket."""
        if self.transport is None:
            return
        if self.error is None and not self.transport.is_closing():
            try:
                await asyncio.wait_for(self.request(b"DISCONNECT\nreceipt:bye\n\n\0", b"bye"), 5)
            except (TimeoutError, StompError, ConnectionError):
                pass
        self.transport.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.lost), 5)


async def connect(host: str, port: int, proto: StompClient) -> StompClient:
    """Open a TCP connection for ``proto`` and run the STOMP handshake."""
    loop = asyncio.get_running_loop()
    await asyncio.wait_for(loop.create_connection(lambda: proto, host, port), CONNECT_TIMEOUT_S)
    await proto.handshake()
    return proto


# -- producer ------------------------------------------------------------


class Producer(StompClient):
    """Sends ``count`` persistent messages, at most ``window`` unreceipted."""

    def __init__(self, destination: str, size: int, count: int, window: int) -> None:
        """Pre-encode the constant parts of every SEND frame."""
        super().__init__()
        self.count = count
        self.window = window
        self.sent = 0
        self.floor = 0  # every receipt id <= floor arrived
        self.above: set[int] = set()
        self.got_receipts = False
        self.first_send_ns = 0
        self.last_confirm_ns = 0
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.prefix = (
            f"SEND\ndestination:{destination}\npersistent:true\n"
            f"content-type:application/octet-stream\ncontent-length:{size}\nreceipt:"
        ).encode()
        self.tail = make_body_filler(size) + b"\0"

    def start(self) -> None:
        """Fill the window."""
        self.first_send_ns = time.monotonic_ns()
        self.top_up()

    def top_up(self) -> None:
        """Send until ``window`` receipts are outstanding, in one write."""
        inflight = self.sent - self.floor - len(self.above)
        n = min(self.window - inflight, self.count - self.sent)
        if n <= 0 or self.transport is None:
            return
        prefix, tail, now = self.prefix, self.tail, time.monotonic_ns
        parts: list[bytes] = []
        for rid in range(self.sent + 1, self.sent + n + 1):
            parts += (prefix, b"%d\n\n" % rid, now().to_bytes(8, "big"), tail)
        self.sent += n
        self.transport.write(b"".join(parts))

    def on_frame(self, command: bytes, buf: bytearray, hs: int, he: int, bs: int, be: int) -> None:
        """Fast path for RECEIPT frames of SENDs (numeric receipt ids)."""
        if command == b"RECEIPT":
            rid_b = self.header(buf, hs, he, b"\nreceipt-id:")
            if rid_b is not None and rid_b.isdigit():
                rid = int(rid_b)
                if rid == self.floor + 1:
                    self.floor = rid
                    above = self.above
                    while above and self.floor + 1 in above:
                        self.floor += 1
                        above.discard(self.floor)
                else:
                    self.above.add(rid)
                self.got_receipts = True
                return
        super().on_frame(command, buf, hs, he, bs, be)

    def after_batch(self) -> None:
        """Top the window up once per batch; finish when all are receipted."""
        if not self.got_receipts:
            return
        self.got_receipts = False
        if self.floor + len(self.above) >= self.count:
            self.last_confirm_ns = time.monotonic_ns()
            if not self.done.done():
                self.done.set_result(None)
            return
        self.top_up()

    def on_failure(self, exc: BaseException) -> None:
        """Fail the completion future."""
        if not self.done.done():
            self.done.set_exception(exc)


async def _producer_main(worker: Worker, stats: ProducerStats) -> None:
    """Connect, send, wait for all receipts, disconnect."""
    args = worker.args
    proto = Producer(args.destination, args.size, worker.count, args.window)
    await connect(args.host, args.port, proto)
    stats.server = proto.server
    try:
        worker.ready()
        if not worker.wait_start():
            raise WorkerTimeout
        cpu0 = time.process_time()
        proto.start()
        try:
            await wait_done(proto.done, worker)
        finally:
            stats.cpu_s = time.process_time() - cpu0
            stats.sent = proto.sent
            stats.confirmed = proto.floor + len(proto.above)
            stats.first_send_ns = proto.first_send_ns
            stats.last_confirm_ns = proto.last_confirm_ns
    finally:
        await proto.close()


def producer(worker: Worker, stats: ProducerStats) -> None:
    """Producer process entry point."""
    run_loop(worker.args, _producer_main(worker, stats))


# -- consumer ------------------------------------------------------------


class Consumer(StompClient):
    """Subscribes with client-individual acks until the run's total arrived."""

    def __init__(self, worker: Worker, stats: ConsumerStats) -> None:
        """Prepare counters; latencies go straight into ``stats``."""
        super().__init__()
        self.worker = worker
        self.stats = stats
        self.latencies = self.stats.latencies
        self.received = 0
        self.acks: list[bytes] = []
        self.done: asyncio.Future[None] = self.loop.create_future()

    async def subscribe(self) -> None:
        """SUBSCRIBE and wait for the broker's receipt."""
        args = self.worker.args
        await self.request(
            (
                f"SUBSCRIBE\nid:{self.worker.index}\ndestination:{args.destination}\n"
                f"ack:client-individual\nprefetch-count:{args.prefetch}\n"
                + "".join(f"{h}\n" for h in args.subscribe_header)
                + "receipt:sub\n\n\0"
            ).encode(),
            b"sub",
        )

    def on_frame(self, command: bytes, buf: bytearray, hs: int, he: int, bs: int, be: int) -> None:
        """Fast path for MESSAGE: record latency, queue the ACK."""
        if command != b"MESSAGE":
            super().on_frame(command, buf, hs, he, bs, be)
            return
        now = time.monotonic_ns()
        if be - bs >= 8:
            self.latencies.append(now - _U64.unpack_from(buf, bs)[0])
        if not self.received:
            self.stats.first_recv_ns = now
        self.stats.last_recv_ns = now
        self.received += 1
        ack_id = self.header(buf, hs, he, b"\nack:")
        if ack_id is not None:
            self.acks.append(b"ACK\nid:" + ack_id + b"\n\n\0")
        else:  # STOMP 1.0/1.1 style brokers
            mid = self.header(buf, hs, he, b"\nmessage-id:") or b""
            sub = self.header(buf, hs, he, b"\nsubscription:") or b""
            self.acks.append(b"ACK\nmessage-id:" + mid + b"\nsubscription:" + sub + b"\n\n\0")

    def after_batch(self) -> None:
        """Send this batch's ACKs in one write and check for the end."""
        if self.acks and self.transport is not None:
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
    """Connect, subscribe, consume until the run's total is reached."""
    args = worker.args
    proto = Consumer(worker, stats)
    await connect(args.host, args.port, proto)
    proto.stats.server = proto.server
    try:
        await proto.subscribe()
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
    finally:
        await proto.close()


def consumer(worker: Worker, stats: ConsumerStats) -> None:
    """Consumer process entry point."""
    run_loop(worker.args, _consumer_main(worker, stats))


# -- queue preparation ---------------------------------------------------


def prepare(args: argparse.Namespace) -> None:
    """Make the run's queue fresh (see the module docstring)."""
    if not args.no_prepare:
        if args.amqp_port:
            from amqp import reset_queue

            reset_queue(args.host, args.amqp_port, args.queue)
        else:
            args.queue = f"{args.queue}-{os.getpid()}-{time.time_ns() % 10**9}"
    args.destination = f"/queue/{args.queue}"


def main() -> None:
    """Parse options, run the benchmark, print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, default_port=61613)
    parser.add_argument(
        "--amqp-port",
        type=int,
        default=0,
        help="RabbitMQ only: delete and re-declare the durable queue over AMQP first",
    )
    parser.add_argument("--no-prepare", action="store_true", help="use --queue as it is")
    parser.add_argument(
        "--subscribe-header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="extra SUBSCRIBE header, repeatable; {prefetch} is replaced by --prefetch "
        "(e.g. ActiveMQ Classic: activemq.prefetchSize:{prefetch})",
    )
    args = parser.parse_args()
    for header in args.subscribe_header:
        if ":" not in header or "\n" in header or header.startswith(":"):
            parser.error(f"--subscribe-header {header!r}: expected NAME:VALUE")
    args.subscribe_header = [h.replace("{prefetch}", str(args.prefetch)) for h in args.subscribe_header]
    report = run_benchmark(args, CLIENT, producer, consumer, prepare)
    report["queue"] = args.queue
    if args.subscribe_header:
        report["subscribe_headers"] = args.subscribe_header
    print_report(args, report)


if __name__ == "__main__":
    main_guard(main)
