"""The example's order events, and the results the pipeline must produce from them.

Orders are generated from a seed, so a run can check its output against the input: the
revenue of every product in every closed one-minute window, and one alert per large order.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

PRODUCTS = ("anvil", "bolt", "crate", "drill", "easel", "fuse", "gear", "hinge")
START_MS = 1_795_651_200_000  # 2026-11-26 00:00:00 UTC: event times start here
WINDOW_MS = 60_000
WATERMARK_MS = 120_000  # events may arrive up to two minutes late
LARGE_ORDER = 1000.0  # an order worth this much or more raises an alert


def generate(count: int, seed: int = 7, minutes: int = 12) -> list[dict[str, Any]]:
    """`count` orders over `minutes` of event time, some arriving late (but within the watermark)."""
    rng = random.Random(seed)
    span = minutes * WINDOW_MS
    orders = []
    for i in range(count):
        ts = START_MS + span * i // count
        if rng.random() < 0.1:
            ts -= rng.randrange(1, WATERMARK_MS // 2)  # out of order, well inside the watermark
        quantity = rng.choice((1, 1, 1, 2, 2, 3, 5, 10, 40))
        orders.append(
            {
                "order_id": f"o-{seed}-{i:07d}",
                "product": rng.choice(PRODUCTS),
                "customer": f"c-{rng.randrange(500):03d}",
                "quantity": quantity,
                "price": round(rng.uniform(2.0, 60.0), 2),
                "ts_ms": max(START_MS, ts),
            }
        )
    return orders


def amount(order: dict[str, Any]) -> float:
    return float(order["quantity"] * order["price"])


def closed_revenue(orders: list[dict[str, Any]]) -> dict[tuple[int, str], tuple[float, int]]:
    """(window start ms, product) -> (revenue, orders) for the windows the watermark has closed.

    A window is emitted once the watermark (latest event time seen minus the delay) reaches its
    end; the windows after that stay open, as they would in a query that keeps running.
    """
    watermark = max(o["ts_ms"] for o in orders) - WATERMARK_MS
    out: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for o in orders:
        start = o["ts_ms"] - o["ts_ms"] % WINDOW_MS
        if start + WINDOW_MS <= watermark:
            cell = out[(start, o["product"])]
            cell[0] += amount(o)
            cell[1] += 1
    return {k: (round(v[0], 2), int(v[1])) for k, v in out.items()}


def large_orders(orders: list[dict[str, Any]]) -> set[str]:
    return {o["order_id"] for o in orders if amount(o) >= LARGE_ORDER}
