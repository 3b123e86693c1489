"""A streaming query in its own driver process, for tests that kill -9 it: queue -> Parquet.

Usage: query_process.py URL QUEUE OUT CHECKPOINT MAX_PER_TRIGGER TRIGGER_SECONDS
Runs until killed, or stops by itself after five minutes.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def main() -> None:
    url, queue, out, checkpoint, per_trigger, seconds = sys.argv[1:7]
    from pyspark.sql import SparkSession

    import tandem.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tandem.spark.register(spark)
    q = (
        spark.readStream.format("tandem")
        .option("url", url)
        .option("queue", queue)
        .option("maxMessagesPerTrigger", per_trigger)
        .option("minPartitions", "2")
        .load()
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{seconds} seconds")
        .start()
    )
    print("query started", flush=True)
    q.awaitTermination(300)
    q.stop()
    spark.stop()


if __name__ == "__main__":
    main()
