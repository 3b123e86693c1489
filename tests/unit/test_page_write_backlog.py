"""The page writer says when more than WRITE_HIGH bytes wait for it and when it is down to
WRITE_LOW again (the broker's pacer stops reading the senders meanwhile, decision 0085); a
writer that fails says it caught up, so that no connection waits for it for ever. Real files,
a slow disk through the fault seam."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tandem.core.message import Message, MessageData
from tandem.journal.faults import ENV
from tandem.store.pages import WRITE_HIGH, WRITE_LOW, PageFiles

BODY = b"x" * 1000


def message(mid: int) -> Message:
    return Message.create(mid, MessageData("paged", body=BODY))


def fill_past_high(pages: PageFiles, first: int) -> int:
    """Append until the writer is behind; the next message id."""
    mid = first
    while not pages.behind:
        pages.append(1, 1, message(mid), [(7, mid)])
        mid += 1
        assert pages.queued <= WRITE_HIGH + 2 * len(BODY)
    return mid


async def until(cond: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.01)


def test_behind_past_the_high_mark_and_caught_up_at_the_low_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "tandem-paging:sync=delay0.2")
    pages = PageFiles(tmp_path / "paging")
    reports: list[tuple[bool, int]] = []
    pages.on_backlog = lambda behind: reports.append((behind, pages.queued))

    async def main() -> None:
        pages.start()
        try:
            mid = fill_past_high(pages, 1)
            assert reports == [(True, pages.queued)] and pages.queued >= WRITE_HIGH
            await until(lambda: not pages.behind)
            assert [b for b, _ in reports] == [True, False] and reports[1][1] <= WRITE_LOW
            fill_past_high(pages, mid)  # and again
            await until(lambda: pages.idle)
            assert [b for b, _ in reports] == [True, False, True, False] and pages.queued == 0
        finally:
            await asyncio.wait_for(pages.stop(), 20)

    asyncio.run(main())


def test_a_writer_that_fails_while_behind_says_it_caught_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "tandem-paging:sync=EIO")
    pages = PageFiles(tmp_path / "paging")
    reports: list[bool] = []
    failures: list[BaseException] = []
    pages.on_backlog = reports.append
    pages.on_failure = failures.append

    async def main() -> None:
        pages.start()
        try:
            fill_past_high(pages, 1)  # one batch (one loop pass): its sync fails
            await until(lambda: bool(failures))
            assert failures and reports == [True, False] and not pages.behind
            for mid in range(10_000, 10_000 + 2 * WRITE_HIGH // len(BODY)):  # an open transaction queues on
                pages.append_tx(1, 5, 1, message(mid), [(7, mid)])
            assert reports == [True, False] and not pages.behind, "behind a writer that writes no more"
        finally:
            await asyncio.wait_for(pages.stop(), 20)

    asyncio.run(main())
