"""A SEND's message as the core decodes it: text that is not UTF-8 fails that message alone.

The native reader leaves a SEND's message encoded (msgspec.Raw); ServerSession.send_run decodes
the header of each message of a producer's burst. A message with invalid UTF-8 in its address,
dedup id or a property (name or value, however nested) must come back as its own
InvalidArgument, and the messages around it must go on as if it were not there.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from bad_utf8 import BAD_UTF8, invalid_utf8, pack, replaced, string_paths
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
