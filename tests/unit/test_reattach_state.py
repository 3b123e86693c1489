"""What the broker keeps per channel for a reattach (server/reattach.py)."""

from __future__ import annotations

from msgspec import Raw

from tandem.protocol.native import RangeResult, Response
from tandem.server.reattach import CLOSED_CHANNELS_KEPT, ChannelReplay, trim_closed


def test_answers_are_kept_up_to_the_limit_and_what_went_is_known() -> None:
    r = ChannelReplay()
    for cmd in range(1, 11):
        r.keep(cmd, f"answer-{cmd}", limit=4)
    assert list(r.replies) == [7, 8, 9, 10]
    assert r.replies_from(9) == ["answer-9", "answer-10"]
    assert r.dropped_upto == 6
    assert r.can_answer_from(7) and r.can_answer_from(11) and r.can_answer_from(-1)  # -1: nothing awaited
    assert not r.can_answer_from(6) and not r.can_answer_from(1)


def test_closed_channels_beyond_the_limit_are_forgotten_oldest_first() -> None:
    replay = {ch: ChannelReplay() for ch in range(0, CLOSED_CHANNELS_KEPT + 11)}
    open_channels = {1, 2, 3}
    trim_closed(replay, open_channels)
    closed = [ch for ch in replay if ch and ch not in open_channels]
    assert len(closed) == CLOSED_CHANNELS_KEPT
    assert 0 in replay and open_channels <= set(replay)
    assert min(closed) == CLOSED_CHANNELS_KEPT + 11 - CLOSED_CHANNELS_KEPT  # the newest kept


def test_answers_are_kept_within_a_byte_budget() -> None:
    """A range read's answer carries messages: a few big ones push the older answers out (and
    the latest always stays), so the broker holds no more than about the budget."""
    big = RangeResult(1, 5, 1, 3, [(1, 1, 1, Raw(b"x" * 1000)), (2, 2, 1, Raw(b"y" * 1000))])
    r = ChannelReplay()
    r.keep(1, Response(1, 1), byte_limit=3000)
    r.keep(2, big, byte_limit=3000)
    assert list(r.replies) == [1, 2] and r.dropped_upto == -1
    r.keep(3, big, byte_limit=3000)
    assert list(r.replies) == [3] and r.dropped_upto == 2 and r.kept_bytes == 64 + 2000
    r.keep(4, Response(1, 4), byte_limit=3000)
    assert list(r.replies) == [3, 4] and not r.can_answer_from(2) and r.can_answer_from(3)
