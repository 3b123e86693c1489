"""Run the whole example pipeline on a local broker and local[2] Spark, then check its output.

    make pipeline            # or: .venv/bin/python examples/pipeline/run.py [--count 20000]

1. starts a broker (`tandem run`) on a free port with its data in a temporary directory;
2. the producer publishes `--count` JSON orders to the address `orders`;
3. the consumer starts listening on `alerts` (a separate process, printing what it gets);
4. the Spark job (job.py) runs both queries until the queues are drained;
5. prints the revenue table from Parquet and checks it, and the alerts, against the orders:
   every closed window's revenue must match, and every large order must raise one alert.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import consumer  # noqa: E402
import job  # noqa: E402
import orders as orders_mod  # noqa: E402
import producer  # noqa: E402

_LISTEN = re.compile(r"listening\s+native: (\S+):(\d+)")


@contextlib.contextmanager
def broker(data: Path) -> Iterator[str]:
    """`tandem run` on 127.0.0.1 with an OS-chosen port; yields its URL, stops it at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem", "run", "--data", str(data), "--bind", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = ""
    deadline = time.monotonic() + 30
    while not url and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"broker exited with {proc.returncode}")
        m = _LISTEN.search(line)
        if m:
            url = f"tcp://{m.group(1)}:{m.group(2)}"
    if not url:
        proc.kill()
        raise SystemExit("broker did not start within 30 s")
    print(f"broker: listening on {url} (data in {data})", flush=True)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()


def check(spark: Any, out: Path, orders: list[dict[str, Any]], alerts: dict[str, dict[str, Any]]) -> list[str]:
    """What the pipeline got wrong, as lines (empty when everything matches)."""
    expected = orders_mod.closed_revenue(orders)
    rows = spark.read.parquet(str(out / "revenue")).collect()
    got = {(r["window_start_ms"], r["product"]): (r["revenue"], r["orders"]) for r in rows}
    problems = []
    if len(rows) != len(got):
        problems.append(f"{len(rows) - len(got)} windows written twice")
    for key in sorted(expected.keys() | got.keys()):
        want, have = expected.get(key), got.get(key)
        if want is None or have is None or abs(want[0] - have[0]) > 0.01 or want[1] != have[1]:
            problems.append(f"window {key}: expected {want}, got {have}")
    large = orders_mod.large_orders(orders)
    if set(alerts) != large:
        problems.append(f"alerts: {len(large - set(alerts))} missing, {len(set(alerts) - large)} unexpected")
    return problems


def print_revenue(spark: Any, out: Path, limit: int = 12) -> None:
    from pyspark.sql import functions as F

    table = spark.read.parquet(str(out / "revenue"))
    print(f"revenue: {table.count()} (minute, product) windows written to {out / 'revenue'}; top {limit}:")
    top = table.orderBy(F.col("revenue").desc()).limit(limit).collect()
    for r in top:
        print(f"  {r['window_start']:%H:%M}  {r['product']:<6} {r['revenue']:>10.2f}  ({r['orders']} orders)")


def run(spark: Any, url: str, out: Path, count: int, seed: int = 7) -> list[str]:
    """Produce, process and consume on a running broker; returns the problems found."""
    orders = orders_mod.generate(count, seed)
    expect = len(orders_mod.large_orders(orders))
    producer.publish(url, orders)
    # The consumer listens while the job runs (a thread here; consumer.py runs it on its own).
    received: dict[str, dict[str, Any]] = {}
    failure: list[BaseException] = []

    def listen() -> None:
        try:
            received.update(consumer.consume(url, expect, idle=120))
        except BaseException as exc:  # reported below, with the rest
            failure.append(exc)

    listener = threading.Thread(target=listen, name="alerts-consumer")
    listener.start()
    job.run(spark, url, out)
    listener.join(180)
    if listener.is_alive() or failure:
        return [f"consumer: {failure[0] if failure else 'still waiting after 180 s'}"]
    print_revenue(spark, out)
    return check(spark, out, orders, received)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20000, help="orders to publish")
    ap.add_argument("--keep", action="store_true", help="keep the data and output directory")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tandem-pipeline-"))
    t0 = time.monotonic()
    spark = job.session()
    try:
        with broker(work / "data") as url:
            problems = run(spark, url, work / "out", args.count)
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"pipeline: {time.monotonic() - t0:.1f} s")
    if problems:
        print("pipeline: FAILED", *problems[:20], sep="\n  ")
        raise SystemExit(1)
    print("pipeline: OK, every closed window and every large order accounted for exactly once")


if __name__ == "__main__":
    main()
