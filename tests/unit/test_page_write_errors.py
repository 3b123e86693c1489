"""A page file write that fails (the fault seam's `tandem-paging:` rules, journal/faults.py) fails
the page files for good, as a journal's does: what comes after is refused with the store's I/O
error (IO_ERROR, "may or may not have been stored"), the error the session hands its client, not
the raw OSError, which a session logs as an internal error with a traceback that grows by one
raise per message until the broker has stopped."""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from pathlib import Path

import pytest
from test_page_acks import Broker

from tandem.core.message import Message, MessageData, RoutingType
from tandem.errors import JournalIOError
from tandem.journal.faults import ENV, ENV_FILE
from tandem.store.pages import PageFiles


def message(mid: int) -> Message:
    return Message.create(mid, MessageData("paged", body=b"x" * 100))


@pytest.mark.parametrize("rule", ["tandem-paging:write=EIO", "tandem-paging:sync=ENOSPC", "tandem-paging:create=EIO"])
def test_after_a_failed_page_write_every_append_is_refused_with_the_stores_io_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    monkeypatch.setenv(ENV, rule)
    pages = PageFiles(tmp_path / "paging")
    failures: list[BaseException] = []
    pages.on_failure = failures.append

    async def main() -> None:
        pages.start()
        try:
            pages.append(1, 1, message(1), [(7, 1)])
            deadline = time.monotonic() + 10
            while not failures and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert len(failures) == 1 and isinstance(failures[0], OSError), failures
            depths = []
            for mid in (2, 3, 4):
                with pytest.raises(JournalIOError, match="injected") as caught:
                    pages.append(1, 1, message(mid), [(7, mid)])
                depths.append(len(traceback.extract_tb(caught.value.__traceback__)))
            assert depths[0] == depths[-1], f"the error's traceback grows with each refusal: {depths}"
        finally:
            await asyncio.wait_for(pages.stop(), 10)

    asyncio.run(main())


def test_a_page_write_that_ends_after_the_message_journal_failed_raises_nothing_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paged send with a dedup id journals the id once its page is durable (decision 0045). Seen
    in a chaos run (`--store paging`, ENOSPC on the journal): the page write ended after the
    journal had failed, and journaling the id raised out of the page writer's completion, on the
    loop, skipping what followed it there. The broker is stopping then: the id is simply not
    journaled (the send is never confirmed; a restart learns the id from the page)."""
    rules = tmp_path / "rules"
    rules.write_text("")
    monkeypatch.setenv(ENV, "tandem-paging:write=delay0.5")
    monkeypatch.setenv(ENV_FILE, str(rules))
    b = Broker(tmp_path / "data")
    errors: list[dict[str, object]] = []
    b.loop.set_exception_handler(lambda loop, ctx: errors.append(ctx))
    try:
        b.po.create_queue("work", "work", RoutingType.ANYCAST)
        b.po.create_queue("other", "other", RoutingType.ANYCAST)
        b.settle()
        for _ in range(12):  # the address fills and pages
            b.po.send(Message.create(b.po.ids.next(), MessageData("work", body=b"x" * 100)))
        b.settle()
        assert b.po.queue("work").addr.pager.active  # type: ignore[union-attr]
        rules.write_text("tandem-data:write=EIO\n")
        b.run(asyncio.sleep(0.1))  # the journal looks at the rules file at most every 20 ms
        b.po.send(Message.create(b.po.ids.next(), MessageData("work", body=b"d" * 100, dedup_id="d1")))
        b.po.send(Message.create(b.po.ids.next(), MessageData("other", body=b"o")))  # a journal write: EIO
        deadline = time.monotonic() + 10
        while (b.storage.messages.failed is None or not b.storage.pages.idle) and time.monotonic() < deadline:
            b.run(asyncio.sleep(0.05))
        b.run(asyncio.sleep(0.2))
        assert b.storage.messages.failed is not None and b.storage.pages.idle
        assert not errors, [str(e.get("exception") or e.get("message")) for e in errors]
    finally:
        rules.write_text("")
        with contextlib.suppress(Exception):
            b.close()
