"""Spark connector throughput against the native consumer, on one broker in one run.

A fresh broker (production defaults) is filled with N 1 KiB durable messages three times: into
two reader-only queues for Spark and into an ordinary queue for the native consumer. Then:

* native: `tandem perf consumer` drains its queue (msgs/s);
* ingest: a streaming query (local[2], Trigger.AvailableNow) reads the Spark queue into
  Spark's `noop` sink, which materialises every row (rows/s, timed from start() to the end,
  after a small warm-up read so Python workers are running);
* sink: a streaming query copies the second queue into a Tandem address with the `tandem`
  sink, one broker transaction per partition (rows/s, reading included);
* batch sink: a generated DataFrame of N rows written with `df.write.format("tandem")`.

    .venv/bin/python bench/spark.py --count 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from brokers.tandem import TandemBroker

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


async def _manage(url: str, op: str, **args: Any) -> Any:
    import tandem.aio as aio

    conn = await aio.connect(url)
    try:
        return await conn.manage(op, **args)
    finally:
        await conn.close()


def _count(url: str, queue: str) -> int:
    return int(asyncio.run(_manage(url, "queue.stat", name=queue))[0]["message_count"])


def _perf(mode: str, url: str, queue: str, count: int, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tandem", "perf", mode, "--url", url, "--queue", queue, "--count", str(count)]
    out = subprocess.run([*cmd, *extra, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _session(cores: int) -> Any:
    from pyspark.sql import SparkSession

    import tandem.spark

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tandem.spark.register(spark)
    return spark


def _timed_stream(
    spark: Any, url: str, queue: str, parts: int, per_trigger: int, sink: str, chk: Path, sink_opts: dict[str, str]
) -> float:
    writer = (
        spark.readStream.format("tandem")
        .option("url", url)
        .option("queue", queue)
        .option("minPartitions", str(parts))
        .option("maxMessagesPerTrigger", str(per_trigger))
        .load()
        .writeStream.format(sink)
        .option("checkpointLocation", str(chk))
    )
    for k, v in sink_opts.items():
        writer = writer.option(k, v)
    t0 = time.monotonic()
    q = writer.trigger(availableNow=True).start()
    q.awaitTermination()
    elapsed = time.monotonic() - t0
    if q.exception() is not None:
        raise RuntimeError(f"query failed: {q.exception()}")
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    print(f"  {sink}: {rows} rows in {elapsed:.1f}s", file=sys.stderr)
    return rows / elapsed if elapsed else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=2, help="minPartitions of the reads (and Spark cores)")
    ap.add_argument("--per-trigger", type=int, default=100_000, help="maxMessagesPerTrigger of the streams")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tandem-spark-bench-"))
    b = TandemBroker().start()
    result: dict[str, Any] = {}
    try:
        queues = ("spark.in", "copy.in", "native.in")
        for q in queues[:2]:
            asyncio.run(_manage(b.url, "queue.create", name=q, reader_only=True))
        print(f"filling 3 x {a.count} messages of {a.size} B ...", file=sys.stderr)
        fill = [
            _perf("producer", b.url, q, a.count, ["--size", str(a.size), "--producers", "4", "--no-progress"])
            for q in queues
        ]
        assert all(_count(b.url, q) == a.count for q in queues)

        print("native consumer ...", file=sys.stderr)
        native = _perf("consumer", b.url, "native.in", a.count, ["--no-progress"])

        spark = _session(a.partitions)
        asyncio.run(_manage(b.url, "queue.create", name="warm", reader_only=True))
        _perf("producer", b.url, "warm", 1000, ["--no-progress"])
        warm = spark.read.format("tandem").option("url", b.url).option("queue", "warm").load()
        warm.count()  # Python workers up and the connector imported before anything is timed

        print("spark ingest ...", file=sys.stderr)
        ingest = _timed_stream(spark, b.url, "spark.in", a.partitions, a.per_trigger, "noop", work / "chk-ingest", {})
        asyncio.run(_manage(b.url, "queue.create", name="sink.out"))
        print("spark sink (stream copy) ...", file=sys.stderr)
        copy = _timed_stream(
            spark,
            b.url,
            "copy.in",
            a.partitions,
            a.per_trigger,
            "tandem",
            work / "chk-copy",
            {"url": b.url, "address": "sink.out"},
        )
        copied = _count(b.url, "sink.out")
        asyncio.run(_manage(b.url, "queue.create", name="batch.out"))
        print("spark sink (batch write) ...", file=sys.stderr)
        from pyspark.sql import functions as F

        df = spark.range(a.count, numPartitions=a.partitions).select(
            F.expr(f"cast(concat(cast(id as string), repeat('x', {a.size})) as binary)").alias("body")
        )
        t0 = time.monotonic()
        df.write.format("tandem").option("url", b.url).option("address", "batch.out").mode("append").save()
        batch_s = time.monotonic() - t0
        batched = _count(b.url, "batch.out")
        spark.stop()
        result = {
            "benchmark": "spark-connector",
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
            f"{os.cpu_count()} cores",
            "command": " ".join(["bench/spark.py", *sys.argv[1:]]),
            "count": a.count,
            "size": a.size,
            "spark": f"local[{a.partitions}], minPartitions={a.partitions}, "
            f"maxMessagesPerTrigger={a.per_trigger}, pyspark {_pyspark_version()}",
            "fill_msgs_per_s": [f["msgs_per_s"] for f in fill],
            "native_consumer_msgs_per_s": native["msgs_per_s"],
            "spark_ingest_rows_per_s": round(ingest),
            "ingest_vs_native": round(ingest / native["msgs_per_s"], 2),
            "spark_stream_copy_rows_per_s": round(copy),
            "stream_copy_rows_written": copied,
            "spark_batch_write_rows_per_s": round(a.count / batch_s),
            "batch_rows_written": batched,
            "target": {"ingest_vs_native": 0.8},
        }
        result["target_met"] = result["ingest_vs_native"] >= 0.8
    finally:
        b.cleanup()
    print(json.dumps(result, indent=2))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spark.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result.get("stream_copy_rows_written") == a.count == result.get("batch_rows_written") else 1


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


if __name__ == "__main__":
    raise SystemExit(main())
