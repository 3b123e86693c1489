"""A received large body (client/large.py): what the client holds while a compressed body lands."""

from __future__ import annotations

import hashlib
import tracemalloc
import zlib

from tandem.client.large import LargeBody, pieces


def test_a_body_that_compresses_well_is_inflated_in_bounded_pieces() -> None:
    """64 MiB of zeros deflate to ~64 KiB: one chunk inflated whole held 64 MiB in the client
    at once (client RSS grew with the message, 146 MiB for a 60 MiB body)."""
    size = 64 << 20
    parts = list(pieces(_zeros(size), 256 << 10, compress=True))
    body = LargeBody(sum(len(p) for p in parts), compressed=True)
    tracemalloc.start()
    try:
        for i, part in enumerate(parts):
            body.add(i, part, i == len(parts) - 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert body.size == size
    digest = hashlib.sha256()
    with body.stream() as f:
        while data := f.read(1 << 20):
            digest.update(data)
    assert digest.hexdigest() == hashlib.sha256(bytes(size)).hexdigest()
    body.close()
    assert peak < 8 << 20, f"{peak / 2**20:.1f} MiB held while inflating a {size >> 20} MiB body"


class _zeros:
    def __init__(self, n: int) -> None:
        self.left = n

    def read(self, k: int) -> bytes:
        k = min(k, self.left)
        self.left -= k
        return bytes(k)


def test_inflated_bodies_match_what_was_sent() -> None:
    data = bytes(range(256)) * 4000 + b"tail"
    parts = list(pieces(_Bytes(data), 1000, compress=True))
    body = LargeBody(sum(len(p) for p in parts), compressed=True)
    for i, part in enumerate(parts):
        body.add(i, part, i == len(parts) - 1)
    assert body.read() == data
    assert zlib.decompress(b"".join(parts)) == data


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def read(self, k: int) -> bytes:
        out = self.data[self.at : self.at + k]
        self.at += len(out)
        return out
