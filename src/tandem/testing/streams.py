"""Bodies for large-message tests and benchmarks: made as they are read, never held whole."""

from __future__ import annotations

import hashlib
import io
from typing import Any


class GeneratedBody(io.RawIOBase):
    """`n` bytes made as they are read (a counter in each 4 KiB block: no two blocks alike, so a
    chunk out of place shows), hashed on the way (`digest`)."""

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
        block = bytearray(k)
        for off in range(0, k, 4096):
            block[off : off + 8] = (self.pos + off).to_bytes(8, "little")
        b[:k] = block
        self.digest.update(block)
        self.pos += k
        return k
