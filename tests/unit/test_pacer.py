"""The broker's pacer (server/pacing.py): a connection that adds to a full buffer stops being
read, and is read again once none of the buffers it adds to is full (decisions 0051, 0085)."""

from __future__ import annotations

from tandem.server.pacing import BACKUP_LINK, PAGE_WRITER, PAGED, UPLOAD, Pacer


class Conn:
    def __init__(self) -> None:
        self.closed = False
        self.paused: list[bool] = []

    def pace(self, paused: bool) -> None:
        self.paused.append(paused)


class Pages:
    appended = 0


def test_nothing_full_pauses_nobody() -> None:
    pacer, c = Pacer(), Conn()
    pacer.wrote(c, PAGED)
    assert c.paused == [] and pacer.pauses == 0 and pacer.waiting == 0


def test_a_paged_send_waits_until_both_its_buffers_have_room() -> None:
    pacer, a, b = Pacer(), Conn(), Conn()
    pacer.full(PAGE_WRITER, True)
    pacer.wrote(a, PAGED)
    pacer.wrote(a, PAGED)  # already waiting: paused once
    pacer.full(BACKUP_LINK, True)
    pacer.wrote(b, PAGED)
    assert (a.paused, b.paused, pacer.waiting, pacer.pauses) == ([True], [True], 2, 2)
    pacer.full(PAGE_WRITER, False)  # the link is still full
    assert (a.paused, b.paused) == ([True], [True])
    pacer.full(BACKUP_LINK, False)
    assert (a.paused, b.paused, pacer.waiting, pacer.congested) == ([True, False], [True, False], 0, False)


def test_a_large_upload_waits_for_the_backup_link_only() -> None:
    pacer, up, paged = Pacer(), Conn(), Conn()
    pacer.full(PAGE_WRITER, True)
    pacer.wrote(up, UPLOAD)  # a slow page writer does not hold an upload back
    assert up.paused == []
    pacer.full(BACKUP_LINK, True)
    pacer.wrote(up, UPLOAD)
    pacer.wrote(paged, PAGED)
    pacer.full(BACKUP_LINK, False)  # the page writer is still behind: only the upload goes on
    assert (up.paused, paged.paused, pacer.waiting) == ([True, False], [True], 1)
    pacer.full(PAGE_WRITER, False)
    assert (paged.paused, pacer.waiting) == ([True, False], 0)


def test_only_a_command_that_appended_to_the_page_files_is_paced() -> None:
    pacer, c, pages = Pacer(), Conn(), Pages()
    pacer.full(PAGE_WRITER, True)
    pacer.paged(c, pages, 0)  # nothing appended
    pacer.paged(c, None, 0)  # no page files
    assert c.paused == []
    pages.appended = 3
    pacer.paged(c, pages, 0)
    assert c.paused == [True]


def test_a_closed_connection_is_not_read_again() -> None:
    pacer, c = Pacer(), Conn()
    pacer.full(PAGE_WRITER, True)
    pacer.wrote(c, PAGED)
    c.closed = True
    pacer.full(PAGE_WRITER, False)
    assert c.paused == [True] and pacer.waiting == 0
