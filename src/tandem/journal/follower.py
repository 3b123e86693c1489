"""Follow a journal that another process writes, so a backup is ready the moment it takes over.

A follower reads the same files, in the same key order, with the same record
checks (file key, CRC) and the same replay code as `Journal.load`, only
incrementally: each poll reads what was appended since the last one. It moves
past a file only at the file's EOF marker (every file but the newest has one, see
`Journal._seal`): before it, the writer may still be writing. When it is asked to
finish — after its server took the live lock, so nobody else writes any more —
it reads every file to where its records end, sealed or not, and settles torn
tails with the very code a load uses (`Journal.settle`). Its state then equals
what a cold load of the store would build.

Whatever it cannot follow safely makes it start over (`poll` returns False):
a file that vanished before it was read to its end (its deletes would be
missed), a file reclaimed while it still holds records the follower counts as
live (the deletes that killed them were in a file that came and went unread),
a file the writer recycled under it, or compaction output (copies of records
already applied: a file with a compaction key, or a key below those already
read, that appears after the first listing). A finish that meets an
unfinished compaction swap returns None and the caller loads cold.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable

from . import compactor
from . import files as jf
from . import records as rec
from .journal import FileEnd, Journal, LiveRecord

log = logging.getLogger("tandem.journal")

CHUNK = 256 * 1024
# Bytes one poll reads at most (one chunk more at worst): the poll runs on the broker's event loop,
# which also answers clients and sends a replicating backup's acknowledgements; a few ms of work.
POLL_BUDGET = 512 * 1024
_LEN = struct.Struct("<I")
# ADDs held back at most between two slices of a read (see `_apply`): a warm-up reads a backlog
# whose messages stay, and settling all of it at once would hold the loop (and, freeing it, the GIL).
HOLD_MAX = 4096
_OUTPUT_KEY = (1 << jf.KEY_SHIFT) - 1  # low bits of a key: only compaction outputs have any set

# observer(kind, user_type, id, body, live record): called for each operation that changed the live set
Observer = Callable[[int, int, int, bytes, LiveRecord], None]


def _sealed(f: jf.JFile) -> bool:
    return f.sealed


class JournalFollower:
    def __init__(self, journal: Journal, observer: Observer | None = None) -> None:
        self.j = journal
        self.observer = observer
        self.live: dict[int, LiveRecord] = {}
        self.problem: str | None = None
        self._max_key = -1
        self._listed = False
        self._gone: list[jf.JFile] = []  # files reclaimed while we still counted live records in them
        self._records: dict[int, int] = {}  # records read per file key (a torn tail is one no record follows)
        self.bytes_read = 0
        self._reading = False  # the last poll spent its budget: go on reading before listing again
        self._pending: dict[int, tuple[int, bytes, jf.JFile]] = {}  # ADDs held back (see _apply)
        self.cancelled: dict[int, int] = {}  # per user type: ADDs never applied, their DELETE read with them

    # -------------------------------------------------------------------- poll
    def poll(self, budget: int = POLL_BUDGET) -> bool | None:
        """Read what was appended; True: caught up, None: more to read (budget spent), False: start over."""
        if self.problem is not None:
            return False
        j = self.j
        if self._reading:
            # Mid-way through what the last listing found (a warm-up reads a big store in many
            # short polls): read on without listing the directory again, which opens every file.
            # A file recycled meanwhile is caught by its header; a listing comes before "caught up".
            self._reading = False
            spent = self._read_files(budget)
            if spent is None:
                return False
            self._reading = spent >= budget
            return None
        # What a listing decides (a file gone with live records in it) counts held-back ADDs too.
        self._settle_pending()
        if not j.directory.exists():
            return True
        if compactor.marker_path(j.directory, j.prefix).exists():
            return True  # a compaction swap is under way: the listing would be half old, half new
        data_files, _free, _top = jf.list_files(j.directory, j.prefix)
        present = dict(data_files)
        for key, f in list(j._files.items()):
            if key not in present:
                if not f.sealed:
                    return self._broken(f"{f.path.name} went away before it was read to its end")
                del j._files[key]
                if f.live > 0:
                    self._gone.append(f)
        for key, path in data_files:
            if key in j._files:
                continue
            if self._listed and (key < self._max_key or key & _OUTPUT_KEY):
                return self._broken(f"{path.name} appeared among the files already read (compaction output)")
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                continue  # recycled between listing and now: the next poll sees where it went
            j._files[key] = jf.JFile(key, path, size)
            self._max_key = max(self._max_key, key)
        self._listed = True
        spent = self._read_files(budget)
        if spent is None:
            return False
        if spent >= budget:
            self._reading = True
            return None
        self._settle_pending()
        # Caught up. A file is reclaimed only once every record in it is dead, and the records that
        # killed them were on disk before it went: if we still count live records in a file that is
        # gone, they died in a file that came and went between two polls, unread.
        for f in self._gone:
            if f.live > 0:
                return self._broken(f"{f.path.name} was reclaimed by deletes this follower never saw")
        self._gone.clear()
        return True

    def _read_files(self, budget: int) -> int | None:
        """Read the known files in order, up to `budget` bytes; how many were read, None to start over."""
        spent = 0
        for f in list(self.j._files.values()):
            if f.sealed:
                continue
            ok, n = self._read(f, budget - spent)
            spent += n
            if ok is False:
                return None
            if not _sealed(f) or spent >= budget:  # (a call: mypy keeps `f.sealed` narrowed to False)
                break  # an unsealed file is where the writer is: the files after it hold nothing yet
        if len(self._pending) > HOLD_MAX:
            self._settle_pending()
        self.bytes_read += spent
        return spent

    def _broken(self, why: str) -> bool:
        self.problem = why
        log.info("journal %s: follower starts over: %s", self.j.prefix, why)
        return False

    def _read(self, f: jf.JFile, budget: int) -> tuple[bool, int]:
        try:
            fd = os.open(f.path, os.O_RDONLY)
        except FileNotFoundError:
            return True, 0  # gone: the next listing decides
        spent = 0
        try:
            if jf.read_header_key(os.pread(fd, jf.FILE_HEADER_SIZE, 0)) != f.key:
                return self._broken(f"{f.path.name} was recycled before it was read to its end"), 0
            pos = f.used
            while spent < budget:
                if pos + rec.HEADER_SIZE > f.size:
                    f.sealed = True  # no room for another record, nor for a marker
                    break
                chunk = os.pread(fd, CHUNK, pos)
                parsed: list[rec.Parsed] = []
                end = rec.scan(chunk, 0, f.key, parsed)
                if end.offset == 0 and not end.eof_marker and end.reason.startswith("bad length"):
                    # a record longer than the chunk: read it whole
                    (length,) = _LEN.unpack_from(chunk, 0)
                    if rec.HEADER_SIZE <= length <= f.size - pos:
                        chunk = os.pread(fd, length, pos)
                        end = rec.scan(chunk, 0, f.key, parsed)
                if parsed:
                    self._apply(parsed, f)
                    self._records[f.key] = self._records.get(f.key, 0) + len(parsed)
                pos += end.offset
                spent += end.offset
                if end.eof_marker:
                    f.sealed = True
                    break
                more = end.reason == "end of file" or end.reason.startswith("bad length")
                if not more or end.offset == 0:
                    break  # caught up (zeros), or a record not complete yet
            f.used = pos
        finally:
            os.close(fd)
        return True, spent

    def _read_rest(self, f: jf.JFile) -> rec.ScanEnd:
        """Read a file to where its records end (the writer is gone): the end a load would find."""
        if f.sealed:
            return rec.ScanEnd(f.used, True, True, "EOF marker")
        with open(f.path, "rb") as fh:
            fh.seek(f.used)
            buf = fh.read(max(f.size - f.used, 0))
        parsed: list[rec.Parsed] = []
        end = rec.scan(buf, 0, f.key, parsed)
        if parsed:
            self._apply(parsed, f)
            self._records[f.key] = self._records.get(f.key, 0) + len(parsed)
            self._settle_pending()
        self.bytes_read += end.offset
        f.used += end.offset
        return rec.ScanEnd(f.used, end.clean, end.eof_marker, end.reason)

    def _apply(self, parsed: list[rec.Parsed], f: jf.JFile) -> None:
        j, live, observer = self.j, self.live, self.observer
        if observer is None:
            j._replay(parsed, f, live)
            return
        # An ADD waits in `_pending` until the read catches up or lists the files again
        # (`_settle_pending`): one deleted meanwhile — a message its consumer acknowledged within
        # a poll, the common case on a replicating backup — is then neither applied nor shown to
        # the observer, where it cost an index entry, a live record and two observer calls to end
        # where it began.
        pending = self._pending
        max_id = j.max_id
        for _off, _len, kind, utype, rid, body in parsed:
            if kind == rec.DELETES:
                ids = rec.unpack_ids(body)
                if ids and max(ids) > max_id:
                    max_id = max(ids)
                for did in ids:
                    held = pending.pop(did, None)
                    if held is not None:
                        f.records += 1
                        self.cancelled[held[0]] = self.cancelled.get(held[0], 0) + 1
                    else:
                        self._observed(rec.DELETE, 0, did, b"", f)
                continue
            ops = rec.decode_batch_body(body) if kind == rec.BATCH else ((kind, utype, rid, body),)
            for k, u, i, b in ops:
                if i > max_id:
                    max_id = i
                if k == rec.ADD and i not in pending and i not in live:
                    pending[i] = (u, b, f)
                    f.records += 1
                elif k == rec.DELETE and i in pending:
                    held = pending.pop(i)
                    f.records += 1
                    self.cancelled[held[0]] = self.cancelled.get(held[0], 0) + 1
                else:
                    if i in pending:
                        self._settle_pending()  # (all of them: the observer sees ADDs in journal order)
                    self._observed(k, u, i, b, f)
        j.max_id = max_id

    def _observed(self, kind: int, utype: int, rid: int, body: bytes, f: jf.JFile) -> None:
        """Apply one operation as a load does and show it to the observer if it changed the live set."""
        live = self.live
        before = live.get(rid)
        self.j._apply_loaded(kind, utype, rid, body, f, live)
        if kind == rec.DELETE:
            if before is not None:
                self.observer(kind, utype, rid, body, before)  # type: ignore[misc]
        else:
            lr = live.get(rid)
            if lr is not None:
                self.observer(kind, utype, rid, body, lr)  # type: ignore[misc]

    def _settle_pending(self) -> None:
        """Apply the ADDs held back, in journal order (their records were counted when read)."""
        pending = self._pending
        if not pending:
            return
        live, add, observer = self.live, self.j._add_live, self.observer
        assert observer is not None
        for rid, (utype, body, f) in pending.items():
            observer(rec.ADD, utype, rid, body, add(rid, utype, body, f, live))
        pending.clear()

    # ------------------------------------------------------------------ finish
    def finish(self) -> dict[int, LiveRecord] | None:
        """We hold the live lock now: read the rest, settle the tails; None if only a cold load will do.

        Raises JournalError, as a load does, if the store is damaged beyond a torn tail."""
        j = self.j
        if compactor.marker_path(j.directory, j.prefix).exists():
            return None  # the writer died in the middle of a compaction swap
        while True:
            done = self.poll()
            if done is False:
                return None
            if done:
                break
        ends = [FileEnd(f, self._read_rest(f), self._records.get(f.key, 0)) for f in list(j._files.values())]
        compactor.apply_marker(j.directory, j.prefix)  # only clears stale outputs (no marker)
        for tmp in j.directory.glob(f"{j.prefix}-*.tmp"):
            tmp.unlink()
        _data, j._free, top_key = jf.list_files(j.directory, j.prefix)
        if j._files:
            top_key = max(top_key, max(j._files))
        j.settle(ends, readonly=False)
        j._next_key = ((top_key >> jf.KEY_SHIFT) + 1) << jf.KEY_SHIFT
        j.directory.mkdir(parents=True, exist_ok=True)
        j._ensure_min_files()
        j._loaded = True
        return self.live
