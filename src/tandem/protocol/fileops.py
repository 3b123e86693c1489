"""File operations on a store directory: what a replication stream carries (pure data, no I/O).

A replicating primary describes every change its store's writers make to their directories
as a list of these, and its backup applies them to its own data directory (journal/storeio.py does both),
so the backup's files are byte for byte the primary's. Nothing here knows what a journal is:
any further kind of store file (paging, large messages) travels the same way.

    CREATE  name, size, key     a new file: zeros, with a journal header for `key` (-1: none)
    WRITE   name, offset, data  bytes written into an existing file
    COPY    name, offset, data  the same, creating the file if it is missing (initial sync)
    RENAME  name → to           a rename within the directory
    UNLINK  name                a removal (of a file that may be gone already)
    PUT     name, data          a small whole file (a compaction's marker), written aside and renamed
"""

from __future__ import annotations

import re
from typing import NamedTuple

CREATE = 1
WRITE = 2
COPY = 3
RENAME = 4
UNLINK = 5
PUT = 6
OPS = frozenset((CREATE, WRITE, COPY, RENAME, UNLINK, PUT))

# The directories of a data directory a stream may name (DESIGN.md §4).
KINDS = ("bindings", "journal", "paging", "large-messages")
MAX_CREATE = 1 << 34  # a file larger than 16 GiB is not a journal file: refuse the operation

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")


class FileOp(NamedTuple):
    op: int
    name: str
    offset: int = 0  # WRITE/COPY: where; CREATE: the file's size
    data: bytes = b""
    to: str = ""  # RENAME: the new name
    key: int = -1  # CREATE: the journal header's file key (-1: a file without one)


def problem(kind: str, op: FileOp) -> str | None:
    """Why `op` must not be applied to directory `kind` (None: it may). Names are plain file
    names inside the directory: a stream can never reach outside its data directory."""
    if kind not in KINDS:
        return f"unknown store directory {kind!r}"
    if op.op not in OPS:
        return f"unknown file operation {op.op}"
    if not _SAFE_NAME.match(op.name):
        return f"unsafe file name {op.name!r}"
    if op.op == RENAME and not _SAFE_NAME.match(op.to):
        return f"unsafe file name {op.to!r}"
    if op.offset < 0 or op.key < -1:
        return f"negative offset or key in {op.name!r}"
    if op.op == CREATE and op.offset > MAX_CREATE:
        return f"file {op.name!r} of {op.offset} bytes is too large"
    if op.offset + len(op.data) > MAX_CREATE:
        return f"write past {MAX_CREATE} bytes into {op.name!r}"
    return None
