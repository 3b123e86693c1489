"""Journal segment files: names, headers, creation and listing (blocking I/O, writer thread or start-up)."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import crc32c

MAGIC = b"TNDJ"
FREE_MAGIC = b"TNDF"  # a pooled file: the header keeps the key it last had, so keys never go backwards
VERSION = 1
FILE_HEADER = struct.Struct("<4sHHQI")
FILE_HEADER_SIZE = 32  # header struct padded to 32 bytes
KEY_SHIFT = 16  # normal files have key n << 16; compaction output sits in between
_ZERO_CHUNK = bytes(1 << 20)


@dataclass(eq=False)
class JFile:
    """In-memory accounting of one data file (loop thread only)."""

    key: int
    path: Path
    size: int
    records: int = 0  # every record counted (BATCH members individually)
    live: int = 0  # records belonging to ids that are still live
    live_bytes: int = 0  # what copying those records would write: a header and its body each
    used: int = FILE_HEADER_SIZE
    sealed: bool = False  # its EOF marker has been read (a follower moves on to the next file)

    def __repr__(self) -> str:
        return f"JFile({self.path.name}, live={self.live}/{self.records}, {self.live_bytes}/{self.used} bytes)"


def data_name(prefix: str, key: int) -> str:
    return f"{prefix}-{key:016x}.tj"


def free_name(prefix: str, n: int) -> str:
    return f"{prefix}-free-{n:08d}.tj"


def header_bytes(key: int, magic: bytes = MAGIC) -> bytes:
    head = FILE_HEADER.pack(magic, VERSION, 0, key, 0)
    crc = crc32c.crc32c(head[:-4])
    head = FILE_HEADER.pack(magic, VERSION, 0, key, crc)
    return head + bytes(FILE_HEADER_SIZE - len(head))


def read_header_key(data: bytes, magic: bytes = MAGIC) -> int | None:
    """The file key from a header, or None if the header is not ours or damaged."""
    if len(data) < FILE_HEADER_SIZE:
        return None
    got, version, _r, key, crc = FILE_HEADER.unpack_from(data, 0)
    if got != magic or version != VERSION:
        return None
    if crc32c.crc32c(data[: FILE_HEADER.size - 4]) != crc:
        return None
    return int(key)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_zeroed(path: Path, size: int, key: int | None) -> None:
    """Create a pre-allocated file filled with zeros (so later syncs touch no metadata)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left > 0:
            n = min(left, len(_ZERO_CHUNK))
            os.write(fd, _ZERO_CHUNK[:n])
            left -= n
        if key is not None:
            os.pwrite(fd, header_bytes(key), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def list_files(directory: Path, prefix: str) -> tuple[list[tuple[int, Path]], list[Path], int]:
    """Data files (key, path) sorted by key, free (pooled) files, and the highest key any file ever had."""
    data: list[tuple[int, Path]] = []
    free: list[Path] = []
    top = 0
    if not directory.exists():
        return data, free, top
    for p in sorted(directory.iterdir()):
        name = p.name
        if not name.startswith(prefix + "-") or not name.endswith(".tj"):
            continue
        try:
            with open(p, "rb") as fh:
                head = fh.read(FILE_HEADER_SIZE)
        except FileNotFoundError:
            continue  # renamed or removed since the listing (a writer recycling, a compaction swap)
        retired = read_header_key(head, FREE_MAGIC)
        if retired is not None:
            top = max(top, retired)
        if name.startswith(prefix + "-free-"):
            free.append(p)
            continue
        key = read_header_key(head)
        if key is None:
            # A file whose header never made it to disk holds nothing confirmed.
            free.append(p)
            continue
        top = max(top, key)
        data.append((key, p))
    data.sort()
    return data, free, top
