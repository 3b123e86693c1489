"""`tandem admin activation show|set` on running servers: a coordinated replicated pair (real
ZooKeeper, real processes) and a live-only broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from broker_process import BrokerProcess
from replicated_pair import ReplicatedPair
from zookeeper import ZooKeeperServer


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem", "admin", "activation", *args], capture_output=True, text=True, timeout=30
    )


def _show(url: str) -> dict[str, object]:
    out = _cli("show", "--url", url, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_show_asks_each_server_of_a_coordinated_pair_and_set_is_refused(
    tmp_path: Path, zookeeper: ZooKeeperServer
) -> None:
    p = ReplicatedPair(tmp_path / "pair", zookeeper=zookeeper.hosts)
    try:
        p.start_all()
        primary, backup = _show(p.url_of(0)), _show(p.url_of(1))
        assert primary["state"] == "active" and backup["state"] == "passive"
        assert primary["node_id"] == backup["node_id"]
        for info in (primary, backup):
            assert (info["local"], info["zookeeper"], info["verdict"]) == (1, 1, "in sync"), info
        assert primary["coordinator"] == "live lock held" and backup["coordinator"] == "connected"
        text = _cli("show", "--url", p.url_of(1)).stdout
        assert "verdict            in sync" in text and "(replication-backup, passive)" in text, text
        refused = _cli("set", "--url", p.url_of(0), "5")
        assert refused.returncode == 1 and "tandem data activation set" in refused.stderr, refused
        assert _show(p.url_of(0))["local"] == 1
    finally:
        p.kill_all()


def test_show_on_a_server_without_a_coordinator(broker: BrokerProcess) -> None:
    info = _show(broker.url)
    assert info["coordinator"] == "none" and info["zookeeper"] is None and info["state"] == "active", info
    assert "no [ha.coordinator]" in _cli("show", "--url", broker.url).stdout
