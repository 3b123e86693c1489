"""A TCP proxy on 127.0.0.1 that loses the broker's answer to a commit, for outcome-unknown tests.

Both directions are read frame by frame (4-byte length, then a msgpack packet) and passed on
unchanged, except the answer (RESPONSE or EXCEPTION) to the first COMMIT(s) the client sends:
the broker did the commit, the client never hears of it (or, with `lose="request"`, the COMMIT
itself: the client cannot tell the two apart). `on_drop` runs at that moment (a test
kills the broker there). The client's connection stays open while the broker's does (its
commit call times out) and ends when the broker's ends (the client sees it fail). The proxy
runs its own event loop on a thread, so blocking and asyncio clients use it alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import Callable

import msgspec

from tandem.protocol import native as p

_LENGTH = struct.Struct("<I")
_client_packet = msgspec.msgpack.Decoder(p.ClientPacket).decode
_server_packet = msgspec.msgpack.Decoder(p.ServerPacket).decode


async def _frame(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    (n,) = _LENGTH.unpack(head)
    return head + await reader.readexactly(n)


class CommitReplyDropper:
    """Proxy to `127.0.0.1:upstream_port`; `port` is where clients connect."""

    def __init__(
        self, upstream_port: int, drops: int = 1, on_drop: Callable[[], None] | None = None, lose: str = "answer"
    ) -> None:
        assert lose in ("answer", "request")
        self.lose = lose  # "request": the COMMIT itself never reaches the broker
        self.upstream_port = upstream_port
        self.drops = drops  # how many commit answers to lose (the first ones)
        self.on_drop = on_drop
        self.dropped = threading.Event()
        self.commits_seen = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="reply-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def __enter__(self) -> CommitReplyDropper:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        def accepted(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            t = asyncio.ensure_future(self._pipe(r, w))
            tasks.add(t)
            t.add_done_callback(tasks.discard)

        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        async with server:
            await self._stop.wait()
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _pipe(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cwriter.close()
            return
        commits: set[tuple[int, int]] = set()

        async def up() -> None:  # client -> broker
            swriter.write(await creader.readexactly(len(p.MAGIC)))
            while True:
                frame = await _frame(creader)
                pkt = _client_packet(frame[4:])
                if type(pkt) is p.Commit:
                    self.commits_seen += 1
                    if self.lose == "request" and self.drops > 0:
                        self.drops -= 1
                        if self.on_drop is not None:
                            self.on_drop()
                        self.dropped.set()
                        continue
                    if len(commits) < self.drops:
                        commits.add((pkt.channel, pkt.cmd))
                swriter.write(frame)

        async def down() -> None:  # broker -> client
            while True:
                frame = await _frame(sreader)
                pkt = _server_packet(frame[4:])
                if type(pkt) in (p.Response, p.Exception_) and (pkt.channel, pkt.cmd) in commits:  # type: ignore[union-attr]
                    self.drops -= 1
                    commits.discard((pkt.channel, pkt.cmd))  # type: ignore[union-attr]
                    if self.on_drop is not None:
                        self.on_drop()
                    self.dropped.set()
                    continue
                cwriter.write(frame)

        legs = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(legs, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in legs:
                t.cancel()
            await asyncio.gather(*legs, return_exceptions=True)
            for w in (cwriter, swriter):
                with contextlib.suppress(Exception):
                    w.close()
