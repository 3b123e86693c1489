"""A disk error on a replicating backup (the fault seam's `replica:` rules on its applier): the
backup stops as a primary does on a disk error (status 3); its primary drops it, records with
ZooKeeper that it alone is current, and carries on; nothing it confirmed is lost."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from client_io import Load, drain_texts
from replicated_pair import ReplicatedPair
from tandem.ha.activation_sequence import SEQUENCE_FILE, read_local_sequence
from zookeeper import ZooKeeperServer

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("stage", ["sync"])  # "write" takes the same path (an OSError in the applier)
def test_a_disk_error_on_the_backup_stops_it_and_the_primary_carries_on(
    tmp_path: Path, zookeeper: ZooKeeperServer, stage: str
) -> None:
    p = ReplicatedPair(tmp_path / "pair", zookeeper=zookeeper.hosts, call_timeout=2000)
    # Let the initial sync through: the applier fails under the load that follows.
    p.backup.env["TANDEM_JOURNAL_FAULTS"] = f"replica:{stage}=EIO@{40 if stage == 'sync' else 400}"
    try:
        p.start_all()
        node = p.status(0)["node_id"]
        load = Load()

        async def run() -> None:
            task = asyncio.create_task(load.run(p.url_of(0), "q"))
            try:
                rc = await asyncio.to_thread(p.backup.wait_exit, 20)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the backup did not stop after its disk error:\n{p.backup.log_text()[-3000:]}")
            assert rc == 3, p.backup.log_text()[-3000:]
            n = len(load.confirmed)
            await load.until(n + 300)  # the primary carries on without its backup
            load.stop.set()
            await asyncio.wait_for(task, 20)

        asyncio.run(run())
        log = p.backup.log_text()
        assert "EIO" in log and "storage failure" in log, log[-3000:]
        st = p.status(0)
        assert st["state"] == "active" and st["replication"] == "unreplicated", st
        assert st["activation_sequence"] == 2 == zookeeper.activation_sequence(node), st
        assert read_local_sequence(p.dirs[1]) < 2  # the failed replica can never take over
        missing = set(load.confirmed) - set(asyncio.run(drain_texts(p.url_of(0), "q")))
        assert not missing, f"confirmed messages missing: {sorted(missing)[:10]} ({len(missing)})"
    finally:
        p.kill_all()


def test_a_backup_that_cannot_write_its_copy_of_the_sequence_stops_instead_of_claiming_in_sync(
    tmp_path: Path, zookeeper: ZooKeeperServer
) -> None:
    """Its `activation-sequence` cannot be replaced (a directory stands in its way): a backup that
    stayed passive would say in-sync yet could never take over. It stops with status 3; the
    primary carries on alone."""
    p = ReplicatedPair(tmp_path / "pair", zookeeper=zookeeper.hosts)
    try:
        blocker = p.dirs[1] / SEQUENCE_FILE / "x"
        blocker.mkdir(parents=True)
        p.primary.start()
        p.wait_state(0, "active")
        p.backup.start()
        try:
            rc = p.backup.wait_exit(20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the backup went on without its copy of the sequence:\n{p.backup.log_text()[-3000:]}")
        assert rc == 3, p.backup.log_text()[-3000:]
        assert "storage failure" in p.backup.log_text()
        st = p.wait_replication(0, "unreplicated")
        assert st["state"] == "active"
    finally:
        p.kill_all()
