"""Publish order events (JSON) to the multicast address `orders`.

Each Spark query reads its own reader-only subscription queue, so the two queries keep their
own offsets: `orders.revenue` for the aggregation, `orders.alerts` for the large-order alerts.

    .venv/bin/python examples/pipeline/producer.py --url tcp://127.0.0.1:61616 --count 20000
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import tandem

ADDRESS = "orders"
QUEUES = ("orders.revenue", "orders.alerts")


def create_queues(url: str) -> None:
    with tandem.connect(url) as conn, conn.session() as session:
        for queue in QUEUES:
            session.create_queue(queue, address=ADDRESS, routing_type="multicast", reader_only=True, exists_ok=True)


def publish(url: str, orders: list[dict[str, Any]]) -> None:
    """Durable sends with the order id as dedup id: a resend after a failover is not a second order."""
    create_queues(url)
    with tandem.connect(url) as conn, conn.session() as session:
        producer = session.create_producer(ADDRESS)
        for n, order in enumerate(orders, 1):
            producer.send_async(json.dumps(order), dedup_id=order["order_id"], durable=True)
            if n % 5000 == 0:
                print(f"producer: sent {n}/{len(orders)} orders", flush=True)
        producer.flush()
    print(f"producer: {len(orders)} orders published to {ADDRESS!r}", flush=True)


def main() -> None:
    from orders import generate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="tcp://127.0.0.1:61616")
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    publish(args.url, generate(args.count, args.seed))


if __name__ == "__main__":
    main()
