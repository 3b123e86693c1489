"""An open transaction's sends, paged as they arrive (decision 0055).

A transaction that sends to a PAGE address that pages (or that its own held messages, or the
open transactions' together, would fill) writes those sends at once to files of its own, one
run of files per address (`a<address id>-t<page transaction>-<n>.page`, up to `page-size-bytes`
each), instead of holding them in the session: memory stays bounded however long it stays open.

- Commit: the files are renamed into the address's page sequence, after its last page (the
  page being written is closed), each queue's sequences for them are taken then (records hold
  1, 2, ... per queue; the PAGE_TX record says where each queue's start), and the commit goes on
  as decision 0049's: PAGE_TX and the rest of the transaction are journaled once the page writes
  and the renames are durable, and only then are its records read. So a queue reads the
  transaction's messages in commit order, as it would have from memory, and never stalls on an
  open transaction: until the commit they are not in its pages at all.
- Rollback (explicit, the session closed, the connection dropped): the files are deleted.
- A start deletes the files left by a transaction that never committed (a crash, a failover):
  a committed one's were renamed before its PAGE_TX was written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .queue import now_ms

if TYPE_CHECKING:
    from .message import Message
    from .paging import AddressPager
    from .queue import Queue


class _Run:
    """One address's files of the transaction."""

    __slots__ = ("files", "pager", "per_queue", "write_bytes")

    def __init__(self, pager: AddressPager) -> None:
        self.pager = pager
        self.files: list[int] = []  # records per file (file n is files[n - 1])
        self.write_bytes = 0
        self.per_queue: dict[int, int] = {}  # queue id -> its records so far


class PagedTx:
    """What an open transaction has paged so far."""

    __slots__ = ("dedup", "runs", "tx")

    def __init__(self, tx: int) -> None:
        self.tx = tx  # its page transaction id
        self.runs: dict[int, _Run] = {}  # address id -> its files
        self.dedup: list[tuple[str, str, bool]] = []  # (address, dedup id, durable) of paged sends

    def pages_to(self, address_id: int) -> bool:
        return address_id in self.runs

    def write(self, pager: AddressPager, message: Message, queues: list[Queue]) -> None:
        addr = pager.addr
        run = self.runs.get(addr.id)
        if run is None:
            run = self.runs[addr.id] = _Run(pager)
        if not run.files or run.write_bytes >= addr.settings.page_size_bytes:
            run.files.append(0)
            run.write_bytes = 0
        s = queues[0].settings
        if not message.expiration and s.expiry_delay > 0:
            message.expiration = now_ms() + s.expiry_delay
        per_queue = run.per_queue
        refs = []
        for q in queues:
            n = per_queue.get(q.id, 0) + 1
            per_queue[q.id] = n
            refs.append((q.id, n))
        run.write_bytes += pager.store.append_tx(addr.id, self.tx, len(run.files), message, refs)
        run.files[-1] += 1
        if message.dedup_id is not None:
            self.dedup.append((message.address, message.dedup_id, message.durable))

    def commit(self) -> tuple[list[AddressPager], list[tuple[int, int, int]]]:
        """Make the files pages of their addresses; (the pagers, (queue id, first sequence,
        count) per queue) for the PAGE_TX record."""
        seqs: list[tuple[int, int, int]] = []
        for run in self.runs.values():
            seqs.extend(run.pager.adopt_tx(self.tx, run.files, run.per_queue))
        return [run.pager for run in self.runs.values()], seqs

    def discard(self) -> None:
        """Rolled back: the files go."""
        for aid, run in self.runs.items():
            for n in range(1, len(run.files) + 1):
                run.pager.store.discard_tx(aid, self.tx, n)
        self.runs.clear()
