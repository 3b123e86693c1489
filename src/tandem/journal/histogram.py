"""Fixed-bucket histograms kept by the journal's writer thread, one observation per batch.

Made to cost a batch next to nothing (decision 0068): integer bounds, one `bisect` and two
additions, no lock. Only the writer thread adds; a reader on another thread (a /metrics scrape)
copies the counters, so it may see a sum one observation ahead of the counts, never a torn count.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

# Write-and-sync time of one batch, in nanoseconds (100 µs .. 2.5 s; slower ones go to +Inf).
SYNC_BOUNDS_NS: tuple[int, ...] = tuple(
    int(s * 1e9) for s in (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
)
# Bytes of one batch (256 B .. 64 MiB, times 4 each).
BATCH_BOUNDS: tuple[int, ...] = tuple(256 * 4**i for i in range(10))


@dataclass(frozen=True)
class HistogramSnapshot:
    """Bucket upper bounds with their cumulative counts (the last bound is +Inf), and the sum."""

    buckets: list[tuple[float, int]]
    total: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1] if self.buckets else 0


class Histogram:
    """Counts per bucket of integer observations; `observe` runs on one thread only."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[int, ...]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("histogram bounds must be increasing")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.total = 0

    def observe(self, value: int) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def snapshot(self, scale: float = 1.0) -> HistogramSnapshot:
        """Cumulative buckets (Prometheus's `le`), bounds and sum multiplied by `scale`."""
        counts = list(self.counts)  # one copy: consistent with itself whatever the writer does meanwhile
        total = self.total
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, None), counts, strict=True):
            running += n
            out.append((float("inf") if bound is None else bound * scale, running))
        return HistogramSnapshot(out, total * scale)


class JournalMetrics:
    """What the writer thread observes of each batch it writes."""

    __slots__ = ("batch_bytes", "sync_ns")

    def __init__(self) -> None:
        self.sync_ns = Histogram(SYNC_BOUNDS_NS)
        self.batch_bytes = Histogram(BATCH_BOUNDS)
