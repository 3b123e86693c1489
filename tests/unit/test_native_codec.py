"""The native wire codec (sans-IO): packet round trips, framing, and what malformed input may raise."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bad_utf8 import BadStr, invalid_utf8, pack, replaced, string_paths
from tandem.errors import (
    ErrorCode,
    FrameTooLarge,
    ProtocolError,
    TandemError,
    UnknownPacket,
    VersionMismatch,
    error_for,
)
from tandem.protocol import native as n
from tandem.protocol.large import ChunkCounter
from tandem.protocol.native import MAGIC, ClientPacket, FrameReader, ServerPacket, encode, encode_many

MAX = 64 * 1024
RAW = msgspec.Raw(msgspec.msgpack.encode({"body": b"\x00\x01payload", "headers": {"k": [1, 2.5, None]}}))

SAMPLES: list[n.Packet] = [
    n.Hello(1, "client-1", "alice", "secret", "my app"),
    n.Hello(1),
    n.Hello(1, None, None, None, "app", 5000, 1 << 20, "c0ffee"),
    n.Reattach("c0ffee", [n.ReattachChannel(0, -1), n.ReattachChannel(1, 7, [(1, 12, 4096), (2, 0, 0)])]),
    n.Reattach("c0ffee"),
    n.Reattached(True, {0: 3, 1: 2**40}),
    n.Reattached(False, {}, "no such connection"),
    n.Received(1, 2**40),
    n.HelloOk(1, "broker", "node-1", 60_000, [{"host": "h", "port": 1}]),
    n.Ping(),
    n.Pong(),
    n.Error(int(ErrorCode.PROTOCOL), "bad things"),
    n.Disconnect(),
    n.Topology([["node-1", "127.0.0.1", 61616], ["node-2", "::1", 61617]]),
    n.Activated([{"node_id": "n", "live": "127.0.0.1:1", "backup": None}]),
    n.CreateSession(1, 1, True, "s1"),
    n.CreateSession(2, 1),
    n.CloseSession(1, 9),
    n.Send(1, 2, RAW),
    n.CreateConsumer(1, 3, 7, "orders", "price > 10", 1024, True),
    n.CreateConsumer(1, 4, 8, "q"),
    n.CloseConsumer(1, 5, 7),
    n.Flow(1, 7, 100),
    n.Ack(1, 6, 7, 2**40, False),
    n.Nack(1, 10, 7, 2**40),
    n.Commit(1, 11, "tx-1"),
    n.Commit(1, 12),
    n.Rollback(1, 13),
    n.RequestCredits(1, 14, "orders", 65536),
    n.ReadRange(1, 15, "log", 10, 20, 5),
    n.AckUpTo(1, 16, "log", 20),
    n.RangeResult(1, 15, 11, 30, [(11, 5, 0, RAW), (12, 6, 1, RAW)]),
    n.RangeResult(1, 16, 11, 30, [(11, 5, 0, RAW), (12, 6, 1, RAW)], [(1, 3 << 30, True)], True),
    n.Manage(0, 7, "create_queue", {"name": "q", "durable": True, "nested": {"x": [1, "2", b"3"]}}),
    n.Confirm(1, 2**63 - 1),
    n.Response(1, 7, {"queues": ["a", "b"], "count": 3}),
    n.Response(1, 8),
    n.Exception_(1, 8, int(ErrorCode.QUEUE_DOES_NOT_EXIST), "no such queue"),
    n.Deliver(1, 7, 42, 2, 17, RAW),
    n.ConsumerClosed(1, 7, int(ErrorCode.SHUTTING_DOWN), "bye"),
    n.LargeBegin(1, RAW, 1 << 31, True),
    n.LargeBegin(1, RAW),
    n.LargeChunk(1, 0, b"\x00" * 100),
    n.LargeEnd(1, 17, 3, 300),
    n.LargeAbort(1),
    n.DeliverLarge(1, 7, 42, 1, 17, RAW, 1 << 33, False),
    n.DeliverChunk(1, 7, 42, 5, b"chunk", True),
    n.DeliverChunk(1, 7, 42, 0, b""),
    n.DeliverChunk(1, -16, 42, 0, b"range body", True),
    n.ReplicaStart("tandem.cluster", "pw", "127.0.0.1:61617", "pair-1"),
    n.ReplicaStart("u", "p", "h:1"),
    n.ReplicaStart("u", "p", "h:1", None, 1),
    n.ReplicaAck(2**40),
    n.ReplicaSynced(7),
    n.ReplicaFailback(),
    n.ReplicaAccept("node-1", False),
    n.ReplicaSyncStart(3, 10 << 20),
    n.ReplicaOps(5, "journal", 123, msgspec.Raw(msgspec.msgpack.encode([[2, "tandem-data-1.tj", 32, b"rec"]]))),
    n.ReplicaSyncDone(9),
    n.ReplicaStop(True, "primary stopping"),
]
CLIENT_CLASSES = set(ClientPacket.__args__)
SERVER_CLASSES = set(ServerPacket.__args__)
CLIENT_SAMPLES = [p for p in SAMPLES if type(p) in CLIENT_CLASSES]
SERVER_SAMPLES = [p for p in SAMPLES if type(p) in SERVER_CLASSES]


def client_reader(max_frame_size: int = MAX) -> FrameReader:
    return FrameReader(ClientPacket, max_frame_size, expect_magic=True)


def server_reader(max_frame_size: int = MAX) -> FrameReader:
    return FrameReader(ServerPacket, max_frame_size, expect_magic=False)


def frame(payload: bytes) -> bytes:
    return n.LENGTH.pack(len(payload)) + payload


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given positions (clamped, sorted, duplicates allowed: empty chunks too)."""
    points = sorted(min(max(c, 0), len(data)) for c in cuts)
    out: list[bytes] = []
    prev = 0
    for p in points:
        out.append(data[prev:p])
        prev = p
    out.append(data[prev:])
    return out


# ------------------------------------------------------------- reattachment
def test_hello_of_an_older_client_reads_with_the_window_off() -> None:
    """A HELLO without the reattachment fields (an older client) decodes with the window off."""
    old = msgspec.msgpack.encode([1, 1, "c", None, None, "app", 5000])
    (hello,) = client_reader().feed(MAGIC + frame(old))
    assert hello.confirmation_window == -1 and hello.connection_id == ""


@pytest.mark.parametrize(
    "fields",
    [
        ["id", [[1, 2, [[1, 2]]]]],  # a consumer entry short of a field
        ["id", [[1, "x"]]],  # a string where a command id goes
        ["id", [["ch"]]],
        [None],
        ["id", {"1": 2}],
    ],
    ids=["short-consumer", "str-cmd", "str-channel", "null-id", "map-channels"],
)
def test_malformed_reattach_is_a_protocol_error(fields: list[Any]) -> None:
    payload = msgspec.msgpack.encode([24, *fields])
    with pytest.raises(ProtocolError, match="malformed packet type 24"):
        client_reader().feed(MAGIC + frame(payload))


@given(
    st.text(max_size=40),
    st.lists(
        st.tuples(
            st.integers(0, 2**31),
            st.integers(-1, 2**62),
            st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 2**62), st.integers(0, 2**62)), max_size=4),
        ),
        max_size=6,
    ),
)
@settings(max_examples=150, deadline=None)
def test_any_reattach_round_trips(conn_id: str, chans: list[Any]) -> None:
    pkt = n.Reattach(conn_id, [n.ReattachChannel(c, a, list(cs)) for c, a, cs in chans])
    (back,) = client_reader().feed(MAGIC + encode(pkt))
    assert back == pkt


# ---------------------------------------------------------------- round trips
def test_samples_cover_every_packet_class() -> None:
    """Every packet class of both unions has a sample (a new packet type must be added here)."""
    assert {type(p) for p in SAMPLES} == CLIENT_CLASSES | SERVER_CLASSES


@pytest.mark.parametrize("packet", SAMPLES, ids=lambda p: type(p).__name__)
def test_every_packet_round_trips(packet: n.Packet) -> None:
    """encode → FrameReader.feed gives an equal packet, for each side that may receive it."""
    data = encode(packet)
    assert n.LENGTH.unpack_from(data)[0] == len(data) - 4
    decoded: list[Any] = []
    if type(packet) in CLIENT_CLASSES:
        r = client_reader()
        decoded += r.feed(MAGIC + data)
        assert r.buffered == 0
    if type(packet) in SERVER_CLASSES:
        r = server_reader()
        decoded += r.feed(data)
        assert r.buffered == 0
    assert decoded and all(d == packet and type(d) is type(packet) for d in decoded)


@pytest.mark.parametrize(
    ("make", "samples"),
    [(client_reader, CLIENT_SAMPLES), (server_reader, SERVER_SAMPLES)],
    ids=["client", "server"],
)
def test_stream_byte_at_a_time_and_all_at_once(make: Any, samples: list[n.Packet]) -> None:
    """A stream of many packets decodes identically fed whole or one byte at a time."""
    stream = encode_many(samples * 5)
    if make is client_reader:
        stream = MAGIC + stream
    assert make().feed(stream) == samples * 5
    r = make()
    got: list[Any] = []
    for i in range(len(stream)):
        got += r.feed(stream[i : i + 1])
    assert got == samples * 5
    assert r.buffered == 0


@given(cuts=st.lists(st.integers(0, 2000), max_size=30))
@settings(max_examples=150, deadline=None)
def test_any_chunking_decodes_the_same(cuts: list[int]) -> None:
    """Arbitrary chunk boundaries (through magic, length prefixes and payloads) never change the result."""
    stream = MAGIC + encode_many(CLIENT_SAMPLES)
    r = client_reader()
    got: list[Any] = []
    for chunk in split(stream, cuts):
        got += r.feed(chunk)
    assert got == CLIENT_SAMPLES


def test_send_data_encodes_like_send() -> None:
    """The client-side SendData twin is received as a Send whose raw message is the encoded struct."""
    msg = {"body": b"hello", "priority": 4}
    (got,) = client_reader().feed(MAGIC + encode(n.SendData(3, 11, msg)))
    assert isinstance(got, n.Send)
    assert (got.channel, got.cmd) == (3, 11)
    assert msgspec.msgpack.decode(got.message) == msg


def test_check_version() -> None:
    """A Hello with another protocol version is refused with VersionMismatch."""
    n.check_version(n.Hello(n.PROTOCOL_VERSION))
    with pytest.raises(VersionMismatch):
        n.check_version(n.Hello(n.PROTOCOL_VERSION + 1))


# ---------------------------------------------------------------------- fuzz
def _feed_all(reader: FrameReader, chunks: list[bytes]) -> list[Any]:
    """Feed until the end or the first ProtocolError (a real connection would be closed then)."""
    out: list[Any] = []
    for chunk in chunks:
        try:
            out += reader.feed(chunk)
        except ProtocolError:
            break
    return out


@given(
    data=st.binary(max_size=400),
    with_magic=st.booleans(),
    cuts=st.lists(st.integers(0, 410), max_size=12),
    max_frame=st.sampled_from([16, 300, MAX]),
)
@settings(max_examples=400, deadline=None)
def test_arbitrary_bytes_raise_only_protocol_errors(
    data: bytes, with_magic: bool, cuts: list[int], max_frame: int
) -> None:
    """Random bytes, with or without the magic, in random chunks: packets or ProtocolError, nothing else."""
    stream = MAGIC + data if with_magic else data
    packets = _feed_all(client_reader(max_frame), split(stream, cuts))
    assert all(type(p) in CLIENT_CLASSES for p in packets)
    packets = _feed_all(server_reader(max_frame), split(data, cuts))
    assert all(type(p) in SERVER_CLASSES for p in packets)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | invalid_utf8().map(BadStr)  # text that is not UTF-8 (packed as a str)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(
            st.text(max_size=8) | st.integers(-(2**63), 2**64 - 1) | invalid_utf8().map(BadStr),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)
_tags = st.sampled_from(sorted(n.CLIENT_TAGS | n.SERVER_TAGS | {0, 8, 99})) | st.integers(-(2**63), 2**64 - 1)


@given(tag=_tags, fields=st.lists(_values, max_size=8), bare=st.booleans())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_structured_payloads_decode_or_raise_protocol_error(tag: int, fields: list[Any], bare: bool) -> None:
    """Valid frames around msgpack payloads (tag + random fields): a packet that re-encodes equal, or ProtocolError."""
    array = fields if bare else [tag, *fields]
    payload = pack(array)
    for reader, classes, prefix in (
        (client_reader(), CLIENT_CLASSES, MAGIC),
        (server_reader(), SERVER_CLASSES, b""),
    ):
        try:
            packets = reader.feed(prefix + frame(payload))
        except UnknownPacket:
            assert array and isinstance(array[0], int) and array[0] not in {c.__struct_config__.tag for c in classes}
            continue
        except ProtocolError:
            continue
        assert len(packets) == 1 and type(packets[0]) in classes
        (again,) = FrameReader(type(packets[0]), MAX, expect_magic=False).feed(encode(packets[0]))
        assert again == packets[0]


# -------------------------------------------------------------- malformed
def test_bad_magic_is_a_protocol_error() -> None:
    """A client that does not start with TNDM is refused, even before 4 bytes have arrived."""
    with pytest.raises(ProtocolError):
        client_reader().feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(ProtocolError):
        client_reader().feed(b"TX")
    r = client_reader()
    assert r.feed(b"TN") == []  # a correct prefix just waits for more
    with pytest.raises(ProtocolError):
        r.feed(b"DX")


def test_frame_too_large_is_raised_as_soon_as_the_length_is_seen() -> None:
    """A length over max-frame-size raises FrameTooLarge right after the 4 length bytes, before any body."""
    r = server_reader(1000)
    assert r.feed(n.LENGTH.pack(1000)) == []  # exactly the limit is fine
    r = server_reader(1000)
    length = n.LENGTH.pack(1001)
    assert r.feed(length[:3]) == []
    with pytest.raises(FrameTooLarge) as info:
        r.feed(length[3:])
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    with pytest.raises(FrameTooLarge):
        client_reader(1000).feed(MAGIC + encode(n.Ping()) + n.LENGTH.pack(2**32 - 1))


def test_first_frame_limit_applies_to_the_first_frame_only() -> None:
    """A server holds a client's first frame (its HELLO) to a small limit, whatever follows in the same read."""
    r = FrameReader(ClientPacket, 1 << 20, expect_magic=True, first_frame_limit=1024)
    with pytest.raises(FrameTooLarge, match="1024, the limit before the handshake"):
        r.feed(MAGIC + n.LENGTH.pack(1025))
    r = FrameReader(ClientPacket, 1 << 20, expect_magic=True, first_frame_limit=1024)
    big = encode(n.Manage(0, 1, "x", {"pad": "y" * 5000}))
    assert [type(x) for x in r.feed(MAGIC + encode(n.Hello(1)) + big)] == [n.Hello, n.Manage]
    r = FrameReader(ClientPacket, 1 << 20, expect_magic=True, first_frame_limit=1024)
    assert r.feed(MAGIC + encode(n.Hello(1))[:3]) == []
    assert r.feed(encode(n.Hello(1))[3:] + big[:10]) != []
    assert type(r.feed(big[10:])[0]) is n.Manage


def test_zero_length_frame_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError) as info:
        server_reader().feed(n.LENGTH.pack(0))
    assert type(info.value) is ProtocolError


def test_unknown_packet_tag_is_unknown_packet() -> None:
    """A well-formed array with an unknown tag (or a tag of the other direction) is UnknownPacket."""
    with pytest.raises(UnknownPacket) as info:
        server_reader().feed(frame(msgspec.msgpack.encode([99, 1, 2])))
    assert info.value.code == ErrorCode.UNKNOWN_PACKET
    with pytest.raises(UnknownPacket):
        client_reader().feed(MAGIC + encode(n.Confirm(1, 2)))  # server → client packet sent by a client
    with pytest.raises(UnknownPacket):
        server_reader().feed(encode(n.Hello(1)))  # client → server packet sent by a server


@pytest.mark.parametrize(
    "fields",
    [[1, "one"], [12, 1, 2], [13, 1, 2, 3, 4], [16, "a", 1, 1, 1], [30], [11, 1], [15, 1, 2, None]],
    ids=[
        "hello-version-str",
        "send-no-message",
        "consumer-queue-int",
        "ack-channel-str",
        "empty",
        "short",
        "credits-nil",
    ],
)
def test_known_tag_with_wrong_fields_is_protocol_error_not_unknown(fields: list[Any]) -> None:
    """A known tag with wrong field types or counts is a plain ProtocolError, never UnknownPacket."""
    reader = client_reader() if fields[0] in n.CLIENT_TAGS else server_reader()
    prefix = MAGIC if fields[0] in n.CLIENT_TAGS else b""
    with pytest.raises(ProtocolError) as info:
        reader.feed(prefix + frame(msgspec.msgpack.encode(fields)))
    assert not isinstance(info.value, UnknownPacket)
    assert info.value.code == ErrorCode.PROTOCOL


@pytest.mark.parametrize(
    "payload",
    [b"\x93\x03", b"\x93\x1e\x01", b"\xa5abc", b"\xc1", b"\x91\x03\x00", b"\x81\xa1t\x03", b"\xc0"],
    ids=["truncated-array", "truncated-confirm", "truncated-str", "never-used-byte", "trailing", "map", "nil"],
)
def test_malformed_msgpack_is_protocol_error(payload: bytes) -> None:
    """Truncated or non-array msgpack inside a complete frame is a ProtocolError."""
    with pytest.raises(ProtocolError) as info:
        server_reader().feed(frame(payload))
    assert not isinstance(info.value, UnknownPacket)


@pytest.mark.parametrize("where", ["top-level", "inside-any-field"])
def test_deeply_nested_msgpack_is_a_protocol_error(where: str) -> None:
    """A few KiB of nested arrays must not escape FrameReader as RecursionError (any client can send it)."""
    nested = b"\x91" * 5000 + b"\x00"
    if where == "top-level":
        payload = nested
    else:  # Manage(channel=0, cmd=1, op="x", args={"a": [[[...]]]})
        payload = b"\x95\x14\x00\x01\xa1x\x81\xa1a" + nested
    assert len(payload) < MAX
    reader = client_reader()
    with pytest.raises(ProtocolError):
        reader.feed(MAGIC + frame(payload))


def test_reader_keeps_partial_frames_buffered() -> None:
    """Packets complete in a feed are returned; the incomplete rest stays buffered for the next feed."""
    a, b = encode(n.Confirm(1, 1)), encode(n.Confirm(1, 2))
    r = server_reader()
    assert r.feed(a + b[:5]) == [n.Confirm(1, 1)]
    assert r.buffered == 5
    assert r.feed(b[5:]) == [n.Confirm(1, 2)]
    assert r.buffered == 0


# ---------------------------------------------------------------- error codes
@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_error_for_round_trips_every_code(code: ErrorCode) -> None:
    """error_for(code, msg) rebuilds an exception carrying that code and message (and survives the wire)."""
    exc = error_for(int(code), "details")
    assert isinstance(exc, TandemError)
    assert exc.code == code
    assert exc.message == "details"
    assert code.name in str(exc)
    (pkt,) = server_reader().feed(encode(n.error_packet(code, "details")))
    again = error_for(pkt.code, pkt.message)
    assert type(again) is type(exc) and again.code == code


def test_error_for_picks_the_specific_class() -> None:
    """Codes map to their own classes (so `except FrameTooLarge` works client-side); unknown codes stay generic."""
    assert type(error_for(ErrorCode.FRAME_TOO_LARGE, "x")) is FrameTooLarge
    assert type(error_for(ErrorCode.UNKNOWN_PACKET, "x")) is UnknownPacket
    assert isinstance(error_for(ErrorCode.PROTOCOL, "x"), ProtocolError)
    unknown = error_for(9999, "what")
    assert type(unknown) is TandemError and "9999" in unknown.message


# ------------------------------------------------------------- invalid UTF-8
def _raw_fields(packet: Any) -> list[bytes]:
    """The still-encoded parts of a packet (a SEND's or DELIVER's message, a RANGE_RESULT's messages)."""
    out = [bytes(v) for v in msgspec.structs.astuple(packet) if isinstance(v, msgspec.Raw)]
    if isinstance(packet, n.RangeResult):
        out += [bytes(m[3]) for m in packet.messages]
    return out


SAMPLES_WITH_TEXT = [p for p in SAMPLES if string_paths(msgspec.msgpack.decode(encode(p)[4:]))]


@pytest.mark.parametrize("length", ["little-endian", "as-in-the-issue"])
def test_hello_whose_user_name_is_not_utf8_is_a_protocol_error(length: str) -> None:
    """The reproducer of issue 13 (a HELLO whose user name is the byte 0xff): a ProtocolError that
    names the problem, not a UnicodeDecodeError (the issue wrote the length big-endian; the wire's
    is little-endian, and 0x06000000 is simply a frame too large for this reader)."""
    payload = bytes.fromhex("9401 01c0 a1ff")
    if length == "little-endian":
        with pytest.raises(ProtocolError) as info:
            client_reader().feed(MAGIC + n.LENGTH.pack(6) + payload)
        assert info.value.code == ErrorCode.PROTOCOL
        assert "UTF-8" in info.value.message and "type 1" in info.value.message
    else:
        with pytest.raises(FrameTooLarge):
            client_reader().feed(MAGIC + (6).to_bytes(4, "big") + payload)


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (pack([99, BadStr(b"\xff")]), UnknownPacket),  # an unknown tag stays UNKNOWN_PACKET
        (pack([BadStr(b"\xff"), 1]), ProtocolError),  # a tag that is bad text
        (pack(BadStr(b"\xff")), ProtocolError),  # not even an array
        (pack([20, 0, 1, "queue.create", {BadStr(b"\xc0\x80"): 1}]), ProtocolError),  # a MANAGE argument's name
        (pack([20, 0, 1, "x", {"a": [[{"b": BadStr(b"\xed\xa0\x80")}]]}]), ProtocolError),  # deep in an argument
    ],
    ids=["unknown-tag", "tag", "bare-string", "manage-arg-name", "nested-arg"],
)
def test_invalid_utf8_anywhere_is_a_protocol_error(payload: bytes, error: type[ProtocolError]) -> None:
    with pytest.raises(ProtocolError) as info:
        client_reader().feed(MAGIC + frame(payload))
    assert type(info.value) is error


@given(sample=st.sampled_from(SAMPLES_WITH_TEXT), where=st.data(), bad=invalid_utf8())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_invalid_utf8_in_every_string_of_every_packet(sample: n.Packet, where: st.DataObject, bad: bytes) -> None:
    """Any string of any packet (fields, map keys, nested values, and the strings inside a SEND's
    or DELIVER's still-encoded message) made invalid UTF-8: the reader raises ProtocolError, or,
    when the string lies in a part it leaves encoded (msgspec.Raw), hands that part on as it came."""
    generic = msgspec.msgpack.decode(encode(sample)[4:])
    path = where.draw(st.sampled_from(string_paths(generic)))
    data = frame(pack(replaced(generic, path, bad)))
    for reader, classes, prefix in (
        (client_reader(), CLIENT_CLASSES, MAGIC),
        (server_reader(), SERVER_CLASSES, b""),
    ):
        if type(sample) not in classes:
            continue
        try:
            packets = reader.feed(prefix + data)
        except ProtocolError as exc:
            assert exc.code == ErrorCode.PROTOCOL and "UTF-8" in exc.message
            continue
        (got,) = packets
        assert type(got) is type(sample)
        assert any(bad in raw for raw in _raw_fields(got)), f"{path} of {sample!r} accepted"


# ----------------------------------------------------------- large messages
@given(
    body=st.binary(max_size=4000),
    chunk=st.integers(min_value=1, max_value=700),
    cuts=st.lists(st.integers(min_value=0, max_value=6000), max_size=12),
    announce=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_large_body_in_chunks_reassembles_through_any_cutting(
    body: bytes, chunk: int, cuts: list[int], announce: bool
) -> None:
    """BEGIN + numbered CHUNKs + END, cut anywhere on the wire: the reader gives them back in order,
    the counter accepts them, and the chunks' data joined is the body."""
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    packets: list[n.Packet] = [n.LargeBegin(3, RAW, len(body) if announce else -1)]
    packets += [n.LargeChunk(3, i, piece) for i, piece in enumerate(pieces)]
    packets.append(n.LargeEnd(3, 9, len(pieces), len(body)))
    got = _feed_all(client_reader(), split(MAGIC + encode_many(packets), cuts))
    assert got == packets
    counter = ChunkCounter(got[0].size)
    joined = bytearray()
    for c in got[1:-1]:
        counter.chunk(c.index, len(c.data))
        joined += c.data
    counter.end(got[-1].chunks, got[-1].size)
    assert bytes(joined) == body


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=8),
    skip=st.integers(min_value=0, max_value=7),
    how=st.sampled_from(["gap", "repeat", "short-end", "long-end", "over-announced"]),
)
@settings(max_examples=200, deadline=None)
def test_large_chunk_counter_refuses_every_broken_sequence(sizes: list[int], skip: int, how: str) -> None:
    """A gap, a repeated chunk, an end that does not match, or more bytes than announced: ProtocolError."""
    total = sum(sizes)
    k = skip % len(sizes)
    counter = ChunkCounter(total if how != "over-announced" else max(total - 1, 0))
    with pytest.raises(ProtocolError):
        for i, size in enumerate(sizes):
            if how == "gap" and i == k:
                counter.chunk(i + 1, size)
            counter.chunk(i, size)
            if how == "repeat" and i == k:
                counter.chunk(i, size)
        if how == "over-announced" and total == 0:
            counter.chunk(len(sizes), 1)
        end = {"short-end": (len(sizes) - 1, total), "long-end": (len(sizes), total + 1)}.get(how, (len(sizes), total))
        counter.end(*end)


def test_large_chunk_counter_accepts_an_empty_body() -> None:
    counter = ChunkCounter(0)
    counter.end(0, 0)
    assert counter.complete
