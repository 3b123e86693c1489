"""The replication stream's records (sans-IO): file operations encoded, checksummed, checked on the way in."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.errors import ProtocolError
from tandem.protocol import native as n
from tandem.protocol.fileops import COPY, CREATE, KINDS, PUT, RENAME, UNLINK, WRITE, FileOp, problem

MAX = 64 * 1024 * 1024

_names = st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9._-]{0,40}\Z")
_ops = st.one_of(
    st.builds(
        lambda nm, size, key: FileOp(CREATE, nm, size, key=key),
        _names,
        st.integers(0, 1 << 30),
        st.integers(-1, 2**63 - 1),
    ),
    st.builds(lambda nm, off, d: FileOp(WRITE, nm, off, d), _names, st.integers(0, 1 << 30), st.binary(max_size=300)),
    st.builds(lambda nm, off, d: FileOp(COPY, nm, off, d), _names, st.integers(0, 1 << 30), st.binary(max_size=300)),
    st.builds(lambda a, b: FileOp(RENAME, a, to=b), _names, _names),
    st.builds(lambda nm: FileOp(UNLINK, nm), _names),
    st.builds(lambda nm, d: FileOp(PUT, nm, data=d), _names, st.binary(max_size=100)),
)


def _received(frame: bytes) -> n.ReplicaOps:
    (pkt,) = n.FrameReader(n.ServerPacket, MAX, expect_magic=False).feed(bytes(frame))
    assert isinstance(pkt, n.ReplicaOps)
    return pkt


@given(position=st.integers(0, 2**63 - 1), kind=st.sampled_from(KINDS), ops=st.lists(_ops, max_size=12))
@settings(max_examples=200, deadline=None)
def test_ops_round_trip(position: int, kind: str, ops: list[FileOp]) -> None:
    """encode_ops → the frame reader → decode_ops gives the same operations, in order."""
    pkt = _received(n.encode_ops(position, kind, ops))
    assert (pkt.position, pkt.kind) == (position, kind)
    assert n.decode_ops(pkt) == ops


@given(flip=st.integers(0, 10_000), bit=st.integers(0, 7))
@settings(max_examples=100, deadline=None)
def test_a_changed_byte_in_the_operations_fails_the_checksum(flip: int, bit: int) -> None:
    ops = [FileOp(WRITE, "tandem-data-0000000000010000.tj", 4096, b"x" * 200), FileOp(UNLINK, "old.tj")]
    pkt = _received(n.encode_ops(3, "journal", ops))
    raw = bytearray(bytes(pkt.ops))
    raw[flip % len(raw)] ^= 1 << bit
    bad = n.ReplicaOps(pkt.position, pkt.kind, pkt.crc, msgspec.Raw(bytes(raw)))
    with pytest.raises(ProtocolError, match="checksum"):
        n.decode_ops(bad)


@pytest.mark.parametrize(
    ("kind", "op", "why"),
    [
        ("journal", FileOp(WRITE, "../server.lock", 0, b"x"), "unsafe file name"),
        ("journal", FileOp(WRITE, "/etc/passwd", 0, b"x"), "unsafe file name"),
        ("journal", FileOp(RENAME, "a.tj", to="../../a.tj"), "unsafe file name"),
        ("journal", FileOp(UNLINK, ".."), "unsafe file name"),
        ("journal", FileOp(UNLINK, ""), "unsafe file name"),
        ("../etc", FileOp(UNLINK, "a"), "unknown store directory"),
        ("journal", FileOp(99, "a"), "unknown file operation"),
        ("journal", FileOp(WRITE, "a", -1, b"x"), "negative"),
        ("journal", FileOp(CREATE, "a", 1 << 40), "too large"),
    ],
)
def test_operations_that_would_leave_the_store_are_refused(kind: str, op: FileOp, why: str) -> None:
    """Names are plain file names of a known store directory: a stream never reaches outside its data directory."""
    assert why in (problem(kind, op) or "")
    with pytest.raises(ProtocolError, match=why):
        n.decode_ops(_received(n.encode_ops(1, kind, [op])))


@given(
    payload=st.binary(max_size=300)
    | st.lists(
        st.lists(st.integers(-(2**63), 2**64 - 1) | st.text(max_size=5) | st.binary(max_size=5), max_size=7), max_size=4
    ).map(msgspec.msgpack.encode)
)
@settings(max_examples=300, deadline=None)
def test_any_payload_decodes_or_raises_protocol_error(payload: bytes) -> None:
    """Whatever a REPLICA_OPS carries (with a matching checksum): operations that pass the checks, or ProtocolError."""
    import crc32c

    pkt = n.ReplicaOps(1, "journal", crc32c.crc32c(payload), msgspec.Raw(payload))
    try:
        ops = n.decode_ops(pkt)
    except ProtocolError:
        return
    assert all(isinstance(op, FileOp) and problem("journal", op) is None for op in ops)


def test_replication_packets_are_each_on_their_side() -> None:
    """The backup sends START/ACK/SYNCED, the primary the rest: a client cannot send the primary's packets."""
    client: set[Any] = set(n.ClientPacket.__args__)
    server: set[Any] = set(n.ServerPacket.__args__)
    assert {n.ReplicaStart, n.ReplicaAck, n.ReplicaSynced} <= client
    assert {n.ReplicaAccept, n.ReplicaSyncStart, n.ReplicaOps, n.ReplicaSyncDone, n.ReplicaStop} <= server
    assert not {n.ReplicaOps, n.ReplicaAccept} & client
