"""A fault proxy (tandem.testing) that loses the broker's answer to a commit, for outcome-unknown tests.

Both directions are read frame by frame (4-byte length, then a msgpack packet) by a filter of the
kit's proxy and passed on unchanged, except the answer (RESPONSE or EXCEPTION) to the first
COMMIT(s) the client sends: the broker did the commit, the client never hears of it (or, with
`lose="request"`, the COMMIT itself: the client cannot tell the two apart). `on_drop` runs at that
moment, on the proxy's thread (a test kills the broker there). The client's connection stays open
while the broker's does (its commit call times out) and ends when the broker's ends (the client
sees it fail). The proxy runs on its own thread, so blocking and asyncio clients use it alike.

`silent_after` makes filters for a plain FaultProxy that let one frame through and then silence
its connection (a link that dies at a chosen moment of a conversation).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence

import msgspec

from tandem.protocol import native as p
from tandem.testing import FaultProxy
from tandem.testing.proxy import Filter, Filters

_LENGTH = struct.Struct("<I")
_client_packet = msgspec.msgpack.Decoder(p.ClientPacket).decode
_server_packet = msgspec.msgpack.Decoder(p.ServerPacket).decode


def frames(buf: bytearray) -> list[bytes]:
    """The complete frames at the head of `buf`, taken out of it."""
    out = []
    while len(buf) >= 4:
        (n,) = _LENGTH.unpack_from(buf)
        if len(buf) < 4 + n:
            break
        out.append(bytes(buf[: 4 + n]))
        del buf[: 4 + n]
    return out


def silent_after(frame: bytes, tripped: threading.Event, on_trip: Callable[[], None] | None = None) -> Filters:
    """Filters under which the first connection to send `frame` up (a whole frame, length
    included) passes it, then passes nothing more either way; `tripped` is set at that moment,
    after `on_trip` has run (on the proxy's thread, before the frame goes on: a test kills the
    sender there). The sockets stay open (a blackhole); later connections pass everything."""

    def filters() -> tuple[Filter, Filter]:
        ups = bytearray()
        magic_left = len(p.MAGIC)
        silent = False

        def up(data: bytes) -> bytes:
            nonlocal magic_left, silent
            if silent:
                return b""
            out = bytearray(data[:magic_left])
            ups.extend(data[magic_left:])
            magic_left -= len(out)
            for f in frames(ups):
                out += f
                if f == frame and not tripped.is_set():
                    silent = True
                    if on_trip is not None:
                        on_trip()
                    tripped.set()
                    break
            return bytes(out)

        def down(data: bytes) -> bytes:
            return b"" if silent else data

        return up, down

    return filters


class CommitReplyDropper:
    """Proxy to `127.0.0.1:upstream_port`; `port` is where clients connect."""

    def __init__(
        self,
        upstream_port: int,
        drops: int = 1,
        on_drop: Callable[[], None] | None = None,
        lose: str | Sequence[str] = "answer",
        port: int = 0,
    ) -> None:
        # What to lose of the first commits, in order: "answer" (the broker commits, the client
        # never hears) or "request" (the COMMIT never reaches the broker); a sequence says it
        # commit by commit (then `drops` is its length).
        self.plan = [lose] * drops if isinstance(lose, str) else list(lose)
        assert all(mode in ("answer", "request") for mode in self.plan)
        self.drops = len(self.plan)
        self.on_drop = on_drop
        self.dropped = threading.Event()
        self.commits_seen = 0
        self.proxy = FaultProxy(upstream_port, port=port, filters=self._filters)

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def url(self) -> str:
        return self.proxy.url

    def __enter__(self) -> CommitReplyDropper:
        self.proxy.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proxy.close()

    def _drop(self) -> None:
        if self.on_drop is not None:
            self.on_drop()
        self.dropped.set()

    def _filters(self) -> tuple[Filter, Filter]:
        """One connection's filters: they share the commits whose answers are to be lost."""
        commits: set[tuple[int, int]] = set()
        ups, downs = bytearray(), bytearray()
        magic_left = len(p.MAGIC)

        def up(data: bytes) -> bytes:  # client -> broker
            nonlocal magic_left
            out = bytearray(data[:magic_left])
            ups.extend(data[magic_left:])
            magic_left -= len(out)
            for frame in frames(ups):
                pkt = _client_packet(frame[4:])
                if type(pkt) is p.Commit:
                    self.commits_seen += 1
                    mode = self.plan[self.commits_seen - 1] if self.commits_seen <= len(self.plan) else None
                    if mode == "request":
                        self.drops -= 1
                        self._drop()
                        continue
                    if mode == "answer":
                        commits.add((pkt.channel, pkt.cmd))
                out += frame
            return bytes(out)

        def down(data: bytes) -> bytes:  # broker -> client
            downs.extend(data)
            out = bytearray()
            for frame in frames(downs):
                pkt = _server_packet(frame[4:])
                if type(pkt) in (p.Response, p.Exception_) and (pkt.channel, pkt.cmd) in commits:  # type: ignore[union-attr]
                    self.drops -= 1
                    commits.discard((pkt.channel, pkt.cmd))  # type: ignore[union-attr]
                    self._drop()
                    continue
                out += frame
            return bytes(out)

        return up, down
