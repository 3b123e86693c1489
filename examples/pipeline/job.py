"""The Spark Structured Streaming job: revenue per product per minute, and large-order alerts.

Two queries over the `orders` address, each on its own reader-only queue:

* revenue: JSON orders -> event time -> 2-minute watermark -> one-minute windows per product
  -> Parquet (append mode: a window is written once the watermark has passed its end);
* alerts: orders worth LARGE_ORDER or more -> JSON alert -> the Tandem address `alerts`, one
  broker transaction per partition with a dedup id, so a replayed batch sends nothing twice.

Both run with Trigger.AvailableNow (everything queued now, then stop) in the example; drop
`availableNow` for a query that keeps running.

    .venv/bin/python examples/pipeline/job.py --url tcp://127.0.0.1:61616 --out ./pipeline-out
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from orders import LARGE_ORDER, WATERMARK_MS

ALERT_FIELDS = ("order_id", "product", "customer", "quantity", "price", "amount", "ts_ms")
ORDER_SCHEMA = "order_id STRING, product STRING, customer STRING, quantity INT, price DOUBLE, ts_ms BIGINT"


def _orders(spark: Any, url: str, queue: str, per_trigger: int) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("tandem")
        .option("url", url)
        .option("queue", queue)
        .option("bodyFormat", "json")
        .option("jsonSchema", ORDER_SCHEMA)
        .option("maxMessagesPerTrigger", per_trigger)
        .option("minPartitions", 2)
        .load()
        .select("body.*")
        .where(F.col("order_id").isNotNull())  # a body that is not an order is null: skip it
        .withColumn("event_time", F.timestamp_millis("ts_ms"))
        .withColumn("amount", F.col("quantity") * F.col("price"))
    )


def start(spark: Any, url: str, out: Path, per_trigger: int = 5000, available_now: bool = True) -> list[Any]:
    """Start both queries; returns them (await them with `awaitTermination`)."""
    from pyspark.sql import functions as F

    revenue = (
        _orders(spark, url, "orders.revenue", per_trigger)
        .withWatermark("event_time", f"{WATERMARK_MS // 1000} seconds")
        .groupBy(F.window("event_time", "1 minute"), "product")
        .agg(F.sum("amount").alias("revenue"), F.count("*").alias("orders"))
        .select(
            F.unix_millis(F.col("window.start")).alias("window_start_ms"),
            F.col("window.start").alias("window_start"),
            "product",
            F.round("revenue", 2).alias("revenue"),
            "orders",
        )
    )
    alerts = (
        _orders(spark, url, "orders.alerts", per_trigger)
        .where(F.col("amount") >= LARGE_ORDER)
        .select(
            F.to_json(F.struct(*ALERT_FIELDS)).alias("body"),
            F.concat(F.lit("alert:"), F.col("order_id")).alias("dedup_id"),
            F.create_map(F.lit("product"), F.col("product")).alias("properties"),
        )
    )
    trigger = {"availableNow": True} if available_now else {"processingTime": "2 seconds"}
    q_revenue = (
        revenue.writeStream.queryName("revenue")
        .format("parquet")
        .outputMode("append")
        .option("path", str(out / "revenue"))
        .option("checkpointLocation", str(out / "checkpoints" / "revenue"))
        .trigger(**trigger)
        .start()
    )
    q_alerts = (
        alerts.writeStream.queryName("alerts")
        .format("tandem")
        .option("url", url)
        .option("address", "alerts")
        .option("checkpointLocation", str(out / "checkpoints" / "alerts"))
        .trigger(**trigger)
        .start()
    )
    return [q_revenue, q_alerts]


def run(spark: Any, url: str, out: Path, per_trigger: int = 5000, timeout: float = 600) -> None:
    queries = start(spark, url, out, per_trigger)
    for q in queries:
        if not q.awaitTermination(timeout):
            q.stop()
            raise RuntimeError(f"query {q.name} did not finish within {timeout}s")
        if q.exception() is not None:
            raise RuntimeError(f"query {q.name} failed: {q.exception()}")
        progress = [p for p in q.recentProgress if p["numInputRows"]]
        rows = sum(p["numInputRows"] for p in progress)
        print(f"job: query {q.name!r} done: {rows} orders in {len(progress)} batches", flush=True)


def session(cores: int = 2) -> Any:
    from pyspark.sql import SparkSession

    import tandem.spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("tandem-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tandem.spark.register(spark)
    return spark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="tcp://127.0.0.1:61616")
    ap.add_argument("--out", type=Path, default=Path("pipeline-out"))
    ap.add_argument("--per-trigger", type=int, default=5000, help="maxMessagesPerTrigger")
    args = ap.parse_args()
    spark = session()
    try:
        run(spark, args.url, args.out, args.per_trigger)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
