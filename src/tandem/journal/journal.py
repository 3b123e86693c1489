"""The append-only journal: placement, group commit, reload, reclaim and compaction.

Everything here runs on the event loop except the writer and compactor threads.
Appends never block: they are placed (file, offset) and queued; the single
writer thread writes and syncs a whole batch at once and then every callback
registered with :meth:`Journal.after_durable` for that batch runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import msgspec

from ..errors import JournalError, JournalIOError
from . import compactor
from . import files as jf
from . import records as rec
from .faults import Faults
from .histogram import JournalMetrics
from .storeio import StoreIO, Tap
from .writer import Batch, Writer, loop_job

log = logging.getLogger("tandem.journal")
_T = TypeVar("_T")

# Where an id's live records are: (file key, live size) per record. The size is what a compaction
# would copy the record as (a plain record: header and body), so the accounting of compaction
# output equals a cold load's, and live bytes say what compacting saves. A key whose file is gone
# (retired) is skipped.
#
# Encoded so that the garbage collector never walks the index: the usual single record is one int
# (key << 40 | size), several (updates) are packed bytes, both objects the GC does not track. A
# dict holding only such values is itself untracked; one tracked value (a tuple, a list, a JFile)
# would make it tracked, put it back in the young generation at every insert, and have every
# collection walk its millions of entries (a full one held the loop 100-220 ms per million).
_Ref = tuple[int, int]
_Entry = int | bytes
_HS = rec.HEADER_SIZE
_SIZE_BITS = 40
_SIZE_MASK = (1 << _SIZE_BITS) - 1
_PAIR = struct.Struct("<QQ")

# The index is split by the id's low bits into this many dicts. One dict of a million ids resizes
# in a single step that holds the interpreter lock 30-60 ms (120 ms at 2.8M; it also recurs every
# N inserts at a steady N live ids, as deleted slots fill the table): every other thread waits, a
# backup's link thread with the acknowledgement the primary's confirmations wait for. A shard
# holds 1/64th: its resizes take under a millisecond per million ids in all (decision 0075).
_SHARDS = 64
_SHARD = _SHARDS - 1


def _refs(entry: _Entry) -> list[_Ref]:
    if type(entry) is int:
        return [(entry >> _SIZE_BITS, entry & _SIZE_MASK)]
    return list(_PAIR.iter_unpack(cast(bytes, entry)))


def _entry(refs: list[_Ref]) -> _Entry:
    if len(refs) == 1:
        k, n = refs[0]
        return (k << _SIZE_BITS) | n
    return b"".join(_PAIR.pack(k, n) for k, n in refs)


_TERMINATOR = bytes(rec.EOF_SIZE)
# `add_soon` places its ADDs by this many, or this many bytes, at the latest (and a body this
# large on its own): a BATCH record is copied whole, and must fit the journal's files.
_COALESCE_OPS = 256
_COALESCE_BYTES = 1 << 20
_SUBOP_PACK = rec.SUBOP.pack


class LiveRecord(msgspec.Struct, gc=False):
    """A live id after reload: its ADD body and its UPDATEs in journal order.

    `obj` is for a reader that builds its own objects as it goes (a backup following the journal).
    """

    user_type: int
    body: bytes
    updates: list[tuple[int, bytes]] | None = None
    obj: Any = None


class FileEnd(NamedTuple):
    """Where a read of one file stopped, and how many records it found (see `Journal.settle`)."""

    file: jf.JFile
    end: rec.ScanEnd
    records: int


@dataclass
class JournalStats:
    files: int
    free_files: int
    records: int
    live_records: int
    live_ids: int
    corrupt: list[str] = field(default_factory=list)
    compactions: int = 0
    live_bytes: int = 0  # what compacting every file would copy (the files' `live_bytes`)
    used_bytes: int = 0  # record bytes written in the data files (headers of the files not counted)


@dataclass(frozen=True)
class JournalSettings:
    file_size: int = 10 * 1024 * 1024
    min_files: int = 2
    pool_files: int = 10
    buffer_timeout_ns: int = 0
    buffer_size: int = 490 * 1024
    compact_percentage: int = 30
    compact_min_files: int = 10
    datasync: bool = True


def _run_callbacks(callbacks: list[Callable[[], None]]) -> None:
    for cb in callbacks:
        try:
            cb()
        except Exception:
            log.exception("journal callback failed")


class Journal:
    def __init__(self, directory: Path, prefix: str, settings: JournalSettings, tap: Tap | None = None) -> None:
        self.directory = Path(directory)
        self.prefix = prefix
        self.s = settings
        # A replicating primary's stream (ha/replication.py): every change to the directory goes to
        # it, and a batch's callbacks wait for the backup as well as the disk.
        self.tap = tap
        self._position = 0  # the stream position of the last batch written
        self._files: dict[int, jf.JFile] = {}
        self._index: tuple[dict[int, _Entry], ...] = tuple({} for _ in range(_SHARDS))  # by rid & _SHARD
        self._cur: jf.JFile | None = None
        self._cur_off = 0
        self._next_key = 1 << jf.KEY_SHIFT
        self._pending = Batch()
        self._coalesced: list[bytes] = []  # ADDs of this loop pass not placed yet (`add_soon`)
        self._coalesced_ids: list[int] = []
        self._coalesced_bytes = 0
        self._inflight: Batch | None = None
        self._flush_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: Writer | None = None
        self._free: list[Path] = []
        self.failed: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self._on_fail_waiters: list[Callable[[], None]] = []  # stop()'s final flush: ends on a failure too
        self.corrupt: list[str] = []
        self.torn: list[FileEnd] = []
        self.torn_tails: list[str] = []
        self.compactions = 0
        self.compaction_seconds = 0.0  # the compactions' durations added up (/metrics)
        self.last_compaction: tuple[float, float] | None = None  # (Unix time it ended, seconds it took)
        self._compaction_began = 0.0
        self.metrics = JournalMetrics()  # the writer thread's per-batch histograms (decision 0068)
        # Compaction state
        self._compacting = False
        self._freeze_key = -1
        self._compact_after: Batch | None = None
        self._compact_thread: threading.Thread | None = None
        self._compact_stop = threading.Event()
        self.max_id = 0
        self._loaded = False
        self._faults = Faults.from_env(prefix)  # tests only (journal/faults.py)

    # ------------------------------------------------------------------ load
    def load(self, readonly: bool = False, repair: bool = False) -> dict[int, LiveRecord]:
        """Replay every file (start-up, blocking); returns live ids in first-append order.

        `readonly` (inspection tools) changes nothing on disk: no torn-tail repair,
        no interrupted compaction finished, no files created. Damage that cannot be a torn
        write (see `settle`) raises JournalError unless `repair` (`tandem data repair`) is
        given, which keeps a copy of each damaged file and cuts it at the damage.
        """
        if not readonly:
            self.directory.mkdir(parents=True, exist_ok=True)
            compactor.apply_marker(self.directory, self.prefix)
            for tmp in self.directory.glob(f"{self.prefix}-*.tmp"):
                tmp.unlink()
        data_files, self._free, top_key = jf.list_files(self.directory, self.prefix)
        live: dict[int, LiveRecord] = {}
        ends: list[FileEnd] = []
        for key, path in data_files:
            with open(path, "rb") as fh:
                buf = fh.read()
            f = jf.JFile(key, path, len(buf))
            parsed: list[rec.Parsed] = []
            end = rec.scan(buf, jf.FILE_HEADER_SIZE, key, parsed)
            del buf
            f.used = end.offset
            self._files[key] = f  # before its records: a DELETE of one of them finds its file
            self._replay(parsed, f, live)
            ends.append(FileEnd(f, end, len(parsed)))
        if self._files:
            top_key = max(top_key, max(self._files))
        self.settle(ends, readonly, repair)
        self._next_key = ((top_key >> jf.KEY_SHIFT) + 1) << jf.KEY_SHIFT
        if not readonly:
            self._ensure_min_files()
        self._loaded = True
        return live

    def settle(self, ends: list[FileEnd], readonly: bool, repair: bool = False) -> None:
        """Judge where each file's records end, and where appends go next (a load and a
        follower's finish both end here, so a backup's takeover equals a cold load).

        A file that ends in its EOF marker is complete. A file that ends cleanly (zeros)
        without one is sealed now if another file follows it: a reader that follows a live
        journal moves past a file only at its marker. An unclean end (a bad CRC, a record
        cut short, stale bytes) is a torn tail when no later file holds a record: the writer
        writes a batch in file order and reports it only when all of it is on disk, so
        nothing after such a point was ever confirmed; it is zeroed (and sealed). An unclean
        end followed by records in a later file is damage, not a torn write: it is reported,
        and the journal refuses to start unless asked to repair it."""
        self.torn = []
        self.corrupt = []
        damaged: list[FileEnd] = []
        later = 0
        for fe in reversed(ends):
            end = fe.end
            if not end.clean:
                (self.torn if later == 0 else damaged).append(fe)
            later += fe.records
        damaged.reverse()
        self.torn.reverse()
        self.corrupt = [f"{fe.file.path.name}: {fe.end.reason}" for fe in damaged]
        self.torn_tails = [f"{fe.file.path.name}: {fe.end.reason}" for fe in self.torn]
        for msg in self.corrupt:
            log.warning("journal %s: damaged: %s", self.prefix, msg)
        if readonly:
            self._place_after(ends)
            return
        if damaged and not repair:
            raise JournalError(
                f"journal {self.prefix} in {self.directory} is damaged ({'; '.join(self.corrupt)}): valid records "
                "follow the damage, so it is not a torn write. Inspect it with `tandem data print`; "
                "`tandem data repair` keeps a copy of each damaged file and cuts it at the damage."
            )
        for fe in damaged:
            kept = self._keep_copy(fe.file)
            name, offset = fe.file.path.name, fe.end.offset
            log.warning("journal %s: %s cut at offset %d (copy kept as %s)", self.prefix, name, offset, kept)
        last = ends[-1].file if ends else None
        for fe in ends:
            f, end = fe.file, fe.end
            if not end.clean:
                if fe in self.torn:
                    log.warning("journal %s: torn tail truncated (%s: %s)", self.prefix, f.path.name, end.reason)
                self._cut(f, end.offset, seal=f is not last)
            elif not end.eof_marker and f is not last and end.offset + rec.EOF_SIZE <= f.size:
                self._cut(f, end.offset, seal=True)
        self._place_after(ends)

    def _place_after(self, ends: list[FileEnd]) -> None:
        if not ends:
            return
        last = ends[-1]
        self._cur = last.file
        full = last.end.eof_marker or last.end.offset + rec.EOF_SIZE > last.file.size
        self._cur_off = last.file.size if full else last.end.offset

    @property
    def started(self) -> bool:
        """Whether records may be written (start ran, no stop since)."""
        return self._writer is not None

    @property
    def torn_tail(self) -> str | None:
        """The torn tails a load found (repaired unless read-only), or None."""
        return "; ".join(self.torn_tails) if self.torn_tails else None

    def _keep_copy(self, f: jf.JFile) -> Path:
        """Copy a damaged file aside before cutting it (`tandem data repair`)."""
        keep = self.directory / "damaged"
        keep.mkdir(exist_ok=True)
        dst = keep / f"{f.path.name}.{time.strftime('%Y%m%dT%H%M%S')}"
        shutil.copyfile(f.path, dst)
        with open(dst, "rb") as fh:
            os.fsync(fh.fileno())
        jf.fsync_dir(keep)
        return dst

    def _replay(self, parsed: list[rec.Parsed], f: jf.JFile, live: dict[int, LiveRecord]) -> None:
        """Apply one file's records (the reload hot loop: plain ADDs are inlined)."""
        index = self._index
        max_id = self.max_id
        add, batch = rec.ADD, rec.BATCH
        for _off, _len, kind, utype, rid, body in parsed:
            if rid > max_id:
                max_id = rid
            if kind == add and rid not in live:
                live[rid] = LiveRecord(utype, body)
                n = _HS + len(body)
                index[rid & _SHARD][rid] = (f.key << _SIZE_BITS) | n
                f.live += 1
                f.live_bytes += n
                f.records += 1
            elif kind == batch:
                for op in rec.decode_batch_body(body):
                    if op.id > max_id:
                        max_id = op.id
                    self._apply_loaded(op.kind, op.user_type, op.id, op.body, f, live)
            elif kind == rec.DELETES:
                for did in rec.unpack_ids(body):
                    f.records += 1
                    if live.pop(did, None) is not None:
                        self._detach(did)
            else:
                self._apply_loaded(kind, utype, rid, body, f, live)
        self.max_id = max_id

    def _apply_loaded(
        self, kind: int, utype: int, rid: int, body: bytes, f: jf.JFile, live: dict[int, LiveRecord]
    ) -> None:
        f.records += 1
        if kind == rec.ADD:
            if rid in live:
                self._attach(rid, f, _HS + len(body))
                lr = live[rid]
                lr.updates = [*(lr.updates or []), (utype, body)]
            else:
                self._add_live(rid, utype, body, f, live)
        elif kind == rec.UPDATE:
            lr2 = live.get(rid)
            if lr2 is not None:
                self._attach(rid, f, _HS + len(body))
                if lr2.updates is None:
                    lr2.updates = [(utype, body)]
                else:
                    lr2.updates.append((utype, body))
        elif kind == rec.DELETE:
            if live.pop(rid, None) is not None:
                self._detach(rid)

    def _add_live(self, rid: int, utype: int, body: bytes, f: jf.JFile, live: dict[int, LiveRecord]) -> LiveRecord:
        """A new live id read from file `f` (its record already counted in `f.records`)."""
        lr = live[rid] = LiveRecord(utype, body)
        n = _HS + len(body)
        self._index[rid & _SHARD][rid] = (f.key << _SIZE_BITS) | n
        f.live += 1
        f.live_bytes += n
        return lr

    def _cut(self, f: jf.JFile, offset: int, seal: bool) -> None:
        """Zero a file from `offset` to its end, with an EOF marker there when `seal` (synced)."""
        tail = bytearray(f.size - offset)
        if seal and len(tail) >= rec.EOF_SIZE:
            tail[: rec.EOF_SIZE] = rec.encode(f.key, rec.EOF, 0, 0)
        fd = os.open(f.path, os.O_RDWR)
        try:
            os.pwrite(fd, tail, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        f.used = offset

    def _ensure_min_files(self) -> None:
        have = len(self._files) + len(self._free)
        n = 0
        while have < self.s.min_files:
            n += 1
            while True:
                p = self.directory / jf.free_name(self.prefix, n)
                if not p.exists():
                    break
                n += 1
            jf.create_zeroed(p, self.s.file_size, None)
            self._free.append(p)
            have += 1
        jf.fsync_dir(self.directory)

    # ------------------------------------------------------------- lifecycle
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Begin accepting appends (after load())."""
        if not self._loaded:
            self.load()
        self._loop = loop or asyncio.get_running_loop()
        self._writer = self._make_writer(self._threadsafe_done, self._threadsafe_fail)
        self._writer.start()

    def start_sync(self) -> None:
        """Accept appends without an event loop: each flush() writes inline (CLI tools)."""
        if not self._loaded:
            self.load()
        self._writer = self._make_writer(lambda b, e: None)

    def _make_writer(
        self, done: Callable[[Batch, BaseException | None], None], failed: Callable[[BaseException], None] | None = None
    ) -> Writer:
        s = self.s
        w = Writer(
            self.directory,
            self.prefix,
            s.file_size,
            s.pool_files,
            s.datasync,
            self._free,
            done,
            failed,
            self._faults,
            StoreIO(self.directory, self.tap),
            self.metrics,
        )
        for key, f in self._files.items():
            w.adopt(key, f.path)
        return w

    async def stop(self) -> None:
        """Flush what is pending, then stop the threads."""
        self._drain()
        self._compact_stop.set()
        if self._compact_thread is not None:
            await asyncio.to_thread(self._compact_thread.join)
        if self.failed is None and self._writer is not None and (self._pending.writes or self._inflight):
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def finished() -> None:
                if not done.done():
                    done.set_result(None)

            self.after_durable(finished)  # (a failed batch runs no callbacks: nothing in it is durable)
            self._on_fail_waiters.append(finished)
            try:
                await asyncio.wait_for(done, 30)
            except TimeoutError:
                log.error("journal %s: final flush timed out", self.prefix)
            finally:
                self._on_fail_waiters.remove(finished)
        if self._writer is not None:
            await asyncio.to_thread(self._writer.stop)
            self._writer = None

    def on_writer(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        """Run `fn` on the writer thread, between two batches (nothing of this journal's own
        changes its directory meanwhile); its result, or its error, on the loop."""
        loop = self._loop
        assert loop is not None and self._writer is not None
        fut, job = loop_job(loop, fn)
        self._writer.submit(job)
        return fut

    def close_sync(self) -> None:
        self.flush_sync()
        if self._writer is not None:
            self._writer.close_all()
            self._writer = None

    # --------------------------------------------------------------- appends
    def add_soon(self, rid: int, user_type: int, body: bytes) -> None:
        """An ADD that may share one BATCH record with the other ADDs of this loop pass.

        Every record costs its own header, CRC, placement and bookkeeping; the hundred
        messages of one client read then cost one. Anything else done to or asked of the
        journal first places them, in order, so no operation can overtake them (a DELETE
        placed before its ADD would bring the message back on reload)."""
        if self._loop is None or len(body) >= _COALESCE_BYTES or self.failed is not None:
            self.add(rid, user_type, body)  # (add raises if the journal has failed)
            return
        co = self._coalesced
        co.append(_SUBOP_PACK(rec.ADD, user_type, rid, len(body)))  # the BATCH member, ready to join
        co.append(body)
        self._coalesced_ids.append(rid)
        self._coalesced_bytes += len(body)
        if len(co) == 2:
            self._loop.call_soon(self._drain)
        elif len(co) >= 2 * _COALESCE_OPS or self._coalesced_bytes >= _COALESCE_BYTES:
            self._drain()

    def _drain(self) -> None:
        """Place the coalesced ADDs: one record for all of them (a BATCH: all or none).

        Every other operation calls this first (a no-op when nothing is coalesced)."""
        co = self._coalesced
        if not co:
            return
        ids = self._coalesced_ids
        self._coalesced = []
        self._coalesced_ids = []
        self._coalesced_bytes = 0
        if self.failed is not None:
            return  # nothing more is written: their confirmations never come
        if len(ids) == 1:
            _, user_type, rid, _ = rec.SUBOP.unpack(co[0])
            self.add(rid, user_type, co[1])
            return
        body = b"".join(co)
        f, off = self._place(rec.HEADER_SIZE + len(body))
        self._write(f, off, rec.encode(f.key, rec.BATCH, 0, 0, body))
        f.records += len(ids)
        index = self._index
        for i, rid in enumerate(ids):  # _count_op for an ADD, inline: this runs for every message
            n = _HS + len(co[2 * i + 1])
            shard = index[rid & _SHARD]
            if rid in shard:
                self._attach(rid, f, n)
            else:
                shard[rid] = (f.key << _SIZE_BITS) | n
                f.live += 1
                f.live_bytes += n

    def add(self, rid: int, user_type: int, body: bytes) -> None:
        self._drain()
        f, off = self._place(rec.HEADER_SIZE + len(body))
        self._write(f, off, rec.encode(f.key, rec.ADD, user_type, rid, body))
        self._count_op(rec.ADD, rid, f, _HS + len(body))

    def update(self, rid: int, user_type: int, body: bytes) -> None:
        self._drain()
        f, off = self._place(rec.HEADER_SIZE + len(body))
        self._write(f, off, rec.encode(f.key, rec.UPDATE, user_type, rid, body))
        self._count_op(rec.UPDATE, rid, f, _HS + len(body))

    def delete(self, rid: int) -> None:
        self._drain()
        f, off = self._place(rec.HEADER_SIZE)
        self._write(f, off, rec.encode(f.key, rec.DELETE, 0, rid))
        self._count_op(rec.DELETE, rid, f, 0)

    def delete_many(self, rids: list[int]) -> None:
        """Delete several ids with one record."""
        self._drain()
        if len(rids) == 1:
            self.delete(rids[0])
            return
        body = rec.pack_ids(rids)
        f, off = self._place(rec.HEADER_SIZE + len(body))
        self._write(f, off, rec.encode(f.key, rec.DELETES, 0, 0, body))
        f.records += len(rids)
        self._detach_all(rids)

    def batch(self, ops: Iterable[rec.Op]) -> None:
        """Append several operations as one record: after a crash all or none of them exist."""
        self._drain()
        ops = list(ops)
        if not ops:
            return
        if len(ops) == 1:
            op = ops[0]
            if op.kind == rec.ADD:
                self.add(op.id, op.user_type, op.body)
            elif op.kind == rec.UPDATE:
                self.update(op.id, op.user_type, op.body)
            else:
                self.delete(op.id)
            return
        body = rec.encode_batch_body(ops)
        f, off = self._place(rec.HEADER_SIZE + len(body))
        self._write(f, off, rec.encode(f.key, rec.BATCH, 0, 0, body))
        for op in ops:
            self._count_op(op.kind, op.id, f, _HS + len(op.body))

    def contains(self, rid: int) -> bool:
        self._drain()
        return rid in self._index[rid & _SHARD]

    def after_durable(self, cb: Callable[[], None]) -> None:
        """Run `cb` on the loop once everything appended so far is on disk."""
        self._drain()
        if self._pending.writes:
            self._pending.callbacks.append(cb)
        elif self._inflight is not None:
            self._inflight.callbacks.append(cb)
        elif self.tap is not None and self._position:
            self.tap.after_acked(self._position, cb)  # on disk here; the backup may not have it yet
        else:
            cb()

    @property
    def idle(self) -> bool:
        self._drain()
        return not self._pending.writes and self._inflight is None

    @property
    def settled(self) -> bool:
        """Idle, and (a replicating primary) no batch has gone to a backup: nothing it may lack.
        False is only a hint to ask `after_durable`, which waits for the backup if it must."""
        return self.idle and not self._position

    @property
    def pending_bytes(self) -> int:
        self._drain()
        return self._pending.nbytes + (self._inflight.nbytes if self._inflight else 0)

    # ------------------------------------------------------------ placement
    def _check(self) -> None:
        if self.failed is not None:
            raise JournalIOError(f"journal {self.prefix} has failed: {self.failed}")
        if self._writer is None:
            raise JournalError(f"journal {self.prefix} is not started")

    def _place(self, size: int) -> tuple[jf.JFile, int]:
        self._check()
        cur = self._cur
        if cur is None or self._cur_off + size + rec.EOF_SIZE > cur.size:
            self._seal()
            cur = self._roll(size)
        off = self._cur_off
        self._cur_off = off + size
        cur.used = self._cur_off
        return cur, off

    def _seal(self) -> None:
        """End the current file with its EOF marker: appends go to a new file from now on.

        Every file but the newest ends with one (placement always keeps room for it), so
        a reader that follows the journal knows when a file is complete."""
        cur = self._cur
        if cur is not None:
            if self._cur_off + rec.EOF_SIZE <= cur.size:
                self._write(cur, self._cur_off, rec.encode(cur.key, rec.EOF, 0, 0))
            self._cur_off = cur.size

    def _roll(self, size: int) -> jf.JFile:
        key = self._next_key
        self._next_key += 1 << jf.KEY_SHIFT
        fsize = max(self.s.file_size, jf.FILE_HEADER_SIZE + size + rec.EOF_SIZE)
        f = jf.JFile(key, self.directory / jf.data_name(self.prefix, key), fsize)
        self._files[key] = f
        self._pending.new_files[key] = fsize
        self._cur = f
        self._cur_off = jf.FILE_HEADER_SIZE
        return f

    def _write(self, f: jf.JFile, off: int, data: bytes) -> None:
        p = self._pending
        p.writes.append((f.key, off, data))
        p.nbytes += len(data)
        if self._flush_handle is None and self._inflight is None and self._loop is not None:
            timeout = self.s.buffer_timeout_ns
            if timeout <= 0 or p.nbytes >= self.s.buffer_size:
                self._flush_handle = self._loop.call_soon(self._handoff)
            else:
                self._flush_handle = self._loop.call_later(timeout / 1e9, self._handoff)
        elif self._flush_handle is not None and p.nbytes >= self.s.buffer_size and self._inflight is None:
            self._flush_handle.cancel()
            self._flush_handle = self._loop.call_soon(self._handoff) if self._loop else None

    def _count_op(self, kind: int, rid: int, f: jf.JFile, size: int) -> None:
        """Account one operation written to `f`; `size` is its live size (header and body)."""
        f.records += 1
        shard = self._index[rid & _SHARD]
        if kind == rec.ADD:
            if rid in shard:
                self._attach(rid, f, size)
            else:
                shard[rid] = (f.key << _SIZE_BITS) | size
                f.live += 1
                f.live_bytes += size
        elif kind == rec.UPDATE:
            if rid in shard:
                self._attach(rid, f, size)
        else:
            self._detach(rid)

    def _attach(self, rid: int, f: jf.JFile, size: int) -> None:
        """One more live record of a live id (an UPDATE, or an ADD of an id that is live)."""
        shard = self._index[rid & _SHARD]
        shard[rid] = _entry([*_refs(shard[rid]), (f.key, size)])
        f.live += 1
        f.live_bytes += size

    def _detach(self, rid: int) -> None:
        self._detach_all((rid,))

    def _detach_all(self, rids: Iterable[int]) -> None:
        """Forget ids' records; many in one loop (every acknowledged message comes through here)."""
        index = self._index
        files = self._files
        for rid in rids:
            entry = index[rid & _SHARD].pop(rid, None)
            if entry is None:
                continue
            if type(entry) is int:
                g = files.get(entry >> _SIZE_BITS)
                if g is not None:
                    g.live -= 1
                    g.live_bytes -= entry & _SIZE_MASK
            else:
                for k, n in _refs(entry):
                    g = files.get(k)
                    if g is not None:
                        g.live -= 1
                        g.live_bytes -= n

    # --------------------------------------------------------- group commit
    def _handoff(self) -> None:
        self._flush_handle = None
        self._drain()
        if self._inflight is not None or not self._pending.writes or self._writer is None:
            return
        batch = self._pending
        self._pending = Batch()
        self._terminate(batch)
        batch.recycle = self._reclaimable()
        self._inflight = batch
        self._writer.submit(batch)

    def _terminate(self, batch: Batch) -> None:
        """Zero the bytes after the batch's last record: a recycled file's stale bytes must not
        follow a clean stop (the space is always there: placement keeps room for an EOF record)."""
        cur = self._cur
        if cur is not None and self._cur_off + rec.EOF_SIZE <= cur.size:
            batch.writes.append((cur.key, self._cur_off, _TERMINATOR))

    def _threadsafe_done(self, batch: Batch, err: BaseException | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_done, batch, err)

    def _threadsafe_fail(self, err: BaseException) -> None:
        """An I/O error outside a batch's write (recycling, a spare file, a compaction swap)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._fail, err)

    def _on_done(self, batch: Batch, err: BaseException | None) -> None:
        if err is None:
            self._drain()  # placed while a batch is in flight: they go with the next one at once
        self._inflight = None
        if err is not None:
            self._fail(err)
            return
        if batch.position and self.tap is not None:
            self._position = batch.position
            if batch.callbacks:
                self.tap.after_acked(batch.position, partial(_run_callbacks, batch.callbacks))
        else:
            _run_callbacks(batch.callbacks)
        if batch is self._compact_after:
            self._compact_after = None
            if self._compact_stop.is_set():
                self._compacting = False  # stopping: never start a compactor that would outlive stop()
            else:
                self._start_compactor()
        if self._pending.writes and self._flush_handle is None:
            self._handoff()
        if not self._compacting:
            self._maybe_compact()

    def halt(self, err: BaseException) -> None:
        """Stop writing, as after an I/O error, for a reason the owner reports itself."""
        if self.failed is None:
            self.failed = err

    def _fail(self, err: BaseException) -> None:
        """The first I/O error ends the journal: nothing more is written or confirmed (once)."""
        if self.failed is not None:
            return
        self.failed = err
        if self.on_failure is not None:
            self.on_failure(err)  # the owner reports it (once) and stops
        else:
            log.critical("journal %s failed, no further appends: %s", self.prefix, err)
        for waiter in list(self._on_fail_waiters):
            waiter()

    def flush_sync(self) -> None:
        """Write and sync what is pending on the calling thread (CLI tools, no loop)."""
        self._drain()
        if self._writer is None or not self._pending.writes:
            return
        batch = self._pending
        self._pending = Batch()
        self._terminate(batch)
        batch.recycle = self._reclaimable()
        self._writer.write_batch(batch)
        self._writer.recycle(batch)
        for cb in batch.callbacks:
            cb()

    def _reclaimable(self) -> list[tuple[int, Path, int]]:
        """The oldest files, up to the first that holds a live byte: a file's DELETEs must stay on
        disk as long as an older file may hold a record they killed. Compaction moves live records
        out of the way (see `needs_compaction`)."""
        out: list[tuple[int, Path, int]] = []
        for key, f in list(self._files.items()):
            if f is self._cur or f.live_bytes > 0 or (self._compacting and key <= self._freeze_key):
                break
            del self._files[key]
            out.append((key, f.path, f.size))
        return out

    # ----------------------------------------------------------- compaction
    def needs_compaction(self) -> bool:
        """Enough files, and their live bytes under journal-compact-percentage of the bytes written.

        Judged by bytes, as a compaction costs (it copies the live bytes) and saves (the rest): a
        small record that stays live next to each large one that died (a dedup id beside its
        acknowledged message) is a third of the records but a few percent of the bytes."""
        if self.s.compact_min_files <= 0 or len(self._files) < self.s.compact_min_files:
            return False
        used = live = 0
        for f in self._files.values():
            used += f.used - jf.FILE_HEADER_SIZE
            live += f.live_bytes
        return used > 0 and live * 100 < self.s.compact_percentage * used

    def _maybe_compact(self) -> None:
        if self._writer is not None and self._loop is not None and self.failed is None and self.needs_compaction():
            self.compact_online()

    def compact_online(self) -> None:
        """Freeze every current file and compact them behind the writer's back."""
        self._drain()
        if self._compacting or not self._files:
            return
        self._compacting = True
        self._freeze_key = max(self._files)
        self._seal()  # the next append rolls to a new file
        if self._pending.writes:
            self._compact_after = self._pending
        elif self._inflight is not None:
            self._compact_after = self._inflight
        else:
            self._start_compactor()

    def _frozen(self) -> list[tuple[int, Path, int]]:
        return [(k, f.path, f.used) for k, f in self._files.items() if k <= self._freeze_key]

    def _start_compactor(self) -> None:
        self._compaction_began = time.monotonic()
        plan = compactor.Plan(self._frozen())
        loop = self._loop
        assert loop is not None

        def work() -> None:
            try:
                io = StoreIO(self.directory, self.tap)
                ok = compactor.run(
                    self.directory, self.prefix, self.s.file_size, plan, self._compact_stop, self._faults, io
                )
            except BaseException as exc:  # an I/O error, like any other, ends the journal
                self._threadsafe_fail(exc)
                ok = False
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._compacted, plan, ok)

        self._compact_thread = threading.Thread(target=work, name=f"compact-{self.prefix}", daemon=True)
        self._compact_thread.start()

    def _compacted(self, plan: compactor.Plan, ok: bool) -> None:
        if not ok or self._writer is None or self.failed is not None:
            io = StoreIO(self.directory, self.tap)
            for o in plan.outputs:
                io.unlink(o.tmp.name, missing_ok=True)
            io.flush()
            self._compacting = False
            return
        writer = self._writer
        loop = self._loop
        assert loop is not None

        def swap_job() -> None:
            for key, _p, _u in plan.frozen:
                writer.forget(key)
            compactor.swap(self.directory, self.prefix, plan, self._faults, writer.io)
            for o in plan.outputs:
                writer.adopt(o.key, o.final)
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._swapped, plan)

        writer.submit(swap_job)

    def _swapped(self, plan: compactor.Plan) -> None:
        self._install(plan)
        self._compacting = False
        self.compactions += 1
        self.last_compaction = (time.time(), time.monotonic() - self._compaction_began)
        self.compaction_seconds += self.last_compaction[1]
        log.info("journal %s compacted: %d records copied, %d dropped", self.prefix, plan.copied, plan.dead)
        # The batches that completed meanwhile were not judged (and the last of a drained queue's
        # acknowledgements may be among them): judge now, or the garbage waits for the next append.
        self._maybe_compact()

    def _install(self, plan: compactor.Plan) -> None:
        """Point the index at the compacted files instead of the frozen ones.

        The first time an id is met in the outputs all its frozen references go
        (the outputs hold exactly its frozen records); each output record then adds one.
        """
        frozen = {k for k, _p, _u in plan.frozen}
        files = {k: f for k, f in self._files.items() if k not in frozen}
        for o in plan.outputs:
            nf = jf.JFile(o.key, o.final, o.size, used=o.used)
            files[nf.key] = nf
            for rid, size in zip(o.ids, o.sizes, strict=True):
                nf.records += 1
                shard = self._index[rid & _SHARD]
                entry = shard.get(rid)
                if entry is None:
                    continue
                refs = _refs(entry)
                if any(k in frozen for k, _n in refs):
                    refs = [r for r in refs if r[0] not in frozen]
                refs.append((nf.key, size))
                nf.live += 1
                nf.live_bytes += size
                shard[rid] = _entry(refs)
        self._files = dict(sorted(files.items()))

    def compact_offline(self) -> compactor.Plan:
        """Compact every file of a stopped broker (CLI `tandem data compact`)."""
        if not self._loaded:
            self.load()
        plan = compactor.Plan([(k, f.path, f.used) for k, f in self._files.items()])
        if not plan.frozen:
            return plan
        compactor.run(self.directory, self.prefix, self.s.file_size, plan)
        compactor.swap(self.directory, self.prefix, plan)
        self.compactions += 1
        return plan

    # --------------------------------------------------------------- stats
    def stats(self) -> JournalStats:
        self._drain()
        return JournalStats(
            files=len(self._files),
            free_files=len(self._writer.free) if self._writer else len(self._free),
            records=sum(f.records for f in self._files.values()),
            live_records=sum(f.live for f in self._files.values()),
            live_ids=self.live_ids(),
            corrupt=list(self.corrupt),
            compactions=self.compactions,
            live_bytes=sum(f.live_bytes for f in self._files.values()),
            used_bytes=sum(f.used - jf.FILE_HEADER_SIZE for f in self._files.values()),
        )

    def live_ids(self) -> int:
        return sum(len(shard) for shard in self._index)

    def ids(self) -> set[int]:
        """Every live id (tests, tools)."""
        return {rid for shard in self._index for rid in shard}

    def file_summaries(self) -> list[jf.JFile]:
        self._drain()
        return list(self._files.values())
