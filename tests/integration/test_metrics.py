"""GET /metrics over real HTTP from a broker process, parsed by prometheus-client's parser and
checked against what was sent, acknowledged, expired and dead-lettered (docs/metrics.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_process import BrokerProcess
from metrics_workload import DLQ, MAIN, SETTINGS, SHORT, Workload, parse, queue_series, run_workload, value
from mgmt_http import Api, management_toml
from secured import password_of, secured

Factory = Callable[..., BrokerProcess]


def _scrape(b: BrokerProcess, **kw: Any) -> dict[str, Any]:
    a = Api.of(b, **kw).get("/metrics")
    assert a.status == 200, a.body
    assert a.headers["content-type"].startswith("text/plain; version=0.0.4"), a.headers
    return parse(a.body.decode())


def test_a_scrape_over_http_equals_the_workload(broker_factory: Factory) -> None:
    w = Workload(sent=40, acked=15, dead=2, expired=3)
    b = broker_factory(
        extra_toml=management_toml(extra='metrics-queues = "orders.#"\n'), address_settings=SETTINGS
    ).start()
    asyncio.run(run_workload(b.url, w))
    fams = _scrape(b)
    main_q = {"queue": MAIN, "address": MAIN}
    assert value(fams, "tandem_queue_messages_added_total", **main_q) == w.sent
    assert value(fams, "tandem_queue_messages_acked_total", **main_q) == w.acked
    assert value(fams, "tandem_queue_messages_dead_lettered_total", **main_q) == w.dead
    assert value(fams, "tandem_queue_messages", **main_q) == w.ready
    assert value(fams, "tandem_queue_messages_delivering", **main_q) == 0
    assert value(fams, "tandem_queue_messages_paged", **main_q) == 0
    short = {"queue": SHORT, "address": SHORT}
    assert value(fams, "tandem_queue_messages_expired_total", **short) == w.expired
    assert value(fams, "tandem_queue_messages_added_total", **short) == w.expired
    assert value(fams, "tandem_queue_messages", **short) == 0
    # metrics-queues = "orders.#": the dead-letter queue has no series, the totals count it
    assert queue_series(fams, "tandem_queue_messages") == {MAIN, SHORT}
    assert DLQ not in queue_series(fams, "tandem_queue_messages_dead_lettered")
    assert value(fams, "tandem_messages") == w.ready + w.dead
    # durable sends: the messages journal wrote batches, and the histograms say so
    count = value(fams, "tandem_journal_fsync_seconds_count", journal="journal")
    assert count > 0
    assert value(fams, "tandem_journal_fsync_seconds_bucket", journal="journal", le="+Inf") == count
    assert value(fams, "tandem_journal_fsync_seconds_sum", journal="journal") > 0
    assert value(fams, "tandem_journal_batch_bytes_count", journal="journal") == count
    assert value(fams, "tandem_ha_active") == 1
    assert value(fams, "tandem_ha_state", state="active") == 1
    assert value(fams, "tandem_connections") == 0  # the workload's connection is closed
    assert value(fams, "tandem_process_resident_memory_bytes") > 0


def test_a_consumer_and_a_connection_show_while_open(broker_factory: Factory) -> None:
    """Live values: a consumer holding unacknowledged messages is seen as consumer and delivering."""
    b = broker_factory(extra_toml=management_toml()).start()

    async def main() -> dict[str, Any]:
        import tandem.aio as aio

        conn = await aio.connect(b.url)
        try:
            session = await conn.create_session(ack_mode="client")
            prod = session.create_producer("work")
            for i in range(7):
                await prod.send(f"w{i}")
            consumer = await session.create_consumer("work")
            got = [await consumer.receive(5) for _ in range(7)]
            assert all(m is not None for m in got)
            return await asyncio.to_thread(_scrape, b)
        finally:
            await conn.close()

    fams = asyncio.run(main())
    q = {"queue": "work", "address": "work"}
    assert value(fams, "tandem_queue_consumers", **q) == 1
    assert value(fams, "tandem_queue_messages_delivering", **q) == 7
    assert value(fams, "tandem_queue_messages", **q) == 0
    assert value(fams, "tandem_connections") == 1
    assert value(fams, "tandem_sessions") == 1
    assert value(fams, "tandem_consumers") == 1


def test_no_per_queue_series_with_an_empty_pattern(broker_factory: Factory) -> None:
    b = broker_factory(extra_toml=management_toml(extra='metrics-queues = ""\n'), address_settings=SETTINGS).start()
    asyncio.run(run_workload(b.url, Workload(sent=5, acked=1, dead=1, expired=1)))
    fams = _scrape(b)
    assert queue_series(fams, "tandem_queue_messages") == set()
    assert value(fams, "tandem_messages") == 3 + 1  # ready in orders.main, one in the DLQ
    assert value(fams, "tandem_queues") == 3


PERMS = '\n[security-settings."tandem.management"]\nview = ["monitor"]\n'


def test_with_security_a_scrape_needs_a_login_with_view(broker_factory: Factory, tmp_path: Path) -> None:
    b = broker_factory(
        **secured(tmp_path, {"prom": ["monitor"], "app": ["producer"]}, extra_toml=management_toml() + PERMS)
    ).start()
    anonymous = Api.of(b).get("/metrics")
    assert anonymous.status == 401
    assert anonymous.headers.get("www-authenticate") == 'Basic realm="tandem"'
    wrong = Api.of(b, basic=("prom", "not-the-password")).get("/metrics")
    assert wrong.status == 401
    other = Api.of(b, basic=("app", password_of("app"))).get("/metrics")
    assert other.status == 403 and other.json["error"]["code"] == "UNAUTHORIZED"
    fams = _scrape(b, basic=("prom", password_of("prom")))
    assert value(fams, "tandem_failed_logins_total") == 1  # the wrong password above
    assert value(fams, "tandem_ha_active") == 1


def test_prometheus_gets_openmetrics_when_it_asks(broker_factory: Factory) -> None:
    """Prometheus sends `Accept: application/openmetrics-text;...`: it gets that format (ending in
    `# EOF`), which prometheus-client's OpenMetrics parser reads; the same numbers as the text one."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

    b = broker_factory(extra_toml=management_toml()).start()
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    a = Api.of(b).get("/metrics", headers={"Accept": accept})
    assert a.status == 200
    assert a.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    text = a.body.decode()
    assert text.endswith("# EOF\n")
    fams = {f.name: f for f in openmetrics_families(text)}
    assert fams["tandem_ha_active"].samples[0].value == 1
    assert fams["tandem_failovers"].type == "counter"
    assert fams["tandem_journal_fsync_seconds"].type == "histogram"
