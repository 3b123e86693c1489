"""A warm takeover frees the follower's records a chunk per loop pass, after it serves."""

from __future__ import annotations

import asyncio

from tandem.server.broker import _release_in_chunks


def test_the_leftovers_are_freed_over_several_loop_passes_and_the_loop_runs_between() -> None:
    async def main() -> tuple[int, int]:
        leftovers = {i: object() for i in range(50_000)}
        _release_in_chunks(asyncio.get_running_loop(), leftovers, chunk=20_000)
        after_first_pass = len(leftovers)
        for _ in range(5):
            await asyncio.sleep(0)
        return after_first_pass, len(leftovers)

    first, last = asyncio.run(main())
    assert first == 30_000, "one chunk at once, the rest later"
    assert last == 0
