"""Exactly once when the query's driver is killed (between batches, then mid-batch) and when the broker fails over."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from brokerio import batches, drain, fill, make_queue, stat, wait_for

from broker_process import BrokerProcess
from ha_pair import Cluster
from replicated_pair import ReplicatedPair
from tandem.testing import procs

HERE = Path(__file__).parent


def _start_query(
    url: str, queue: str, out: Path, chk: Path, per_trigger: int, seconds: float
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "query_process.py"),
            url,
            queue,
            str(out),
            str(chk),
            str(per_trigger),
            str(seconds),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 the driver and everything it started (JVM, Python workers)."""
    procs.kill(proc, group=True, timeout=30)


@pytest.mark.timeout(600)
def test_query_killed_between_batches_and_mid_batch_writes_each_message_once(
    spark: Any, tmp_path: Path, broker_factory: Any
) -> None:
    b: BrokerProcess = broker_factory("eo").start()
    total = 2000
    fill(b.url, "eo.in", [f"e{i}" for i in range(total)])
    out, chk = tmp_path / "out", tmp_path / "chk"

    # 1. Killed between batches: a batch committed, the next not yet planned (3 s triggers leave a gap).
    proc = _start_query(b.url, "eo.in", out, chk, 200, 3)
    try:
        wait_for(lambda: len(batches(chk, "commits")) >= 2, 240, "two committed batches")
        wait_for(lambda: batches(chk, "offsets") == batches(chk, "commits"), 30, "a gap between batches")
        _kill(proc)
    finally:
        _kill(proc)
    done_first = batches(chk, "commits")
    assert batches(chk, "offsets") == done_first

    # 2. Killed mid-batch: a batch planned (offsets/N written) but not committed.
    proc = _start_query(b.url, "eo.in", out, chk, 200, 0.2)
    try:
        wait_for(
            lambda: (
                len(batches(chk, "commits")) > len(done_first)
                and batches(chk, "offsets")[-1] > batches(chk, "commits")[-1]
            ),
            240,
            "a batch in flight after a committed one",
        )
        _kill(proc)
    finally:
        _kill(proc)
    planned, committed = batches(chk, "offsets"), batches(chk, "commits")
    assert planned[-1] > committed[-1], "the kill was meant to land mid-batch"

    # 3. Restarted from the same checkpoint here: the planned batch is replayed, then the rest.
    q = (
        spark.readStream.format("tandem")
        .option("url", b.url)
        .option("queue", "eo.in")
        .option("maxMessagesPerTrigger", "200")
        .option("minPartitions", "2")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(240)
    assert q.exception() is None
    seqs = [r.sequence for r in spark.read.parquet(str(out)).select("sequence").collect()]
    dupes = [s for s, n in Counter(seqs).items() if n > 1]
    assert not dupes, f"written more than once: {dupes[:10]}"
    assert sorted(seqs) == list(range(1, total + 1))
    assert stat(b.url, "eo.in")["first_seq"] > 1  # committed batches were acknowledged to the broker


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["shared-store", "replicated"])
def test_reads_and_writes_ride_through_a_kill9_failover_exactly_once(spark: Any, tmp_path: Path, kind: str) -> None:
    """The backup of a replicated pair has what the source acknowledged and the sink committed
    (both confirmed only once the backup has them), so the query goes on from its checkpoint."""
    pair = (Cluster if kind == "shared-store" else ReplicatedPair)(tmp_path / "pair", journal_file_size=1024 * 1024)
    c = pair.start_all()
    try:
        total = 3000
        fill(c.url, "fo.in", [f"f{i}" for i in range(total)])
        make_queue(c.url, "fo.out")
        chk = tmp_path / "chk"
        q = (
            spark.readStream.format("tandem")
            .option("url", c.url)
            .option("retry_interval", "100")
            .option("queue", "fo.in")
            .option("maxMessagesPerTrigger", "150")
            .option("minPartitions", "2")
            .load()
            .select("body", "properties")
            .writeStream.format("tandem")
            .option("url", c.url)
            .option("retry_interval", "100")
            .option("address", "fo.out")
            .option("checkpointLocation", str(chk))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            wait_for(lambda: len(batches(chk, "commits")) >= 3, 240, "three committed batches")
            c.primary.kill()
            killed_at = len(batches(chk, "commits"))
            c.wait_state(1, "active", 60)
            wait_for(lambda: stat(c.url_of(1), "fo.out")["message_count"] >= total, 300, "every message written")
            time.sleep(1.0)  # a duplicate would arrive now
            assert q.exception() is None
        finally:
            q.stop()
        assert killed_at < total // 150, "the failover happened mid-stream"
        got = [m.text for m in drain(c.url_of(1), "fo.out")]
        dupes = [s for s, n in Counter(got).items() if n > 1]
        assert not dupes, f"delivered more than once: {dupes[:10]}"
        assert sorted(got) == sorted(f"f{i}" for i in range(total))
    finally:
        c.kill_all()
