"""Short real chaos runs through `tandem chaos`: a pair of real servers, real clients, real faults
(eleven in all over two runs, one of each kind of pair, and three more while the address pages),
then the total-queue check. Nothing
confirmed may be lost, nothing acknowledged twice, nothing unexpected delivered (docs/chaos.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tandem.chaos import faults, history


def chaos(out: Path, *args: str, timeout: float) -> tuple[int, dict[str, Any], str]:
    """Run the command; its exit status, the JSON verdict (its last stdout line), and its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "tandem", "chaos", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    return proc.returncode, json.loads(last), proc.stderr


def check_run(out: Path, rc: int, verdict: dict[str, Any], err: str, faults_wanted: int) -> None:
    why = f"{json.dumps(verdict, indent=1)}\n{err[-4000:]}\nhistory kept in {out}"
    assert verdict["lost"] == 0, "confirmed messages lost: " + why
    assert verdict["duplicated"] == 0, "messages acknowledged twice: " + why
    assert verdict["unexpected"] == 0, "messages delivered that were never sent: " + why
    assert rc == 0 and verdict["valid"], why
    assert verdict["faults"] == faults_wanted and verdict["healed"] == faults_wanted, why
    assert verdict["confirmed"] > 500 and verdict["delivered"] >= verdict["confirmed"], why
    assert verdict["left_in_queue"] == 0, why
    assert verdict["late_disk_stops"] == 0, "a server went on 15 s after a disk fault: " + why
    assert "fault 1/" in err and "healed" in err, "no progress shown on stderr"
    events = list(history.read(out / "history.jsonl"))
    kinds = {e["kind"] for e in events if e["ev"] == "fault"}
    assert len(kinds) == faults_wanted, kinds  # a round of the plan: each kind once
    assert (out / "chaos.png").stat().st_size > 10_000  # the plot (matplotlib: the `chaos` extra)


@pytest.mark.timeout(200)
def test_short_runs_on_both_kinds_of_pair_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    """Six faults on a replicated pair (seed 13: link reset, ZooKeeper, kill, ENOSPC, link blackhole,
    zombie; the ENOSPC's restart may not fail back, so the last two strike the backup), then five on a
    shared-store pair (seed 104: clean stop, EIO, client blackhole, kill of the backup, client reset):
    every kind of fault at least once. One test, so the two runs never load the machine together
    (xdist's loadgroup does not group under pytest 9: it sets a node id attribute pytest no longer reads)."""
    runs = [("replication", "6", "20", "13"), ("shared-store", "5", "15", "104")]
    results = []
    for pair, n, seconds, seed in runs:
        out = tmp_path / pair
        args = ("--pair", pair, "--faults", n, "--seconds", seconds, "--seed", seed)
        results.append((out, *chaos(out, *args, timeout=95), int(n)))
    for out, rc, verdict, err, n in results:
        check_run(out, rc, verdict, err, n)


def test_the_two_runs_together_strike_with_every_kind_of_fault() -> None:
    kinds = {p.kind for p in faults.plan("replication", 6, 13)} | {p.kind for p in faults.plan("shared-store", 5, 104)}
    assert kinds == set(faults.KINDS)


def test_the_plan_is_seeded_and_covers_every_kind_each_round() -> None:
    a = faults.plan("replication", 25, seed=11)
    assert [p.kind for p in a] == [p.kind for p in faults.plan("replication", 25, seed=11)]
    assert [p.kind for p in a] != [p.kind for p in faults.plan("replication", 25, seed=12)]
    kinds = faults.kinds_for("replication")
    assert set(p.kind for p in a[: len(kinds)]) == set(kinds)
    assert all(1.0 <= p.hold <= 3.0 and 0.2 <= p.gap <= 0.8 for p in a)
    shared = {p.kind for p in faults.plan("shared-store", 30, seed=1)}
    assert shared == set(faults.kinds_for("shared-store")) and not shared & {"zookeeper", "link-blackhole"}


@pytest.mark.timeout(150)
def test_a_short_run_while_the_address_pages_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """`--store paging` (seed 11: kill, kill-backup, stop-failover on a replicated pair): the chaos
    address pages almost every message and the consumers' pauses make backlogs that are read back
    from page files while the pair fails over and syncs again; nothing lost or acknowledged twice."""
    out = tmp_path / "paging"
    args = ("--pair", "replication", "--store", "paging", "--faults", "3", "--seconds", "15", "--seed", "11")
    rc, verdict, err = chaos(out, *args, timeout=120)
    check_run(out, rc, verdict, err, 3)
    pressure = verdict["store_pressure"]
    assert verdict["store"] == "paging" and pressure["paging_started"] >= 1, verdict
