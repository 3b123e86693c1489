"""A replicated journal's backup directory is the primary's, byte for byte, whenever it is in sync.

A stateful property test: hypothesis drives a real journal (tiny files, rolls, recycling,
online compactions) whose store writes through a real replication source (ha/source.py). A
backup attaches at any moment — its initial sync then runs while the journal keeps writing
and compacting — and is dropped at any moment. The backup's side is the real applier
(journal/storeio.py) behind an in-process connection that decodes the very frames a socket
would carry. At quiescent moments an in-sync backup's directory must equal the primary's file
for file and byte for byte, and a cold load of it must give the model's live records.
A second test checks the confirmation rule: a batch's callbacks wait for the backup.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from journal_model import JournalWrites, quiet, state_of
from tandem.config import BrokerConfig
from tandem.ha.source import BackupStream, ReplicationSource
from tandem.journal import Journal, JournalSettings
from tandem.journal.storeio import Applier
from tandem.protocol import native as p
from tandem.store.records import STORE_FORMAT

PREFIX = "tr"
SETTINGS = JournalSettings(
    file_size=4096,
    min_files=2,
    pool_files=2,
    buffer_timeout_ns=0,
    buffer_size=8192,
    compact_min_files=3,
    compact_percentage=40,
)
CFG = BrokerConfig(initial_replication_sync_timeout=10_000)


def _replica_start() -> p.ReplicaStart:
    """What a backup of this version sends (ha/replica.py)."""
    return p.ReplicaStart(CFG.cluster_user, CFG.cluster_password, "b:1", store_format=STORE_FORMAT)


def files_of(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(directory.iterdir()) if f.is_file()} if directory.exists() else {}


class LoopbackLink:
    """A backup's connection without the socket: the frames the primary writes are read back
    with the backup's frame reader and applied by a real Applier; acknowledgements come back
    on the loop (or are held, to see what waits for them)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.peer = "loopback"
        self.closed = False
        self.writable = True
        self.replica: Any = None
        self.applier = Applier(root)
        self.reader = p.FrameReader(p.ServerPacket, 1 << 30, expect_magic=False)
        self.hold = False
        self.held: list[int] = []
        self.synced_at: int | None = None
        self.accepted = False

    def write(self, data: bytes | bytearray) -> None:
        assert not self.closed, "written after close"
        loop = asyncio.get_running_loop()
        for pkt in self.reader.feed(bytes(data)):
            if isinstance(pkt, p.ReplicaOps):
                self.applier.apply(pkt.kind, p.decode_ops(pkt))
                if pkt.position:
                    if self.hold:
                        self.held.append(pkt.position)
                    else:
                        loop.call_soon(self.replica.on_ack, pkt.position)
            elif isinstance(pkt, p.ReplicaSyncDone):
                self.applier.sync()
                self.synced_at = pkt.position
                loop.call_soon(self.replica.on_synced, pkt.position)
            elif isinstance(pkt, p.ReplicaAccept):
                self.accepted = True

    write_now = write

    def write_from_threads(self) -> Any:
        """Frames from the journal's writer thread come back to the loop in order, as a socket
        written from that thread would deliver them."""
        loop = asyncio.get_running_loop()
        return lambda data: loop.call_soon_threadsafe(self.write, data)

    def send(self, packet: p.Packet) -> None:
        self.write(p.encode(packet))

    def release(self) -> None:
        self.hold = False
        for pos in self.held:
            self.replica.on_ack(pos)
        self.held.clear()

    def close(self) -> None:
        self.closed = True
        self.applier.close()

    async def drained(self) -> None:
        return None


class ReplicatedJournal(JournalWrites):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tandem-repl-"))
        self.data = self.root / "primary"
        self.loop = asyncio.new_event_loop()
        self.source = ReplicationSource(CFG)
        self._run(self._start_source())
        self.j = Journal(self.data / "journal", PREFIX, SETTINGS, self.source)
        self.j.load()
        self.j.start(self.loop)
        self.link: LoopbackLink | None = None
        self.backups = 0
        self.compared = 0

    async def _start_source(self) -> None:
        self.source.start()

    def teardown(self) -> None:
        try:
            if self.j._writer is not None:
                self.loop.run_until_complete(self.j.stop())

            async def close() -> None:
                self.source.close(failover=False)
                await asyncio.sleep(0.01)  # the cancelled tasks end

            self.loop.run_until_complete(close())
        finally:
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    async def _quiet(self) -> None:
        """Everything appended is on disk, compaction done, dead files retired, frames delivered."""
        await quiet(self.j)
        for _ in range(3):
            await asyncio.sleep(0)  # frames handed over by the writer reach the link

    @rule()
    def flush(self) -> None:
        self._run(self._quiet())

    @rule()
    def compact(self) -> None:
        self.j.compact_online()

    @rule(turns=st.integers(0, 20))
    def let_the_loop_run(self, turns: int) -> None:
        """The sync and the writer make progress while nothing is flushed."""

        async def spin() -> None:
            for _ in range(turns):
                await asyncio.sleep(0.001)

        self._run(spin())

    # --------------------------------------------------------------- backups
    @precondition(lambda self: self.link is None)
    @rule()
    def attach_backup(self) -> None:
        """A backup connects: its sync starts now, while the journal goes on."""
        self.backups += 1
        link = LoopbackLink(self.root / f"backup{self.backups}")
        self.link = link

        async def accept() -> None:
            self.source.accept(link, _replica_start(), [self.j], self.data)

        self._run(accept())
        assert link.accepted

    @precondition(lambda self: self.link is not None)
    @rule()
    def drop_backup(self) -> None:
        assert self.link is not None

        async def drop() -> None:
            assert self.link is not None
            self.source.drop(self.link.replica, "test")
            await asyncio.sleep(0)

        self._run(drop())
        assert self.link.closed
        self.link = None

    @precondition(lambda self: self.link is not None)
    @rule()
    def compare(self) -> None:
        """Once in sync and quiet: the same files, the same bytes, and a cold load gives the model."""
        link = self.link
        assert link is not None
        b: BackupStream = link.replica

        async def synced() -> None:
            while not b.synced:
                assert not b.closed, "the backup was dropped"
                await asyncio.sleep(0.002)

        self._run(synced())
        self._run(self._quiet())
        assert not self.source._waiters, "a confirmation still waits for the backup"
        primary = files_of(self.data / "journal")
        backup = files_of(link.root / "journal")
        assert sorted(backup) == sorted(primary)
        for name, data in primary.items():
            assert backup[name] == data, f"{name} differs"
        cold = Journal(link.root / "journal", PREFIX, SETTINGS)
        assert state_of(cold.load(readonly=True)) == self.model
        self.compared += 1
        event(f"compared after {min(self.j.compactions, 2)} compactions, {min(len(primary), 6)} files")

    @invariant()
    def writer_alive(self) -> None:
        assert self.j.failed is None


ReplicatedJournal.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_backup_directory_equals_the_primary = ReplicatedJournal.TestCase


def test_a_batch_is_confirmed_only_once_the_backup_has_it(tmp_path: Path) -> None:
    """After the sync, a batch's callbacks wait for the backup's acknowledgement (held here), and
    run at once when it comes, or when the backup is dropped; a primary alone confirms at once."""

    async def main() -> None:
        source = ReplicationSource(CFG)
        source.start()
        j = Journal(tmp_path / "primary" / "journal", PREFIX, SETTINGS, source)
        j.load()
        j.start()
        done: list[str] = []

        async def durable(tag: str) -> None:
            fut = asyncio.get_running_loop().create_future()
            j.after_durable(lambda: (done.append(tag), fut.done() or fut.set_result(None)))
            await asyncio.wait_for(fut, 5)

        j.add(1, 1, b"alone")
        await durable("alone")  # no backup: the disk is enough
        link = LoopbackLink(tmp_path / "backup")
        source.accept(link, _replica_start(), [j], tmp_path / "primary")
        b: BackupStream = link.replica
        while not b.synced:
            await asyncio.sleep(0.005)
        link.hold = True
        j.add(2, 1, b"replicated")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(durable("held")), 0.3)
        assert done == ["alone"] and link.held, "confirmed before the backup had it"
        link.release()
        await asyncio.sleep(0.01)
        assert done == ["alone", "held"]
        link.hold = True
        j.add(3, 1, b"dropped")
        j.after_durable(lambda: done.append("dropped"))
        await asyncio.sleep(0.1)
        assert done == ["alone", "held"]
        source.drop(b, "test")  # the primary carries on alone: what waited for the backup goes out
        await asyncio.sleep(0.01)
        assert done == ["alone", "held", "dropped"]
        await j.stop()
        source.close(failover=False)

    asyncio.run(main())


def test_the_sync_reports_its_progress_then_in_sync(tmp_path: Path) -> None:
    """`replication` reads unreplicated, then syncing N% (N rising with the bytes copied), then in-sync."""

    async def main() -> None:
        source = ReplicationSource(CFG)
        source.start()
        j = Journal(tmp_path / "primary" / "journal", PREFIX, SETTINGS, source)
        j.load()
        j.start()
        for i in range(1, 60):
            j.add(i, 1, bytes(500))
        fut = asyncio.get_running_loop().create_future()
        j.after_durable(lambda: fut.set_result(None))
        await fut
        assert source.state() == "unreplicated" and source.peer is None
        seen: list[str] = []

        class Watching(LoopbackLink):
            def write(self, data: bytes | bytearray) -> None:
                super().write(data)
                seen.append(source.state())

        link = Watching(tmp_path / "backup")
        source.accept(link, _replica_start(), [j], tmp_path / "primary")
        b: BackupStream = link.replica
        while not b.synced:
            await asyncio.sleep(0.005)
        assert source.state() == "in-sync" and source.peer == "b:1"
        pcts = [int(s.split()[1].rstrip("%")) for s in seen if s.startswith("syncing")]
        assert pcts[0] == 0 and pcts == sorted(pcts) and len(set(pcts)) > 2, seen
        source.drop(b, "test")
        assert source.state() == "unreplicated"
        await j.stop()
        source.close(failover=False)

    asyncio.run(main())


def test_writes_made_while_the_backup_catches_up_are_not_held_for_it(tmp_path: Path) -> None:
    """At the end of the copy, the operations queued meanwhile go to the backup and it applies
    them, while the primary keeps confirming on its own disk: confirmations start waiting for the
    backup (and the backup is told the sync is done) only once it has acknowledged that backlog.
    Until then a batch is confirmed without the backup; from then on every batch waits for it."""

    async def main() -> None:
        source = ReplicationSource(CFG)
        source.start()
        j = Journal(tmp_path / "primary" / "journal", PREFIX, SETTINGS, source)
        j.load()
        j.start()
        done: list[str] = []

        async def durable(tag: str, timeout: float = 5) -> None:
            fut = asyncio.get_running_loop().create_future()
            j.after_durable(lambda: (done.append(tag), fut.done() or fut.set_result(None)))
            await asyncio.wait_for(asyncio.shield(fut), timeout)

        for i in range(1, 20):
            j.add(i, 1, bytes(500))
        await durable("backlog")
        go = asyncio.Event()

        class Paused(LoopbackLink):
            """The copy stops after its first frame until `go` (a connection that takes no more)."""

            def __init__(self, root: Path) -> None:
                super().__init__(root)
                self.writable = False

            async def drained(self) -> None:
                await go.wait()

        link = Paused(tmp_path / "backup")
        link.hold = True  # the backup's acknowledgements are held until release()
        source.accept(link, _replica_start(), [j], tmp_path / "primary")
        b: BackupStream = link.replica
        for _ in range(500):
            if b.copied:
                break
            await asyncio.sleep(0.005)
        assert b.copied and b.queue is not None, "the copy did not start"
        j.add(100, 1, b"during the copy")
        await durable("during the copy")  # queued for the backup: nothing waits for it yet
        go.set()
        for _ in range(500):
            if b.queue is None:
                break
            await asyncio.sleep(0.005)
        assert b.queue is None, "the copy did not end"
        assert link.held, "the operations queued during the copy did not follow it"
        j.add(101, 1, b"while the backup catches up")
        await durable("catching up", timeout=2)  # the backup has not acknowledged the backlog: not held
        assert not b.synced and link.synced_at is None, "in sync before acknowledging what was queued"
        link.release()
        for _ in range(500):
            if b.synced:
                break
            link.release()
            await asyncio.sleep(0.005)
        assert b.synced, "not in sync once the backlog was acknowledged"
        link.hold = True
        j.add(102, 1, b"in sync")
        with pytest.raises(TimeoutError):
            await durable("in sync", timeout=0.3)  # from now on a batch waits for the backup
        link.release()
        await asyncio.sleep(0.01)
        assert done[-1] == "in sync"
        await j.stop()
        source.close(failover=False)

    asyncio.run(main())
