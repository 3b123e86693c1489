"""A journal follower (the warm backup's reader) always ends in the state a cold load builds.

A stateful property test: hypothesis drives a real journal with tiny files through random
appends, updates, deletes, atomic batches, coalesced adds, rolls and online compactions,
while a follower tails the same directory. At quiescent moments the follower's live set and
file accounting must equal a fresh cold load's (and the model's); at a simulated crash (a
batch half written, its last write torn) the follower finishes — as a backup taking over —
and must equal a cold load of the same directory, then becomes the writer itself and is
followed in turn (a failover cycle).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from journal_model import JournalWrites, Model, quiet, state_of
from tandem.journal import ADD, DELETE, Journal, JournalSettings, LiveRecord
from tandem.journal.follower import JournalFollower

PREFIX = "tf"
SETTINGS = JournalSettings(
    file_size=4096,
    min_files=2,
    pool_files=2,
    buffer_timeout_ns=0,
    buffer_size=8192,
    compact_min_files=3,
    compact_percentage=40,
)


def accounting(j: Journal) -> dict[str, Any]:
    """What the journal reclaims and compacts by: per file its live and all records and its live bytes; the live ids."""
    return {
        "files": {k: (f.live, f.records, f.live_bytes) for k, f in j._files.items()},
        "ids": j.ids(),
    }


def cold(directory: Path) -> tuple[Journal, Model]:
    """A fresh read-only load of the directory: the journal (for its accounting) and its live set."""
    j = Journal(directory, PREFIX, SETTINGS)
    return j, state_of(j.load(readonly=True))


class FollowedJournal(JournalWrites):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="tandem-follow-"))
        self.loop = asyncio.new_event_loop()
        self.j = Journal(self.dir, PREFIX, SETTINGS)
        self.j.load()
        self.j.start(self.loop)
        self.follower = self._follower()
        self.durable: Model = {}  # what is on disk for sure (after the last flush)
        self.crashes = 0

    def teardown(self) -> None:
        try:
            if self.j._writer is not None:
                self.loop.run_until_complete(self.j.stop())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -------------------------------------------------------------- helpers
    def _follower(self) -> JournalFollower:
        return JournalFollower(Journal(self.dir, PREFIX, SETTINGS))

    def _check_follower(self) -> None:
        """Hook: a follower with an observer checks what the observer saw (below)."""

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 20))

    def _flush(self) -> None:
        self._run(quiet(self.j))
        assert self.j.failed is None
        self.durable = dict(self.model)

    def _poll(self) -> None:
        """Poll until caught up, starting over as the broker does when the follower says so."""
        for _ in range(50):
            done = self.follower.poll(budget=16 * 1024)
            if done is False:
                self.follower = self._follower()
            elif done:
                return
        raise AssertionError("the follower never caught up")

    # ---------------------------------------------------------------- rules
    @rule()
    def flush(self) -> None:
        self._flush()

    @rule()
    def compact(self) -> None:
        self.j.compact_online()
        self._flush()

    @rule(budget=st.integers(1, 64 * 1024))
    def poll_while_writing(self, budget: int) -> None:
        """The writer thread may be in the middle of a batch: the follower must cope."""
        if self.follower.poll(budget=budget) is False:
            self.follower = self._follower()

    @rule()
    def poll_and_compare(self) -> None:
        self._flush()
        self._poll()
        c, loaded = cold(self.dir)
        assert loaded == self.model
        assert state_of(self.follower.live) == self.model
        assert accounting(self.follower.j) == accounting(c)
        self._check_follower()
        assert accounting(self.j) == accounting(c), "the writer's own accounting (compaction output included)"

    @rule(data=st.data())
    def crash_and_take_over(self, data: st.DataObject) -> None:
        """The writer dies mid-batch; the follower finishes (takes over) and must equal a cold load."""
        self._flush()
        self._poll() if data.draw(st.booleans()) else None  # a follower caught up, or behind
        # Queue more work, then write only part of its batch, the last write torn, and die.
        for _ in range(data.draw(st.integers(1, 12))):
            rid = self.next_id
            self.next_id += 1
            self.j.add(rid, 1, data.draw(st.binary(min_size=1, max_size=900)))
        j = self.j
        j._drain()
        batch = j._pending
        j._terminate(batch)
        writer = j._writer
        assert writer is not None
        writer.submit(lambda: None)  # nothing in flight: the thread is idle
        self._run(asyncio.sleep(0.01))
        for key, size in batch.new_files.items():
            writer._open_new(key, size)
        writes = batch.writes[: data.draw(st.integers(0, len(batch.writes)))]
        for i, (key, off, blob) in enumerate(writes):
            if i == len(writes) - 1:
                blob = blob[: data.draw(st.integers(0, len(blob)))]
            os.pwrite(writer._fds[key], blob, off)
        j._pending = type(batch)()
        j._writer = None
        writer.stop()
        _, before = cold(self.dir)  # what a cold load sees (read-only: nothing repaired yet)
        finished = self.follower.finish()
        if finished is None:  # the follower could not be finished: the backup loads cold
            successor = Journal(self.dir, PREFIX, SETTINGS)
            loaded = state_of(successor.load())
        else:
            successor = self.follower.j
            loaded = state_of(finished)
            self._check_follower()
        assert loaded == before
        assert successor.corrupt == [], "a crash leaves torn tails, never damage"
        for rid, value in self.durable.items():  # nothing that was on disk for sure is lost
            assert loaded.get(rid) == value, rid
        after, reloaded = cold(self.dir)  # the repairs the takeover made change nothing a load sees
        assert reloaded == loaded
        assert accounting(successor) == accounting(after)
        # The backup serves now: it writes where the old writer stopped, and is followed in turn.
        self.model = dict(loaded)
        self.durable = dict(loaded)
        self.j = successor
        self.j.start(self.loop)
        self.follower = self._follower()
        self.crashes += 1

    @invariant()
    def writer_alive(self) -> None:
        assert self.j.failed is None


FollowedJournal.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_follower_equals_cold_load = FollowedJournal.TestCase


class ObservedJournal(FollowedJournal):
    """The same, with an observer (as the warm backup's StoreFollower has): what it was told adds up to the live set.

    The observer keeps its own copy of every live id from the operations it is shown; at each
    comparison that copy, and the order in which it first saw the ids, must be the follower's live
    set (so a cold load's). A follower may skip an id added and deleted between two of its polls,
    never one that stays live, nor an update of one that does."""

    def _follower(self) -> JournalFollower:
        self.seen: dict[int, list[tuple[int, bytes]]] = {}

        def observe(kind: int, utype: int, rid: int, body: bytes, lr: LiveRecord) -> None:
            if kind == DELETE:
                assert rid in self.seen, f"delete of {rid}, never seen added"
                del self.seen[rid]
            elif rid in self.seen:
                self.seen[rid].append((utype, body))
            else:
                assert kind == ADD, f"an update of {rid}, never seen added"
                self.seen[rid] = [(utype, body)]
            if kind != DELETE:
                assert lr is self.follower.live[rid]

        return JournalFollower(Journal(self.dir, PREFIX, SETTINGS), observe)

    def _check_follower(self) -> None:
        live = self.follower.live
        assert list(self.seen) == list(live)
        assert {rid: (v[0][0], v[0][1], tuple(v[1:])) for rid, v in self.seen.items()} == state_of(live)


ObservedJournal.TestCase.settings = FollowedJournal.TestCase.settings
test_observed_follower_equals_cold_load = ObservedJournal.TestCase
