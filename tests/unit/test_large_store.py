"""Large messages without a broker: the store's file lifetime (records and holders), and the
client's chunking, compression, rewinding and spooling."""

from __future__ import annotations

import gc
import io
import os
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.client.large import LargeBody as Spool
from tandem.client.large import Rewind, body_size, pieces
from tandem.errors import ProtocolError
from tandem.store.large_messages import LargeMessageStore


def names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def store(tmp_path: Path) -> LargeMessageStore:
    s = LargeMessageStore(tmp_path / "large-messages")  # no journal: a removal is not deferred
    s.start()
    return s


def complete(s: LargeMessageStore, mid: int, data: bytes = b"body") -> object:
    up = s.upload(mid)
    up.write(data)
    return up.finish(False)


def test_an_upload_is_a_part_file_until_finished(tmp_path: Path) -> None:
    s = store(tmp_path)
    up = s.upload(7)
    up.write(b"abc")
    up.write(b"def")
    assert names(s.directory) == ["7.part"]
    body = up.finish(False)
    assert names(s.directory) == ["7.msg"]
    assert (s.directory / "7.msg").read_bytes() == b"abcdef"
    assert body.size == 6  # type: ignore[attr-defined]


def test_a_discarded_upload_leaves_nothing(tmp_path: Path) -> None:
    s = store(tmp_path)
    up = s.upload(8)
    up.write(b"x" * 100)
    up.discard()
    assert names(s.directory) == []


def test_an_unrecorded_body_goes_with_its_last_holder(tmp_path: Path) -> None:
    s = store(tmp_path)
    body = complete(s, 1)
    other = body  # a second reference (a dead-letter copy shares the object)
    del body
    gc.collect()
    assert names(s.directory) == ["1.msg"]
    del other
    assert names(s.directory) == []


def test_a_recorded_file_stays_while_held_and_goes_after_the_last_record(tmp_path: Path) -> None:
    s = store(tmp_path)
    body = complete(s, 2)
    s.recorded(2, "2.msg")
    s.recorded(5, "2.msg")  # a copy's record names the same file
    del body
    assert names(s.directory) == ["2.msg"], "a live record keeps the file"
    s.record_deleted(2)
    assert names(s.directory) == ["2.msg"], "another record still names it"
    s.record_deleted(5)
    assert names(s.directory) == []


def test_a_deleted_record_waits_for_the_holder(tmp_path: Path) -> None:
    s = store(tmp_path)
    body = complete(s, 3)
    s.recorded(3, "3.msg")
    s.record_deleted(3)
    assert names(s.directory) == ["3.msg"], "a delivery in progress still reads it"
    del body
    assert names(s.directory) == []


def test_a_closed_or_not_started_store_removes_nothing(tmp_path: Path) -> None:
    """A stopping broker frees its messages; a backup follows a store it does not own."""
    s = LargeMessageStore(tmp_path / "large-messages")
    s.start()
    body = complete(s, 4)
    s.close()
    del body
    assert names(s.directory) == ["4.msg"]
    follower = LargeMessageStore(tmp_path / "large-messages")  # not started
    held = follower.body("4.msg", 4, False)
    follower.recorded(4, "4.msg")
    follower.record_deleted(4)
    del held
    assert names(s.directory) == ["4.msg"]


def test_clean_removes_what_no_record_names(tmp_path: Path) -> None:
    s = store(tmp_path)
    for mid in (10, 11):
        complete(s, mid)  # unrecorded and not held: removed at once
    kept = complete(s, 12)
    s.recorded(12, "12.msg")
    (s.directory / "13.part").write_bytes(b"half")
    (s.directory / "14.msg").write_bytes(b"crash")
    fresh = LargeMessageStore(s.directory)
    fresh.recorded(12, "12.msg")
    assert fresh.clean() == 2
    assert names(s.directory) == ["12.msg"]
    assert fresh.complete("12.msg", 4) and not fresh.complete("12.msg", 5) and not fresh.complete("99.msg", 0)
    del kept


# ------------------------------------------------------------------------------------ client
@given(
    data=st.binary(max_size=5000),
    step=st.integers(min_value=1, max_value=900),
    compress=st.booleans(),
    as_file=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_pieces_then_spool_give_the_body_back(data: bytes, step: int, compress: bool, as_file: bool) -> None:
    """Chunked (and compressed) as a sender does, spooled (and inflated) as a consumer does."""
    source = io.BytesIO(data) if as_file else data
    chunks = list(pieces(source, step, compress))
    assert all(0 < len(c) <= step for c in chunks)
    if not compress:
        assert b"".join(chunks) == data
    else:
        assert zlib.decompress(b"".join(chunks)) == data
    stored = sum(len(c) for c in chunks)
    spool = Spool(stored, compress)
    if not chunks:
        spool.add(0, b"", True)
    for i, c in enumerate(chunks):
        spool.add(i, c, i == len(chunks) - 1)
    assert spool.complete and spool.read() == data and spool.size == len(data)
    assert spool.stream().read() == data


def test_a_spool_refuses_a_gap_and_a_short_body() -> None:
    s = Spool(10, False)
    s.add(0, b"12345", False)
    with pytest.raises(ProtocolError):
        s.add(2, b"x", False)
    s = Spool(10, False)
    with pytest.raises(ProtocolError):
        s.add(0, b"12345", True)


def test_a_big_spool_goes_to_disk(tmp_path: Path) -> None:
    s = Spool(3 << 20, False)
    for i in range(3):
        s.add(i, b"z" * (1 << 20), i == 2)
    assert s.file._rolled  # past 1 MiB the body is in a temporary file, not in memory
    out = tmp_path / "saved"
    assert s.save(out) == 3 << 20 and out.stat().st_size == 3 << 20


def test_rewind_and_size_of_each_kind_of_source(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    with path.open("rb") as f:
        f.read(3)
        assert body_size(f) == 7  # from where it is now
        r = Rewind(f)
        assert r.possible
        f.read()
        r.rewind()
        assert f.read() == b"3456789"
    assert body_size(b"abc") == 3 and Rewind(b"abc").possible

    class Pipe(io.RawIOBase):
        def readable(self) -> bool:
            return True

    assert body_size(Pipe()) == -1
    assert not Rewind(Pipe()).possible
    r_fd, w_fd = os.pipe()
    try:
        with os.fdopen(r_fd, "rb") as pipe:
            assert not Rewind(pipe).possible
    finally:
        os.close(w_fd)


def test_a_failed_background_sync_fails_the_final_one(tmp_path: Path) -> None:
    """The kernel reports a failed writeback once per open file, and the background sync's
    descriptor shares the upload's: its error must fail the final sync, which would otherwise
    succeed over pages the disk never took (and the message be confirmed)."""
    import asyncio
    import errno

    from tandem.journal.faults import Faults, Rule
    from tandem.store.large_messages import SYNC_EVERY

    s = store(tmp_path)

    async def run() -> OSError | None:
        up = s.upload(9)
        s.faults = Faults([Rule("sync", errno.EIO, 0.0, 0)], "tandem-large")
        up.write(b"x" * SYNC_EVERY)  # starts the background sync, which fails
        await asyncio.sleep(0)
        s.faults = None  # the disk answers the final sync as if all were well
        try:
            await asyncio.to_thread(up.sync_body)
        except OSError as exc:
            return exc
        return None

    err = asyncio.run(run())
    assert err is not None and err.errno == errno.EIO


def test_an_io_error_is_the_stores_failure_once(tmp_path: Path) -> None:
    """`fail` reports the first error to the broker (which stops) and refuses later uploads."""
    import errno

    from tandem.errors import ErrorCode, JournalIOError

    s = store(tmp_path)
    seen: list[BaseException] = []
    s.on_failure = seen.append
    first = OSError(errno.ENOSPC, "full")
    assert s.fail(first).code == ErrorCode.IO_ERROR
    assert s.fail(OSError(errno.EIO, "again")).code == ErrorCode.IO_ERROR
    assert seen == [first]
    with pytest.raises(JournalIOError):
        s.upload(10)
