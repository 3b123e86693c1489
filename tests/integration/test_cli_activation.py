"""`tandem data activation show|set`: the activation sequence of a data directory and of its node id in ZooKeeper."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_cli import fails, ok

from tandem.ha.activation_sequence import SEQUENCE_FILE, read_local_sequence
from tandem.ha.coordinator import Coordinator
from zookeeper import ZooKeeperServer


def coordinator(zk: ZooKeeperServer, node_id: str, holder: str) -> Coordinator:
    c = Coordinator(zk.hosts, node_id, session_timeout=2000, connect_timeout=5000, holder=holder)
    c.start()
    return c


def test_show_and_set_the_local_copy(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    out = ok("data", "activation", "show", data)
    assert "local" in out and " 0" in out
    assert not (data / SEQUENCE_FILE).exists(), "show changes nothing"
    assert "set to 5" in ok("data", "activation", "set", data, "5")
    assert read_local_sequence(data) == 5
    shown = json.loads(ok("data", "activation", "show", data, "--json"))
    assert shown["local"] == 5 and shown["zookeeper"] is None


def test_set_refuses_bad_values_and_a_running_broker(tmp_path: Path, broker_factory: Any) -> None:
    data = tmp_path / "data"
    data.mkdir()
    fails("data", "activation", "set", data, "-1")
    fails("data", "activation", "set", data, "x")
    r = fails("data", "activation", "show", data, "--zookeeper", "127.0.0.1:1")
    assert "--node-id" in r.stderr
    assert not (data / SEQUENCE_FILE).exists()
    b = broker_factory().start()
    r = fails("data", "activation", "set", b.data_dir, "3")
    assert "running" in r.stderr
    assert read_local_sequence(b.data_dir) == 0


def test_show_and_set_with_zookeeper(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    data = tmp_path / "data"
    zk = ("--zookeeper", zookeeper.hosts, "--node-id", "pair-1")
    out = ok("data", "activation", "set", data, "3", *zk)
    assert "ZooKeeper" in out
    assert read_local_sequence(data) == 3
    shown = json.loads(ok("data", "activation", "show", data, "--json", *zk))
    assert (shown["local"], shown["zookeeper"], shown["verdict"], shown["live_lock"]) == (3, 3, "in sync", [])

    active = coordinator(zookeeper, "pair-1", "primary on 127.0.0.1:61616")
    try:
        assert active.try_lock_live(5)
        assert active.claim_activation(3, lambda n: None) == 4  # an activation this directory did not see
        shown = json.loads(ok("data", "activation", "show", data, "--json", *zk))
        assert (shown["local"], shown["zookeeper"], shown["verdict"]) == (3, 4, "stale")
        assert shown["live_lock"] == ["primary on 127.0.0.1:61616"]
        text = ok("data", "activation", "show", data, *zk)
        assert "stale" in text and "primary on 127.0.0.1:61616" in text
        r = fails("data", "activation", "set", data, "4", *zk)
        assert "primary on 127.0.0.1:61616" in r.stderr, "no repair under a server in the lock's line"
        assert active.activation_sequence() == 4 and read_local_sequence(data) == 3
    finally:
        active.close()
    ok("data", "activation", "set", data, "4", *zk)
    shown = json.loads(ok("data", "activation", "show", data, "--json", *zk))
    assert (shown["local"], shown["zookeeper"], shown["verdict"]) == (4, 4, "in sync")


def test_zookeeper_unreachable_is_an_error_not_a_hang(tmp_path: Path) -> None:
    from ha_pair import free_port

    r = fails(
        "data", "activation", "show", tmp_path, "--zookeeper", f"127.0.0.1:{free_port()}", "--node-id", "n",
        "--connect-timeout", "500",
    )  # fmt: skip
    assert "ZooKeeper" in r.stderr
