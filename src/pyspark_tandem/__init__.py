"""Lets Spark find the `tandem` data source without a register() call (pyspark_* modules are scanned)."""

from tandem.spark.source import TandemDataSource as DefaultSource

__all__ = ["DefaultSource"]
