"""Prometheus metrics, read at scrape time from what the broker keeps anyway (decision 0068).

A custom collector on its own `CollectorRegistry` (never the process-wide default one: two
brokers in one process each have theirs): every scrape walks the queues once and reads the
counters they keep for `queue.stat`, the journals' per-batch histograms (journal/histogram.py),
the connection set, the activation's state. Nothing is counted per message for metrics' sake.

Per-queue series are limited by the `[management]` key `metrics-queues` (an address-settings
style pattern on the queue name; decision 0069); temporary queues never get series of their own.
docs/metrics.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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


class BrokerCollector(Collector):
    """Yields every `tandem_*` family at each scrape (prometheus-client calls `collect`)."""

    def __init__(self, broker: Observed, queues_pattern: str = "#") -> None:
        self.broker = broker
        self.queues = QueueFilter(queues_pattern)

    def collect(self) -> Iterator[Metric]:
        b = self.broker
        yield from self._broker(b)
        yield from self._ha(b)
        if b.active:
            yield from self._queues(b.postoffice)
            yield from self._memory(b.postoffice)
            yield from self._journals(getattr(b.storage, "journals", ()))

    # ------------------------------------------------------------ broker
    def _broker(self, b: Observed) -> Iterator[Metric]:
        cfg = b.config
        role = b.activation.role if b.activation is not None else "live-only"
        info = GaugeMetricFamily(
            "tandem_info", "This server: always 1, its facts in labels", labels=["version", "name", "node_id", "role"]
        )
        info.add_metric([__version__, cfg.name, b.node_id, role], 1)
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
    def _queues(self, po: Any) -> Iterator[Metric]:
        ready = GaugeMetricFamily(
            "tandem_queue_messages", "Messages ready for delivery, paged ones included", labels=QUEUE_LABELS
        )
        delivering = GaugeMetricFamily(
            "tandem_queue_messages_delivering", "Messages delivered and not yet acknowledged", labels=QUEUE_LABELS
        )
        scheduled = GaugeMetricFamily(
            "tandem_queue_messages_scheduled", "Messages waiting out a redelivery delay", labels=QUEUE_LABELS
        )
        paged = GaugeMetricFamily(
            "tandem_queue_messages_paged", "Of the ready messages, those in page files", labels=QUEUE_LABELS
        )
        consumers = GaugeMetricFamily("tandem_queue_consumers", "Consumers attached", labels=QUEUE_LABELS)
        added = CounterMetricFamily("tandem_queue_messages_added", "Messages routed to the queue", labels=QUEUE_LABELS)
        acked = CounterMetricFamily(
            "tandem_queue_messages_acked", "Messages acknowledged (consumed)", labels=QUEUE_LABELS
        )
        expired = CounterMetricFamily(
            "tandem_queue_messages_expired", "Messages expired (moved to the expiry address or dropped)",
            labels=QUEUE_LABELS,
        )  # fmt: skip
        killed = CounterMetricFamily(
            "tandem_queue_messages_dead_lettered", "Messages moved to the dead-letter address (or dropped there)",
            labels=QUEUE_LABELS,
        )  # fmt: skip
        wanted = self.queues
        total = total_delivering = total_consumers = 0
        queues = po.queues
        for name, q in queues.items():
            n_paged = q.paged_count
            n_delivering = q.delivering_count
            n_ready = q.ready_count + n_paged
            total += n_ready + n_delivering + q.scheduled_count
            total_delivering += n_delivering
            total_consumers += len(q.consumers)
            if q.temporary or not wanted(name):
                continue
            labels = [name, q.address]
            ready.add_metric(labels, n_ready)
            delivering.add_metric(labels, n_delivering)
            scheduled.add_metric(labels, q.scheduled_count)
            paged.add_metric(labels, n_paged)
            consumers.add_metric(labels, len(q.consumers))
            added.add_metric(labels, q.messages_added)
            acked.add_metric(labels, q.messages_acked)
            expired.add_metric(labels, q.messages_expired)
            killed.add_metric(labels, q.messages_killed)
        yield from (ready, delivering, scheduled, paged, consumers, added, acked, expired, killed)
        yield GaugeMetricFamily("tandem_queues", "Queues (all of them, whatever metrics-queues says)", len(queues))
        yield GaugeMetricFamily("tandem_addresses", "Addresses", len(po.addresses))
        yield GaugeMetricFamily(
            "tandem_messages", "Messages in every queue: ready, paged, in delivery, scheduled", total
        )
        yield GaugeMetricFamily("tandem_messages_delivering", "Messages in delivery, every queue", total_delivering)
        yield GaugeMetricFamily("tandem_consumers", "Consumers, every queue", total_consumers)

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


class MetricsRegistry:
    """A broker's registry: its collector and the process's (RSS, CPU, open files) as `tandem_process_*`."""

    def __init__(self, broker: Observed, queues_pattern: str = "#") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = BrokerCollector(broker, queues_pattern)
        self.registry.register(self.collector)
        ProcessCollector(namespace="tandem", registry=self.registry)

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """Every metric now, and its content type: OpenMetrics if the `Accept` header asks for it
        (Prometheus does), else the Prometheus text format 0.0.4 that every scraper reads."""
        encode, content_type = choose_encoder(accept)  # type: ignore[arg-type]  # (None is handled)
        return encode(self.registry), content_type


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
        body, content_type = registry.exposition(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_get("/metrics", scrape)
