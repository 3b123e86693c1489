"""The persistence manager over real journals: counters stay one record each, ids never repeat."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tandem.core.ids import BLOCK, IdGenerator
from tandem.journal import JournalSettings
from tandem.store.journal_storage import JournalStorage

SETTINGS = JournalSettings(file_size=128 * 1024, buffer_timeout_ns=0)


def test_counter_reservations_keep_one_live_record_each(tmp_path: Path) -> None:
    async def write() -> None:
        st = JournalStorage(tmp_path, SETTINGS)
        st.load()
        st.start()
        for i in range(1, 201):
            st.reserve_ids(i * 1000)
        await st.stop()

    asyncio.run(write())
    st = JournalStorage(tmp_path, SETTINGS)
    state = st.load()
    assert state.id_reserved == 200_000
    counters = [r for r in st.bindings.ids() if r >= (1 << 62)]
    assert len(counters) == 1, f"{len(counters)} live counter records"
    assert st.bindings.stats().live_ids == 1


def test_id_generator_continues_above_the_reservation() -> None:
    reserved: list[int] = []
    gen = IdGenerator(start=10, reserved=5_000_000, reserve=reserved.append)
    first = gen.next()
    assert first >= 5_000_000, "ids below the last reservation may already have been used"
    assert reserved and reserved[-1] >= first + BLOCK // 2


def test_pooled_files_of_another_size_are_not_reused(tmp_path: Path) -> None:
    from tandem.journal import Journal

    small = JournalSettings(file_size=64 * 1024, buffer_timeout_ns=0, pool_files=10)
    j = Journal(tmp_path, "t", small)
    j.load()
    j.start_sync()
    for i in range(1, 400):
        j.add(i, 1, b"x" * 1000)
    j.delete_many(list(range(1, 400)))
    j.add(1000, 1, b"y")
    j.close_sync()
    assert list(tmp_path.glob("t-free-*.tj")), "the test needs pooled files"
    big = JournalSettings(file_size=256 * 1024, buffer_timeout_ns=0, pool_files=10)
    j2 = Journal(tmp_path, "t", big)
    assert set(j2.load()) == {1000}
    j2.start_sync()
    for i in range(2000, 2600):
        j2.add(i, 1, b"z" * 1000)
    j2.close_sync()
    sizes = {f.stat().st_size for f in tmp_path.glob("t-*.tj") if "free" not in f.name}
    assert 256 * 1024 in sizes
    new_files = [f for f in j2.file_summaries() if f.key > max(k.key for k in j.file_summaries())]
    assert new_files and all(f.path.stat().st_size == 256 * 1024 for f in new_files)
    assert set(Journal(tmp_path, "t", big).load()) == {1000, *range(2000, 2600)}


def test_a_dedup_id_evicted_at_once_leaves_no_record(tmp_path: Path) -> None:
    """id-cache-size = 0: the id is forgotten as it is added, so nothing may stay in the journal."""

    async def write() -> None:
        st = JournalStorage(tmp_path, SETTINGS)
        st.load()
        st.start()
        for rid in range(1, 101):
            st.store_dedup("a", f"id-{rid}", rid, [rid], None)
        st.store_dedup("a", "kept", 500, [], None)
        await st.stop()

    asyncio.run(write())
    st = JournalStorage(tmp_path, SETTINGS)
    st.load()
    assert st.messages.ids() == {500}
