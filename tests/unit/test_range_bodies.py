"""A range read's large bodies on the client (client/range.py): in order, whole, or failed."""

from __future__ import annotations

import asyncio
import zlib

import msgspec
import pytest

from tandem.client.range import RangeBodies
from tandem.errors import CallTimeout, ProtocolError, Unblocked
from tandem.protocol import native as n

RAW = msgspec.Raw(b"\x91\xa1q")


def result(large: list[tuple[int, int, bool]]) -> n.RangeResult:
    return n.RangeResult(1, 7, 1, 3, [(1, 10, 1, RAW), (2, 11, 1, RAW), (3, 12, 1, RAW)], large)


def chunk(mid: int, index: int, data: bytes, last: bool = False) -> n.DeliverChunk:
    return n.DeliverChunk(1, -7, mid, index, data, last)


def test_bodies_arrive_in_the_order_the_answer_names_them() -> None:
    async def go() -> None:
        r = RangeBodies(asyncio.get_running_loop(), 0)
        packed = zlib.compress(b"z" * 1000)
        r.answer(result([(0, 6, False), (2, len(packed), True)]), 0)
        assert r.waiting
        r.chunk(chunk(10, 0, b"abc"))
        r.chunk(chunk(10, 1, b"def", last=True))
        r.chunk(chunk(12, 0, packed, last=True))
        bodies = await r.wait(1)
        assert sorted(bodies) == [0, 2]
        assert bodies[0].read() == b"abcdef" and bodies[2].read() == b"z" * 1000

    asyncio.run(go())


def test_an_answer_without_large_messages_is_done_at_once() -> None:
    async def go() -> None:
        r = RangeBodies(asyncio.get_running_loop(), 0)
        r.answer(result([]), 0)
        assert await r.wait(1) == {}

    asyncio.run(go())


@pytest.mark.parametrize(
    "bad",
    [chunk(11, 0, b"abc"), chunk(10, 1, b"abc")],
    ids=["another message", "a gap"],
)
def test_a_chunk_out_of_place_is_a_protocol_error(bad: n.DeliverChunk) -> None:
    async def go() -> None:
        r = RangeBodies(asyncio.get_running_loop(), 0)
        r.answer(result([(0, 6, False)]), 0)
        with pytest.raises(ProtocolError):
            r.chunk(bad)

    asyncio.run(go())


def test_short_body_is_a_protocol_error() -> None:
    async def go() -> None:
        r = RangeBodies(asyncio.get_running_loop(), 0)
        r.answer(result([(0, 6, False)]), 0)
        with pytest.raises(ProtocolError):
            r.chunk(chunk(10, 0, b"abc", last=True))

    asyncio.run(go())


def test_an_answer_sent_again_after_a_link_loss_fails_rather_than_waiting_for_lost_chunks() -> None:
    async def go() -> None:
        r = RangeBodies(asyncio.get_running_loop(), 0)
        r.answer(result([(0, 6, False)]), 1)  # a reattach replayed it: its chunks went with the old link
        with pytest.raises(Unblocked):
            await r.wait(1)
        r.chunk(chunk(10, 0, b"abc"))  # late chunks of it are dropped

    asyncio.run(go())


def test_a_body_that_stops_arriving_times_out() -> None:
    async def go() -> None:
        r = RangeBodies(asyncio.get_running_loop(), 0)
        r.answer(result([(0, 6, False)]), 0)
        r.chunk(chunk(10, 0, b"abc"))
        with pytest.raises(CallTimeout):
            await r.wait(0.05)

    asyncio.run(go())
