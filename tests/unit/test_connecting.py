"""connecting.within: a connection made just as its attempt is given up is closed, not leaked
(Python 3.11's wait_for drops it when the waiting task is cancelled: a ResourceWarning for a
socket left open, seen failing a full test run)."""

from __future__ import annotations

import asyncio

import pytest

from tandem.connecting import within
from tandem.testing import free_port


class _Made:
    closed = False


def test_a_connection_made_as_the_attempt_is_cancelled_is_discarded() -> None:
    made = _Made()

    async def stubborn() -> _Made:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return made  # the connection completed just as the cancellation came
        raise AssertionError("not cancelled")

    async def main() -> None:
        task = asyncio.create_task(within(5, stubborn, lambda m: setattr(m, "closed", True)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert made.closed


def test_a_connection_made_in_time_is_returned_open() -> None:
    made = _Made()

    async def quick() -> _Made:
        return made

    assert asyncio.run(within(5, quick, lambda m: setattr(m, "closed", True))) is made
    assert not made.closed


def test_an_attempt_past_its_time_raises_timeout() -> None:
    async def slow() -> _Made:
        await asyncio.sleep(10)
        return _Made()

    with pytest.raises(TimeoutError):
        asyncio.run(within(0.01, slow, lambda m: None))


def test_free_port_never_hands_out_a_port_twice() -> None:
    """A chaos topology asks for six ports at once; two alike made its test fail (5 distinct)."""
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
