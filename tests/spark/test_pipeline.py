"""The example pipeline (examples/pipeline) on a real broker: its own checks must find nothing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from broker_process import BrokerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "pipeline"))

import orders
import run


def test_example_pipeline_accounts_for_every_order(spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    problems = run.run(spark, broker.url, tmp_path / "out", count=6000, seed=11)
    assert problems == []
    # The checks compare against the generated orders; make sure they had something to compare.
    generated = orders.generate(6000, 11)
    assert len(orders.closed_revenue(generated)) > 40
    assert len(orders.large_orders(generated)) > 100


def test_pipeline_check_catches_a_wrong_window(spark: Any, tmp_path: Path) -> None:
    """The runner's check is what `make pipeline` trusts: a missing alert or wrong sum must show."""
    generated = orders.generate(2000, 3)
    expected = orders.closed_revenue(generated)
    rows = [
        {"window_start_ms": k[0], "window_start": None, "product": k[1], "revenue": v[0] + 1.0, "orders": v[1]}
        for k, v in expected.items()
    ]
    spark.createDataFrame(
        rows, "window_start_ms LONG, window_start TIMESTAMP, product STRING, revenue DOUBLE, orders LONG"
    ).write.parquet(str(tmp_path / "revenue"))
    problems = run.check(spark, tmp_path, generated, {})
    assert len([p for p in problems if p.startswith("window")]) == len(expected)
    assert any(p.startswith("alerts:") and "missing" in p for p in problems)
