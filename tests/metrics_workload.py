"""A known workload for the metrics tests, and how to read a scrape (prometheus-client's parser).

`run_workload` sends, acknowledges, dead-letters and expires known numbers of messages, so a
scrape can be checked value by value. The broker needs the address settings of `SETTINGS`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import tandem.aio as aio

MAIN = "orders.main"  # sent, acked, dead-lettered, the rest left ready
SHORT = "orders.short"  # expired
DLQ = "DLQ"
SETTINGS = {"orders.#": {"max-delivery-attempts": 1, "dead-letter-address": DLQ}}


@dataclass(frozen=True)
class Workload:
    sent: int = 50
    acked: int = 20
    dead: int = 3
    expired: int = 4

    @property
    def ready(self) -> int:
        return self.sent - self.acked - self.dead


async def run_workload(url: str, w: Workload = Workload()) -> None:
    conn = await aio.connect(url)
    try:
        session = await conn.create_session()
        prod = session.create_producer()
        for i in range(w.sent):
            await prod.send(f"m{i}", address=MAIN)
        for i in range(w.expired):
            await prod.send(f"e{i}", address=SHORT, ttl=1)
        acking = await conn.create_session(ack_mode="individual")
        consumer = await acking.create_consumer(MAIN, window=0)
        for _ in range(w.acked):
            m = await consumer.receive(5)
            assert m is not None
            await m.ack()
        await consumer.close()
        failing = await conn.create_session(ack_mode="individual")
        consumer = await failing.create_consumer(MAIN, window=0)
        for _ in range(w.dead):
            m = await consumer.receive(5)
            assert m is not None
            await m.nack()  # max-delivery-attempts 1: to the dead-letter address
        await consumer.close()
        # The expired ones go at the next expiry scan, or when a consumer meets them.
        expiring = await (await conn.create_session()).create_consumer(SHORT)
        assert await expiring.receive(0.3) is None
        await expiring.close()
        await asyncio.sleep(0.1)
    finally:
        await conn.close()


def parse(text: str) -> dict[str, Any]:
    """Metric families by name (a counter's family is named without `_total`)."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict[str, Any], sample: str, **labels: str) -> float:
    """The value of the one sample named `sample` whose labels include `labels`."""
    family = sample
    for suffix in ("_total", "_bucket", "_count", "_sum"):
        if sample.endswith(suffix) and sample not in families:
            family = sample[: -len(suffix)]
            break
    hits = [
        s.value
        for s in families[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(hits) == 1, f"{sample}{labels}: {len(hits)} samples"
    return float(hits[0])


def queue_series(families: dict[str, Any], family: str) -> set[str]:
    """The queues a per-queue family has series for."""
    return {s.labels["queue"] for s in families[family].samples} if family in families else set()
