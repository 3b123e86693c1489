"""The STOMP codec (sans-IO): frame round trips in 1.0/1.1/1.2, escaping, framing, errors, negotiate()."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.errors import FrameTooLarge, ProtocolError
from tandem.protocol.stomp import (
    BODY_END,
    BODY_PART,
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    VERSIONS,
    Frame,
    StompError,
    StompParser,
    ascii_int,
    encode,
    escape,
    negotiate,
)

MAX = 64 * 1024
RAW_COMMANDS = ("CONNECT", "STOMP", "CONNECTED")  # never escaped
ALL_COMMANDS = sorted(CLIENT_COMMANDS | SERVER_COMMANDS)


def parser(version: str = "1.2", command: str = "SEND", max_frame_size: int = MAX) -> StompParser:
    commands = SERVER_COMMANDS if command in SERVER_COMMANDS else CLIENT_COMMANDS
    return StompParser(max_frame_size, version, commands)


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` split at the given positions (clamped, sorted; empty chunks allowed)."""
    points = sorted(min(c, len(data)) for c in cuts)
    out, last = [], 0
    for p in points:
        out.append(data[last:p])
        last = p
    out.append(data[last:])
    return out


def feed_all(p: StompParser, chunks: list[bytes]) -> list[Frame]:
    """Feed every chunk; after each, feed(b"") until it yields nothing (a parser may hold back the frames
    after a CONNECT until the connection has negotiated its version)."""
    frames: list[Frame] = []
    for chunk in chunks:
        frames.extend(p.feed(chunk))
        for _ in range(100):
            more = p.feed(b"")
            if not more:
                break
            frames.extend(more)
    return frames


# ----------------------------------------------------------------------------- round trips

# Header text that every version can carry, and text needing escapes (1.1/1.2 only).
PLAIN = [("destination", "/queue/orders"), ("x-id", "abc 123 é ü"), ("empty", "")]
SPECIAL = [("colon", "a:b:c"), ("newline", "one\ntwo"), ("back\\slash", "C:\\path\\n"), ("k:ey", "v")]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_every_command_round_trips_in_every_version(command: str, version: str) -> None:
    headers = list(PLAIN)
    if version != "1.0" and command not in RAW_COMMANDS:
        headers += SPECIAL
    if version == "1.2" and command not in RAW_COMMANDS:
        headers.append(("cr", "a\rb\r"))
    for body in (b"", b"plain body", b"\x00nul\x00 inside\x00", bytes(range(256))):
        data = encode(command, headers, body, version)
        frames = parser(version, command).feed(data)
        assert frames == [Frame(command, dict(headers) | ({"content-length": str(len(body))} if body else {}), body)]


@pytest.mark.parametrize(
    ("version", "value", "wire"),
    [
        ("1.0", "a:b\\c", b"k:a:b\\c\n"),
        ("1.1", "a:b\\c\nd", b"k:a\\cb\\\\c\\nd\n"),
        ("1.1", "a\rb", b"k:a\rb\n"),  # 1.1 has no \r escape
        ("1.2", "a:b\\c\nd\re", b"k:a\\cb\\\\c\\nd\\re\n"),
    ],
)
def test_escaping_rules_per_version(version: str, value: str, wire: bytes) -> None:
    data = encode("SEND", [("k", value)], b"", version)
    assert wire in data
    assert parser(version).feed(data)[0].headers["k"] == value


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("command", RAW_COMMANDS)
def test_connect_and_connected_are_never_escaped(command: str, version: str) -> None:
    data = encode(command, [("passcode", "p:a\\ss")], b"", version)
    assert b"passcode:p:a\\ss\n" in data
    # a backslash in a CONNECT header is not an escape, even where it would be undefined in other frames
    raw = f"{command}\nlogin:us\\er\npasscode:a\\cb\\t\n\n\0".encode()
    frame = parser(version, command).feed(raw)[0]
    assert frame.headers == {"login": "us\\er", "passcode": "a\\cb\\t"}


def test_version_1_0_never_unescapes() -> None:
    frame = parser("1.0").feed(b"SEND\ndestination:/queue/a\\cb\nk:\\t\\n\\\\\n\n\0")[0]
    assert frame.headers == {"destination": "/queue/a\\cb", "k": "\\t\\n\\\\"}


def test_escape_function() -> None:
    assert escape("a:b", "1.0") == "a:b"
    assert escape("\\\n:\r", "1.1") == "\\\\\\n\\c\r"
    assert escape("\\\n:\r", "1.2") == "\\\\\\n\\c\\r"
    assert escape("plain", "1.2") == "plain"


def test_repeated_header_first_value_wins() -> None:
    frame = parser().feed(b"SEND\ndestination:/queue/first\nk:1\ndestination:/queue/second\nk:2\n\n\0")[0]
    assert frame.headers == {"destination": "/queue/first", "k": "1"}
    # also for content-length: the first one frames the body
    frame = parser().feed(b"SEND\ncontent-length:3\ncontent-length:1\n\na\0b\0")[0]
    assert frame.body == b"a\0b"


def test_repeated_header_first_wins_after_unescaping() -> None:
    frame = parser("1.2").feed(b"SEND\na\\cb:1\na\\cb:2\na:b:3\n\n\0")[0]
    assert frame.headers == {"a:b": "1", "a": "b:3"}  # the name ends at the first raw ':', escaped ones are text


def test_crlf_line_endings() -> None:
    data = b"SEND\r\ndestination:/queue/a\r\nk:v\r\n\r\nbody\0\r\n"
    frame = parser("1.2").feed(data)[0]
    assert frame == Frame("SEND", {"destination": "/queue/a", "k": "v"}, b"body")
    # mixed endings, and a body that itself starts with an EOL
    frame = parser("1.2").feed(b"SEND\r\nk:v\n\r\n\r\nbody\0")[0]
    assert frame == Frame("SEND", {"k": "v"}, b"\r\nbody")


def test_heartbeat_eols_between_frames() -> None:
    p = parser()
    assert p.feed(b"\n") == []
    assert p.feed(b"\r\n\n") == []
    assert p.heartbeats == 3
    frames = p.feed(b"SEND\nk:1\n\n\0\n\n\r\nSEND\nk:2\n\n\0\n")
    assert [f.headers["k"] for f in frames] == ["1", "2"]
    assert p.heartbeats >= 5  # (whether the EOL right after a NUL counts as a beat is a detail)


def test_content_length_body_with_nuls() -> None:
    body = b"\0\0a\0b\0\0"
    data = b"SEND\ncontent-length:%d\n\n" % len(body) + body + b"\0"
    assert parser().feed(data)[0].body == body
    # without content-length the body ends at the first NUL
    frames = parser().feed(b"SEND\n\nab\0SEND\n\ncd\0")
    assert [f.body for f in frames] == [b"ab", b"cd"]


def test_empty_body_and_no_headers() -> None:
    assert parser().feed(b"DISCONNECT\n\n\0") == [Frame("DISCONNECT", {}, b"")]
    assert parser().feed(b"SEND\ncontent-length:0\n\n\0") == [Frame("SEND", {"content-length": "0"}, b"")]


def _stream(version: str) -> tuple[bytes, list[Frame]]:
    frames = [
        Frame("SEND", {"destination": "/queue/a", "k": "v:1" if version != "1.0" else "v"}, b"hello"),
        Frame("SEND", {"destination": "/topic/t"}, b"\x00bin\x00ary\x00"),
        Frame("BEGIN", {"transaction": "tx1"}, b""),
        Frame("ACK", {"id": "1.2", "transaction": "tx1"}, b""),
        Frame("COMMIT", {"transaction": "tx1"}, b""),
        Frame("DISCONNECT", {"receipt": "bye"}, b""),
    ]
    data = b"\n".join(encode(f.command, list(f.headers.items()), f.body, version) for f in frames) + b"\r\n"
    expected = [
        Frame(f.command, f.headers | ({"content-length": str(len(f.body))} if f.body else {}), f.body) for f in frames
    ]
    return data, expected


@pytest.mark.parametrize("version", VERSIONS)
def test_byte_at_a_time_and_all_in_one_feed(version: str) -> None:
    data, expected = _stream(version)
    assert parser(version).feed(data) == expected
    p = parser(version)
    got: list[Frame] = []
    for i in range(len(data)):
        got.extend(p.feed(data[i : i + 1]))
    assert got == expected
    assert p.feed(b"") == []


def test_many_frames_in_one_feed() -> None:
    data = b"".join(
        encode("SEND", [("destination", "/queue/q"), ("n", str(i))], b"x" * (i % 7), "1.2") for i in range(500)
    )
    frames = parser().feed(data)
    assert [f.headers["n"] for f in frames] == [str(i) for i in range(500)]
    assert [len(f.body) for f in frames] == [i % 7 for i in range(500)]


@given(
    # ids as this broker hands them out ("CID.MID", the fast path's case) and anything else
    value=st.one_of(st.from_regex(r"[0-9.]{0,20}", fullmatch=True), st.text(max_size=30)),
    version=st.sampled_from(VERSIONS),
    cuts=st.lists(st.integers(0, 60), max_size=4),
)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_plain_ack_frames_parse_as_the_general_path_does(value: str, version: str, cuts: list[int]) -> None:
    """`ACK` with one `id` header has a fast path: it must agree with the general one (forced here
    by a second header) for every id, escaped or not, in any chunking."""
    wire_value = escape(value, version) if version != "1.0" else value.replace("\n", "").replace("\r", "")
    fast = b"ACK\nid:" + wire_value.encode() + b"\n\n\0"
    general = b"ACK\nid:" + wire_value.encode() + b"\nx:1\n\n\0"
    expected = parser(version, "ACK").feed(general)
    assert len(expected) == 1
    p = parser(version, "ACK")
    got = [f for chunk in cut(fast + fast, cuts) for f in p.feed(chunk)]
    assert got == [Frame("ACK", {"id": expected[0].headers["id"]}, b"")] * 2


def test_plain_ack_frame_with_bad_utf8_is_an_error() -> None:
    with pytest.raises(StompError, match="UTF-8"):
        parser("1.2", "ACK").feed(b"ACK\nid:\xff\n\n\0")


def test_partial_frame_is_kept_until_complete() -> None:
    p = parser()
    assert p.feed(b"SEND\ndestination:/queue/a\n\nhel") == []
    assert p.feed(b"lo") == []
    assert p.feed(b"\0SEND\ncontent-length:3\n\n\0\0") == [Frame("SEND", {"destination": "/queue/a"}, b"hello")]
    assert p.feed(b"\0\0") == [Frame("SEND", {"content-length": "3"}, b"\0\0\0")]


@given(cuts=st.lists(st.integers(0, 400), max_size=25), version=st.sampled_from(VERSIONS))
@settings(max_examples=200, deadline=None)
def test_any_chunking_parses_the_same(cuts: list[int], version: str) -> None:
    data, expected = _stream(version)
    assert feed_all(parser(version), cut(data, cuts)) == expected


def _header_text(version: str) -> st.SearchStrategy[str]:
    if version == "1.0":  # no escaping: no EOL characters anywhere, no ':' in names (handled below)
        return st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=12)
    if version == "1.1":  # \r has no escape in 1.1 and would be taken for a CRLF line ending
        return st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r"), max_size=12)
    return st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def frames(draw: st.DrawFn) -> tuple[str, str, list[tuple[str, str]], bytes]:
    version = draw(st.sampled_from(VERSIONS))
    command = draw(st.sampled_from(ALL_COMMANDS))
    text = _header_text("1.0" if command in RAW_COMMANDS else version)
    names = text.filter(lambda s: s != "content-length")
    if version == "1.0" or command in RAW_COMMANDS:
        names = names.filter(lambda s: ":" not in s)
    headers = draw(st.lists(st.tuples(names, text), max_size=6, unique_by=lambda h: h[0]))
    body = draw(st.binary(max_size=64))
    return version, command, headers, body


@given(frame=frames(), cuts=st.lists(st.integers(0, 300), max_size=8))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_generated_frames_round_trip(frame: tuple[str, str, list[tuple[str, str]], bytes], cuts: list[int]) -> None:
    version, command, headers, body = frame
    data = encode(command, headers, body, version)
    got = feed_all(parser(version, command), cut(data, cuts))
    expected = dict(headers) | ({"content-length": str(len(body))} if body else {})
    assert got == [Frame(command, expected, body)]


# ------------------------------------------------------------------------------------ errors

BAD_FRAMES: list[tuple[str, bytes, str]] = [
    ("1.2", b"FROB\n\n\0", "unknown command"),
    ("1.2", b"send\ndestination:/queue/a\n\n\0", "unknown command"),
    ("1.2", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "unknown command"),
    ("1.2", b"MESSAGE\ndestination:/queue/a\n\n\0", "unknown command"),  # a server command from a client
    ("1.2", b"SEND\nno colon here\n\n\0", "without ':'"),
    ("1.2", b"SEND\nk:\xff\xfe\n\n\0", "UTF-8"),
    ("1.2", b"SEND\ncontent-length:abc\n\n\0", "content-length"),
    ("1.2", b"SEND\ncontent-length:-1\n\n\0", "ASCII digits"),
    ("1.2", "SEND\ncontent-length:\u0663\n\n\0".encode(), "ASCII digits"),  # int() reads it as 3
    ("1.2", b"SEND\ncontent-length:+3\n\nabc\0", "ASCII digits"),
    ("1.2", b"SEND\ncontent-length: 3\n\nabc\0", "ASCII digits"),
    ("1.2", b"SEND\ncontent-length:2\n\nabc\0", "not followed by NUL"),
    ("1.2", b"SEND\ncontent-length:0\n\nx", "not followed by NUL"),
    ("1.2", b"SEND\nk:a\\tb\n\n\0", "escape"),
    ("1.2", b"SEND\nk:ab\\\n\n\0", "escape"),
    ("1.1", b"SEND\nk:a\\rb\n\n\0", "escape"),  # \r is a 1.2 escape only
    ("1.1", b"SEND\nk\\x:v\n\n\0", "escape"),
]


@pytest.mark.parametrize(("version", "data", "words"), BAD_FRAMES)
def test_bad_frames_raise_stomp_error(version: str, data: bytes, words: str) -> None:
    with pytest.raises(StompError, match=words) as info:
        parser(version).feed(data)
    assert not isinstance(info.value, FrameTooLarge)
    assert info.value.message


def test_bad_frame_after_good_ones_in_the_same_feed_returns_the_good_ones_then_raises() -> None:
    p = parser()
    frames = p.feed(b"SEND\n\nok\0SEND\n\nalso\0FROB\n\n\0")
    assert [f.body for f in frames] == [b"ok", b"also"]
    assert isinstance(p.failed, StompError) and "FROB" in p.failed.message
    with pytest.raises(StompError, match="FROB"):
        p.feed(b"SEND\n\nlater\0")
    with pytest.raises(StompError):  # a bad first frame raises at once
        parser().feed(b"FROB\n\n\0SEND\n\nok\0")


def test_frame_too_large() -> None:
    limit = 1024
    # headers that never end
    with pytest.raises(FrameTooLarge):
        parser(max_frame_size=limit).feed(b"SEND\n" + b"k:" + b"v" * limit)
    # a body without NUL that grows past the limit, fed in pieces
    p = parser(max_frame_size=limit)
    assert p.feed(b"SEND\n\n") == []
    with pytest.raises(FrameTooLarge):
        for _ in range(10):
            assert p.feed(b"x" * 200) == []
    # a content-length past the limit: refused before the body arrives
    with pytest.raises(FrameTooLarge):
        parser(max_frame_size=limit).feed(b"SEND\ncontent-length:100000\n\n")
    # a whole frame one byte over
    over = b"SEND\n\n" + b"x" * (limit - 6) + b"\0"
    assert len(over) == limit + 1
    with pytest.raises(FrameTooLarge):
        parser(max_frame_size=limit).feed(over)
    with pytest.raises(FrameTooLarge):
        parser(max_frame_size=limit).feed(b"SEND\ncontent-length:%d\n\n" % (limit - 24) + b"y" * (limit - 24) + b"\0")


def test_first_frame_limit_holds_until_connect() -> None:
    """Before CONNECT a server holds frames to a small limit; after it, max-frame-size applies."""
    p = StompParser(1 << 20, "1.0", CLIENT_COMMANDS, first_frame_limit=1024)
    with pytest.raises(FrameTooLarge, match="1024 bytes, the limit before CONNECT"):
        p.feed(b"CONNECT\nhost:" + b"x" * 2000)
    p = StompParser(1 << 20, "1.0", CLIENT_COMMANDS, first_frame_limit=1024)
    with pytest.raises(FrameTooLarge, match="before CONNECT"):
        p.feed(b"SEND\ncontent-length:5000\n\n")  # any first frame
    p = StompParser(1 << 20, "1.0", CLIENT_COMMANDS, first_frame_limit=1024)
    big = b"SEND\ncontent-length:5000\n\n" + b"y" * 5000 + b"\0"
    assert [f.command for f in p.feed(b"CONNECT\nhost:x\n\n\0" + big)] == ["CONNECT"]  # the rest is held
    p.version = "1.2"
    assert p.feed(b"")[0].body == b"y" * 5000
    p = StompParser(1 << 20, "1.0", CLIENT_COMMANDS, first_frame_limit=1024)
    for chunk in (b"CONN", b"ECT\nhost:x\n\n", b"\0"):  # a CONNECT that spans reads lifts it too
        p.feed(chunk)
    assert p.feed(big)[0].body == b"y" * 5000


def test_ascii_int() -> None:
    assert [ascii_int(t) for t in ("0", "17", "007")] == [0, 17, 7]
    assert [ascii_int(t) for t in ("", "-1", "+1", " 1", "1 ", "1.0", "\u0663", "\uff13", "9" * 5000)] == [None] * 9


def test_frame_exactly_at_the_limit_is_accepted() -> None:
    limit = 1024
    exact = b"SEND\n\n" + b"x" * (limit - 7) + b"\0"
    assert len(exact) == limit
    assert parser(max_frame_size=limit).feed(exact)[0].body == b"x" * (limit - 7)
    exact = b"SEND\ncontent-length:998\n\n" + b"y" * 998 + b"\0"
    assert len(exact) == limit
    assert parser(max_frame_size=limit).feed(exact)[0].body == b"y" * 998


def test_error_types() -> None:
    assert issubclass(StompError, ProtocolError)
    assert issubclass(FrameTooLarge, ProtocolError)


# ---------------------------------------------------------------------------------- negotiate


@pytest.mark.parametrize(
    ("accept", "version"),
    [
        (None, "1.0"),
        ("1.0", "1.0"),
        ("1.1", "1.1"),
        ("1.2", "1.2"),
        ("1.0,1.1", "1.1"),
        ("1.0,1.1,1.2", "1.2"),
        ("1.2,1.0", "1.2"),
        (" 1.0 , 1.1 ", "1.1"),
        ("1.1,2.0", "1.1"),
        ("2.0", None),
        ("1.3,3", None),
        ("", None),
    ],
)
def test_negotiate(accept: str | None, version: str | None) -> None:
    assert negotiate(accept) == version


# ------------------------------------------------------------------------------------- fuzzing

VALID = b"".join(
    [
        encode("CONNECT", [("accept-version", "1.2"), ("host", "x"), ("heart-beat", "0,0")], b"", "1.2"),
        encode("SEND", [("destination", "/queue/a"), ("k", "a:b\\c\r\n")], b"body\0with nul", "1.2"),
        b"\r\n\n",
        b"SUBSCRIBE\r\nid:1\r\ndestination:/topic/t\r\nack:client\r\n\r\n\0",
        b"ACK\nid:1.2\ntransaction:t\n\n\0",
        b"SEND\ndestination:/queue/b\n\nno length\0\n",
    ]
)


@given(
    data=st.binary(max_size=600),
    cuts=st.lists(st.integers(0, 600), max_size=12),
    version=st.sampled_from(VERSIONS),
    max_frame_size=st.sampled_from([16, 100, MAX]),
)
@settings(max_examples=500, deadline=None)
def test_arbitrary_bytes_raise_only_protocol_errors(
    data: bytes, cuts: list[int], version: str, max_frame_size: int
) -> None:
    p = StompParser(max_frame_size, version)
    try:
        for frame in feed_all(p, cut(data, cuts)):
            assert frame.command in CLIENT_COMMANDS
            assert isinstance(frame.body, bytes)
    except ProtocolError as exc:
        assert exc.message


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "dup"]))
        i = draw(st.integers(0, len(data)))
        if op == "flip" and i < len(data):
            data[i] = draw(st.sampled_from([0, 10, 13, 58, 92, draw(st.integers(0, 255))]))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        else:
            j = draw(st.integers(i, min(len(data), i + 40)))
            data[i:i] = data[i:j]
    return bytes(data)


@given(
    data=mutated(),
    cuts=st.lists(st.integers(0, len(VALID) + 100), max_size=12),
    version=st.sampled_from(VERSIONS),
)
@settings(max_examples=500, deadline=None)
def test_mutated_frames_raise_only_protocol_errors(data: bytes, cuts: list[int], version: str) -> None:
    p = StompParser(MAX, version)
    try:
        for frame in feed_all(p, cut(data, cuts)):
            assert frame.command in CLIENT_COMMANDS
    except ProtocolError as exc:
        assert exc.message


@given(cuts=st.lists(st.integers(0, len(VALID)), max_size=12))
@settings(max_examples=100, deadline=None)
def test_valid_stream_parses_the_same_in_any_chunking(cuts: list[int]) -> None:
    expected = feed_all(parser("1.2"), [VALID])
    assert [f.command for f in expected] == ["CONNECT", "SEND", "SUBSCRIBE", "ACK", "SEND"]
    assert expected[1].headers["k"] == "a:b\\c\r\n" and expected[1].body == b"body\0with nul"
    assert feed_all(parser("1.2"), cut(VALID, cuts)) == expected


# ------------------------------------------------------------------------------ work per frame
# No timings: the parser's own counters (`scanned`, `copied`: bytes searched and copied for frames
# that span reads) and the searches it makes on the bytes it is fed (CountingBytes) are counted.


class CountingBytes(bytes):
    """bytes that add to `tally[0]` every byte a find() or count() on them passes over."""

    tally: list[int]

    def _span(self, start: int | None, end: int | None) -> tuple[int, int]:
        return (0 if start is None else start), (len(self) if end is None else min(end, len(self)))

    def find(self, sub: bytes, start: int | None = None, end: int | None = None) -> int:  # type: ignore[override]
        found = super().find(sub, start, end)
        lo, hi = self._span(start, end)
        self.tally[0] += max(0, (found + len(sub) if found >= 0 else hi) - lo)  # a search stops at its match
        return found

    def count(self, sub: bytes, start: int | None = None, end: int | None = None) -> int:  # type: ignore[override]
        lo, hi = self._span(start, end)
        self.tally[0] += max(0, hi - lo)
        return super().count(sub, start, end)


def counting(data: bytes, tally: list[int]) -> CountingBytes:
    b = CountingBytes(data)
    b.tally = tally
    return b


def _big_frame(kind: str, size: int) -> tuple[bytes, Frame]:
    if kind == "content-length":
        body = bytes(range(256)) * (size // 256)  # NULs inside: only the length frames it
        return encode("SEND", [("destination", "/queue/big")], body, "1.2"), Frame(
            "SEND", {"destination": "/queue/big", "content-length": str(len(body))}, body
        )
    if kind == "nul-terminated":
        body = b"0123456789abcdef" * (size // 16)
        return b"SEND\ndestination:/queue/big\n\n" + body + b"\0", Frame("SEND", {"destination": "/queue/big"}, body)
    headers = {f"h{i:07d}": "v" * 20 for i in range(size // 30)}  # a large header block, no body
    head = "SEND\n" + "".join(f"{k}:{v}\n" for k, v in headers.items()) + "\n"
    return head.encode() + b"\0", Frame("SEND", headers, b"")


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
@pytest.mark.parametrize("kind", ["content-length", "nul-terminated", "large-headers"])
def test_a_large_frame_in_small_chunks_costs_work_linear_in_its_size(kind: str, crlf: bool) -> None:
    """A 2 MiB frame fed in 4 KiB reads (then a small frame): every byte is searched and copied a
    bounded number of times, not once per read as when each read re-joined and re-scanned the buffer."""
    data, expected = _big_frame(kind, 2 << 20)
    if crlf and kind != "content-length":
        data = data.replace(b"\n", b"\r\n")  # (the body has no EOL; a CRLF in a binary body is body)
    elif crlf:
        head, _, rest = data.partition(b"\n\n")
        data = head.replace(b"\n", b"\r\n") + b"\r\n\r\n" + rest
    data += b"\nSEND\ndestination:/queue/small\n\nsmall\0"
    size = len(data)
    p = parser("1.2", max_frame_size=4 << 20)
    tally = [0]
    chunk = 4096
    got: list[Frame] = []
    for i in range(0, size, chunk):
        got += p.feed(counting(data[i : i + chunk], tally))
    assert got == [expected, Frame("SEND", {"destination": "/queue/small"}, b"small")]
    assert p.copied <= 3 * size, f"{p.copied:,} bytes copied for a frame of {size:,}"
    assert p.scanned + tally[0] <= 3 * size, f"{p.scanned + tally[0]:,} bytes searched for a frame of {size:,}"


@pytest.mark.parametrize(
    "frame",
    [
        b"SEND\r\ndestination:/queue/a\r\n\r\nx\0",  # CRLF: no LF LF anywhere in the read
        b"ACK\nid:1.2\r\n\r\n\0",  # looks like the ACK fast path's frame, is not
        b"ACK\nid:1.2\ntransaction:t1\n\n\0",
        b"SEND\ncontent-length:1\n\nx\0\n",
    ],
    ids=["crlf-send", "crlf-ack", "ack-two-headers", "content-length"],
)
def test_many_small_frames_in_one_read_cost_work_linear_in_the_read(frame: bytes) -> None:
    """A read of 4,000 small frames: each search stops within a few frames of where it started,
    instead of running to the end of the read for every frame."""
    data = frame * 4000
    tally = [0]
    frames = parser("1.2", "ACK").feed(counting(data, tally))
    assert len(frames) == 4000
    assert tally[0] <= 6 * len(data), f"{tally[0]:,} bytes searched for a read of {len(data):,}"


@st.composite
def streams(draw: st.DrawFn) -> tuple[str, bytes, list[Frame]]:
    """Several frames in one stream: each with or without content-length, with LF or CRLF line
    endings, heart-beats between them; bodies with NULs only where a content-length frames them."""
    version = draw(st.sampled_from(["1.1", "1.2"]))
    data, expected = b"", []
    for _ in range(draw(st.integers(1, 5))):
        command = draw(st.sampled_from(["SEND", "ACK", "SUBSCRIBE", "BEGIN"]))
        names = st.from_regex(r"[a-z]{1,6}", fullmatch=True)
        headers = list(dict(draw(st.lists(st.tuples(names, _header_text(version)), max_size=3))).items())
        body = draw(st.binary(max_size=40) | st.binary(min_size=100, max_size=3000))
        if draw(st.booleans()):  # content-length
            wire = encode(command, headers, body, version)
            want = Frame(command, dict(headers) | ({"content-length": str(len(body))} if body else {}), body)
        else:
            body = body.replace(b"\0", b"")
            wire = encode(command, headers, b"", version)[:-1] + body + b"\0"
            want = Frame(command, dict(headers), body)
        if draw(st.booleans()):  # CRLF line endings (escaped header text has no raw LF)
            head, _, rest = wire.partition(b"\n\n")
            wire = head.replace(b"\n", b"\r\n") + b"\r\n\r\n" + rest
        data += wire + draw(st.sampled_from([b"", b"\n", b"\r\n", b"\n\n\r\n"]))
        expected.append(want)
    return version, data, expected


@given(stream=streams(), cuts=st.lists(st.integers(0, 16000), max_size=20))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_streams_of_mixed_frames_parse_the_same_in_any_chunking(
    stream: tuple[str, bytes, list[Frame]], cuts: list[int]
) -> None:
    """Frames that span reads (headers, length-framed or NUL-framed bodies cut anywhere, an EOL EOL
    split between reads) come out as when the whole stream is fed at once."""
    version, data, expected = stream
    assert parser(version, max_frame_size=1 << 20).feed(data) == expected
    p = parser(version, max_frame_size=1 << 20)
    assert [f for chunk in cut(data, cuts) for f in p.feed(chunk)] == expected


# ------------------------------------------------------- streamed SEND bodies (large messages)
def _collect(p: StompParser, pieces: list[bytes]) -> list[Frame]:
    out: list[Frame] = []
    for piece in pieces:
        out += p.feed(piece)
    return out


@given(
    body=st.binary(max_size=3000),
    over=st.integers(min_value=0, max_value=100),
    cuts=st.lists(st.integers(min_value=0, max_value=3200), max_size=10),
    version=st.sampled_from(["1.0", "1.2"]),
)
@settings(max_examples=200, deadline=None)
def test_a_send_over_stream_over_comes_out_in_pieces_in_any_chunking(
    body: bytes, over: int, cuts: list[int], version: str
) -> None:
    """SEND with a content-length over `stream_over`: the frame (empty body, streamed), its body
    in pieces that join to the body, BODY_END; then the next frame parses as usual. Smaller
    bodies come whole. The body may hold NULs and LFs (content-length says where it ends)."""
    data = (
        b"SEND\ndestination:/queue/a\ncontent-length:%d\n\n" % len(body) + body + b"\0\n"
        b"SEND\ndestination:/queue/b\n\nafter\0"
    )
    p = parser(version, max_frame_size=256)  # smaller than most bodies: streaming is not limited by it
    p.stream_over = over
    frames = _collect(p, cut(data, cuts))
    assert frames[-1] == Frame("SEND", {"destination": "/queue/b"}, b"after")
    frames = frames[:-1]
    if len(body) <= over:
        assert frames == [Frame("SEND", {"destination": "/queue/a", "content-length": str(len(body))}, body)]
        return
    head, *parts, end = frames
    assert head.command == "SEND" and head.streamed and head.body == b""
    assert head.headers["content-length"] == str(len(body))
    assert all(f.command == BODY_PART and f.body for f in parts)
    assert b"".join(f.body for f in parts) == body
    assert end.command == BODY_END
    assert p.buffered == 0


def test_a_streamed_body_without_its_nul_is_an_error() -> None:
    p = parser()
    p.stream_over = 4
    frames = p.feed(b"SEND\ndestination:/queue/a\ncontent-length:10\n\n0123456")
    assert [f.command for f in frames] == ["SEND", BODY_PART]
    assert p.feed(b"789")[0].body == b"789"
    with pytest.raises(StompError, match="NUL"):
        p.feed(b"X")


def test_only_send_frames_stream() -> None:
    """Other frames with a body over the threshold are still held whole (and to max-frame-size)."""
    p = parser(command="SEND")
    p.stream_over = 2
    (f,) = p.feed(b"BEGIN\ntransaction:t\ncontent-length:5\n\nhello\0")
    assert f.command == "BEGIN" and not f.streamed and f.body == b"hello"
