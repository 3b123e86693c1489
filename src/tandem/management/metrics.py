"""Prometheus metrics, read at scrape time from what the broker keeps anyway (decision 0068).

A custom collector, rendered by prometheus-client through a `CollectorRegistry` of each scrape's
own (never the process-wide default one: two brokers in one process must not mix): every scrape
walks the queues once and reads the counters they keep for `queue.stat`, the journals' per-batch
histograms (journal/histogram.py), the connection set, the activation's state. Nothing is
counted per message for metrics' sake. The reading is on the broker's loop, the formatting on a
worker thread (`MetricsRegistry.scrape`).

Per-queue series are limited by the `[management]` key `metrics-queues` (an address-settings
style pattern on the queue name; decision 0069); temporary queues never get series of their own.
docs/metrics.md lists every metric.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from .. import __version__
from ..config import check_metrics_queues
from ..core.permissions import MANAGEMENT_ADDRESS
from ..core.settings import words_match
from ..journal.histogram import HistogramSnapshot
from ..server import allocator

__all__ = ["BrokerCollector", "MetricsRegistry", "add_route"]

HA_STATES = ("starting", "waiting", "passive", "active", "stopped")
QUEUE_LABELS = ["queue", "address"]
_MATCH_CACHE_LIMIT = 100_000


class Observed(Protocol):
    """What the collector reads of a broker (server/broker.py's `Broker` has all of it)."""

    @property
    def config(self) -> Any: ...

    @property
    def active(self) -> bool: ...

    @property
    def ha_state(self) -> str: ...

    @property
    def node_id(self) -> str: ...

    @property
    def activation(self) -> Any: ...

    @property
    def postoffice(self) -> Any: ...

    @property
    def storage(self) -> Any: ...

    @property
    def connections(self) -> set[Any]: ...

    @property
    def backups(self) -> dict[Any, str]: ...

    @property
    def authenticator(self) -> Any: ...

    @property
    def failovers(self) -> int: ...


class QueueFilter:
    """Which queues get series of their own: names matching the pattern (answers cached by name)."""

    def __init__(self, pattern: str) -> None:
        check_metrics_queues(pattern)
        self.pattern = pattern
        self._words = tuple(pattern.split(".")) if pattern else ()
        self._all = pattern == "#"
        self._seen: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        if self._all:
            return True
        if not self._words:
            return False
        hit = self._seen.get(name)
        if hit is None:
            if len(self._seen) >= _MATCH_CACHE_LIMIT:
                self._seen.clear()
            hit = self._seen[name] = words_match(self._words, tuple(name.split(".")))
        return hit


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def _histogram(family: HistogramMetricFamily, labels: list[str], snap: HistogramSnapshot) -> None:
    family.add_metric(labels, [(_le(le), n) for le, n in snap.buckets], snap.total)


# One queue's numbers: name, address, ready (paged included), delivering, scheduled, paged,
# consumers, added, acknowledged, expired, dead-lettered.
QueueRow = tuple[str, str, int, int, int, int, int, int, int, int, int]


@dataclass
class Snapshot:
    """A scrape's numbers, read on the broker's loop: the broker-wide families already made (a few
    dozen samples), the per-queue numbers as plain rows (made into families off the loop)."""

    families: list[Metric]
    queues: list[QueueRow]


class BrokerCollector(Collector):
    """Reads the broker (`snapshot`, on its loop) and yields every `tandem_*` family (`collect`)."""

    def __init__(self, broker: Observed, queues_pattern: str = "#") -> None:
        self.broker = broker
        self.queues = QueueFilter(queues_pattern)

    def collect(self) -> Iterator[Metric]:
        return families(self.snapshot())

    def snapshot(self) -> Snapshot:
        """What a scrape shows, read now: run it on the broker's loop (nothing else reads safely)."""
        b = self.broker
        out = [*self._broker(b), *self._ha(b)]
        rows: list[QueueRow] = []
        if b.active:
            rows, totals = self._queue_rows(b.postoffice)
            out += totals
            out += self._memory(b.postoffice)
            out += self._journals(getattr(b.storage, "journals", ()))
        return Snapshot(out, rows)

    # ------------------------------------------------------------ broker
    def _broker(self, b: Observed) -> Iterator[Metric]:
        cfg = b.config
        role = b.activation.role if b.activation is not None else "live-only"
        info = GaugeMetricFamily(
            "tandem_info",
            "This server: always 1, its facts in labels",
            labels=["version", "name", "node_id", "role", "memory_allocator"],
        )
        info.add_metric([__version__, cfg.name, b.node_id, role, allocator.running()], 1)
        yield info
        conns = sessions = 0
        for c in b.connections:
            if not getattr(c, "detached", False):
                conns += 1
            sessions += len(getattr(c, "sessions", ()))
        yield GaugeMetricFamily("tandem_connections", "Open client connections (every protocol)", conns)
        yield GaugeMetricFamily("tandem_sessions", "Open sessions of those connections", sessions)
        yield CounterMetricFamily(
            "tandem_failed_logins", "Logins refused since start (wrong user or password, every protocol)",
            b.authenticator.failed_logins,
        )  # fmt: skip

    def _ha(self, b: Observed) -> Iterator[Metric]:
        cfg = b.config
        role = b.activation.role if b.activation is not None else "live-only"
        state = GaugeMetricFamily(
            "tandem_ha_state",
            "1 for the state this server is in, 0 for the others",
            labels=["role", "ha_policy", "state"],
        )
        for s in HA_STATES:
            state.add_metric([role, cfg.ha_policy, s], 1 if b.ha_state == s else 0)
        yield state
        yield GaugeMetricFamily("tandem_ha_active", "1 while this server serves its node", 1 if b.active else 0)
        yield GaugeMetricFamily(
            "tandem_ha_backup_connected",
            "1 while a backup is announced to (or replicates from) this active server",
            1 if b.active and b.backups else 0,
        )
        yield CounterMetricFamily(
            "tandem_failovers", "Times this server took its node over from another server since start", b.failovers
        )
        rep = b.activation.replication() if b.activation is not None else {}
        if "replication" in rep:
            text = str(rep["replication"])
            yield GaugeMetricFamily(
                "tandem_replication_in_sync",
                "1 when the replication peer is in sync (on the primary: its backup; on a backup: itself)",
                1 if text == "in-sync" else 0,
            )
            lag = rep.get("replication_lag")
            if isinstance(lag, dict):
                yield GaugeMetricFamily(
                    "tandem_replication_lag_records",
                    "Replication stream records sent to the backup and not yet acknowledged by it",
                    lag["records"],
                )
                yield GaugeMetricFamily(
                    "tandem_replication_lag_bytes",
                    "Bytes of those records (what the backup has not acknowledged)",
                    lag["bytes"],
                )
                yield CounterMetricFamily(
                    "tandem_replication_streamed_bytes",
                    "Bytes of stream records made for the current backup (from 0 at each new backup)",
                    lag["streamed_bytes"],
                )

    # ------------------------------------------------------------ queues
    def _queue_rows(self, po: Any) -> tuple[list[QueueRow], list[Metric]]:
        """The rows of the queues metrics-queues wants, and the totals over every queue."""
        wanted = self.queues
        rows: list[QueueRow] = []
        total = total_delivering = total_consumers = 0
        queues = po.queues
        for name, q in queues.items():
            n_paged = q.paged_count
            n_delivering = q.delivering_count
            n_ready = q.ready_count + n_paged
            n_consumers = len(q.consumers)
            total += n_ready + n_delivering + q.scheduled_count
            total_delivering += n_delivering
            total_consumers += n_consumers
            if q.temporary or not wanted(name):
                continue
            rows.append(
                (name, q.address, n_ready, n_delivering, q.scheduled_count, n_paged, n_consumers,
                 q.messages_added, q.messages_acked, q.messages_expired, q.messages_killed)
            )  # fmt: skip
        totals: list[Metric] = [
            GaugeMetricFamily("tandem_queues", "Queues (all of them, whatever metrics-queues says)", len(queues)),
            GaugeMetricFamily("tandem_addresses", "Addresses", len(po.addresses)),
            GaugeMetricFamily("tandem_messages", "Messages in every queue (ready, in delivery, scheduled)", total),
            GaugeMetricFamily("tandem_messages_delivering", "Messages in delivery, every queue", total_delivering),
            GaugeMetricFamily("tandem_consumers", "Consumers, every queue", total_consumers),
        ]
        return rows, totals

    def _memory(self, po: Any) -> Iterator[Metric]:
        lim = po.limits
        yield GaugeMetricFamily(
            "tandem_memory_message_bytes",
            "Bytes of the messages held in memory (what global-max-size counts, overhead included)",
            lim.size,
        )
        yield GaugeMetricFamily("tandem_memory_messages", "Messages held in memory (not paged)", lim.messages)
        yield GaugeMetricFamily(
            "tandem_memory_max_bytes", "global-max-size: paging starts above it (-1: no limit)", lim.max_size
        )
        yield GaugeMetricFamily(
            "tandem_transaction_bytes", "Bytes of messages held by open transactions until they commit",
            po.tx_held_bytes,
        )  # fmt: skip

    # ----------------------------------------------------------- journals
    def _journals(self, journals: Iterable[Any]) -> Iterator[Metric]:
        sync = HistogramMetricFamily(
            "tandem_journal_fsync_seconds",
            "Time to write and sync one journal batch (one group commit)",
            labels=["journal"],
        )
        sizes = HistogramMetricFamily(
            "tandem_journal_batch_bytes", "Bytes written by one journal batch (one group commit)", labels=["journal"]
        )
        compactions = SummaryMetricFamily(
            "tandem_journal_compaction_seconds", "Online compactions: how many, and their time", labels=["journal"]
        )
        for j in journals:
            label = [j.directory.name]
            _histogram(sync, label, j.metrics.sync_ns.snapshot(1e-9))
            _histogram(sizes, label, j.metrics.batch_bytes.snapshot())
            compactions.add_metric(label, j.compactions, j.compaction_seconds)
        yield from (sync, sizes, compactions)


def families(snap: Snapshot) -> Iterator[Metric]:
    """Every family of a snapshot: the per-queue ones made here (any thread)."""
    yield from snap.families
    specs: list[tuple[type[GaugeMetricFamily] | type[CounterMetricFamily], str, str]] = [
        (GaugeMetricFamily, "tandem_queue_messages", "Messages ready for delivery, paged ones included"),
        (GaugeMetricFamily, "tandem_queue_messages_delivering", "Messages delivered and not yet acknowledged"),
        (GaugeMetricFamily, "tandem_queue_messages_scheduled", "Messages waiting out a redelivery delay"),
        (GaugeMetricFamily, "tandem_queue_messages_paged", "Of the ready messages, those in page files"),
        (GaugeMetricFamily, "tandem_queue_consumers", "Consumers attached"),
        (CounterMetricFamily, "tandem_queue_messages_added", "Messages routed to the queue"),
        (CounterMetricFamily, "tandem_queue_messages_acked", "Messages acknowledged (consumed)"),
        (CounterMetricFamily, "tandem_queue_messages_expired", "Messages expired (to the expiry address or dropped)"),
        (CounterMetricFamily, "tandem_queue_messages_dead_lettered",
         "Messages moved to the dead-letter address (or dropped there)"),
    ]  # fmt: skip
    made = [kind(name, text, labels=QUEUE_LABELS) for kind, name, text in specs]
    adders = [f.add_metric for f in made]
    for row in snap.queues:
        labels = [row[0], row[1]]
        for add, v in zip(adders, row[2:], strict=True):
            add(labels, v)
    yield from made


class _Frozen(Collector):
    """A snapshot as a collector, for one scrape's registry."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        return families(self.snap)


RENDER_ON_LOOP_QUEUES = 50  # at about 0.1 ms per queue: a few ms of the loop at most


class MetricsRegistry:
    """A broker's registry: its collector and the process's (RSS, CPU, open files) as `tandem_process_*`."""

    def __init__(self, broker: Observed, queues_pattern: str = "#") -> None:
        self.collector = BrokerCollector(broker, queues_pattern)
        self.process = ProcessCollector(namespace="tandem", registry=None)

    def render(self, snap: Snapshot, accept: str | None = None) -> tuple[bytes, str]:
        """A snapshot (and the process's numbers, read now) in the format the `Accept` header asks
        for: OpenMetrics if it says so (Prometheus does), else the text format 0.0.4 every scraper
        reads. Any thread: this is the slow part (about 0.1 ms per queue with series)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Frozen(snap))
        registry.register(self.process)
        encode, content_type = choose_encoder(accept)  # type: ignore[arg-type]  # (None is handled)
        return encode(registry), content_type

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """Read and render on the calling thread (the broker's loop): tests, tools."""
        return self.render(self.collector.snapshot(), accept)

    async def scrape(self, accept: str | None = None) -> tuple[bytes, str]:
        """Read on the loop; render a small scrape there too, a big one on a worker thread: the
        loop is held only for the reading (a few ms per thousand queues), not for formatting
        their series. A thread for a small one cost more than it saved: the hand-over of the GIL
        to a thread that formats while the loop serves clients raised the broker's CPU per
        message by about 3 % with a scraper every second (bench/metrics_overhead.py)."""
        snap = self.collector.snapshot()
        if len(snap.queues) <= RENDER_ON_LOOP_QUEUES:
            return self.render(snap, accept)
        return await asyncio.to_thread(self.render, snap, accept)


def add_route(app: web.Application, server: Any) -> None:
    """`GET /metrics` on the management listener (`server`: management/app.py's ManagementServer).

    With security on the listener has authenticated the request (HTTP basic, as Prometheus's
    `basic_auth` sends, or the console's cookie); a scrape then needs `view` (or `manage`) on the
    management address, as every read-only operation (decision 0069). No audit line: a scraper
    every 15 s would bury the audit log's real entries.
    """
    registry = MetricsRegistry(server.broker, server.config.metrics_queues)

    async def scrape(request: web.Request) -> web.Response:
        caller = request["caller"]  # set by the listener's authentication (management/app.py)
        if caller.access is not None:
            caller.access.check_management(False, MANAGEMENT_ADDRESS)
        body, content_type = await registry.scrape(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_get("/metrics", scrape)
