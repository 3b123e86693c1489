"""A follower that reads a store while another writer appends ends with the same state as a cold load."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from tandem.config import load_config
from tandem.server.broker import Broker, journal_settings
from tandem.store.follower import StoreFollower


def _snapshot(broker: Broker) -> dict[str, Any]:
    """What a broker holds: queues with their messages (id, seq, delivery count, body) in order, dedup ids."""
    po = broker.postoffice
    queues = {
        name: [(r.message.id, r.seq, r.delivery_count, bytes(r.message.raw)) for r in q.iter_refs()]
        for name, q in po.queues.items()
    }
    dedup = {a: sorted(c.ids) for a, c in po.dedup.items() if len(c)}
    return {"queues": queues, "dedup": dedup, "addresses": sorted(po.addresses)}


def test_follower_matches_a_cold_load(tmp_path: Path) -> None:
    """Random sends, acks, redeliveries, dedup ids and queue deletions, polled at random moments."""
    rng = random.Random(7)
    cfg = load_config(
        None,
        data_directory=str(tmp_path),
        journal_file_size=64 * 1024,
        journal_buffer_timeout=0,
        acceptors=[{"name": "n", "bind": "127.0.0.1:0"}],
    )

    async def main() -> tuple[dict[str, Any], dict[str, Any], bool]:
        writer = Broker(cfg)
        await writer.start()
        follower = StoreFollower(tmp_path, journal_settings(cfg))
        from tandem.core.message import Message, MessageData
        from tandem.core.session import ServerSession

        po = writer.postoffice
        session = ServerSession(po, None)
        po.create_queue("doomed")
        for step in range(3000):
            op = rng.random()
            q = rng.choice(["a", "b", "doomed"] if "doomed" in po.queues else ["a", "b"])
            if op < 0.6:
                dedup = f"d{rng.randrange(400)}" if rng.random() < 0.3 else None
                data = MessageData(q, True, rng.randrange(10), 0, 1, dedup, 0, {"i": step}, rng.randbytes(50))
                session.send_message(Message.create(po.ids.next(), data))
            elif op < 0.85 and q in po.queues:
                queue = po.queues[q]
                refs = list(queue.iter_refs())[:3]
                for r in refs:  # take them as a delivery would, then ack or return them
                    queue._remove_queued(r)
                    queue.delivering_count += 1
                if refs and rng.random() < 0.7:
                    queue.acknowledge(refs)
                elif refs:
                    queue.cancel(refs, redeliver_delay=False)
            elif op < 0.86 and "doomed" in po.queues:
                po.delete_queue("doomed")
            if rng.random() < 0.05:
                await asyncio.sleep(0.005)  # let the journal write
                assert follower.poll() is not False, follower.problem
        expected = _snapshot(writer)
        await writer.storage.stop()  # like a crash after the last write: no clean-stop record
        writer.node_manager.close()  # type: ignore[union-attr]
        assert follower.poll() is not False, follower.problem
        warm = Broker(cfg)
        warm.node_manager = None
        storage = follower.finish()
        assert storage is not None, follower.problem
        warm.storage = storage
        warm._load()
        got_warm = _snapshot(warm)
        await warm.storage.stop()
        cold = Broker(cfg)
        cold.storage = type(storage)(tmp_path, journal_settings(cfg))
        cold._load()
        got_cold = _snapshot(cold)
        await cold.storage.stop()
        assert got_cold == expected
        return got_warm, got_cold, True

    warm, cold, _ = asyncio.run(main())
    assert warm == cold
    assert sum(len(v) for v in warm["queues"].values()) > 100


def test_follower_starts_over_when_compaction_replaces_the_files(tmp_path: Path) -> None:
    from tandem.journal import Journal, JournalSettings
    from tandem.journal.follower import JournalFollower

    settings = JournalSettings(file_size=64 * 1024, buffer_timeout_ns=0, compact_min_files=0)
    j = Journal(tmp_path, "t", settings)
    j.load()
    j.start_sync()
    for i in range(1, 200):
        j.add(i, 1, b"x" * 500)
    j.flush_sync()
    follower = JournalFollower(Journal(tmp_path, "t", settings))
    assert follower.poll() is True
    assert set(follower.live) == set(range(1, 200))
    j.delete_many(list(range(1, 150)))
    j.close_sync()
    Journal(tmp_path, "t", settings).compact_offline()  # outputs sit below the files already read
    assert follower.poll() is False
    assert follower.problem is not None  # the files it was reading were replaced
    fresh = JournalFollower(Journal(tmp_path, "t", settings))
    assert fresh.poll() is True
    assert set(fresh.live) == set(range(150, 200))


def _twelve_mib_journal(directory: Path) -> Any:
    """A closed journal of 12,000 1 KiB records (ids 1..12000) in 1 MiB files; returns its settings."""
    from tandem.journal import Journal, JournalSettings

    settings = JournalSettings(file_size=1 << 20, buffer_timeout_ns=0)
    j = Journal(directory, "t", settings)
    j.load()
    j.start_sync()
    for i in range(1, 12_001):
        j.add(i, 1, b"x" * 1024)
    j.flush_sync()
    j.close_sync()
    return settings


def test_a_follower_poll_reads_a_short_slice(tmp_path: Path) -> None:
    """A warm backup's follower runs on the broker's event loop, which also sends a replicating
    backup's acknowledgements: one poll reads a few MiB at most (then says there is more), so a
    backup warming up on a big store does not hold up the primary's confirmations."""
    from tandem.journal import Journal
    from tandem.journal.follower import JournalFollower

    settings = _twelve_mib_journal(tmp_path)
    follower = JournalFollower(Journal(tmp_path, "t", settings))
    slices = []
    for _ in range(100):
        before = follower.bytes_read
        done = follower.poll()
        slices.append(follower.bytes_read - before)
        if done is True:
            break
    assert done is True and set(follower.live) == set(range(1, 12_001))
    assert len(slices) > 3, slices
    assert max(slices) <= 4 << 20, slices


def test_a_warm_up_holds_back_a_bounded_number_of_adds(tmp_path: Path) -> None:
    """The follower holds ADDs back so that one deleted soon after is never built; a warm-up
    reads a backlog that stays, and held all of it (1M messages: one build and one free of a
    million entries at the end, a 192 ms stall of the primary's confirmations). The observer sees
    what was read as the warm-up goes, a bounded number at a time."""
    from tandem.journal import Journal
    from tandem.journal.follower import HOLD_MAX, JournalFollower

    settings = _twelve_mib_journal(tmp_path)
    seen: list[int] = []
    follower = JournalFollower(Journal(tmp_path, "t", settings), lambda k, u, rid, b, lr: seen.append(rid))
    held = []
    for _ in range(1000):
        done = follower.poll()
        held.append(len(follower._pending))
        if done is True:
            break
    assert done is True and seen == list(range(1, 12_001))
    assert 0 < max(held) <= HOLD_MAX + 1000, held
    assert held[-1] == 0


def test_a_warming_follower_makes_no_collections_then_freezes_what_it_built(tmp_path: Path) -> None:
    """Warming up builds an object per message, as a reload does: a collection now and then would
    walk them all on the event loop (hundreds of ms, holding up a replicating backup's
    acknowledgements). As the reload, the warm-up runs with the collector off, and once caught
    up freezes what it built."""
    import gc

    from tandem.core.message import Message, MessageData
    from tandem.core.session import ServerSession

    cfg = load_config(None, data_directory=str(tmp_path), acceptors=[{"name": "n", "bind": "127.0.0.1:0"}])

    async def main() -> None:
        writer = Broker(cfg)
        await writer.start()
        po = writer.postoffice
        session = ServerSession(po, None)
        for i in range(4000):
            data = MessageData("q", True, 4, 0, 1, None, 0, {}, bytes(1000))
            session.send_message(Message.create(po.ids.next(), data))
            if i % 500 == 0:
                await asyncio.sleep(0.01)
        await writer.stop()
        backup = Broker(cfg)
        frozen = gc.get_freeze_count()
        await backup.start_backup()
        seen: list[bool] = []
        for _ in range(10_000):
            f = backup._follower
            if f is not None and f.caught_up:
                break
            if f is not None and f.messages.bytes_read:
                seen.append(gc.isenabled())
            await asyncio.sleep(0)
        try:
            assert backup._follower is not None and backup._follower.caught_up
            assert backup._follower.messages_seen == 4000
            assert seen and not any(seen), "the collector ran while the follower warmed up"
            for _ in range(10):
                await asyncio.sleep(0)
            assert gc.isenabled()
            assert gc.get_freeze_count() > frozen + 4000, "what the warm-up built was not frozen"
        finally:
            await backup._stop_following()
            gc.enable()
            gc.unfreeze()

    asyncio.run(main())


def test_a_warm_up_in_short_polls_lists_the_directory_once_per_pass_not_per_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing the directory opens every file of the store: done at each of a warm-up's thousands
    of short polls, it doubled a 1M-message warm-up. Read on, then list again before caught up."""
    from tandem.journal import Journal
    from tandem.journal import files as jf
    from tandem.journal import follower as follower_module
    from tandem.journal.follower import JournalFollower

    settings = _twelve_mib_journal(tmp_path)
    listings = 0
    real = jf.list_files

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal listings
        listings += 1
        return real(*args, **kw)

    monkeypatch.setattr(follower_module.jf, "list_files", counting)
    follower = JournalFollower(Journal(tmp_path, "t", settings))
    polls = 0
    while (done := follower.poll()) is None and polls < 1000:
        polls += 1
    assert done is True and set(follower.live) == set(range(1, 12_001))
    assert polls > 10, polls
    assert listings <= 3, f"{listings} listings in {polls} polls"


def test_follower_and_cold_load_agree_on_large_messages(tmp_path: Path) -> None:
    """Large messages (bodies in files under large-messages/): a warm takeover and a cold load
    hold the same ones with the same files; one whose file was lost is dropped by both (never
    delivered), and a file no record names (a crashed upload) is removed."""
    cfg = load_config(
        None,
        data_directory=str(tmp_path),
        journal_file_size=64 * 1024,
        journal_buffer_timeout=0,
        acceptors=[{"name": "n", "bind": "127.0.0.1:0"}],
    )

    def snap(broker: Broker) -> list[tuple[int, str, int]]:
        q = broker.postoffice.queues["big"]
        out = []
        for r in q.iter_refs():
            lg = r.message.large
            assert lg is not None
            assert (tmp_path / "large-messages" / lg.name).stat().st_size == lg.size
            out.append((r.message.id, lg.name, lg.size))
        return out

    async def main() -> tuple[list[Any], list[Any], list[Any]]:
        from tandem.core.message import Message, MessageData
        from tandem.core.session import ServerSession

        writer = Broker(cfg)
        await writer.start()
        follower = StoreFollower(tmp_path, journal_settings(cfg))
        po = writer.postoffice
        session = ServerSession(po, None)
        po.create_queue("big")
        large = writer.storage.large  # type: ignore[union-attr]
        for i in range(6):
            m = Message.create(po.ids.next(), MessageData("big", True, body=b""))
            up = large.upload(m.id)
            for _ in range(3):
                up.write(bytes([i]) * 10_000)
            m.large = up.finish(False)
            session.send_message(m)
            del m
            await asyncio.sleep(0.005)
            assert follower.poll() is not False, follower.problem
        q = po.queues["big"]
        first = next(iter(q.iter_refs()))
        q._remove_queued(first)
        q.delivering_count += 1
        q.acknowledge([first])  # its file goes once the DELETE is synced
        del first
        await asyncio.sleep(0.05)
        stray = large.upload(po.ids.next())  # an upload a crash interrupted
        stray.write(b"partial")
        expected = snap(writer)
        assert len(expected) == 5
        await writer.storage.stop()
        writer.node_manager.close()  # type: ignore[union-attr]
        assert follower.poll() is not False, follower.problem
        lost = expected[2]
        (tmp_path / "large-messages" / lost[1]).unlink()  # a disk that lost a synced file
        warm = Broker(cfg)
        warm.node_manager = None
        storage = follower.finish()
        assert storage is not None, follower.problem
        warm.storage = storage
        warm._load()
        got_warm = snap(warm)
        await warm.storage.stop()
        cold = Broker(cfg)
        cold.storage = type(storage)(tmp_path, journal_settings(cfg))
        cold._load()
        got_cold = snap(cold)
        await cold.storage.stop()
        return [e for e in expected if e != lost], got_warm, got_cold

    expected, warm, cold = asyncio.run(main())
    assert warm == expected
    assert cold == expected
    assert sorted(p.name for p in (tmp_path / "large-messages").iterdir()) == sorted(n for _, n, _ in expected)


def test_messages_acknowledged_within_one_poll_are_never_built(tmp_path: Path) -> None:
    """A backup whose primary's consumers keep up sees most messages added and deleted between two
    polls: building each (decode, message, references) only to drop it was a fifth of the
    backup's CPU in a 1+1 run. Only what is still live at the end of a poll is built; the state
    is still a cold load's (test_follower_matches_a_cold_load)."""
    cfg = load_config(None, data_directory=str(tmp_path), journal_buffer_timeout=0)

    async def main() -> tuple[int, list[int], list[int]]:
        writer = Broker(cfg)
        await writer.start()
        from tandem.core.message import Message, MessageData
        from tandem.core.session import ServerSession

        follower = StoreFollower(tmp_path, journal_settings(cfg))
        built: list[int] = []
        make = follower.storage.make_message
        follower.storage.make_message = lambda rid, rec: (built.append(rid), make(rid, rec))[1]  # type: ignore[method-assign]
        po = writer.postoffice
        session = ServerSession(po, None)
        queue = po.create_queue("q")
        stored = asyncio.get_running_loop().create_future()
        po.storage.after_bindings_durable(lambda: stored.set_result(None))
        await stored  # sends to a queue whose record is not on disk yet wait for it
        for i in range(200):
            session.send_message(Message.create(po.ids.next(), MessageData("q", True, 4, 0, 1, None, 0, None, b"x")))
            if i % 2:  # every other one consumed and acknowledged at once
                (ref,) = list(queue.iter_refs())[-1:]
                queue._remove_queued(ref)
                queue.delivering_count += 1
                queue.acknowledge([ref])
        await asyncio.sleep(0.05)
        assert follower.poll() is True, follower.problem
        live = [r.message.id for r in queue.iter_refs()]
        await writer.storage.stop()
        writer.node_manager.close()  # type: ignore[union-attr]
        return follower.messages_seen, live, built

    seen, live, built = asyncio.run(main())
    assert seen == 200 and len(live) == 100
    assert sorted(built) == live, f"{len(built)} built for {len(live)} live messages"
