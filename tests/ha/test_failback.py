"""Failback of a replicated pair, real processes (decision 0035): kill -9 of the primary, the
backup serves and takes a replica; the restarted primary finds it (check-for-live-server), syncs
from it as a backup, and with allow-failback asks it to step down and serves again, while the
old backup (restart-backup) becomes its backup again."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from client_io import Load, drain_texts, exactly_once_across_a_kill, send_confirmed
from ha_pair import free_port
from metrics_workload import parse, value
from mgmt_http import Api
from replicated_pair import ReplicatedPair, admin_status, status_row
from reply_proxy import silent_after
from tandem.journal.faults import ENV_FILE, FILE_CHECK
from tandem.protocol import native as wire
from tandem.testing import FaultProxy
from zookeeper import ZooKeeperServer

pytestmark = pytest.mark.timeout(90)


def _fail_back(p: ReplicatedPair) -> None:
    """kill -9 of the primary; the backup serves; the primary, restarted, syncs from it and takes
    over again; the old backup is its in-sync backup once more."""
    p.primary.kill()
    p.wait_state(1, "active", timeout=20)
    p.wait_replication(1, "unreplicated")
    p.primary.start()
    p.wait_state(0, "active", timeout=30)
    p.wait_in_sync()


def test_the_restarted_primary_syncs_as_backup_fails_back_and_the_old_backup_is_its_backup_again(pair: Any) -> None:
    """(a) Messages sent before the kill and to the backup while it served are all on the primary
    after failback, once each; its old data is kept aside; status tells each step truthfully."""
    p = pair().start_all()
    before = asyncio.run(send_confirmed(p.url_of(0), "fb", "a", 300))
    p.primary.kill()
    p.wait_state(1, "active", timeout=20)
    st = p.status(1)
    assert (st["role"], st["replication"], st["replication_peer"]) == ("backup", "unreplicated", None)
    while_down = asyncio.run(send_confirmed(p.url_of(1), "fb", "b", 300))  # only on the backup's disk
    p.primary.start()
    p.wait_state(0, "active", timeout=30)
    p.wait_in_sync()
    primary = admin_status(p.url_of(0))
    assert (status_row(primary, "role"), status_row(primary, "state"), status_row(primary, "replication")) == (
        "primary",
        "active",
        "in-sync",
    )
    assert status_row(primary, "replication_peer") == f"127.0.0.1:{p.ports[1]}"
    backup = admin_status(p.url_of(1))
    assert (status_row(backup, "role"), status_row(backup, "state"), status_row(backup, "replication")) == (
        "backup",
        "passive",
        "in-sync",
    )
    assert status_row(backup, "replication_peer") == f"127.0.0.1:{p.ports[0]}"
    assert (p.dirs[0] / "oldreplica.1" / "journal").is_dir(), "the primary's stale data was not moved aside"
    primary_log, backup_log = p.primary.log_text(), p.backup.log_text()
    assert "active server for this node found" in primary_log
    assert "asking it to step down" in primary_log
    assert "failback: stepping down" in backup_log
    got = asyncio.run(drain_texts(p.url_of(0), "fb"))
    assert sorted(got) == sorted(before + while_down)


@pytest.mark.timeout(150)
def test_three_failback_cycles_under_load_lose_and_duplicate_nothing(pair: Any) -> None:
    """(b) An auto-dedup producer and a transacted consumer on the pair's URL through three
    kill -9 / failback cycles: every confirmed message consumed exactly once."""
    p = pair().start_all()

    def three_cycles() -> None:
        for _ in range(3):
            _fail_back(p)

    consumed, times = exactly_once_across_a_kill(p.url, three_cycles, total=2000, until_killed=True)
    total = int(times["sent"])
    dupes = [k for k, n in Counter(consumed).items() if n > 1]
    assert not dupes, f"consumed twice: {dupes[:10]}"
    assert sorted(consumed) == list(range(total)), f"lost: {sorted(set(range(total)) - set(consumed))[:10]}"
    assert p.primary.log_text().count("asking it to step down") == 3
    assert p.status(0)["state"] == "active" and p.status(1)["state"] == "passive"


def test_without_allow_failback_the_restarted_primary_stays_a_backup_and_takes_over_at_the_next_failure(
    pair: Any,
) -> None:
    """(c) allow-failback = false: the restarted primary syncs and stays the backup of the server
    that took over; when that one dies, it takes over with everything."""
    p = pair(server_toml=("allow-failback = false\n", "")).start_all()
    before = asyncio.run(send_confirmed(p.url_of(0), "nf", "a", 200))
    p.primary.kill()
    p.wait_state(1, "active", timeout=20)
    while_down = asyncio.run(send_confirmed(p.url_of(1), "nf", "b", 200))
    p.primary.start()
    p.wait_replication(0, "in-sync")
    p.wait_replication(1, "in-sync")
    st = p.wait_state(0, "passive")
    st = p.status(0)
    assert (st["role"], st["replication_peer"]) == ("primary", f"127.0.0.1:{p.ports[1]}")
    after = asyncio.run(send_confirmed(p.url_of(1), "nf", "c", 200))  # replicated to the restarted primary
    assert p.status(1)["state"] == "active" and p.status(0)["state"] == "passive"
    assert "asking it to step down" not in p.primary.log_text()
    p.backup.kill()
    p.wait_state(0, "active", timeout=20)
    got = asyncio.run(drain_texts(p.url_of(0), "nf"))
    assert sorted(got) == sorted(before + while_down + after)


def test_without_restart_backup_the_server_that_handed_the_node_back_stops(pair: Any) -> None:
    """restart-backup = false on the backup: after failback it stops (status 0) instead of syncing again."""
    p = pair(server_toml=("", "restart-backup = false\n")).start_all()
    p.primary.kill()
    p.wait_state(1, "active", timeout=20)
    p.primary.start()
    p.wait_state(0, "active", timeout=30)
    assert p.backup.wait_exit(20) == 0
    assert "restart-backup = false: stopping" in p.backup.log_text()
    assert p.status(0)["replication"] == "unreplicated"


def test_without_check_for_live_server_an_uncoordinated_primary_serves_its_stale_copy_and_says_so(
    pair: Any,
) -> None:
    """(d) check-for-live-server = false, no coordinator: the restarted primary cannot know a backup
    took over; it serves its own (stale) data beside the backup: the split brain docs/ha.md warns
    of, and the warning it logs at start."""
    p = pair(server_toml=("check-for-live-server = false\n", "")).start_all()
    before = asyncio.run(send_confirmed(p.url_of(0), "st", "a", 100))
    p.primary.kill()
    p.wait_state(1, "active", timeout=20)
    asyncio.run(send_confirmed(p.url_of(1), "st", "b", 100))
    p.primary.start()
    p.wait_state(0, "active")
    assert p.status(1)["state"] == "active"  # two active servers for one node id
    assert "check-for-live-server = false" in p.primary.log_text()
    assert sorted(asyncio.run(drain_texts(p.url_of(0), "st"))) == sorted(before)  # stale: no b*


def test_without_check_for_live_server_a_coordinated_primary_is_refused_as_stale(
    tmp_path: Path, zookeeper: ZooKeeperServer
) -> None:
    """(d) check-for-live-server = false with ZooKeeper: while the backup serves, its live lock keeps
    the restarted primary out; once it is gone too, the activation sequence refuses the stale copy."""
    no_check = ("check-for-live-server = false\n", "")
    p = ReplicatedPair(tmp_path / "pair", zookeeper=zookeeper.hosts, server_toml=no_check)
    try:
        p.start_all()
        p.primary.kill()
        p.wait_state(1, "active", timeout=20)
        p.backup.kill()  # nobody holds the live lock: only the sequence stands in the stale copy's way
        with pytest.raises(RuntimeError) as info:
            p.primary.start()
        assert "this data is stale" in str(info.value) and "activation sequence" in str(info.value)
    finally:
        p.kill_all()


@pytest.mark.timeout(120)
def test_a_coordinated_failback_cycle(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    """With ZooKeeper: the returning primary copies the sequence as a backup does, claims the next
    one when it takes over, and the stepped-down server serves the pair again as its backup."""
    p = ReplicatedPair(tmp_path / "pair", zookeeper=zookeeper.hosts)
    try:
        p.start_all()
        seq0 = p.status(0)["activation_sequence"]
        before = asyncio.run(send_confirmed(p.url_of(0), "zk", "a", 200))
        p.primary.kill()
        p.wait_state(1, "active", timeout=30)
        seq1 = p.status(1)["activation_sequence"]
        while_down = asyncio.run(send_confirmed(p.url_of(1), "zk", "b", 200))
        p.primary.start()
        p.wait_state(0, "active", timeout=40)
        p.wait_in_sync()
        st = p.status(0)
        assert st["activation_sequence"] > seq1 > seq0  # each activation claims the next value
        assert p.status(1)["activation_sequence"] == st["activation_sequence"]  # copied once in sync
        assert st["coordinator"] == "live lock held"
        assert sorted(asyncio.run(drain_texts(p.url_of(0), "zk"))) == sorted(before + while_down)
    finally:
        p.kill_all()


def _kill_the_primary_and_load_the_backup(p: ReplicatedPair, load: Load, queue: str) -> threading.Thread:
    """kill -9 of the primary; once the backup serves, `load` sends to it (500 confirmed first)."""
    p.primary.kill()
    p.wait_state(1, "active", timeout=30)
    loader = threading.Thread(target=asyncio.run, args=(load.run(p.url_of(1), queue),), daemon=True)
    loader.start()
    asyncio.run(load.until(500))
    return loader


def _failback_request() -> bytes:
    return bytes(wire.encode(wire.ReplicaFailback()))


@pytest.mark.timeout(150)
def test_a_link_silent_from_the_failback_request_on_loses_nothing_confirmed(
    tmp_path: Path, zookeeper: ZooKeeperServer
) -> None:
    """The returning primary's link goes silent just after it asks for its node back, while the
    active server takes writes: that server steps down at once (every write it confirmed, the
    primary has acknowledged), the primary takes over when the link closes, and every confirmed
    message is there once."""
    link = free_port()
    tripped = threading.Event()
    p = ReplicatedPair(tmp_path / "pair", zookeeper=zookeeper.hosts, return_link_port=link)
    proxy = FaultProxy(p.ports[1], port=link, filters=silent_after(_failback_request(), tripped))
    load = Load()
    try:
        p.start_all()
        before = asyncio.run(send_confirmed(p.url_of(0), "fd", "a", 100))
        loader = _kill_the_primary_and_load_the_backup(p, load, "fd")
        with proxy:
            p.primary.start()
            assert tripped.wait(30), "the primary never asked for its node back"
            p.wait_state(0, "active", timeout=60)
            p.wait_in_sync()
        load.stop.set()
        loader.join(30)
        got = Counter(asyncio.run(drain_texts(p.url_of(0), "fd")))
        missing = [m for m in [*before, *load.confirmed] if got[m] == 0]
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {missing[:5]}"
        assert all(got[m] == 1 for m in load.confirmed), "a confirmed message was delivered twice"
    finally:
        load.stop.set()
        p.kill_all()


@pytest.mark.timeout(150)
def test_a_primary_killed_as_it_asks_for_its_node_back_leaves_the_active_server_serving(
    tmp_path: Path, zookeeper: ZooKeeperServer
) -> None:
    """The returning primary dies the moment it asks for its node back. The active server sees
    the request and the lost link together; dropping its backup, it claims a new activation
    sequence (the dead primary's copy is stale from then on). It must serve on, not step down
    for a primary that will never take over (nobody would serve the node: the old primary,
    restarted, may not activate). Restarted, the primary syncs again and fails back."""
    link = free_port()
    tripped = threading.Event()
    p = ReplicatedPair(tmp_path / "pair", zookeeper=zookeeper.hosts, return_link_port=link)
    proxy = FaultProxy(p.ports[1], port=link, filters=silent_after(_failback_request(), tripped, p.primary.kill))
    try:
        p.start_all()
        before = asyncio.run(send_confirmed(p.url_of(0), "fk", "a", 100))
        p.primary.kill()
        p.wait_state(1, "active", timeout=30)
        while_down = asyncio.run(send_confirmed(p.url_of(1), "fk", "b", 100))
        with proxy:
            p.primary.start()
            assert tripped.wait(30), "the primary never asked for its node back"
            time.sleep(0.5)  # the server has the request and the closed link
            p.wait_state(1, "active", timeout=20)
            later = asyncio.run(send_confirmed(p.url_of(1), "fk", "c", 100))  # it serves
            log = p.backup.log_text()
            assert "is gone before this server stepped down" in log or "went while this server stopped" in log, log
            p.primary.start(timeout=60)
            p.wait_state(0, "active", timeout=60)
            p.wait_in_sync()
        got = Counter(asyncio.run(drain_texts(p.url_of(0), "fk")))
        assert sorted(got) == sorted(before + while_down + later) and set(got.values()) == {1}
    finally:
        p.kill_all()


@pytest.mark.timeout(150)
def test_a_primary_dropped_while_the_server_steps_down_for_it_leaves_that_server_serving_again(
    tmp_path: Path, zookeeper: ZooKeeperServer
) -> None:
    """The active server, asked for failback under load, stops serving; its last sync is slow
    (the journal's fault seam delays it 3 s) and meanwhile the returning primary's link is silent,
    so the server drops it (call-timeout) and claims a new activation sequence. Once stopped, it
    finds no backup in sync to hand over to: it loads its store again and serves, rather than
    leave the node to a primary whose copy is stale; serving again is no failover (its counter
    stays at the one takeover). The primary syncs again and fails back."""
    link = free_port()
    tripped = threading.Event()
    rules = tmp_path / "backup.faults"
    rules.write_text("")
    p = ReplicatedPair(
        tmp_path / "pair",
        zookeeper=zookeeper.hosts,
        return_link_port=link,
        server_toml=("", 'call-timeout = 1000\nmanagement = { bind = "127.0.0.1:0" }\n'),
    )
    p.backup.env[ENV_FILE] = str(rules)

    def slow_sync() -> None:
        rules.write_text("tandem-data:sync=delay3")
        # The journal looks at its rules file at most every FILE_CHECK: hold the request until
        # the server's next sync is sure to see the delay (else its last sync may beat it, and
        # it hands over in sync: a fresh-clone run met that race).
        time.sleep(10 * FILE_CHECK)

    proxy = FaultProxy(p.ports[1], port=link, filters=silent_after(_failback_request(), tripped, slow_sync))
    load = Load()
    try:
        p.start_all()
        loader = _kill_the_primary_and_load_the_backup(p, load, "fs")
        with proxy:
            p.primary.start()
            assert tripped.wait(30), "the primary never asked for its node back"
            _wait_for_line(p.backup, "dropped (", 20)
            rules.write_text("")  # the new journal syncs as usual
            _wait_for_line(p.backup, "went while this server stopped: serving again", 20)
            p.wait_state(1, "active", timeout=20)
            metrics = Api.of(p.backup).get("/metrics")
            assert metrics.status == 200, metrics.body
            assert value(parse(metrics.body.decode()), "tandem_failovers_total") == 1
            load.stop.set()
            loader.join(30)
            later = asyncio.run(send_confirmed(p.url_of(1), "fs", "c", 100))  # it serves
            p.wait_state(0, "active", timeout=60)  # the second failback, over a new link
            p.wait_in_sync()
        got = Counter(asyncio.run(drain_texts(p.url_of(0), "fs")))
        missing = [m for m in [*load.confirmed, *later] if got[m] == 0]
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {missing[:5]}"
        assert all(got[m] == 1 for m in [*load.confirmed, *later]), "a confirmed message was delivered twice"
    finally:
        load.stop.set()
        p.kill_all()


def _wait_for_line(server: Any, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.log_text():
        assert time.monotonic() < deadline, f"no {text!r} in the log within {timeout} s:\n{server.log_text()[-4000:]}"
        time.sleep(0.05)
