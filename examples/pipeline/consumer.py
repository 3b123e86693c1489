"""Print the large-order alerts the Spark job publishes to the address `alerts`.

    .venv/bin/python examples/pipeline/consumer.py --url tcp://127.0.0.1:61616 [--expect N]

Stops after `--expect` alerts, or once none has come for `--idle` seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import tandem

ADDRESS = "alerts"


def consume(url: str, expect: int | None = None, idle: float = 30.0) -> dict[str, dict[str, Any]]:
    """Alerts by order id; a repeated alert fails the run (exactly once is the point)."""
    alerts: dict[str, dict[str, Any]] = {}
    received = 0
    with tandem.connect(url) as conn, conn.session(ack_mode="client") as session:
        session.create_queue(ADDRESS, address=ADDRESS, exists_ok=True)
        consumer = session.create_consumer(ADDRESS)
        last = time.monotonic()
        while (expect is None or received < expect) and time.monotonic() - last < idle:
            msg = consumer.receive(1.0)
            if msg is None:
                continue
            last = time.monotonic()
            received += 1
            alert = json.loads(msg.text)
            alerts[alert["order_id"]] = alert
            if received <= 5:
                a = alert
                print(f"consumer: ALERT {a['order_id']} {a['product']} x{a['quantity']} = {a['amount']:.2f}")
            msg.ack()
    print(f"consumer: {received} alerts received, {len(alerts)} distinct orders", flush=True)
    if received != len(alerts):
        raise SystemExit(f"consumer: {received - len(alerts)} duplicate alerts")
    return alerts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="tcp://127.0.0.1:61616")
    ap.add_argument("--expect", type=int)
    ap.add_argument("--idle", type=float, default=30.0)
    args = ap.parse_args()
    consume(args.url, args.expect, args.idle)


if __name__ == "__main__":
    main()
