"""The broker's pacer (server/pacing.py): a connection that adds to a full buffer stops being
read, and is read again only once no paced buffer is full (decisions 0051, 0085)."""

from __future__ import annotations

from tandem.server.pacing import BACKUP_LINK, PAGE_WRITER, Pacer


class Conn:
    def __init__(self) -> None:
        self.closed = False
        self.paused: list[bool] = []

    def pace(self, paused: bool) -> None:
        self.paused.append(paused)


def test_nothing_full_pauses_nobody() -> None:
    pacer, c = Pacer(), Conn()
    pacer.wrote(c)
    assert c.paused == [] and pacer.pauses == 0 and pacer.waiting == 0


def test_a_writer_waits_until_every_full_buffer_has_room() -> None:
    pacer, a, b = Pacer(), Conn(), Conn()
    pacer.full(PAGE_WRITER, True)
    pacer.wrote(a)
    pacer.wrote(a)  # already waiting: paused once
    pacer.full(BACKUP_LINK, True)
    pacer.wrote(b)
    assert (a.paused, b.paused, pacer.waiting, pacer.pauses) == ([True], [True], 2, 2)
    pacer.full(PAGE_WRITER, False)  # the link is still full
    assert (a.paused, b.paused) == ([True], [True])
    pacer.full(BACKUP_LINK, False)
    assert (a.paused, b.paused, pacer.waiting, pacer.congested) == ([True, False], [True, False], 0, False)


def test_a_closed_connection_is_not_read_again() -> None:
    pacer, c = Pacer(), Conn()
    pacer.full(PAGE_WRITER, True)
    pacer.wrote(c)
    c.closed = True
    pacer.full(PAGE_WRITER, False)
    assert c.paused == [True] and pacer.waiting == 0
