"""A page file write that fails (the fault seam's `tandem-paging:` rules, journal/faults.py) fails
the page files for good, as a journal's does: what comes after is refused with the store's I/O
error (IO_ERROR, "may or may not have been stored"), the error the session hands its client, not
the raw OSError, which a session logs as an internal error with a traceback that grows by one
raise per message until the broker has stopped."""

from __future__ import annotations

import asyncio
import time
import traceback
from pathlib import Path

import pytest

from tandem.core.message import Message, MessageData
from tandem.errors import JournalIOError
from tandem.journal.faults import ENV
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
