"""The chaos pair's configuration, before anything starts: every link through a proxy, failback per server."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from tandem.chaos.topology import Pair


def config(p: Pair, i: int) -> dict[str, Any]:
    return tomllib.loads(p.servers[i].config_path.read_text())


def test_replicated_servers_announce_their_client_proxy_and_reach_each_other_through_a_link_proxy(
    tmp_path: Path,
) -> None:
    p = Pair(tmp_path, "replication")
    for i in range(2):
        c = config(p, i)
        urls = {x["name"]: x["url"] for x in c["connectors"]}
        assert c["ha-policy"] == ("replication-primary", "replication-backup")[i]
        assert urls["me"] == f"127.0.0.1:{p.client_ports[i]}" and c["connector-ref"] == "me"
        assert urls["peer"] == f"127.0.0.1:{p.link_ports[1 - i]}" and c["static-connectors"] == ["peer"]
        assert c["acceptors"][0]["bind"] == f"127.0.0.1:{p.ports[i]}"
        assert p.zookeeper is not None and c["ha"]["coordinator"]["zookeeper"] == p.zookeeper.hosts
        assert c["allow-failback"] is True
    assert len({*p.ports, *p.client_ports, *p.link_ports}) == 6
    assert p.url == f"tcp://127.0.0.1:{p.client_ports[0]},tcp://127.0.0.1:{p.client_ports[1]}"


def test_a_shared_store_backup_starts_without_failback_and_each_restart_can_change_it(tmp_path: Path) -> None:
    p = Pair(tmp_path, "shared-store")
    assert p.zookeeper is None and p.link_proxies == []
    assert config(p, 0)["data-directory"] == config(p, 1)["data-directory"]
    assert config(p, 0)["allow-failback"] is True and config(p, 1)["allow-failback"] is False
    p.set_failback(1, True)
    p.set_failback(0, False)
    assert config(p, 1)["allow-failback"] is True and config(p, 0)["allow-failback"] is False


def test_an_unknown_pair_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Pair(tmp_path, "colocated")
