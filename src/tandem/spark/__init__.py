"""PySpark connector: `spark.readStream.format("tandem")` and `df.writeStream.format("tandem")`.

Install with `pip install 'tandem-mq[spark]'`, then `tandem.spark.register(spark)` (Spark also finds
it by itself through the `pyspark_tandem` module). See docs/spark.md.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the `tandem` data source with a SparkSession."""
    from .source import TandemDataSource

    spark.dataSource.register(TandemDataSource)


__all__ = ["register"]
