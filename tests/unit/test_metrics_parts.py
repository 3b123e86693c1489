"""The metrics' parts that need no broker: the journal's histograms and the queue pattern."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tandem.config import check_metrics_queues, load_config
from tandem.errors import ConfigError
from tandem.journal import Journal, JournalSettings
from tandem.journal.histogram import BATCH_BOUNDS, Histogram
from tandem.management.metrics import QueueFilter


def test_histogram_buckets_are_cumulative_with_an_infinite_last() -> None:
    h = Histogram((10, 100, 1000))
    for v in (1, 10, 11, 500, 5000, 5000):
        h.observe(v)
    snap = h.snapshot(0.5)
    assert snap.buckets == [(5.0, 2), (50.0, 3), (500.0, 4), (float("inf"), 6)]
    assert snap.count == 6
    assert snap.total == pytest.approx(0.5 * (1 + 10 + 11 + 500 + 5000 + 5000))


def test_histogram_bounds_must_increase() -> None:
    with pytest.raises(ValueError, match="increasing"):
        Histogram((10, 10, 20))
    assert list(BATCH_BOUNDS) == sorted(BATCH_BOUNDS)


def test_a_reader_on_another_thread_never_sees_counts_go_down() -> None:
    h = Histogram((100, 1000))
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set() and i < 2_000_000:
            h.observe(i % 2000)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    last = 0
    try:
        for _ in range(2000):
            snap = h.snapshot()
            counts = [n for _le, n in snap.buckets]
            assert counts == sorted(counts)
            assert snap.count >= last
            last = snap.count
    finally:
        stop.set()
        t.join(10)
    assert last > 0


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("#", ["a", "a.b", "DLQ"], []),
        ("", [], ["a", "DLQ"]),
        ("orders.#", ["orders", "orders.main", "orders.a.b"], ["DLQ", "order.x"]),
        ("*.dlq", ["a.dlq"], ["dlq", "a.b.dlq"]),
        ("DLQ", ["DLQ"], ["DLQ.x", "dlq"]),
    ],
)
def test_queue_pattern(pattern: str, yes: list[str], no: list[str]) -> None:
    f = QueueFilter(pattern)
    assert [f(n) for n in yes] == [True] * len(yes)
    assert [f(n) for n in no] == [False] * len(no)
    assert [f(n) for n in yes] == [True] * len(yes)  # cached answers agree


def test_a_bad_queue_pattern_is_refused() -> None:
    for bad in ("a..b", "a#", "x.*y"):
        with pytest.raises(ValueError, match="metrics-queues"):
            check_metrics_queues(bad)


def test_the_journal_writer_observes_each_batch_once(tmp_path: Path) -> None:
    """One observation per batch written, whatever it holds: the batch's bytes and its write-and-sync time."""
    j = Journal(tmp_path, "t", JournalSettings(file_size=1024 * 1024, min_files=1, pool_files=0))
    j.start_sync()
    written = 0
    for batch in range(3):
        for i in range(10):
            j.add(batch * 100 + i + 1, 1, b"x" * 200)
        written += j.pending_bytes
        j.flush_sync()
    sync = j.metrics.sync_ns.snapshot(1e-9)
    sizes = j.metrics.batch_bytes.snapshot()
    assert sync.count == sizes.count == 3
    assert sync.total > 0
    assert written <= sizes.total <= written + 3 * 64  # (each batch also zeroes the bytes after it)
    j.close_sync()


def test_metrics_queues_is_read_and_checked_with_the_config(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('[management]\nbind = "127.0.0.1:0"\nmetrics-queues = "orders.#"\n')
    cfg = load_config(path)
    assert cfg.management is not None and cfg.management.metrics_queues == "orders.#"
    path.write_text('[management]\nmetrics-queues = "orders#"\n')
    with pytest.raises(ConfigError, match="metrics-queues"):
        load_config(path)
    path.write_text("[management]\n")
    assert load_config(path).management.metrics_queues == "#"  # type: ignore[union-attr]
