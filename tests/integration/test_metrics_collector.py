"""The metrics collector against a real broker in this process (real sockets, real journal).

The same checks over HTTP against a broker process are in test_metrics.py; here the collector's
registry is read directly, which also lets a test look at what a scrape costs the loop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from metrics_workload import DLQ, MAIN, SETTINGS, SHORT, Workload, parse, queue_series, run_workload, value
from tandem.config import load_config
from tandem.management.metrics import MetricsRegistry
from tandem.server.broker import Broker


def _broker(tmp_path: Path) -> Broker:
    cfg = load_config(
        None,
        name="m",
        data_directory=str(tmp_path / "data"),
        journal_file_size=1024 * 1024,
        acceptors=[{"name": "native", "bind": "127.0.0.1:0"}],
        address_settings=SETTINGS,
    )
    return Broker(cfg)


def test_a_scrape_reads_what_was_sent_acked_expired_and_dead_lettered(tmp_path: Path) -> None:
    w = Workload()

    async def main() -> dict[str, Any]:
        b = _broker(tmp_path)
        await b.start()
        try:
            host, port = b.bound["native"]
            await run_workload(f"tcp://{host}:{port}", w)
            return parse(MetricsRegistry(b, "orders.#").exposition()[0].decode())
        finally:
            await b.stop()

    fams = asyncio.run(main())
    main_q = {"queue": MAIN, "address": MAIN}
    assert value(fams, "tandem_queue_messages_added_total", **main_q) == w.sent
    assert value(fams, "tandem_queue_messages_acked_total", **main_q) == w.acked
    assert value(fams, "tandem_queue_messages_dead_lettered_total", **main_q) == w.dead
    assert value(fams, "tandem_queue_messages", **main_q) == w.ready
    assert value(fams, "tandem_queue_messages_delivering", **main_q) == 0
    assert value(fams, "tandem_queue_consumers", **main_q) == 0
    short = {"queue": SHORT, "address": SHORT}
    assert value(fams, "tandem_queue_messages_expired_total", **short) == w.expired
    assert value(fams, "tandem_queue_messages", **short) == 0
    # DLQ does not match orders.#: no series of its own, but counted in the totals
    assert queue_series(fams, "tandem_queue_messages") == {MAIN, SHORT}
    assert DLQ not in queue_series(fams, "tandem_queue_messages_added")
    assert value(fams, "tandem_messages") == w.ready + w.dead
    assert value(fams, "tandem_queues") == 3
    # durable sends went through the messages journal: batches observed, sums consistent
    count = value(fams, "tandem_journal_fsync_seconds_count", journal="journal")
    assert count > 0
    assert value(fams, "tandem_journal_fsync_seconds_bucket", journal="journal", le="+Inf") == count
    assert value(fams, "tandem_journal_batch_bytes_count", journal="journal") == count
    assert value(fams, "tandem_journal_batch_bytes_sum", journal="journal") > w.sent * 10
    assert value(fams, "tandem_ha_state", state="active", role="live-only", ha_policy="live-only") == 1
    assert value(fams, "tandem_ha_state", state="waiting", role="live-only", ha_policy="live-only") == 0
    assert value(fams, "tandem_ha_active") == 1
    assert value(fams, "tandem_failovers_total") == 0
    assert value(fams, "tandem_process_resident_memory_bytes") > 10 * 1024 * 1024
    assert value(fams, "tandem_memory_message_bytes") > 0
