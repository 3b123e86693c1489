"""server/link_writer.py: frames from any thread reach the peer whole and in order; a full socket
pauses the writer's owner and a drained one resumes it; a peer that goes away is reported."""

from __future__ import annotations

import asyncio
import socket
import threading

from tandem.server.link_writer import LinkWriter


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)  # as an event loop's transport leaves it
    return a, b


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    sock.settimeout(10)
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, f"peer closed after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


def test_frames_from_threads_arrive_in_the_order_handed_over() -> None:
    asyncio.run(_frames_from_threads_arrive_in_the_order_handed_over())


async def _frames_from_threads_arrive_in_the_order_handed_over() -> None:
    loop = asyncio.get_running_loop()
    a, b = _pair()
    events: list[str] = []
    w = LinkWriter(a.fileno(), loop, 1 << 16, 1 << 12, lambda: events.append("pause"), lambda: events.append("resume"),
                   lambda exc: events.append(f"failed {exc}"))  # fmt: skip
    lock = threading.Lock()
    sent: list[bytes] = []

    def producer(tag: int) -> None:
        for i in range(500):
            frame = f"{tag:02d}:{i:05d};".encode() * (1 + i % 50)
            with lock:  # the replication source's lock: one order over all threads
                sent.append(frame)
                w.write(frame)

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(len(f) for f in sent)
    got = await asyncio.to_thread(_read_exactly, b, total)
    assert got == b"".join(sent)
    w.close()
    await asyncio.sleep(0.05)
    a.close()
    assert b.recv(1) == b""  # the writer's descriptor is gone too: the peer sees the end
    assert not any(e.startswith("failed") for e in events), events
    b.close()


def test_a_full_socket_pauses_and_a_drained_one_resumes() -> None:
    asyncio.run(_a_full_socket_pauses_and_a_drained_one_resumes())


async def _a_full_socket_pauses_and_a_drained_one_resumes() -> None:
    loop = asyncio.get_running_loop()
    a, b = _pair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    paused = asyncio.Event()
    resumed = asyncio.Event()
    w = LinkWriter(a.fileno(), loop, 1 << 16, 1 << 14, paused.set, resumed.set, lambda exc: None)
    data = b"x" * (1 << 20)
    w.write(data)  # far more than the socket holds: the writer waits in poll
    await asyncio.wait_for(paused.wait(), 5)
    assert not resumed.is_set() and w.pending > 1 << 16
    got = await asyncio.to_thread(_read_exactly, b, len(data))
    assert got == data
    await asyncio.wait_for(resumed.wait(), 5)
    assert w.pending == 0
    w.close()
    a.close()
    b.close()


def test_a_peer_that_went_away_is_reported_and_later_writes_are_dropped() -> None:
    asyncio.run(_a_peer_that_went_away_is_reported_and_later_writes_are_dropped())


async def _a_peer_that_went_away_is_reported_and_later_writes_are_dropped() -> None:
    loop = asyncio.get_running_loop()
    a, b = _pair()
    failed: asyncio.Future[OSError] = loop.create_future()
    w = LinkWriter(a.fileno(), loop, 1 << 16, 1 << 12, lambda: None, lambda: None, failed.set_result)
    b.close()
    for _ in range(100):
        w.write(b"y" * 65536)
        if failed.done():
            break
        await asyncio.sleep(0.01)
    exc = await asyncio.wait_for(failed, 5)
    assert isinstance(exc, OSError)
    w.write(b"after")  # ignored, not raised
    assert w.pending >= 0
    a.close()


def test_a_frame_from_another_thread_with_nothing_queued_is_written_on_that_thread() -> None:
    asyncio.run(_a_frame_from_another_thread_with_nothing_queued_is_written_on_that_thread())


async def _a_frame_from_another_thread_with_nothing_queued_is_written_on_that_thread() -> None:
    """The journal's writer thread hands over a batch's frame: written at once (no wake-up of the
    writer's thread) when nothing is queued; the loop's own frames still go through the queue."""
    loop = asyncio.get_running_loop()
    a, b = _pair()
    w = LinkWriter(a.fileno(), loop, 1 << 20, 1 << 12, lambda: None, lambda: None, lambda exc: None)
    frame = b"batch;" * 1000
    await asyncio.to_thread(w.write, frame)
    assert w.written_directly == len(frame)
    w.write(b"from the loop")
    assert w.written_directly == len(frame)
    got = await asyncio.to_thread(_read_exactly, b, len(frame) + len(b"from the loop"))
    assert got == frame + b"from the loop"
    w.close()
    await asyncio.sleep(0.05)
    a.close()
    b.close()
