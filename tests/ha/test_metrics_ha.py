"""/metrics of a replicated pair: the primary's replication state and lag, the backup's HA state,
and the failover counter after a kill -9 of the primary (real processes, real HTTP)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import yaml

from client_io import send_confirmed
from ha_pair import Cluster
from metrics_workload import SETTINGS, Workload, parse, queue_series, run_workload, value
from mgmt_http import Api

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MANAGEMENT = 'management = { bind = "127.0.0.1:0" }\n'  # an inline table: these lines are top-level ones


def _scrape(b: Any) -> dict[str, Any]:
    a = Api.of(b).get("/metrics")
    assert a.status == 200, a.body
    return parse(a.body.decode())


def test_replication_metrics_and_a_failover(pair: Any) -> None:
    p = pair(server_toml=(MANAGEMENT, MANAGEMENT)).start_all()
    asyncio.run(send_confirmed(p.url_of(0), "work", "m", 200))
    primary, backup = _scrape(p.primary), _scrape(p.backup)
    assert value(primary, "tandem_ha_state", role="primary", state="active") == 1
    assert value(primary, "tandem_ha_backup_connected") == 1
    assert value(primary, "tandem_replication_in_sync") == 1
    # idle, the backup has acknowledged everything (a spare journal file made after the last
    # send may still be on its way: bounded wait)
    deadline = time.monotonic() + 10
    while (value(primary, "tandem_replication_lag_records"), value(primary, "tandem_replication_lag_bytes")) != (0, 0):
        assert time.monotonic() < deadline, "the lag never came back to 0"
        time.sleep(0.1)
        primary = _scrape(p.primary)
    assert value(primary, "tandem_replication_streamed_bytes_total") > 200 * 10  # and all of them acknowledged
    assert value(primary, "tandem_queue_messages", queue="work") == 200
    assert value(backup, "tandem_ha_active") == 0
    assert value(backup, "tandem_ha_state", role="backup", state="passive") == 1
    assert value(backup, "tandem_failovers_total") == 0
    assert queue_series(backup, "tandem_queue_messages") == set()  # a passive backup has no queues to show
    p.primary.kill()
    p.wait_state(1, "active")
    deadline = time.monotonic() + 30
    while True:
        after = _scrape(p.backup)
        if value(after, "tandem_ha_active") == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert value(after, "tandem_failovers_total") == 1
    assert value(after, "tandem_ha_state", role="backup", state="active") == 1
    assert value(after, "tandem_queue_messages", queue="work") == 200


def test_a_shared_store_pair_shows_its_backup_and_counts_the_failover(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    for b in c.servers:
        with b.config_path.open("a") as f:
            f.write('\n[management]\nbind = "127.0.0.1:0"\n')
    try:
        c.start_all()
        primary, backup = _scrape(c.primary), _scrape(c.backup)
        assert value(primary, "tandem_ha_state", role="primary", ha_policy="shared-store-primary", state="active") == 1
        assert value(primary, "tandem_ha_backup_connected") == 1
        assert "tandem_replication_in_sync" not in primary  # not a replication policy
        assert value(backup, "tandem_ha_state", role="backup", state="passive") == 1
        assert value(backup, "tandem_ha_backup_connected") == 0
        c.primary.kill()
        c.wait_state(1, "active")
        after = _scrape(c.backup)
        assert value(after, "tandem_failovers_total") == 1
        assert value(after, "tandem_ha_active") == 1
        assert value(after, "tandem_ha_backup_connected") == 0  # alone now: TandemNoBackup would fire
    finally:
        c.kill_all()


def _dashboard_metrics(dashboard: dict[str, Any]) -> set[str]:
    exprs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("expr", "query") and isinstance(v, str):
                    exprs.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dashboard)
    assert exprs, "the dashboard has no queries"
    return {name for e in exprs for name in _names(e)}


_NAME = re.compile(r"\btandem_[a-z0-9_]+\b")


def _names(expr: str) -> set[str]:
    return set(_NAME.findall(expr))


def _exported(fams: dict[str, Any]) -> set[str]:
    return {s.name for f in fams.values() for s in f.samples}


def test_the_example_dashboard_and_alerts_use_only_exported_metrics(pair: Any) -> None:
    """Every `tandem_*` name in examples/grafana and examples/prometheus is one a broker exports:
    the primary of a replicated pair after a workload exports them all."""
    p = pair(server_toml=(MANAGEMENT, MANAGEMENT), address_settings=SETTINGS).start_all()
    asyncio.run(run_workload(p.url_of(0), Workload(sent=5, acked=1, dead=1, expired=1)))
    exported = _exported(_scrape(p.primary))
    dashboard = json.loads((EXAMPLES / "grafana" / "tandem-dashboard.json").read_text())
    used = _dashboard_metrics(dashboard)
    assert {"tandem_queue_messages", "tandem_journal_fsync_seconds_bucket", "tandem_ha_state"} <= used
    assert used <= exported, used - exported
    rules = yaml.safe_load((EXAMPLES / "prometheus" / "alerts.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    assert len(alerts) >= 4
    for r in alerts:
        assert r["alert"] and r["expr"] and r["annotations"]["summary"], r
        names = _names(r["expr"])
        assert names and names <= exported, (r["alert"], names - exported)
