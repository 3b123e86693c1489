"""A TCP proxy that makes the network fail on demand: delay, blackhole, cut one way, reset, refuse.

Tests put one between a client and a server, or between two servers, to get the failures a real
network has without root, iptables or Docker. Each fault acts per direction ("up": from the side
that connected to the proxy towards the target; "down": back) and on every connection, open or
new, until `heal()`:

- delay: every byte is held at least that long (ordering kept);
- blackhole: bytes are read and thrown away, sockets stay open (the end of a stream too is
  swallowed: neither side learns anything, as in a partition); a stream healed after a blackhole
  has a gap;
- cut: bytes are held, not lost (a one-way partition as TCP lives it: the sender's bytes wait and
  arrive after the heal); held bytes are bounded, past that TCP pushes the sender back;
- reset: an RST to both sides of every open connection, once;
- refuse_new: the listening socket closes, so a connect is refused; open connections go on.

`AsyncFaultProxy` runs on the caller's event loop (its controls are coroutines); `FaultProxy`
runs it on a thread of its own so blocking tests, other threads and coroutines of any loop can
call its plain methods.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import logging
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

log = logging.getLogger(__name__)

Direction = Literal["up", "down", "both"]
OneWay = Literal["up", "down"]
Filter = Callable[[bytes], bytes]
"""Sees each chunk read in one direction and returns what to pass on (b"" to pass nothing)."""
Filters = Callable[[], tuple[Filter, Filter]]
"""Called for each new connection: its (up, down) filters, so a filter may keep per-connection state."""

READ_SIZE = 64 * 1024
DEFAULT_BUFFER = 1024 * 1024
_RST_LINGER = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
_T = TypeVar("_T")


class _End(enum.Enum):
    EOF = "eof"
    RESET = "reset"


@dataclass(frozen=True)
class ProxyStats:
    """Counts since the proxy started; bytes are counted when written to their destination."""

    connections: int  # accepted
    open: int
    bytes_up: int
    bytes_down: int
    dropped_up: int  # thrown away by a blackhole
    dropped_down: int
    buffered: int  # held in the proxy now (delayed or cut), all connections


class _Way:
    """The faults of one direction, shared by every connection."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.blackhole = False
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.delivered = 0
        self.dropped = 0

    def heal(self) -> None:
        self.delay = 0.0
        self.blackhole = False
        self.flowing.set()


class _Queue:
    """Chunks waiting to be written, bounded in bytes (a put may overshoot by one chunk)."""

    def __init__(self, limit: int) -> None:
        self.items: deque[tuple[float, bytes | _End]] = deque()
        self.size = 0
        self.limit = limit
        self.cond = asyncio.Condition()

    async def put(self, at: float, item: bytes | _End) -> None:
        async with self.cond:
            await self.cond.wait_for(lambda: self.size < self.limit)
            self.items.append((at, item))
            self.size += len(item) if isinstance(item, bytes) else 0
            self.cond.notify_all()

    async def get(self) -> tuple[float, bytes | _End]:
        async with self.cond:
            await self.cond.wait_for(lambda: bool(self.items))
            at, item = self.items.popleft()
            self.size -= len(item) if isinstance(item, bytes) else 0
            self.cond.notify_all()
            return at, item


def _send_rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST_LINGER)
    writer.transport.abort()


class _Link:
    """One proxied connection: two directions, each a reader task and a writer task."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.queues: list[_Queue] = []

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.server) if w is not None]

    def rst(self) -> None:
        for w in self.writers():
            _send_rst(w)

    async def closed(self) -> None:
        for w in self.writers():
            w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(w.wait_closed(), 5)

    async def run(
        self,
        creader: asyncio.StreamReader,
        sreader: asyncio.StreamReader,
        ways: tuple[_Way, _Way],
        limit: int,
        filters: tuple[Filter | None, Filter | None],
    ) -> None:
        assert self.server is not None
        tasks: list[asyncio.Task[Any]] = []
        writers: set[asyncio.Task[Any]] = set()
        for src, dst, way, filt in (
            (creader, self.server, ways[0], filters[0]),
            (sreader, self.client, ways[1], filters[1]),
        ):
            q = _Queue(limit)
            self.queues.append(q)
            tasks.append(asyncio.ensure_future(_read(src, q, way, filt)))
            w = asyncio.ensure_future(_write(q, dst, way))
            writers.add(w)
            tasks.append(w)
        try:
            pending: set[asyncio.Task[Any]] = set(tasks)
            ended = 0
            while ended < 2:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    exc = t.exception()
                    if exc is not None:
                        if not isinstance(exc, OSError):
                            log.error("fault proxy: a connection failed", exc_info=exc)
                        self.rst()  # a side is gone: the other learns it as TCP would tell it
                        return
                    if t in writers:
                        if t.result() is _End.RESET:
                            self.rst()
                            return
                        ended += 1
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _read(src: asyncio.StreamReader, q: _Queue, way: _Way, filt: Filter | None) -> None:
    loop = asyncio.get_running_loop()
    while True:
        try:
            data = await src.read(READ_SIZE)
        except OSError:  # reset by the peer
            await q.put(loop.time() + way.delay, _End.RESET)
            return
        if not data:
            await q.put(loop.time() + way.delay, _End.EOF)
            return
        if filt is not None:
            data = filt(data)
            if not data:
                continue
        if way.blackhole:  # drop at once: a blackhole costs no memory
            way.dropped += len(data)
            continue
        await q.put(loop.time() + way.delay, data)


async def _write(q: _Queue, dst: asyncio.StreamWriter, way: _Way) -> _End:
    loop = asyncio.get_running_loop()
    while True:
        at, item = await q.get()
        wait = at - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        await way.flowing.wait()
        if way.blackhole:
            if isinstance(item, bytes):
                way.dropped += len(item)
                continue
            return _End.EOF  # the end swallowed: this direction is over, nobody told
        if item is _End.EOF:
            if dst.can_write_eof() and not dst.transport.is_closing():
                with contextlib.suppress(OSError):
                    dst.write_eof()
            return _End.EOF
        if item is _End.RESET:
            _send_rst(dst)
            return _End.RESET
        if dst.transport.is_closing():
            raise ConnectionResetError("the destination is gone")
        dst.write(item)
        way.delivered += len(item)
        await dst.drain()


def _ways(direction: str) -> tuple[str, ...]:
    if direction == "both":
        return ("up", "down")
    if direction in ("up", "down"):
        return (direction,)
    raise ValueError(f"direction must be 'up', 'down' or 'both', not {direction!r}")


class AsyncFaultProxy:
    """The proxy on the running event loop: `async with AsyncFaultProxy(port) as proxy:`.

    Controls are coroutines; each is in effect when it returns.
    """

    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = "127.0.0.1",
        host: str = "127.0.0.1",
        port: int = 0,
        buffer_bytes: int = DEFAULT_BUFFER,
        filters: Filters | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        if buffer_bytes < 1:
            raise ValueError("buffer_bytes must be >= 1")
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self.buffer_bytes = buffer_bytes  # per connection and direction
        self.filters = filters
        self.connect_timeout = connect_timeout
        self._ways = {"up": _Way(), "down": _Way()}
        self._listener: socket.socket | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections = 0
        self._closed = False

    @property
    def url(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        """`host:port`, as a connector or a `[[connectors]]` url wants it."""
        return f"{self.host}:{self.port}"

    async def start(self) -> AsyncFaultProxy:
        await self._listen()
        return self

    async def __aenter__(self) -> AsyncFaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _listen(self) -> None:
        family, kind, proto, _, addr = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self._listener = sock
        asyncio.get_running_loop().add_reader(sock, self._accept_waiting, sock)

    def _accept_waiting(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the connection waits in the backlog
                log.warning("fault proxy: accept failed: %s", exc)
                return
            self._adopt(conn)

    def _unlisten(self) -> None:
        """Close the listening socket, keeping what the kernel had accepted: a connect that returned stays."""
        sock, self._listener = self._listener, None
        if sock is not None:
            asyncio.get_running_loop().remove_reader(sock)
            self._accept_waiting(sock)
            sock.close()

    # ------------------------------------------------------------ controls
    async def delay(self, seconds: float, direction: Direction = "both") -> None:
        """Hold each byte read from now on at least `seconds` (0: no delay)."""
        if seconds < 0:
            raise ValueError("delay must be >= 0 seconds")
        for w in _ways(direction):
            self._ways[w].delay = seconds

    async def blackhole(self, direction: Direction = "both") -> None:
        """Throw bytes away, silently; the sockets stay open."""
        for w in _ways(direction):
            self._ways[w].blackhole = True

    async def cut(self, direction: OneWay) -> None:
        """Hold the bytes of one direction until `heal()`; the other direction goes on."""
        if direction not in ("up", "down"):
            raise ValueError(f"cut takes one direction, 'up' or 'down', not {direction!r}")
        self._ways[direction].flowing.clear()

    async def heal(self) -> None:
        """Back to plain forwarding: no delay, blackhole or cut, and new connections accepted."""
        for way in self._ways.values():
            way.heal()
        await self.refuse_new(False)

    async def reset(self) -> int:
        """RST both sides of every open connection; returns how many connections."""
        links = list(self._links)
        for link in links:
            link.rst()
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(links)

    async def refuse_new(self, refuse: bool = True) -> None:
        """Close (True) or reopen (False) the listening socket, on the same port."""
        if self._closed:
            return
        if refuse:
            self._unlisten()
        elif self._listener is None:
            await self._listen()

    async def stats(self) -> ProxyStats:
        up, down = self._ways["up"], self._ways["down"]
        return ProxyStats(
            connections=self._connections,
            open=len(self._links),
            bytes_up=up.delivered,
            bytes_down=down.delivered,
            dropped_up=up.dropped,
            dropped_down=down.dropped,
            buffered=sum(q.size for link in self._links for q in link.queues),
        )

    async def aclose(self) -> None:
        """Stop listening and close every connection (a FIN, not a reset)."""
        if self._closed:
            return
        await self.refuse_new(True)
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------ connections
    def _adopt(self, conn: socket.socket) -> None:
        self._connections += 1
        task = asyncio.ensure_future(self._serve(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            creader, cwriter = await asyncio.open_connection(sock=conn)
        except BaseException:
            conn.close()
            raise
        link = _Link(cwriter)
        self._links.add(link)
        try:
            try:
                sreader, link.server = await asyncio.wait_for(
                    asyncio.open_connection(*self.target), self.connect_timeout
                )
            except (OSError, TimeoutError):
                link.rst()  # the target is down: the client sees a reset, as from a dead host's port
                return
            filters: tuple[Filter | None, Filter | None] = self.filters() if self.filters else (None, None)
            await link.run(creader, sreader, (self._ways["up"], self._ways["down"]), self.buffer_bytes, filters)
        except asyncio.CancelledError:  # reset() or aclose(): no flushing of what is still held
            for w in link.writers():
                w.transport.abort()
            raise
        finally:
            self._links.discard(link)
            await link.closed()


class FaultProxy:
    """`AsyncFaultProxy` on a thread of its own, for blocking tests: `with FaultProxy(port) as proxy:`.

    Every method is thread-safe and returns once in effect; it waits only for the proxy's own
    thread, so a coroutine may call it too (it blocks its loop for that moment). Not from a
    filter: that runs on the proxy's thread.
    """

    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = "127.0.0.1",
        host: str = "127.0.0.1",
        port: int = 0,
        buffer_bytes: int = DEFAULT_BUFFER,
        filters: Filters | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.core = AsyncFaultProxy(
            target_port, target_host=target_host, host=host, port=port, buffer_bytes=buffer_bytes, filters=filters
        )
        self.timeout = timeout  # bound on each call into the proxy's thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.core.port

    @property
    def url(self) -> str:
        return self.core.url

    @property
    def address(self) -> str:
        return self.core.address

    def start(self) -> FaultProxy:
        if self._loop is not None:
            raise RuntimeError("the proxy is already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        try:
            self._call(self.core.start())
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            raise RuntimeError("the proxy is not running")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("FaultProxy called from its own thread (a filter): use the AsyncFaultProxy `core`")
        fut: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(coro, loop)
        return fut.result(self.timeout)

    def delay(self, seconds: float, direction: Direction = "both") -> None:
        self._call(self.core.delay(seconds, direction))

    def blackhole(self, direction: Direction = "both") -> None:
        self._call(self.core.blackhole(direction))

    def cut(self, direction: OneWay) -> None:
        self._call(self.core.cut(direction))

    def heal(self) -> None:
        self._call(self.core.heal())

    def reset(self) -> int:
        return self._call(self.core.reset())

    def refuse_new(self, refuse: bool = True) -> None:
        self._call(self.core.refuse_new(refuse))

    def stats(self) -> ProxyStats:
        return self._call(self.core.stats())

    def wait_stats(self, predicate: Callable[[ProxyStats], bool], timeout: float) -> ProxyStats:
        """Poll until `predicate(stats)` holds; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if predicate(s):
                return s
            if time.monotonic() >= deadline:
                raise TimeoutError(f"proxy stats not as wanted within {timeout}s: {s}")
            time.sleep(0.02)

    def close(self) -> None:
        """Close every connection and the listener, then stop the thread. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or loop.is_closed():
            return
        try:
            if thread is not None and thread.is_alive():
                self._call(self.core.aclose())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(self.timeout)
            if thread is None or not thread.is_alive():
                loop.close()


__all__ = ["AsyncFaultProxy", "Direction", "FaultProxy", "Filter", "Filters", "OneWay", "ProxyStats"]
