"""Page files: where the messages of a paging address go instead of memory (docs/storage.md, "Paging").

One flat directory, `paging/`, with files named `a<address id>-<page number>.page` (decision
0043): a page file is a journal-format file (the journal's header and record codec, CRC32C per
record) holding ADD records of the messages appended to it. Since decision 0086 one record holds
a run of them (PAGED_MESSAGES: a msgpack array of `PagedRecord`s, up to GROUP_BYTES, each with its
message id), so that reading back checks one CRC and makes one decoder call per run instead of
per message; pages written before hold one message per record (PAGED_MESSAGE, a `MessageRecord`
whose record id is the message id), and are read as ever. A message's position in its page (the
cursors' and acknowledgements' unit) is its place among the page's messages either way.
Page files are append-only and never recycled: a page is written once, read by the address's
queues (each through its own cursor, journaled as PAGE_CURSOR records in the message journal)
and deleted when every cursor is past it. After a restart nothing is appended to an existing
page (a torn tail stays where it is and is never read past); new messages start a new page.

An open transaction's sends to a paging address go to files of their own as they arrive,
`a<address id>-t<page transaction>-<n>.page` (decision 0055): its commit renames them into the
address's page sequence (their records keep the key they were written with, the page
transaction: the file's header says which); a rollback deletes them, and a start deletes those
left by a transaction that never committed.

Writes are group-committed off the event loop as the journal's are: everything appended during
one loop pass becomes one batch for the writer thread, which writes it, syncs it and reports
back; `after_durable` callbacks run then (and, on a replicating primary, once the backup has the
batch too: every change goes through a `StoreIO`, so the replication tap sees it).

Reads for depaging are chunks (`read_soon` with a limit): the `pread` in a worker thread, the
records decoded on the loop (docs/storage.md, "Reading back").
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import crc32c
import msgspec

from ..core.message import Message
from ..core.paging import PagedRecord
from ..errors import JournalIOError
from ..journal import files as jf
from ..journal import records as rec
from ..journal.faults import Faults
from ..journal.records import _CRC_FROM
from ..journal.storeio import StoreIO, Tap
from ..journal.writer import loop_job
from .records import RecordType, encoder

log = logging.getLogger("tandem.paging")
_T = TypeVar("_T")

_NAME = re.compile(r"^a(\d{1,19})-(\d{10})\.page$")
_TX_NAME = re.compile(r"^a\d{1,19}-t\d{1,19}-\d{6}\.page$")
_dec_record = msgspec.msgpack.Decoder(PagedRecord)  # MessageRecord's layout, read back
_dec_run = msgspec.msgpack.Decoder(list[PagedRecord])  # a PAGED_MESSAGES record's body

# A run's record is sealed once its messages take this many bytes: a depaging read (READ_BYTES,
# 1 MiB) holds several, and one torn or damaged record never takes more than this many with it.
GROUP_BYTES = 128 * 1024


def _array_head(n: int) -> bytes:
    """msgpack's array header for `n` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def encode_run(items: list[bytes]) -> bytes:
    """A PAGED_MESSAGES record's body from encoded `PagedRecord`s (`encode_item`)."""
    return _array_head(len(items)) + b"".join(items)


def encode_item(message: Message, refs: list[tuple[int, int]], tx: int) -> bytes:
    """One message of a run: `PagedRecord`'s layout (MessageRecord's, then the message id)."""
    raw = message.raw
    if type(raw) is not msgspec.Raw:
        raw = msgspec.Raw(raw)
    return encoder.encode(PagedRecord(refs, raw, message.expiration or 0, None, 0, tx, message.id))


FAULTS_PREFIX = "tandem-paging"  # the fault seam's rules for page files (journal/faults.py)


def page_name(address_id: int, page: int) -> str:
    return f"a{address_id}-{page:010d}.page"


def tx_page_name(address_id: int, tx: int, n: int) -> str:
    """File `n` of an open transaction's sends to an address (not a page until its commit)."""
    return f"a{address_id}-t{tx}-{n:06d}.page"


def is_tx_page_name(name: str) -> bool:
    return _TX_NAME.match(name) is not None


def page_key(data: bytes, page: int) -> int:
    """The key a page's records carry: its header's (a page that was a transaction's file keeps
    the page transaction's), else its number."""
    key = jf.read_header_key(data[: jf.FILE_HEADER_SIZE])
    return page if key is None else key


def parse_page_name(name: str) -> tuple[int, int] | None:
    m = _NAME.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def decode_page(data: bytes, page: int, start: int = jf.FILE_HEADER_SIZE) -> tuple[list[PagedRecord], int, str]:
    """The records of a page file's bytes from `start`: (messages, where the valid records end, why the scan stopped).

    The common records (whole, valid ADDs of PAGED_MESSAGES or PAGED_MESSAGE) are checked and
    decoded here, straight from the buffer; at the first other one the journal's scan takes
    over, for its rules and its reason. Each message's bytes are its own copy, so that no
    message keeps the read buffer alive."""
    out: list[PagedRecord] = []
    pos = start
    end = len(data)
    mv = memoryview(data)
    unpack = rec.HEADER.unpack_from
    crc = crc32c.crc32c
    decode = _dec_record.decode
    decode_run = _dec_run.decode
    hs = rec.HEADER_SIZE
    add = rec.ADD
    run = RecordType.PAGED_MESSAGES
    single = RecordType.PAGED_MESSAGE
    while end - pos >= hs:
        length, rcrc, key, kind, utype, rid = unpack(data, pos)
        if kind != add or (utype != run and utype != single) or key != page or length < hs or length > end - pos:
            break
        if crc(mv[pos + _CRC_FROM : pos + length]) != rcrc:
            break
        if utype == run:
            out.extend(_owned(decode_run(mv[pos + hs : pos + length])))
        else:
            r = decode(data[pos + hs : pos + length])  # a copy of the body: its Raw keeps only that
            r.mid = rid
            out.append(r)
        pos += length
    parsed: list[rec.Parsed] = []
    stop = rec.scan(data, pos, page, parsed)
    for _off, _len, kind, utype, rid, body in parsed:
        if kind != rec.ADD:
            continue
        if utype == run:
            out.extend(_owned(decode_run(body)))
        elif utype == single:
            r = decode(bytes(body))
            r.mid = rid
            out.append(r)
    return out, stop.offset, stop.reason


def _owned(records: list[PagedRecord]) -> list[PagedRecord]:
    """A run's messages, each with a copy of its bytes (decoded, they are views of the run)."""
    for r in records:
        r.raw = r.raw.copy()
    return records


class _Run:
    """Messages appended to one page file, to be written as one PAGED_MESSAGES record."""

    __slots__ = ("items", "key", "size")

    def __init__(self, key: int) -> None:
        self.key = key
        self.items: list[bytes] = []
        self.size = 0


@dataclass
class _Batch:
    creates: list[tuple[str, int]] = field(default_factory=list)  # (name, key)
    writes: dict[str, tuple[int, list[bytes]]] = field(default_factory=dict)  # name -> (offset, buffers)
    renames: list[tuple[str, str]] = field(default_factory=list)  # a transaction's files made pages, after the writes
    unlinks: list[str] = field(default_factory=list)
    ends: dict[str, int] = field(default_factory=dict)  # name -> end of the data once written
    callbacks: list[Callable[[], None]] = field(default_factory=list)
    position: int = 0
    size: int = 0  # bytes of messages appended (in `writes`, or in `runs` until sealed there)
    runs: dict[str, _Run] = field(default_factory=dict)  # name -> its messages not sealed into a record yet


# What the writer may have queued (appended, not yet written) before the connections that add
# to it wait (server/pacing.py, decision 0085): sends answered before their write would
# otherwise pile up in memory at a client's pace when the disk is slower.
WRITE_HIGH = 4 * 1024 * 1024
WRITE_LOW = 1024 * 1024


class PageFiles:
    """The page files of one data directory (loop thread, plus one writer thread)."""

    def __init__(self, directory: Path, datasync: bool = True, tap: Tap | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.datasync = datasync
        self.tap = tap
        self.on_failure: Callable[[BaseException], None] = lambda exc: None
        self.on_durable: Callable[[], None] = lambda: None  # new data readable (the post office depages)
        # queued bytes passed WRITE_HIGH (True) or fell to WRITE_LOW (False): the broker's Pacer
        self.on_backlog: Callable[[bool], None] = lambda behind: None
        self.queued = 0  # bytes appended and not yet written
        self.behind = False  # queued passed WRITE_HIGH and has not fallen to WRITE_LOW since
        self.appended = 0  # messages appended so far (a connection tells whether its sends were paged)
        self.failed: BaseException | None = None
        self._end: dict[str, int] = {}  # name -> bytes in its records (the loop's view: sealed runs, written or not)
        self._durable: dict[str, int] = {}  # name -> bytes written and synced
        self._keys: dict[str, int] = {}  # name -> its records' key, where that is not its page number
        self._renamed: dict[str, str] = {}  # old name -> new, until the batch that renames it is done
        self._pending: _Batch | None = None
        self._inflight: _Batch | None = None
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: queue.SimpleQueue[_Batch | Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._fds: dict[str, int] = {}
        self._halted = False
        self._batch_done: asyncio.Event | None = None
        self._position = 0  # the stream position of the last batch written (a replicating primary's)

    # ------------------------------------------------------------ start-up
    def listing(self) -> dict[int, list[int]]:
        """Page numbers per address id, in order; stray temporary files are removed (start-up)."""
        out: dict[int, list[int]] = {}
        for p in self.directory.iterdir():
            if p.name.endswith(".tmp") or _TX_NAME.match(p.name):  # a transaction's that never committed
                p.unlink(missing_ok=True)
                continue
            parsed = parse_page_name(p.name)
            if parsed is not None:
                out.setdefault(parsed[0], []).append(parsed[1])
        for pages in out.values():
            pages.sort()
        return out

    def load(self, address_id: int, page: int) -> list[PagedRecord]:
        """Every valid record of an existing page (start-up); the page is closed for appends."""
        name = page_name(address_id, page)
        data = (self.directory / name).read_bytes()
        key = page_key(data, page)
        if key != page:
            self._keys[name] = key
        records, end, reason = decode_page(data, key)
        if end < len(data) and reason != "unused space" and reason != "end of file":
            log.warning("page file %s: records end at %d of %d bytes (%s)", name, end, len(data), reason)
        self._end[name] = self._durable[name] = end
        return records

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="paging-writer", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        try:
            await self._stop()
        finally:
            self._caught_up()  # however the stop ends, nobody waits for this writer any more

    async def _stop(self) -> None:
        if self._thread is None:
            return
        while not self.idle and self.failed is None and not self._halted:  # what is pending goes out first
            if self._inflight is None:
                self._submit()
            done = self._batch_done = asyncio.Event()
            await asyncio.wait_for(done.wait(), 30)
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def on_writer(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        """Run `fn` on the writer thread between two batches (nothing of this store changes the
        directory meanwhile: a replicating primary lists it there for a backup's sync, as each
        journal's writer does); its result, or its error, on the loop."""
        loop = self._loop
        assert loop is not None and self._thread is not None
        fut, job = loop_job(loop, fn)
        self._jobs.put(job)
        return fut

    def halt(self, err: BaseException) -> None:
        """Write nothing more; what is pending is never confirmed."""
        self._halted = True
        self.failed = self.failed or err
        self._caught_up()

    def _caught_up(self) -> None:
        if self.behind:
            self.behind = False
            self.on_backlog(False)

    # -------------------------------------------------------------- writing
    def append(self, address_id: int, page: int, message: Message, refs: list[tuple[int, int]], tx: int = 0) -> int:
        """Queue one message for its page (created if new); the bytes it takes there. `tx`: the
        page transaction it belongs to (0: none), visible only once that is journaled."""
        if self.failed is not None:
            # A fresh error each time, as a failed journal raises: the session hands it to the
            # client (IO_ERROR) while the broker stops. Re-raising the stored OSError made each
            # refusal an internal error, logged with a traceback one raise longer each time.
            # (append_tx queues on as before: the batch is never written, its commit never
            # confirmed, and raising there would leave a transaction half moved to its pages.)
            raise JournalIOError(f"page files have failed: {self.failed}")
        return self._append(page_name(address_id, page), page, message, refs, tx)

    def append_tx(self, address_id: int, tx: int, n: int, message: Message, refs: list[tuple[int, int]]) -> int:
        """Queue one message of open page transaction `tx` for its file `n` (decision 0055)."""
        return self._append(tx_page_name(address_id, tx, n), tx, message, refs, tx)

    def adopt_tx(self, address_id: int, tx: int, n: int, page: int) -> None:
        """File `n` of `tx` becomes page `page` of the address (a rename after its writes)."""
        old, new = tx_page_name(address_id, tx, n), page_name(address_id, page)
        self._seal(self._pending, old)  # its last messages are written (before the rename)
        for d in (self._end, self._durable):
            if old in d:
                d[new] = d.pop(old)
        self._keys[new] = tx
        self._renamed[old] = new
        self._batch().renames.append((old, new))

    def discard_tx(self, address_id: int, tx: int, n: int) -> None:
        """File `n` of a transaction rolled back: deleted."""
        name = tx_page_name(address_id, tx, n)
        self._seal(self._pending, name)
        self._end.pop(name, None)
        self._durable.pop(name, None)
        if self.failed is None:
            self._batch().unlinks.append(name)

    def _append(self, name: str, key: int, message: Message, refs: list[tuple[int, int]], tx: int) -> int:
        item = encode_item(message, refs, tx)
        b = self._batch()
        if name not in self._end:
            self._end[name] = self._durable[name] = jf.FILE_HEADER_SIZE
            b.creates.append((name, key))
        if name not in b.writes:
            b.writes[name] = (self._end[name], [])
        r = b.runs.get(name)
        if r is None:
            r = b.runs[name] = _Run(key)
        r.items.append(item)
        size = len(item)
        r.size += size
        if r.size >= GROUP_BYTES:
            self._seal(b, name)
        b.size += size
        self.queued += size
        self.appended += 1
        if self.queued >= WRITE_HIGH and not self.behind and not self._halted and self.failed is None:
            self.behind = True  # (a writer that writes no more is never waited for)
            self.on_backlog(True)
        return size

    def _seal(self, b: _Batch | None, name: str) -> None:
        """The messages appended to `name` in `b` since its last record become one record."""
        r = b.runs.pop(name, None) if b is not None else None
        if r is None:
            return
        assert b is not None
        record = rec.encode(r.key, rec.ADD, RecordType.PAGED_MESSAGES, 0, encode_run(r.items))
        b.writes[name][1].append(record)
        self._end[name] = b.ends[name] = self._end[name] + len(record)

    def remove(self, address_id: int, page: int) -> None:
        """Delete a page every cursor is past (call once those cursors are durable)."""
        name = page_name(address_id, page)
        self._seal(self._pending, name)
        self._end.pop(name, None)
        self._durable.pop(name, None)
        self._keys.pop(name, None)
        if self.failed is None:
            self._batch().unlinks.append(name)

    def after_durable(self, cb: Callable[[], None]) -> None:
        """Run `cb` once every page write made so far is synced (and replicated)."""
        b = self._pending or self._inflight
        if b is not None:
            b.callbacks.append(cb)
        elif self.tap is not None and self._position:
            self.tap.after_acked(self._position, cb)  # on disk here; the backup may not have it yet
        else:
            cb()

    @property
    def idle(self) -> bool:
        return self._pending is None and self._inflight is None

    @property
    def settled(self) -> bool:
        """Idle, and (a replicating primary) nothing written that a backup may still lack: no
        batch has gone to one since the writer started. False is only a hint to ask `after_durable`."""
        return self._pending is None and self._inflight is None and not self._position

    def _batch(self) -> _Batch:
        b = self._pending
        if b is None:
            b = self._pending = _Batch()
            if self._inflight is None and not self._flush_scheduled and self._loop is not None:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        return b

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._inflight is None and self._pending is not None:
            self._submit()

    def _submit(self) -> None:
        b = self._pending
        if b is None or self._halted:
            return
        for name in list(b.runs):
            self._seal(b, name)
        self._pending = None
        self._inflight = b
        self._jobs.put(b)

    # ---------------------------------------------------------- writer thread
    def _run(self) -> None:
        io = StoreIO(self.directory, self.tap)
        faults = Faults.from_env(FAULTS_PREFIX)  # tests only (journal/faults.py)
        while True:
            b = self._jobs.get()
            if b is None:
                return
            if not isinstance(b, _Batch):  # `on_writer`: between two batches
                try:
                    b()
                except RuntimeError:  # the loop is closed: nobody waits any more
                    return
                continue
            if self.failed is None:
                try:
                    self._write(io, b, faults)
                except BaseException as exc:  # an I/O error is fatal to the store
                    self.failed = exc
            loop = self._loop
            assert loop is not None
            try:
                loop.call_soon_threadsafe(self._done, b, self.failed)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return

    def _write(self, io: StoreIO, b: _Batch, faults: Faults | None = None) -> None:
        for name, key in b.creates:
            if faults is not None:
                faults.hit("create")
            io.create(name, jf.FILE_HEADER_SIZE, key)
            self._fds[name] = io.open(name)
        for name, (offset, buffers) in b.writes.items():
            data = buffers[0] if len(buffers) == 1 else b"".join(buffers)
            if faults is not None:
                faults.hit("write")
            io.write(self._fds[name], name, data, offset)
        if self.datasync:
            for name in b.writes:
                if faults is not None:
                    faults.hit("sync")
                os.fdatasync(self._fds[name])
        if b.creates:
            io.sync_dir()
        if b.renames:
            for old, new in b.renames:
                if faults is not None:
                    faults.hit("rename")
                io.rename(old, new)
                fd = self._fds.pop(old, None)
                if fd is not None:
                    self._fds[new] = fd
            io.sync_dir()  # a commit's PAGE_TX waits for this batch: the renames are durable first
        for name in b.unlinks:
            fd = self._fds.pop(name, None)
            if fd is not None:
                os.close(fd)
            io.unlink(name, missing_ok=True)
        b.position = io.flush()

    def _done(self, b: _Batch, err: BaseException | None) -> None:
        self._inflight = None
        if self._batch_done is not None:
            self._batch_done.set()
        self.queued -= b.size
        if err is not None:
            self.failed = err
            self._caught_up()  # nobody waits for a writer that writes no more
            self.on_failure(err)
            return
        if self.behind and self.queued <= WRITE_LOW:
            self._caught_up()
        renamed = self._renamed
        for name, end in b.ends.items():
            name = renamed.get(name, name)
            if name in self._durable:
                self._durable[name] = end
        for old, _new in b.renames:
            renamed.pop(old, None)
        if b.position:
            self._position = b.position
        if b.callbacks:
            if b.position and self.tap is not None:
                self.tap.after_acked(b.position, partial_run(b.callbacks))
            else:
                for cb in b.callbacks:
                    cb()
        if self._pending is not None:
            self._submit()
        if b.writes:
            self.on_durable()

    # -------------------------------------------------------------- reading
    def read(self, address_id: int, page: int, offset: int) -> tuple[list[PagedRecord], int]:
        """Records of a page from byte `offset` (0: the start) up to what is durable; (records, next offset)."""
        name = page_name(address_id, page)
        end = self._durable.get(name)
        start = max(offset, jf.FILE_HEADER_SIZE)
        if end is None or end <= start:
            return [], start
        return self._pread(name, self._keys.get(name, page), start, end)

    def readable(self, address_id: int, page: int, offset: int) -> bool:
        """Whether the page has durable bytes past `offset` (what `read_soon` would read)."""
        end = self._durable.get(page_name(address_id, page))
        return end is not None and end > max(offset, jf.FILE_HEADER_SIZE)

    def read_soon(
        self,
        address_id: int,
        page: int,
        offset: int,
        done: Callable[[list[PagedRecord], int, BaseException | None], None],
        limit: int = 0,
    ) -> None:
        """`read`, in a worker thread (a page is up to `page-size-bytes`: not on the event loop),
        of at most `limit` bytes (0: all that is durable; a record bigger than that is read whole);
        `done(records, next offset, error)` runs on the loop."""
        name = page_name(address_id, page)
        start = max(offset, jf.FILE_HEADER_SIZE)
        end = self._durable.get(name, start)  # read on the loop: the thread reads no loop state
        loop = self._loop or asyncio.get_running_loop()
        key = self._keys.get(name, page)  # a renamed transaction file keeps its own key
        if limit > 0:
            # Only the read in the thread; the records are decoded on the loop when it is back:
            # decoding in the thread took the GIL from the loop every switch interval (0.1 ms)
            # for no parallelism, and allocated the messages in another malloc arena.
            chunk = loop.run_in_executor(None, self._pread_bytes, name, start, end, limit)
            chunk.add_done_callback(partial(_decode_chunk, done, key, start))
            return
        fut = loop.run_in_executor(None, self._pread, name, key, start, end)
        fut.add_done_callback(partial(_settle, done, start))

    def _pread_bytes(self, name: str, start: int, end: int, limit: int) -> bytes:
        """Up to `limit` bytes of a page from `start` (not past `end`); a first record longer than
        that is read whole."""
        if end <= start:
            return b""
        fd = os.open(self.directory / name, os.O_RDONLY)
        try:
            data = os.pread(fd, min(end - start, limit), start)
            if len(data) >= 4:
                (length,) = _LENGTH.unpack_from(data, 0)
                if len(data) < length <= end - start:
                    data = os.pread(fd, length, start)
        finally:
            os.close(fd)
        return data

    def _pread(self, name: str, key: int, start: int, end: int) -> tuple[list[PagedRecord], int]:
        if end <= start:
            return [], start
        fd = os.open(self.directory / name, os.O_RDONLY)
        try:
            data = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
        records, stop, _reason = decode_page(data, key, 0)
        return records, start + stop

    def paged_bytes(self, address_id: int) -> int:
        """Bytes in the address's page files, appended ones not sealed into a record yet too."""
        prefix = f"a{address_id}-"
        n = sum(end - jf.FILE_HEADER_SIZE for name, end in self._end.items() if name.startswith(prefix))
        if self._pending is not None:
            n += sum(r.size for name, r in self._pending.runs.items() if name.startswith(prefix))
        return n


_LENGTH = struct.Struct("<I")  # a record's first field: its length


def _decode_chunk(
    done: Callable[[list[PagedRecord], int, BaseException | None], None],
    page: int,
    start: int,
    f: asyncio.Future[bytes],
) -> None:
    exc = f.exception()
    if exc is not None:
        done([], start, exc)
        return
    try:
        records, stop, _reason = decode_page(f.result(), page, 0)
    except Exception as err:  # a record whose checksum holds but whose body does not decode
        done([], start, err)
        return
    done(records, start + stop, None)


def _settle(
    done: Callable[[list[PagedRecord], int, BaseException | None], None],
    start: int,
    f: asyncio.Future[tuple[list[PagedRecord], int]],
) -> None:
    exc = f.exception()
    if exc is not None:
        done([], start, exc)
    else:
        records, nxt = f.result()
        done(records, nxt, None)


def partial_run(callbacks: list[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for cb in callbacks:
            cb()

    return run
