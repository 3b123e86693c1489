"""Large-message chunk bookkeeping (sans-IO), shared by both ends of a native connection.

A large body travels as numbered chunks closed by an end packet giving their count and total
size. The receiver checks each chunk against what it expects before it writes a byte, so a
gap, a repeat or a short body is a protocol error, never a truncated message.
"""

from __future__ import annotations

from ..errors import ProtocolError


class ChunkCounter:
    """Expects chunks 0, 1, 2... of a body of `size` bytes (-1: announced only at the end)."""

    __slots__ = ("chunks", "received", "size")

    def __init__(self, size: int = -1) -> None:
        if size < -1:
            raise ProtocolError(f"a large message's size must be -1 (unknown) or >= 0, got {size}")
        self.size = size
        self.chunks = 0
        self.received = 0

    def chunk(self, index: int, length: int) -> None:
        """Account for chunk `index` of `length` bytes (raises before anything is written)."""
        if index != self.chunks:
            raise ProtocolError(f"large message chunk {index} out of order: expected chunk {self.chunks}")
        received = self.received + length
        if 0 <= self.size < received:
            raise ProtocolError(f"large message chunks exceed the announced size of {self.size} bytes")
        self.chunks += 1
        self.received = received

    def end(self, chunks: int, size: int) -> None:
        """The sender says it sent `chunks` chunks of `size` bytes: raise unless that is what arrived."""
        if chunks != self.chunks or size != self.received or (self.size >= 0 and size != self.size):
            raise ProtocolError(
                f"large message incomplete: end says {chunks} chunks of {size} bytes in all, "
                f"received {self.chunks} chunks of {self.received} bytes"
                + (f" (announced {self.size})" if self.size >= 0 else "")
            )

    @property
    def complete(self) -> bool:
        return self.size >= 0 and self.received == self.size
