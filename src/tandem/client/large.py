"""Large messages on the client: bodies sent and received in chunks, never needed whole in memory.

Sending: a body over `min_large_message_size` (bytes, or any object with `read(n)`) goes as
LARGE_BEGIN, numbered LARGE_CHUNKs and LARGE_END (protocol/native.py), optionally zlib-compressed
on the way (`compress_large_messages`, as Artemis does it: on the client). Receiving: the chunks
of a delivery go to a spooled temporary file (in memory up to the threshold, on disk beyond),
which the application reads as a stream, saves to a path, or reads whole as `body`.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from typing import IO, Any, Protocol

from ..errors import InvalidArgument, ProtocolError
from ..protocol.large import ChunkCounter

SPOOL_IN_MEMORY = 1 << 20  # a received body up to this stays in memory; beyond, a temporary file
INFLATE_STEP = 1 << 20  # most bytes one decompression call may produce


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


Source = bytes | bytearray | memoryview | Readable


def body_size(source: Source) -> int:
    """The body's size when known without reading it (-1 otherwise)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source)
    fileno = getattr(source, "fileno", None)
    tell = getattr(source, "tell", None)
    if fileno is not None and tell is not None:
        try:
            return int(os.fstat(fileno()).st_size - tell())
        except (OSError, ValueError, io.UnsupportedOperation):
            return -1
    return -1


class Rewind:
    """How to read a source again from where the send began (a failover makes the client resend)."""

    __slots__ = ("position", "source")

    def __init__(self, source: Source) -> None:
        self.source = source
        self.position: int | None = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.position = 0
            return
        seekable = getattr(source, "seekable", None)
        try:
            if seekable is not None and seekable():
                self.position = source.tell()  # type: ignore[attr-defined]
        except (OSError, ValueError):
            self.position = None

    @property
    def possible(self) -> bool:
        return self.position is not None

    def rewind(self) -> None:
        if self.position is not None and not isinstance(self.source, (bytes, bytearray, memoryview)):
            self.source.seek(self.position)  # type: ignore[attr-defined]


def pieces(source: Source, step: int, compress: bool) -> Iterator[bytes]:
    """The body in chunks of at most `step` bytes (zlib-compressed when `compress`)."""
    comp = zlib.compressobj() if compress else None
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source)
        raw: Iterator[bytes] = (bytes(view[i : i + step]) for i in range(0, len(view), step))
    else:
        raw = _read_all(source, step)
    if comp is None:
        yield from raw
        return
    pending = bytearray()
    for data in raw:
        pending += comp.compress(data)
        while len(pending) >= step:
            yield bytes(pending[:step])
            del pending[:step]
    pending += comp.flush()
    while pending:
        yield bytes(pending[:step])
        del pending[:step]


def _read_all(source: Readable, step: int) -> Iterator[bytes]:
    while True:
        data = source.read(step)
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidArgument(f"a large message's source must read bytes, got {type(data).__name__}")
        if not data:
            return
        yield bytes(data)


class LargeBody:
    """A received large body: chunks land in a spooled temporary file as they arrive."""

    def __init__(self, size: int, compressed: bool) -> None:
        self.file: Any = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
        self.counter = ChunkCounter(size)
        self._inflate = zlib.decompressobj() if compressed else None
        self.size = 0  # bytes of the body (after decompression)
        self.complete = False

    def add(self, index: int, data: bytes, last: bool) -> None:
        self.counter.chunk(index, len(data))
        inflate = self._inflate
        if inflate is None:
            self.file.write(data)
            self.size += len(data)
        else:
            # In bounded pieces: a chunk of a body that compresses well inflates a thousandfold.
            while True:
                out = inflate.decompress(data, INFLATE_STEP)
                self.file.write(out)
                self.size += len(out)
                data = inflate.unconsumed_tail
                if not data and len(out) < INFLATE_STEP:
                    break
            if last:
                out = inflate.flush()  # nothing is left by now; flush to be sure
                self.file.write(out)
                self.size += len(out)
        if last:
            self.counter.end(self.counter.chunks, self.counter.received)
            if not self.counter.complete:
                raise ProtocolError("large message ended short of its announced size")
            self.complete = True
            self.file.seek(0)

    def stream(self) -> IO[bytes]:
        """The body as a file object, from its start."""
        self.file.seek(0)
        return self.file  # type: ignore[no-any-return]

    def read(self) -> bytes:
        self.file.seek(0)
        return self.file.read()  # type: ignore[no-any-return]

    def save(self, path: str | os.PathLike[str]) -> int:
        self.file.seek(0)
        with open(path, "wb") as out:
            shutil.copyfileobj(self.file, out, 1 << 20)
        return self.size

    def close(self) -> None:
        self.file.close()

    def __del__(self) -> None:  # the message is gone: so is its spool (a temporary file is removed)
        self.file.close()
