"""The fault-injection proxy with real sockets on 127.0.0.1: an echo server behind it, each fault checked.

Timing is asserted one way only: a delayed byte arrives no sooner than the delay; "nothing
arrives" is checked over a short wait. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tandem.testing import AsyncFaultProxy, FaultProxy, ProxyStats

QUIET = 0.3  # how long "nothing arrives" is watched


class EchoServer:
    """A blocking echo server (a thread per connection) that records what reaches it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.echo = True
        self.conns: list[socket.socket] = []
        self.received = bytearray()
        self.resets = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            if not select.select([self.sock], [], [], 0.05)[0]:
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        while not self.stopping.is_set():
            if not select.select([conn], [], [], 0.05)[0]:
                continue
            try:
                data = conn.recv(65536)
            except ConnectionResetError:
                with self.lock:
                    self.resets += 1
                return
            except OSError:
                return
            if not data:  # the client is done: so are we
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_WR)
                return
            with self.lock:
                self.received += data
            if self.echo:
                try:
                    conn.sendall(data)
                except OSError:
                    return

    def push(self, data: bytes) -> None:
        """Send from the server side on every connection (blocks while the path is full)."""
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            c.sendall(data)

    def got(self) -> bytes:
        with self.lock:
            return bytes(self.received)

    def close(self) -> None:
        """The threads end first (each looks at `stopping` every 50 ms), then the sockets close:
        closing a socket one of them was waiting on made its select() fail with EBADF."""
        self.stopping.set()
        for t in self.threads:
            t.join(5)
        self.sock.close()
        with self.lock:
            for c in self.conns:
                c.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(echo.port) as p:
        yield p


def connect(proxy: FaultProxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    s.settimeout(5)
    return s


def recv_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, f"EOF after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


def nothing_arrives(s: socket.socket) -> None:
    s.settimeout(QUIET)
    try:
        with pytest.raises(TimeoutError):
            data = s.recv(100)
            pytest.fail(f"got {data!r} through a fault")
    finally:
        s.settimeout(5)


def eventually(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.01)


def test_plain_forwarding_and_stats(echo: EchoServer, proxy: FaultProxy) -> None:
    with connect(proxy) as c:
        c.sendall(b"hello")
        assert recv_exactly(c, 5) == b"hello"
        s = proxy.stats()
        assert (s.connections, s.open, s.bytes_up, s.bytes_down) == (1, 1, 5, 5)
        assert (s.dropped_up, s.dropped_down) == (0, 0)
    eventually(lambda: proxy.stats().open == 0, "the closed connection leaves the proxy")
    assert proxy.url == f"tcp://127.0.0.1:{proxy.port}"


@pytest.mark.parametrize("direction", ["up", "down", "both"])
def test_delay_holds_bytes_at_least_that_long(proxy: FaultProxy, direction: str) -> None:
    with connect(proxy) as c:
        proxy.delay(0.25, direction)  # type: ignore[arg-type]
        t0 = time.monotonic()
        c.sendall(b"slow")
        assert recv_exactly(c, 4) == b"slow"
        assert time.monotonic() - t0 >= 0.25
        proxy.heal()
        c.sendall(b"fast")
        assert recv_exactly(c, 4) == b"fast"


def test_blackhole_drops_silently_and_heal_lets_new_bytes_through(echo: EchoServer, proxy: FaultProxy) -> None:
    with connect(proxy) as c:
        proxy.blackhole()
        c.sendall(b"lost")
        nothing_arrives(c)
        assert echo.got() == b""
        assert proxy.stats().dropped_up == 4
        assert proxy.stats().open == 1, "a blackhole keeps the sockets open"
        proxy.heal()
        c.sendall(b"new")
        assert recv_exactly(c, 3) == b"new"
        assert echo.got() == b"new", "bytes sent into the blackhole stay lost"


def test_blackhole_one_direction(echo: EchoServer, proxy: FaultProxy) -> None:
    with connect(proxy) as c:
        proxy.blackhole("down")
        c.sendall(b"ping")
        eventually(lambda: echo.got() == b"ping", "the server gets the client's bytes")
        nothing_arrives(c)
        eventually(lambda: proxy.stats().dropped_down == 4, "the echo is dropped")


def test_reset_sends_rst_to_both_sides(echo: EchoServer, proxy: FaultProxy) -> None:
    with connect(proxy) as c:
        c.sendall(b"x")
        assert recv_exactly(c, 1) == b"x"
        assert proxy.reset() == 1
        with pytest.raises(ConnectionResetError):
            c.recv(10)
        eventually(lambda: echo.resets == 1, "the server sees the reset too")
    with connect(proxy) as c2:  # a reset is a one-off: new connections work
        c2.sendall(b"again")
        assert recv_exactly(c2, 5) == b"again"


def test_cut_up_holds_the_clients_bytes_while_the_server_still_talks(echo: EchoServer, proxy: FaultProxy) -> None:
    with connect(proxy) as c:
        c.sendall(b"a")
        assert recv_exactly(c, 1) == b"a"
        proxy.cut("up")
        c.sendall(b"held")
        echo.push(b"hi")
        assert recv_exactly(c, 2) == b"hi", "server to client still flows"
        time.sleep(QUIET)
        assert echo.got() == b"a", "client to server is cut"
        proxy.heal()
        assert recv_exactly(c, 4) == b"held", "a cut holds bytes, it does not lose them"
        assert echo.got() == b"aheld"


def test_cut_down_holds_the_servers_bytes_while_the_client_still_talks(echo: EchoServer, proxy: FaultProxy) -> None:
    with connect(proxy) as c:
        proxy.cut("down")
        c.sendall(b"ping")
        eventually(lambda: echo.got() == b"ping", "client to server still flows")
        nothing_arrives(c)
        proxy.heal()
        assert recv_exactly(c, 4) == b"ping"


def test_refuse_new_connections_keeps_the_open_ones(proxy: FaultProxy) -> None:
    with connect(proxy) as c:
        proxy.refuse_new(True)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=5).close()
        c.sendall(b"still")
        assert recv_exactly(c, 5) == b"still"
        proxy.refuse_new(False)
        with connect(proxy) as c2:
            c2.sendall(b"back")
            assert recv_exactly(c2, 4) == b"back"
    assert proxy.stats().connections == 2


def test_heal_accepts_again(proxy: FaultProxy) -> None:
    proxy.refuse_new(True)
    proxy.heal()
    with connect(proxy) as c:
        c.sendall(b"ok")
        assert recv_exactly(c, 2) == b"ok"


def test_a_cut_buffers_a_bounded_amount(echo: EchoServer) -> None:
    """Held bytes stay in the proxy up to its buffer; past that the sender is pushed back by TCP."""
    limit = 64 * 1024
    total = 64 * 1024 * 1024  # more than the kernel's buffers on the way can hold (rmem max 32 MiB + wmem 4 MiB here)
    with FaultProxy(echo.port, buffer_bytes=limit) as proxy, connect(proxy) as c:
        c.sendall(b"x")
        assert recv_exactly(c, 1) == b"x"
        proxy.cut("down")
        pusher = threading.Thread(target=echo.push, args=(b"\0" * total,), daemon=True)
        pusher.start()
        pusher.join(1.0)
        assert pusher.is_alive(), "the server could send everything although the path is cut"
        assert proxy.stats().buffered <= limit + 64 * 1024
        assert proxy.stats().bytes_down == 1
        proxy.heal()
        got = 0
        while got < total:
            chunk = c.recv(1 << 20)
            assert chunk, f"EOF after {got} bytes"
            got += len(chunk)
        pusher.join(10)
        assert not pusher.is_alive()
        assert proxy.stats().bytes_down == total + 1


def test_filters_see_every_chunk(echo: EchoServer) -> None:
    with FaultProxy(echo.port, filters=lambda: (bytes.upper, lambda b: b.replace(b"A", b"-"))) as proxy:
        with connect(proxy) as c:
            c.sendall(b"abc")
            assert recv_exactly(c, 3) == b"-BC"
            assert echo.got() == b"ABC"


def test_target_down_resets_the_client() -> None:
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
        with FaultProxy(dead) as proxy, pytest.raises(ConnectionResetError):  # maybe as soon as connect returns
            with connect(proxy) as c:
                c.sendall(b"x")
                c.recv(10)


def test_close_ends_connections_and_the_listener(echo: EchoServer) -> None:
    proxy = FaultProxy(echo.port).start()
    c = connect(proxy)
    c.sendall(b"x")
    assert recv_exactly(c, 1) == b"x"
    proxy.close()
    try:
        assert c.recv(10) == b""
    except ConnectionResetError:
        pass
    finally:
        c.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=5).close()
    proxy.close()  # twice is fine


def test_bad_direction_is_refused(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="direction"):
        proxy.cut("both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="direction"):
        proxy.blackhole("sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delay"):
        proxy.delay(-1)


def test_threaded_proxy_controls_from_a_coroutine(echo: EchoServer, proxy: FaultProxy) -> None:
    async def main() -> None:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        proxy.blackhole("up")
        w.write(b"gone")
        await w.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r.read(10), QUIET)
        proxy.heal()
        w.write(b"here")
        assert await asyncio.wait_for(r.readexactly(4), 5) == b"here"
        w.close()
        await w.wait_closed()

    asyncio.run(main())
    assert echo.got() == b"here"


def test_async_proxy_in_the_callers_loop(echo: EchoServer) -> None:
    async def main() -> ProxyStats:
        async with AsyncFaultProxy(echo.port) as proxy:
            r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
            await proxy.cut("down")
            w.write(b"wait")
            await w.drain()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r.read(10), QUIET)
            await proxy.heal()
            assert await asyncio.wait_for(r.readexactly(4), 5) == b"wait"
            assert await proxy.reset() == 1
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(r.read(10), 5)
            w.close()
            return await proxy.stats()

    stats = asyncio.run(main())
    assert stats.bytes_up == 4 and stats.bytes_down == 4
