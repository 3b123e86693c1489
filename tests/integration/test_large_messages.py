"""Large messages through real broker processes: streamed in, stored in their own file, streamed out.

Each body is over the client's min_large_message_size, so it travels as LARGE_BEGIN/CHUNK/END
and DELIVER_LARGE/CHUNK; the files under large-messages/ are watched directly.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from tandem.testing import free_port
from tandem.testing.procs import memory
from tandem.testing.streams import GeneratedBody

Factory = Callable[..., BrokerProcess]
QUEUE = "big"
CHUNK = 64 * 1024  # the client's min_large_message_size in these tests (its chunk size too)


def url(b: BrokerProcess, **opts: Any) -> str:
    q = "&".join(f"{k}={v}" for k, v in {"min_large_message_size": CHUNK, **opts}.items())
    return f"{b.url}?{q}"


def files(b: BrokerProcess) -> list[str]:
    d = b.data_dir / "large-messages"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def part_bytes(b: BrokerProcess) -> int:
    """Bytes in the `.part` files (bodies still arriving)."""
    n = 0
    for name in files(b):
        if name.endswith(".part"):
            try:
                n += (b.data_dir / "large-messages" / name).stat().st_size
            except FileNotFoundError:
                pass
    return n


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def body(n: int, seed: int = 0) -> bytes:
    """`n` bytes that differ chunk to chunk (a shifted or dropped chunk shows)."""
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    out = bytearray()
    i = 0
    while len(out) < n:
        out += i.to_bytes(8, "little") + block[: min(len(block), n - len(out)) - 8 if n - len(out) > 8 else 0]
        i += 1
    return bytes(out[:n])


class Pattern(io.RawIOBase):
    """A readable (not seekable) stream of `n` pattern bytes, made as it is read."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pos = 0
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        k = min(len(b), self.n - self.pos)
        if k <= 0:
            return 0
        data = bytes((self.pos + i) % 251 for i in range(min(k, 256))) * (k // 256 + 1)
        data = data[:k]
        b[:k] = data
        self.digest.update(data)
        self.pos += k
        return k


def test_bytes_body_round_trip_file_then_ack_removes_it(broker: BrokerProcess) -> None:
    data = body(5 * CHUNK + 123)
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
        s.create_producer(QUEUE).send(data, properties={"k": "v"})
        (name,) = files(broker)
        assert name.endswith(".msg")
        assert (broker.data_dir / "large-messages" / name).stat().st_size == len(data)
        m = s.create_consumer(QUEUE).receive(5)
        assert m is not None and m.large
        assert m.properties == {"k": "v"}
        assert m.body == data
        assert m.body_stream().read() == data
    assert wait_for(lambda: files(broker) == []), files(broker)


def test_stream_send_and_save_with_client_ack(broker: BrokerProcess, tmp_path: Path) -> None:
    src = Pattern(3 * CHUNK + 7)
    with tandem.connect(url(broker)) as c, c.session(ack_mode="client") as s:
        s.create_queue(QUEUE)
        s.create_producer(QUEUE).send_stream(src, properties={"name": "p"})
        assert len(files(broker)) == 1
        cons = s.create_consumer(QUEUE)
        m = cons.receive(5)
        assert m is not None
        out = tmp_path / "out.bin"
        assert m.save_body(out) == src.n
        assert hashlib.sha256(out.read_bytes()).hexdigest() == src.digest.hexdigest()
        assert files(broker) != []  # not acknowledged yet
        m.ack()
    assert wait_for(lambda: files(broker) == []), files(broker)


def test_compressed_large_message_arrives_whole(broker: BrokerProcess) -> None:
    data = b"compress me " * (CHUNK // 2)  # compresses well: fewer, smaller chunks
    with tandem.connect(url(broker, compress_large_messages="true")) as c, c.session() as s:
        s.create_queue(QUEUE)
        s.create_producer(QUEUE).send(data)
        (name,) = files(broker)
        assert (broker.data_dir / "large-messages" / name).stat().st_size < len(data) // 10
        m = s.create_consumer(QUEUE).receive(5)
        assert m is not None and m.body == data


def test_empty_and_exact_threshold_streams(broker: BrokerProcess) -> None:
    """send_stream always makes a large message, even of an empty body; `send` of a body of
    exactly min_large_message_size bytes is an ordinary one (only a body over it is large)."""
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
        p = s.create_producer(QUEUE)
        p.send_stream(io.BytesIO(b""))
        p.send(b"e" * CHUNK)
        p.send_stream(b"tiny")
        cons = s.create_consumer(QUEUE)
        got = [cons.receive(5) for _ in range(3)]
        assert [(m.large, m.body) for m in got if m is not None] == [
            (True, b""),
            (False, b"e" * CHUNK),
            (True, b"tiny"),
        ]
    assert wait_for(lambda: files(broker) == [])


def test_ordering_with_small_messages_around_a_large_one(broker: BrokerProcess) -> None:
    """Queued before the consumer comes: the broker streams the large one over several loop passes,
    and the small one after it waits for its last chunk (it is not written between them)."""
    data = body(40 * CHUNK, seed=2)
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
        p = s.create_producer(QUEUE)
        p.send(b"before")
        p.send(data)
        p.send(b"after")
        cons = s.create_consumer(QUEUE)
        got = [cons.receive(5) for _ in range(3)]
        assert [m.body if m is not None else None for m in got] == [b"before", data, b"after"]


def test_pipelined_sends_keep_their_order_across_large_ones(broker: BrokerProcess) -> None:
    """Small and large sends written without waiting, on one session: a large body is synced off
    the broker's loop before it is routed, and the sends read after its END wait for it, so the
    queue has them in the order they were sent."""
    bodies = [body(3 * CHUNK + i, seed=40 + i) if i % 4 == 1 else f"small {i}".encode() for i in range(40)]

    async def run() -> list[bytes | None]:
        async with await aio.connect(url(broker)) as conn:
            s = await conn.create_session()
            await s.create_queue(QUEUE)
            prod = s.create_producer(QUEUE)
            futs = [prod.send_nowait(b) for b in bodies]  # every chunk and END written at once
            await asyncio.wait_for(asyncio.gather(*[f for f in futs if f is not None]), 30)
            cons = await s.create_consumer(QUEUE)
            got = [await cons.receive(5) for _ in range(len(bodies))]
            assert await cons.receive(0.2) is None
            return [m.body if m is not None else None for m in got]

    assert asyncio.run(run()) == bodies


def test_restart_keeps_a_durable_large_message(broker: BrokerProcess) -> None:
    data = body(6 * CHUNK, seed=3)
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
        s.create_producer(QUEUE).send(data)
    broker.stop()
    broker.start()
    assert len(files(broker)) == 1
    with tandem.connect(url(broker)) as c, c.session() as s:
        m = s.create_consumer(QUEUE).receive(5)
        assert m is not None and m.body == data
    assert wait_for(lambda: files(broker) == [])


def test_transaction_rollback_discards_the_file_and_commit_delivers(broker: BrokerProcess) -> None:
    data = body(3 * CHUNK, seed=4)
    with tandem.connect(url(broker)) as c:
        with c.session() as s:
            s.create_queue(QUEUE)
        with c.session(transacted=True) as tx:
            p = tx.create_producer(QUEUE)
            p.send(data)
            assert len(files(broker)) == 1
            tx.rollback()
            assert wait_for(lambda: files(broker) == []), files(broker)
            p.send(data)
            tx.commit()
        with c.session() as s:
            m = s.create_consumer(QUEUE).receive(5)
            assert m is not None and m.body == data
            assert s.create_consumer(QUEUE).receive(0.3) is None


def test_kill_with_an_uncommitted_large_message_leaves_nothing(broker: BrokerProcess) -> None:
    """Its body complete (a whole .msg file) but its transaction never committed: after kill -9
    the file has no record, is removed at start, and nothing is delivered."""
    data = body(3 * CHUNK, seed=15)
    with tandem.connect(url(broker)) as c:
        with c.session() as s:
            s.create_queue(QUEUE)
        tx = c.session(transacted=True)
        tx.create_producer(QUEUE).send(data)
        assert [n for n in files(broker) if n.endswith(".msg")], files(broker)
        broker.kill()
    broker.start()
    assert files(broker) == []
    with tandem.connect(url(broker)) as c, c.session() as s:
        assert s.create_consumer(QUEUE).receive(0.3) is None


def test_multicast_file_stays_until_every_queue_acked(broker: BrokerProcess) -> None:
    data = body(2 * CHUNK + 1, seed=5)
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue("sub.a", address="news", routing_type="multicast")
        s.create_queue("sub.b", address="news", routing_type="multicast")
        s.create_producer("news").send(data, routing_type="multicast")
        assert len(files(broker)) == 1
        m = s.create_consumer("sub.a").receive(5)
        assert m is not None and m.body == data
        time.sleep(0.3)
        assert len(files(broker)) == 1  # sub.b still holds it
        m = s.create_consumer("sub.b").receive(5)
        assert m is not None and m.body == data
    assert wait_for(lambda: files(broker) == [])


def test_dead_lettered_large_message_keeps_its_body_across_a_restart(broker_factory: Factory) -> None:
    """A large message that fails its last delivery moves to the dead-letter address: the copy
    shares the file, survives a restart whole, and the file goes once the copy is acknowledged."""
    b = broker_factory(address_settings={QUEUE: {"dead-letter-address": "DLQ", "max-delivery-attempts": 1}}).start()
    data = body(5 * CHUNK, seed=14)
    with tandem.connect(url(b)) as c, c.session(ack_mode="client") as s:
        s.create_queue(QUEUE)
        s.create_queue("DLQ")
        s.create_producer(QUEUE).send(data)
        m = s.create_consumer(QUEUE).receive(5)
        assert m is not None
        m.nack()
        assert len(files(b)) == 1
    b.stop()
    b.start()
    assert len(files(b)) == 1
    with tandem.connect(url(b)) as c, c.session() as s:
        assert s.create_consumer(QUEUE).receive(0.3) is None
        d = s.create_consumer("DLQ").receive(5)
        assert d is not None and d.large and d.body == data
        assert d.properties["_AMQ_ORIG_QUEUE"] == QUEUE
    assert wait_for(lambda: files(b) == []), files(b)


def test_non_durable_large_message_file_goes_when_consumed(broker: BrokerProcess) -> None:
    data = body(2 * CHUNK, seed=6)
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
        s.create_producer(QUEUE).send(data, durable=False)
        assert len(files(broker)) == 1
        m = s.create_consumer(QUEUE).receive(5)
        assert m is not None and m.body == data and not m.durable
    assert wait_for(lambda: files(broker) == [])


def test_async_client_streams_in_and_out(broker: BrokerProcess, tmp_path: Path) -> None:
    data = body(7 * CHUNK + 5, seed=7)
    src = tmp_path / "in.bin"
    src.write_bytes(data)

    async def run() -> None:
        async with await aio.connect(url(broker)) as conn:
            s = await conn.create_session()
            await s.create_queue(QUEUE)
            p = s.create_producer(QUEUE)
            with src.open("rb") as f:  # a real file: read a chunk at a time by the client
                await p.send_stream(f)
            await p.send(data)  # the same body as bytes: chunked transparently
            cons = await s.create_consumer(QUEUE)
            for _ in range(2):
                m = await cons.receive(5)
                assert m is not None and m.large
                assert m.body_stream().read() == data

    asyncio.run(run())
    assert wait_for(lambda: files(broker) == [])


def test_kill_mid_send_discards_the_partial_file(broker: BrokerProcess) -> None:
    """kill -9 while a large message streams in: after the restart no part of it is delivered,
    and no file is left; the client gave up (no reconnection) and nothing was confirmed."""
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
    part_seen = []

    class Slow(io.RawIOBase):
        def __init__(self) -> None:
            self.sent = 0

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            if self.sent >= 20 * CHUNK:
                wait_for(lambda: part_bytes(broker) > 0)  # the broker has begun writing the body
                part_seen.append(files(broker))
                broker.kill()  # the body is not complete: its END was never sent
                return 0
            k = min(len(b), CHUNK)
            b[:k] = b"x" * k
            self.sent += k
            return k

    with tandem.connect(url(broker)) as c, c.session() as s:
        with pytest.raises(tandem.TandemError):
            s.create_producer(QUEUE).send_stream(Slow())
    assert part_seen and any(n.endswith(".part") for n in part_seen[0]), part_seen
    broker.start()
    assert files(broker) == []
    with tandem.connect(url(broker)) as c, c.session() as s:
        assert s.create_consumer(QUEUE).receive(0.5) is None
    assert "no journal record names it" in broker.log_text()


def test_record_without_its_whole_file_is_never_delivered(broker: BrokerProcess) -> None:
    """A journal record whose file is short (damaged disk, a lost write): dropped at start, logged."""
    data = body(3 * CHUNK, seed=8)
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
        s.create_producer(QUEUE).send(data)
        s.create_producer(QUEUE).send(b"small")
    broker.kill()
    (name,) = files(broker)
    path = broker.data_dir / "large-messages" / name
    os.truncate(path, CHUNK)
    broker.start()
    with tandem.connect(url(broker)) as c, c.session() as s:
        cons = s.create_consumer(QUEUE)
        m = cons.receive(5)
        assert m is not None and m.body == b"small"
        assert cons.receive(0.3) is None
    assert "is missing or not" in broker.log_text()
    assert wait_for(lambda: files(broker) == [])


def test_max_frame_size_no_longer_limits_message_size(broker_factory: Factory) -> None:
    b = broker_factory(max_frame_size=256 * 1024).start()
    data = body(2 * 1024 * 1024, seed=9)  # 8x the broker's max-frame-size
    with tandem.connect(url(b)) as c, c.session() as s:
        s.create_queue(QUEUE)
        s.create_producer(QUEUE).send(data)
        m = s.create_consumer(QUEUE).receive(5)
        assert m is not None and m.body == data


# ------------------------------------------------------------------------------------- STOMP
STOMP_ACCEPTORS = (
    '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
    '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
)


class RawStomp:
    """A STOMP 1.2 client on a plain socket, frames parsed by the codec (up to 16 MiB each)."""

    def __init__(self, port: int) -> None:
        import socket

        from tandem.protocol.stomp import SERVER_COMMANDS, StompParser

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.parser = StompParser(1 << 24, "1.2", SERVER_COMMANDS)
        self.frames: list[Any] = []
        self.sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0")
        assert self.next().command == "CONNECTED"

    def next(self, timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        while not self.frames:
            assert time.monotonic() < deadline, "no frame in time"
            data = self.sock.recv(1 << 20)
            assert data, "the server closed the connection"
            self.frames += self.parser.feed(data)
        return self.frames.pop(0)

    def close(self) -> None:
        self.sock.close()


def test_stomp_large_send_is_streamed_and_delivered_to_stomp_and_native(broker_factory: Factory) -> None:
    """A SEND with a content-length over min-large-message-size, on a broker whose max-frame-size is
    far smaller than the body: taken (a buffered frame would be refused), stored as a large message's
    file, and delivered whole to a STOMP subscriber (a MESSAGE streamed from the file) and to a
    native consumer."""
    b = broker_factory(extra_toml=STOMP_ACCEPTORS, max_frame_size=64 * 1024, min_large_message_size=16 * 1024).start()
    data = body(1024 * 1024 + 17, seed=10).replace(b"\0", b"\1")  # (a NUL is fine too: content-length)
    data = data[:1000] + b"\0\n\0" + data[1003:]
    sender = RawStomp(b.ports["stomp"])
    try:
        for dest in ("stomp-out", "native-out"):
            head = f"SEND\ndestination:/queue/{dest}\npersistent:true\nreceipt:r-{dest}\ncontent-length:{len(data)}\n\n"
            sender.sock.sendall(head.encode())
            view = memoryview(data)
            for i in range(0, len(data), 100_000):  # in pieces, as a real client's socket would
                sender.sock.sendall(view[i : i + 100_000])
            sender.sock.sendall(b"\0")
            f = sender.next()
            assert f.command == "RECEIPT" and f.headers["receipt-id"] == f"r-{dest}", f
        assert len(files(b)) == 2
        assert all((b.data_dir / "large-messages" / n).stat().st_size == len(data) for n in files(b))
    finally:
        sender.close()
    sub = RawStomp(b.ports["stomp"])
    try:
        sub.sock.sendall(b"SUBSCRIBE\nid:s1\ndestination:/queue/stomp-out\nack:client-individual\n\n\0")
        m = sub.next()
        assert m.command == "MESSAGE", m
        assert m.headers["content-length"] == str(len(data))
        assert m.body == data
        sub.sock.sendall(f"ACK\nid:{m.headers['ack']}\nreceipt:ack\n\n\0".encode())
        f = sub.next()
        assert f.command == "RECEIPT", f
    finally:
        sub.close()
    with tandem.connect(url(b)) as c, c.session() as s:
        m2 = s.create_consumer("native-out").receive(5)
        assert m2 is not None and m2.large and m2.body == data
    assert wait_for(lambda: files(b) == []), files(b)


def test_stomp_frames_after_a_large_body_wait_for_its_sync(broker_factory: Factory) -> None:
    """A large SEND and small SENDs behind it in one write: the body is synced off the broker's loop,
    and the frames after it are handled only once it is routed, so the queue keeps their order and
    the receipts come in order."""
    b = broker_factory(extra_toml=STOMP_ACCEPTORS, min_large_message_size=16 * 1024).start()
    data = body(512 * 1024 + 3, seed=60).replace(b"\0", b"\1")
    sender = RawStomp(b.ports["stomp"])
    try:
        out = bytearray()
        for i in range(3):
            out += f"SEND\ndestination:/queue/{QUEUE}\nreceipt:big{i}\ncontent-length:{len(data)}\n\n".encode()
            out += data + b"\0"
            out += f"SEND\ndestination:/queue/{QUEUE}\nreceipt:small{i}\n\nsmall {i}\0".encode()
        sender.sock.sendall(bytes(out))
        receipts = [sender.next(30).headers.get("receipt-id") for _ in range(6)]
        assert receipts == ["big0", "small0", "big1", "small1", "big2", "small2"]
    finally:
        sender.close()
    with tandem.connect(url(b)) as c, c.session() as s:
        cons = s.create_consumer(QUEUE)
        got = [cons.receive(5) for _ in range(6)]
        assert [m.body if m is not None else None for m in got] == [
            data,
            b"small 0",
            data,
            b"small 1",
            data,
            b"small 2",
        ]
        assert cons.receive(0.2) is None


def test_native_large_message_to_a_stomp_subscriber_then_small_ones(broker_factory: Factory) -> None:
    """A STOMP subscriber gets a native producer's large message as one MESSAGE frame, and the
    frames after it intact (nothing written into the middle of the streamed body)."""
    b = broker_factory(extra_toml=STOMP_ACCEPTORS).start()
    data = body(9 * CHUNK + 3, seed=11)
    with tandem.connect(url(b)) as c, c.session() as s:
        s.create_queue("mixed")
        p = s.create_producer("mixed")
        p.send(data)
        p.send(b"tail-1")
        p.send(b"tail-2")
    sub = RawStomp(b.ports["stomp"])
    try:
        sub.sock.sendall(b"SUBSCRIBE\nid:s1\ndestination:/queue/mixed\nreceipt:sub\n\n\0")
        got = [sub.next() for _ in range(4)]
    finally:
        sub.close()
    msgs = [f for f in got if f.command == "MESSAGE"]
    assert [f.body for f in msgs] == [data, b"tail-1", b"tail-2"]
    assert wait_for(lambda: files(b) == []), files(b)


# --------------------------------------------------------------------- kill -9 with reconnection
def fixed_port_broker(broker_factory: Factory) -> BrokerProcess:
    """A broker that listens on the same port after a restart (so a client reconnects to it)."""
    port = free_port()
    return broker_factory(extra_toml=f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:{port}"\n').start()


def test_kill_mid_send_with_reconnection_resends_it_whole_once(
    broker_factory: Factory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker dies while a (seekable) file streams in; the client reconnects to the restarted
    broker and sends it again from its start: one message, whole, and no file left over."""
    broker = fixed_port_broker(broker_factory)
    data = body(40 * CHUNK, seed=12)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
    killed: list[bool] = []

    class KillingFile(io.FileIO):
        def read(self, n: int = -1) -> bytes:
            if not killed and self.tell() >= 20 * CHUNK:
                killed.append(True)
                broker.kill()
                broker.start()  # a broker again on the same port: the client reconnects to it
            return super().read(n)

    reconnecting = url(broker, reconnect_attempts=-1, retry_interval=100)
    with tandem.connect(reconnecting) as c, c.session() as s, KillingFile(src, "rb") as f:
        s.create_producer(QUEUE).send_stream(f)
    assert killed
    assert "sending it again from its start" in caplog.text
    with tandem.connect(url(broker)) as c, c.session() as s:
        cons = s.create_consumer(QUEUE)
        m = cons.receive(5)
        assert m is not None and m.body == data
        assert cons.receive(0.3) is None
    assert wait_for(lambda: files(broker) == []), files(broker)


def test_kill_mid_consume_then_the_message_comes_whole_after_restart(broker_factory: Factory) -> None:
    """The broker dies while a large message streams out to a consumer: the consumer never hands
    over the part it had; after the restart the message comes again, whole, exactly once."""
    broker = fixed_port_broker(broker_factory)
    data = body(160 * CHUNK, seed=13)  # 10 MiB: more than the socket buffers hold
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
        s.create_producer(QUEUE).send(data)

    async def run() -> None:
        async with await aio.connect(url(broker, reconnect_attempts=-1, retry_interval=100)) as conn:
            s = await conn.create_session()
            cons = await s.create_consumer(QUEUE)
            deadline = time.monotonic() + 10
            while cons._arriving is None or cons._arriving._large is None or cons._arriving._large.size == 0:
                assert time.monotonic() < deadline, "no chunk arrived"
                await asyncio.sleep(0.001)
            transport = conn._proto.transport  # type: ignore[union-attr]
            transport.pause_reading()  # the broker's stream stalls at its high-water mark
            await asyncio.sleep(0.2)
            assert not cons.buffer  # part of the body is here: nothing handed over
            broker.kill()
            transport.resume_reading()
            await asyncio.to_thread(broker.start)
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while not got:
                assert time.monotonic() < deadline
                try:
                    m = await cons.receive(1)
                except tandem.errors.Unblocked:
                    continue
                if m is not None:
                    got.append(m.body)
                    await m.ack()
            assert got == [data]
            assert await cons.receive(0.3) is None

    asyncio.run(run())
    assert wait_for(lambda: files(broker) == []), files(broker)


# ---------------------------------------------------------------------------- bounded memory
BIG = (
    int(os.environ.get("TANDEM_LARGE_TEST_MIB", "256")) << 20
)  # (about 10 s here; bench/large_message.py goes further)


def test_a_message_far_larger_than_the_broker_memory_growth_allows(broker: BrokerProcess, tmp_path: Path) -> None:
    """A BIG-byte message in and out: the broker's peak RSS (VmHWM of the real process) grows by
    far less than the message (it is never held whole), and the body arrives intact."""
    assert broker.proc is not None
    pid = broker.proc.pid
    with tandem.connect(url(broker, min_large_message_size=256 * 1024)) as c, c.session() as s:
        s.create_queue(QUEUE)
        base = memory(pid, "VmRSS")
        src = GeneratedBody(BIG)
        s.create_producer(QUEUE).send_stream(src, size=BIG)
        assert (broker.data_dir / "large-messages" / files(broker)[0]).stat().st_size == BIG
        m = s.create_consumer(QUEUE).receive(60)
        assert m is not None and m.large
        digest = hashlib.sha256()
        stream = m.body_stream()
        while block := stream.read(1 << 20):
            digest.update(block)
        assert digest.hexdigest() == src.digest.hexdigest()
        peak = memory(pid, "VmHWM")
    growth = peak - base
    # (measured: about 7 MiB for 256 MiB; a body held whole would add at least its own size)
    assert growth < 32 << 20, f"broker peak RSS grew by {growth >> 20} MiB for a {BIG >> 20} MiB message"
    assert wait_for(lambda: files(broker) == [])


def test_deleting_a_queue_removes_its_large_messages_files(broker: BrokerProcess) -> None:
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
        p = s.create_producer(QUEUE)
        for i in range(3):
            p.send(body(2 * CHUNK, seed=20 + i))
        assert len(files(broker)) == 3
        assert s.delete_queue(QUEUE, force=True) == 3
    assert wait_for(lambda: files(broker) == []), files(broker)


def test_without_persistence_large_messages_still_live_in_files(broker_factory: Factory) -> None:
    """persistence-enabled = false: the body is still never held in memory (a file), the file goes
    when consumed, and a restart starts with an empty directory."""
    b = broker_factory(persistence_enabled=False).start()
    data = body(4 * CHUNK, seed=30)
    with tandem.connect(url(b)) as c, c.session() as s:
        s.create_queue(QUEUE)
        p = s.create_producer(QUEUE)
        p.send(data)
        p.send(data)
        assert len(files(b)) == 2
        m = s.create_consumer(QUEUE).receive(5)
        assert m is not None and m.body == data
        assert wait_for(lambda: len(files(b)) == 1), files(b)
    b.kill()
    assert len(files(b)) == 1
    b.start()
    assert files(b) == []


def test_stomp_kill_mid_send_discards_the_partial_body(broker_factory: Factory) -> None:
    """kill -9 while a STOMP SEND's large body streams in: after the restart nothing of it is
    delivered and its part file is gone."""
    b = broker_factory(extra_toml=STOMP_ACCEPTORS, min_large_message_size=16 * 1024).start()
    sender = RawStomp(b.ports["stomp"])
    try:
        sender.sock.sendall(b"SEND\ndestination:/queue/cut\npersistent:true\ncontent-length:1000000\n\n")
        sender.sock.sendall(b"y" * 300_000)
        assert wait_for(lambda: part_bytes(b) > 0)
        b.kill()
    finally:
        sender.close()
    b.start()
    assert files(b) == []
    with tandem.connect(url(b)) as c, c.session() as s:
        assert s.create_consumer("cut").receive(0.3) is None


def test_the_spark_sink_writes_big_rows_as_large_messages_its_source_reads(broker: BrokerProcess) -> None:
    """The Spark sink's transactions carry large messages like any producer's (a 300 KiB row is
    a file), and the source's range reads carry them back whole."""
    from tandem.spark.options import WriteOptions
    from tandem.spark.source import write_partition

    big = body(300 * 1024, seed=21)
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue("rows", reader_only=True)
    opts = WriteOptions.parse({"url": broker.url, "address": "rows"})
    write_partition(opts, ["body"], iter([(big,), (b"small",)]), "tx-1", 0)
    write_partition(opts, ["body"], iter([(big,), (b"small",)]), "tx-1", 0)  # a retried task: nothing twice
    assert wait_for(lambda: len(files(broker)) == 1), files(broker)

    async def read() -> list[bytes]:
        async with await aio.connect(broker.url) as conn:
            s = await conn.create_session()
            got = await s.read_range("rows", 0, 10)
            return [m.body for m in got.messages]

    assert asyncio.run(read()) == [big, b"small"]

    # Per-row dedup ids: a large row whose id an earlier write used is dropped (the broker refuses
    # the transaction naming it, the sink sends it again without), the other large row goes in.
    other = body(200 * 1024, seed=22)
    write_partition(opts, ["body", "dedup_id"], iter([(other, "d-2")]), "tx-2", 0)
    write_partition(opts, ["body", "dedup_id"], iter([(big, "d-2"), (other[::-1], "d-3")]), "tx-3", 0)
    assert asyncio.run(read()) == [big, b"small", other, other[::-1]]
    assert wait_for(lambda: len(files(broker)) == 3), files(broker)


def test_data_print_lists_the_large_message_files(broker: BrokerProcess) -> None:
    """`tandem data print` lists large-messages/: each file with its size and the record naming it,
    and a file no record names (removed at the next start) as such."""
    import subprocess
    import sys

    data = body(3 * CHUNK + 1, seed=50)
    with tandem.connect(url(broker)) as c, c.session() as s:
        s.create_queue(QUEUE)
        s.create_producer(QUEUE).send(data)
    (name,) = files(broker)
    assert broker.stop() == 0
    (broker.data_dir / "large-messages" / "999999.part").write_bytes(b"x" * 10)
    r = subprocess.run(
        [sys.executable, "-m", "tandem", "data", "print", str(broker.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    section = r.stdout.split("== large messages")[1].split("== ")[0]
    lines = [x.strip() for x in section.splitlines()[1:] if x.strip()]
    assert any(x.startswith(f"{name}  size {len(data)}  message ") for x in lines), lines
    assert "999999.part  size 10  no record names it (removed at the next start)" in lines, lines
