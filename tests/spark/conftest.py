"""One SparkSession for all Spark tests (local[2,3]: two cores, up to three attempts per task)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Set before the JVM starts so every Python worker sees it (tests arm faults with marker files).
FAULT_DIR = Path(tempfile.mkdtemp(prefix="tandem-spark-faults-"))
os.environ["TANDEM_SPARK_FAULT_DIR"] = str(FAULT_DIR)

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.stopTimeout": "60s",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    import tandem.spark

    builder = SparkSession.builder.master("local[2,3]").appName("tandem-tests")
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    tandem.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def arm_fault() -> Iterator[Any]:
    """arm_fault(point, address): the next task reaching that point for that address fails once."""
    armed: list[Path] = []

    def arm(point: str, address: str) -> Path:
        marker = FAULT_DIR / f"{point}-{address}"
        marker.write_text("armed")
        armed.append(marker)
        return marker

    yield arm
    for m in armed:
        m.unlink(missing_ok=True)
        Path(str(m) + ".fired").unlink(missing_ok=True)
