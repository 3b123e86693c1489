"""What the broker keeps per channel for a reattach (server/reattach.py)."""

from __future__ import annotations

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
