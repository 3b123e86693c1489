"""A SEND's message as the core decodes it: text that is not UTF-8 fails that message alone.

The native reader leaves a SEND's message encoded (msgspec.Raw); ServerSession.send_run decodes
the header of each message of a producer's burst. A message with invalid UTF-8 in its address,
dedup id or a property (name or value, however nested) must come back as its own
InvalidArgument, and the messages around it must go on as if it were not there.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bad_utf8 import BAD_UTF8, BadStr, invalid_utf8, pack, replaced, string_paths
from tandem.core.ids import IdGenerator
from tandem.core.message import Message, MessageData
from tandem.core.session import ServerSession
from tandem.errors import ErrorCode, InvalidArgument, TandemError


class RecordingPostOffice:
    """What send_run needs of a post office: ids, and a send that records what it was handed."""

    def __init__(self) -> None:
        self.ids = IdGenerator(1, 0, lambda upto: None)
        self.sent: list[Message] = []

    def send(self, message: Message) -> tuple[bool, bool]:
        self.sent.append(message)
        return True, True


RICH = MessageData(
    "orders",
    True,
    4,
    0,
    1_700_000_000_000,
    "dedup-1",
    1,
    {"type": "order", "n": 7, "tags": ["a", {"deep": "b"}], "blob": b"\x00\xff"},
    b"\xff\xfe body bytes are bytes: anything goes",
)
GOOD = msgspec.msgpack.encode(MessageData("orders", True, body=b"good"))


def send_run(raws: list[bytes]) -> tuple[list[bool | TandemError], RecordingPostOffice]:
    po = RecordingPostOffice()
    session = ServerSession(po, owner=None)  # type: ignore[arg-type]
    return session.send_run([msgspec.Raw(r) for r in raws]), po


def test_the_rich_message_is_accepted_as_it_is() -> None:
    """The control: with all its text valid, the message used below goes through."""
    results, po = send_run([msgspec.msgpack.encode(RICH)])
    assert results == [True]
    assert po.sent[0].address == "orders" and po.sent[0].properties == RICH.properties


@given(where=st.data(), bad=invalid_utf8())
@settings(max_examples=300, deadline=None)
def test_invalid_utf8_in_any_string_of_a_message_fails_that_send_only(where: st.DataObject, bad: bytes) -> None:
    generic = msgspec.msgpack.decode(msgspec.msgpack.encode(RICH))
    path = where.draw(st.sampled_from(string_paths(generic)))
    bad_raw = pack(replaced(generic, path, bad))
    results, po = send_run([GOOD, bad_raw, GOOD])
    assert results[0] is True and results[2] is True
    err = results[1]
    assert isinstance(err, InvalidArgument), (path, err)
    assert err.code == ErrorCode.INVALID_ARGUMENT and "UTF-8" in err.message
    assert [m.address for m in po.sent] == ["orders", "orders"]


def test_each_bad_message_of_a_burst_gets_its_own_error() -> None:
    generic: list[Any] = msgspec.msgpack.decode(msgspec.msgpack.encode(RICH))
    bad = [pack(replaced(generic, path, b)) for path, b in zip(string_paths(generic), BAD_UTF8 * 3, strict=False)]
    burst = [GOOD, *bad, GOOD]
    results, po = send_run(burst)
    assert results[0] is True and results[-1] is True
    assert all(isinstance(r, InvalidArgument) for r in results[1:-1]), results
    assert len(po.sent) == 2


# Field values for a message array: what a producer should send, and anything else (bad text too).
_any = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | invalid_utf8().map(BadStr),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_FIELDS = [
    st.text(min_size=1, max_size=8),  # address
    st.booleans(),  # durable
    st.integers(-3, 12),  # priority
    st.integers(0, 2**40),  # expiration
    st.integers(0, 2**40),  # timestamp
    st.none() | st.text(max_size=8),  # dedup id
    st.integers(0, 2),  # routing type
    st.none() | st.dictionaries(st.text(max_size=4), st.integers(-(2**63), 2**63) | st.text(max_size=4)),  # properties
    st.binary(max_size=16),  # body
]


@st.composite
def message_arrays(draw: st.DrawFn) -> list[Any]:
    """A message as a msgpack array: each field valid, or (sometimes) any value at all, bad text included."""
    fields = [draw(_any if draw(st.integers(0, 4)) == 0 else f) for f in _FIELDS]
    return fields[: draw(st.integers(1, len(fields)))] + draw(st.lists(_any, max_size=2) if len(fields) == 9 else [])


@given(array=message_arrays())
@settings(max_examples=300, deadline=None)
def test_a_message_the_broker_accepts_is_one_every_consumer_can_decode(array: list[Any]) -> None:
    """The broker decodes only a message's header and keeps its bytes; a STOMP subscription and
    the clients decode all of it (MessageData) at delivery. So whatever send_run accepts must
    decode as MessageData, or it would fail every consumer it reaches (the body too: bytes, not text)."""
    raw = pack(array)
    (result,), po = send_run([raw])
    if isinstance(result, TandemError):
        assert isinstance(result, InvalidArgument), result
        assert not po.sent
    else:
        msgspec.msgpack.decode(raw, type=MessageData)


@pytest.mark.parametrize(
    "body",
    [BadStr(b"\xff"), "text, not bytes", None, 7, [b"x"]],
    ids=["invalid-utf8-text", "valid-text", "nil", "int", "array"],
)
def test_a_message_whose_body_is_not_bytes_is_refused(body: Any) -> None:
    raw = pack(["orders", True, 4, 0, 0, None, 0, None, body])
    results, po = send_run([GOOD, raw, GOOD])
    assert results[0] is True and results[2] is True
    assert isinstance(results[1], InvalidArgument), results[1]
    assert len(po.sent) == 2
