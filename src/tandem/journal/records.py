"""Journal record codec (sans-IO).

A record on disk::

    u32 length     whole record, header included
    u32 crc32c     over every byte after this field
    u64 file_key   key of the file the record was written into (stale data in a
                   recycled file carries an older key and is ignored)
    u8  kind       ADD / UPDATE / DELETE / BATCH / EOF / DELETES
    u8  user_type  meaning of the body for the layer above (store/)
    u64 id         record id (message id, queue id, ...); 0 for EOF
    ...            body

A DELETES record deletes many ids at once (its body is packed u64 ids): a
cumulative acknowledgement of hundreds of messages is one record, not hundreds.

A BATCH record holds several operations that must apply together (a
transaction): its body is a sequence of ``u8 kind, u8 user_type, u64 id,
u32 body_length, body``. One CRC covers the batch, so it is all or nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from enum import IntEnum
from typing import NamedTuple

import crc32c

HEADER = struct.Struct("<IIQBBQ")
HEADER_SIZE = HEADER.size  # 26
_CRC_FROM = 8  # crc covers bytes [8:]
SUBOP = struct.Struct("<BBQI")
SUBOP_SIZE = SUBOP.size
_LEN_CRC = struct.Struct("<II")


class Kind(IntEnum):
    ADD = 1
    UPDATE = 2
    DELETE = 3
    BATCH = 4
    EOF = 5
    DELETES = 6


ADD = Kind.ADD
UPDATE = Kind.UPDATE
DELETE = Kind.DELETE
BATCH = Kind.BATCH
EOF = Kind.EOF
DELETES = Kind.DELETES

EOF_SIZE = HEADER_SIZE


class Op(NamedTuple):
    """One logical journal operation (a record, or a member of a BATCH)."""

    kind: int
    user_type: int
    id: int
    body: bytes


_TAIL = struct.Struct("<QBBQ")
_crc = crc32c.crc32c


def encode(file_key: int, kind: int, user_type: int, rid: int, body: bytes = b"") -> bytes:
    """Encode one record for `file_key`."""
    tail = _TAIL.pack(file_key, kind, user_type, rid)
    if body:
        return _LEN_CRC.pack(HEADER_SIZE + len(body), _crc(body, _crc(tail))) + tail + body
    return _LEN_CRC.pack(HEADER_SIZE, _crc(tail)) + tail


def encode_batch_body(ops: list[Op]) -> bytes:
    parts: list[bytes] = []
    for op in ops:
        parts.append(SUBOP.pack(op.kind, op.user_type, op.id, len(op.body)))
        if op.body:
            parts.append(op.body)
    return b"".join(parts)


def decode_batch_body(body: bytes) -> list[Op]:
    """Split a BATCH body; raises ValueError if it is malformed."""
    ops: list[Op] = []
    pos = 0
    end = len(body)
    while pos < end:
        if end - pos < SUBOP_SIZE:
            raise ValueError("truncated batch member header")
        kind, utype, rid, blen = SUBOP.unpack_from(body, pos)
        pos += SUBOP_SIZE
        if kind not in (ADD, UPDATE, DELETE) or blen > end - pos:
            raise ValueError("bad batch member")
        ops.append(Op(kind, utype, rid, body[pos : pos + blen]))
        pos += blen
    return ops


def rekey(record: bytes | memoryview, file_key: int) -> bytes:
    """Re-encode a record for another file (compaction copies live records)."""
    _length, _crc, _key, kind, utype, rid = HEADER.unpack_from(record, 0)
    return encode(file_key, kind, utype, rid, bytes(record[HEADER_SIZE:]))


# A parsed record: (offset, length, kind, user_type, id, body). A plain tuple: reload makes millions.
Parsed = tuple[int, int, int, int, int, bytes]


class ScanEnd(NamedTuple):
    """Why a scan stopped: `clean` (zeros or EOF marker) or a reason string."""

    offset: int
    clean: bool
    eof_marker: bool
    reason: str


def scan(buf: bytes, start: int, file_key: int, out: list[Parsed], bodies: bool = True) -> ScanEnd:
    """Parse records of `file_key` from `buf[start:]` into `out` until the first invalid one.

    With `bodies=False` only BATCH and DELETES records (whose bodies hold operations) keep
    theirs; the others get b"" (a reader that needs ids and kinds copies no payloads)."""
    pos = start
    end = len(buf)
    unpack = HEADER.unpack_from
    crc = crc32c.crc32c
    mv = memoryview(buf)
    while True:
        if end - pos < HEADER_SIZE:
            return ScanEnd(pos, True, False, "end of file")
        length, rcrc, key, kind, utype, rid = unpack(buf, pos)
        if length == 0 and rcrc == 0:
            return ScanEnd(pos, True, False, "unused space")
        if length < HEADER_SIZE or length > end - pos:
            return ScanEnd(pos, False, False, f"bad length {length} at offset {pos}")
        if key != file_key:
            return ScanEnd(pos, False, False, f"stale record (file key {key:#x}) at offset {pos}")
        if crc(mv[pos + _CRC_FROM : pos + length]) != rcrc:
            return ScanEnd(pos, False, False, f"CRC mismatch at offset {pos}")
        if kind == EOF:
            return ScanEnd(pos, True, True, "EOF marker")
        if kind not in (ADD, UPDATE, DELETE, BATCH, DELETES):
            return ScanEnd(pos, False, False, f"unknown record kind {kind} at offset {pos}")
        if bodies or kind == BATCH or kind == DELETES:
            out.append((pos, length, kind, utype, rid, buf[pos + HEADER_SIZE : pos + length]))
        else:
            out.append((pos, length, kind, utype, rid, b""))
        pos += length


def pack_ids(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}Q", *ids)


def unpack_ids(body: bytes) -> tuple[int, ...]:
    if len(body) % 8:
        raise ValueError("DELETES body is not a whole number of ids")
    return struct.unpack(f"<{len(body) // 8}Q", body)


def iter_ops(parsed: Parsed) -> Iterator[Op]:
    """The logical operations in one parsed record (a BATCH or DELETES yields its members)."""
    _off, _len, kind, utype, rid, body = parsed
    if kind == BATCH:
        yield from decode_batch_body(body)
    elif kind == DELETES:
        for i in unpack_ids(body):
            yield Op(DELETE, 0, i, b"")
    else:
        yield Op(kind, utype, rid, body)
