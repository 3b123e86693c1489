"""Large messages across a failover, on both kinds of pair (shared store, replication), with real
processes and kill -9: a send cut mid-stream is sent again by the client from its start and arrives
once, whole; a delivery cut mid-stream comes again whole from the backup; a backup that joins while
large messages are being written takes over with every confirmed one. Bodies are compared exactly."""

from __future__ import annotations

import asyncio
import hashlib
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from ha_pair import Cluster
from replicated_pair import ReplicatedPair
from tandem.testing.procs import memory
from tandem.testing.streams import GeneratedBody

CHUNK = 64 * 1024  # the clients' min_large_message_size here (and their chunk size)
QUEUE = "big"


def body(n: int, seed: int) -> bytes:
    """`n` bytes in which every 64 KiB chunk differs (a dropped, doubled or shifted chunk shows)."""
    block = hashlib.sha256(str(seed).encode()).digest() * (CHUNK // 32)
    out = bytearray()
    i = 0
    while len(out) < n:
        out += i.to_bytes(8, "little") + block[8:]
        i += 1
    return bytes(out[:n])


def opts(**more: Any) -> str:
    return "?" + "&".join(f"{k}={v}" for k, v in {"min_large_message_size": CHUNK, **more}.items())


def large_dir(pair: Cluster, i: int) -> Path:
    """Server i's large-messages/ (one directory for both on a shared store)."""
    return (pair.dirs[i] if isinstance(pair, ReplicatedPair) else pair.data) / "large-messages"


def names(d: Path) -> list[str]:
    return sorted(f.name for f in d.iterdir()) if d.is_dir() else []


def wait_for(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.fixture(params=["shared-store", "replicated"])
def started(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A started pair of either kind (the backup passive, announced / in sync)."""
    pair: Cluster
    if request.param == "shared-store":
        pair = Cluster(tmp_path).start_all()
    else:
        pair = ReplicatedPair(tmp_path).start_all()
        pair.wait_announced()
    try:
        yield pair
    finally:
        pair.kill_all()


@pytest.mark.timeout(120)
def test_kill_of_the_primary_mid_send_the_client_resends_on_the_backup_once_whole(
    started: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kill -9 of the primary while a seekable file streams in: the client fails over and sends it
    again from its start with its dedup id; the backup delivers it once, whole, and no file stays."""
    pair = started
    data = body(48 * CHUNK + 5, seed=1)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    with tandem.connect(pair.url_of(0) + opts()) as c, c.session() as s:
        s.create_queue(QUEUE)
    killed: list[int] = []

    class KillingFile(io.FileIO):
        def read(self, n: int = -1) -> bytes:  # type: ignore[override]
            if not killed and self.tell() >= 24 * CHUNK:
                killed.append(self.tell())
                pair.primary.kill()
            return super().read(n)

    with tandem.connect(pair.url + opts()) as c, c.session() as s, KillingFile(src, "rb") as f:
        s.create_producer(QUEUE).send_stream(f)
    assert killed
    assert "sending it again from its start" in caplog.text
    pair.wait_state(1, "active")
    with tandem.connect(pair.url_of(1) + opts(ha="false")) as c, c.session() as s:
        cons = s.create_consumer(QUEUE)
        m = cons.receive(10)
        assert m is not None and m.large
        assert len(m.body) == len(data) and m.body == data
        assert cons.receive(0.5) is None  # once: no second copy, no partial one
    d = large_dir(pair, 1)
    assert wait_for(lambda: names(d) == []), names(d)


@pytest.mark.timeout(120)
def test_kill_of_the_primary_mid_send_twice_in_a_row_no_partial_message(started: Cluster) -> None:
    """Two large messages confirmed, a third cut by the kill before its END: the backup has the two
    confirmed ones whole and nothing of the third (the application sends from a stream that cannot
    seek back, so the client gives up with Unblocked rather than resend)."""
    pair = started
    first, second = body(10 * CHUNK + 1, seed=2), body(12 * CHUNK + 2, seed=3)
    with tandem.connect(pair.url + opts()) as c, c.session() as s:
        s.create_queue(QUEUE)
        prod = s.create_producer(QUEUE)
        prod.send(first)
        prod.send_stream(io.BytesIO(second))

        class Unseekable(io.RawIOBase):
            def __init__(self) -> None:
                self.sent = 0

            def readable(self) -> bool:
                return True

            def readinto(self, b: Any) -> int:
                if self.sent >= 8 * CHUNK:
                    pair.primary.kill()
                    time.sleep(0.2)
                if self.sent >= 64 * CHUNK:
                    return 0
                k = min(len(b), CHUNK)
                b[:k] = b"x" * k
                self.sent += k
                return k

        with pytest.raises(tandem.errors.Unblocked):
            prod.send_stream(Unseekable())
    pair.wait_state(1, "active")
    with tandem.connect(pair.url_of(1) + opts(ha="false")) as c, c.session() as s:
        cons = s.create_consumer(QUEUE)
        got = [cons.receive(10), cons.receive(10)]
        assert [m.body if m is not None else None for m in got] == [first, second]
        assert cons.receive(0.5) is None


@pytest.mark.timeout(120)
def test_kill_of_the_primary_mid_consume_the_backup_redelivers_it_whole(started: Cluster) -> None:
    """kill -9 of the primary while a large message streams out: the consumer hands over no part
    of it; it fails over and gets the message from the backup, whole, exactly once."""
    pair = started
    data = body(160 * CHUNK + 9, seed=4)  # 10 MiB: more than the socket buffers hold
    with tandem.connect(pair.url_of(0) + opts()) as c, c.session() as s:
        s.create_queue(QUEUE)
        s.create_producer(QUEUE).send(data)

    async def run() -> None:
        async with await aio.connect(pair.url + opts(retry_interval=100)) as conn:
            # A fixed small receive buffer: the kernel's autotuning (tcp_rmem up to 32 MiB here)
            # could otherwise take the whole body in before the kill, and it would arrive whole.
            sock = conn._proto.transport.get_extra_info("socket")  # type: ignore[union-attr]
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            s = await conn.create_session(ack_mode="client")
            cons = await s.create_consumer(QUEUE)
            deadline = time.monotonic() + 10
            while cons._arriving is None or cons._arriving._large is None or cons._arriving._large.size == 0:
                assert time.monotonic() < deadline, "no chunk arrived"
                await asyncio.sleep(0.001)
            transport = conn._proto.transport  # type: ignore[union-attr]
            transport.pause_reading()  # the primary's stream stalls at its high-water mark
            await asyncio.sleep(0.2)
            assert not cons.buffer  # part of the body is here: nothing handed over
            await asyncio.to_thread(pair.primary.kill)
            transport.resume_reading()
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while not got:
                assert time.monotonic() < deadline, "nothing redelivered by the backup"
                try:
                    m = await cons.receive(1)
                except tandem.errors.Unblocked:
                    continue
                if m is not None:
                    got.append(m.body)
                    await m.ack()
            assert len(got[0]) == len(data)
            assert got == [data]
            assert await cons.receive(0.5) is None

    asyncio.run(run())
    assert pair.status(1)["state"] == "active"
    d = large_dir(pair, 1)
    assert wait_for(lambda: names(d) == []), names(d)


@pytest.mark.timeout(180)
def test_a_backup_joining_while_large_messages_are_written_takes_over_with_every_confirmed_one(
    tmp_path: Path,
) -> None:
    """A replicated primary takes large messages (stream sends) while its backup starts and syncs
    (initial sync of files being written); kill -9 of the primary once the backup is in sync: the
    backup delivers every confirmed message whole, in order, and nothing else."""
    pair = ReplicatedPair(tmp_path)
    try:
        pair.primary.start()
        pair.wait_state(0, "active")
        with tandem.connect(pair.url_of(0) + opts()) as c, c.session() as s:
            s.create_queue(QUEUE)
        confirmed: list[bytes] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def produce() -> None:
            try:
                with tandem.connect(pair.url_of(0) + opts(ha="false")) as c, c.session() as s:
                    prod = s.create_producer(QUEUE)
                    for i in range(200):
                        if stop.is_set():
                            return
                        data = body((8 + i % 24) * CHUNK + i, seed=100 + i)
                        prod.send_stream(io.BytesIO(data))
                        confirmed.append(data)
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=produce)
        t.start()
        try:
            assert wait_for(lambda: len(confirmed) >= 3 or bool(errors)), errors
            pair.backup.start()
            pair.wait_in_sync(timeout=60)
            n_at_sync = len(confirmed)
            assert wait_for(lambda: len(confirmed) >= n_at_sync + 3 or bool(errors)), errors
        finally:
            stop.set()
            t.join(60)
        assert not t.is_alive()
        assert not errors, errors
        pair.primary.kill()
        pair.wait_state(1, "active", timeout=30)
        got: list[bytes] = []
        with tandem.connect(pair.url_of(1) + opts(ha="false")) as c, c.session() as s:
            cons = s.create_consumer(QUEUE)
            while len(got) <= len(confirmed) and (m := cons.receive(2)) is not None:
                got.append(m.body)
        assert len(got) == len(confirmed)
        assert got == confirmed
        d = large_dir(pair, 1)
        assert wait_for(lambda: names(d) == []), names(d)
    finally:
        pair.kill_all()


@pytest.mark.timeout(240)
def test_a_slow_backup_paces_a_large_upload_instead_of_filling_the_primary_s_memory(tmp_path: Path) -> None:
    """A 96 MiB message streamed into a replicating primary while its backup is stopped (SIGSTOP)
    again and again: the primary stops reading the upload while its link holds more than its
    high-water mark, so its peak RSS grows by far less than the message (unpaced, the chunks
    queue for the backup in its memory); then kill -9 of the primary, and the backup delivers
    the message whole."""
    size = 96 << 20
    pair = ReplicatedPair(tmp_path).start_all()
    try:
        assert pair.primary.proc is not None
        pid = pair.primary.proc.pid
        url = pair.url_of(0) + opts(min_large_message_size=256 * 1024, ha="false")
        with tandem.connect(url) as c, c.session() as s:
            s.create_queue(QUEUE)
            base = memory(pid, "VmRSS")
            src = GeneratedBody(size)

            def send() -> None:
                with tandem.connect(url) as c2, c2.session() as s2:
                    s2.create_producer(QUEUE).send_stream(src, size=size)

            stops = stalling_the_backup(pair, send)
            peak = memory(pid, "VmHWM")
        growth = peak - base
        print(f"primary peak RSS grew by {growth >> 20} MiB over {stops} stalls of its backup")
        # (unpaced, the stalls queue tens of MiB of chunks for the backup)
        assert growth < 40 << 20, f"the primary's peak RSS grew by {growth >> 20} MiB for a {size >> 20} MiB message"
        pair.primary.kill()
        pair.wait_state(1, "active", timeout=30)
        with tandem.connect(pair.url_of(1) + opts(ha="false")) as c, c.session() as s:
            cons = s.create_consumer(QUEUE)
            m = cons.receive(60)
            assert m is not None and m.large
            digest = hashlib.sha256()
            stream = m.body_stream()
            while block := stream.read(1 << 20):
                digest.update(block)
            assert digest.hexdigest() == src.digest.hexdigest()
            assert cons.receive(0.5) is None
    finally:
        pair.kill_all()


@pytest.mark.timeout(120)
def test_an_upload_paced_longer_than_its_connection_ttl_is_not_taken_for_a_dead_client(tmp_path: Path) -> None:
    """The backup stalls for several times the uploader's connection TTL: the primary does not
    read the uploader meanwhile (its pings and its half-read chunk wait in the socket), and must not
    close it as silent; the upload completes once the backup resumes, and arrives whole."""
    size = 48 << 20
    pair = ReplicatedPair(tmp_path).start_all()
    try:
        url = pair.url_of(0) + opts(min_large_message_size=256 * 1024, ha="false", connection_ttl=600)
        with tandem.connect(url) as c, c.session() as s:
            s.create_queue(QUEUE)
        src = GeneratedBody(size)
        errors: list[BaseException] = []
        done = threading.Event()

        def send() -> None:
            try:
                with tandem.connect(url + "&reconnect_attempts=0") as c2, c2.session() as s2:
                    s2.create_producer(QUEUE).send_stream(src, size=size)
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                done.set()

        t = threading.Thread(target=send)
        t.start()
        try:
            assert wait_for(lambda: src.pos >= 2 << 20 or done.is_set(), 30)
            with pair.backup.paused():
                done.wait(3.0)  # five TTLs with the upload paced
                assert not done.is_set()
        finally:
            t.join(60)
        assert not t.is_alive()
        assert not errors, errors
        with tandem.connect(pair.url_of(0) + opts(ha="false")) as c, c.session() as s:
            m = s.create_consumer(QUEUE).receive(30)
            assert m is not None and m.large
            digest = hashlib.sha256()
            stream = m.body_stream()
            while block := stream.read(1 << 20):
                digest.update(block)
            assert digest.hexdigest() == src.digest.hexdigest()
    finally:
        pair.kill_all()


@pytest.mark.timeout(240)
def test_a_slow_backup_paces_a_stomp_large_body_too(tmp_path: Path) -> None:
    """A 64 MiB STOMP SEND (content-length) into a replicating primary whose backup stalls again
    and again: the primary stops reading the STOMP connection while its link is full, so its peak
    RSS grows by far less than the body; its RECEIPT comes, and after kill -9 of the primary the
    backup delivers the body whole."""
    import socket

    from tandem.protocol.stomp import SERVER_COMMANDS, StompParser

    size = 64 << 20
    pair = ReplicatedPair(tmp_path, stomp=True, min_large_message_size=256 * 1024).start_all()
    try:
        assert pair.primary.proc is not None
        pid = pair.primary.proc.pid
        sock = socket.create_connection(("127.0.0.1", pair.stomp_ports[0]), timeout=60)
        parser = StompParser(1 << 20, "1.2", SERVER_COMMANDS)
        frames: list[Any] = []

        def next_frame() -> Any:
            for _ in range(10_000):
                if frames:
                    return frames.pop(0)
                data = sock.recv(1 << 16)
                assert data, "the server closed the connection"
                frames.extend(parser.feed(data))
            raise AssertionError("no frame")

        try:
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0")
            assert next_frame().command == "CONNECTED"
            base = memory(pid, "VmRSS")
            src = GeneratedBody(size)

            def send() -> None:
                head = f"SEND\ndestination:/queue/{QUEUE}\npersistent:true\nreceipt:r1\ncontent-length:{size}\n\n"
                sock.sendall(head.encode())
                while piece := src.read(1 << 20):
                    sock.sendall(piece)
                sock.sendall(b"\0")

            stops = stalling_the_backup(pair, send)
            f = next_frame()
            assert f.command == "RECEIPT" and f.headers["receipt-id"] == "r1", f
            peak = memory(pid, "VmHWM")
        finally:
            sock.close()
        growth = peak - base
        print(f"primary peak RSS grew by {growth >> 20} MiB over {stops} stalls of its backup (STOMP)")
        assert growth < 40 << 20, f"the primary's peak RSS grew by {growth >> 20} MiB for a {size >> 20} MiB body"
        pair.primary.kill()
        pair.wait_state(1, "active", timeout=30)
        with tandem.connect(pair.url_of(1) + opts(ha="false")) as c, c.session() as s:
            m = s.create_consumer(QUEUE).receive(60)
            assert m is not None and m.large
            digest = hashlib.sha256()
            stream = m.body_stream()
            while block := stream.read(1 << 20):
                digest.update(block)
            assert digest.hexdigest() == src.digest.hexdigest()
    finally:
        pair.kill_all()


def stalling_the_backup(pair: ReplicatedPair, send: Callable[[], None]) -> int:
    """Run `send` on a thread while the backup stalls 1 s out of every 1.3 s, from the send's
    start, until it returns; the number of stalls (what `send` raised is raised here)."""
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            send()
        except BaseException as exc:  # raised below, on the test's thread
            errors.append(exc)
        finally:
            done.set()

    t = threading.Thread(target=run)
    stops = 0
    try:
        for k in range(100):
            with pair.backup.paused():
                if k == 0:
                    t.start()
                stops += 1
                done.wait(1.0)
            if done.is_set():
                break
            time.sleep(0.3)
    finally:
        t.join(120)
    assert not t.is_alive(), "the send did not end"
    if errors:
        raise errors[0]
    return stops
