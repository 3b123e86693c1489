"""Message rates (msg/s in and out) for the management API, from counters the queues keep anyway.

No per-message work: each queue already counts what was added and acknowledged. A sample of
those counters is taken at most once a second (when the broker's housekeeping runs, and when a
rate is asked for and the last sample is older than that), and a rate is the difference between
the newest sample and the oldest one of the window (10 s), divided by the time between them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

WINDOW = 10.0  # s
MIN_PERIOD = 1.0  # s between two samples


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic()
    added: dict[str, int]  # per queue
    acked: dict[str, int]
    total_added: int
    total_acked: int


class RateTracker:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: deque[Sample] = deque()

    def sample(self, queues: Iterable[Any], force: bool = False) -> None:
        """Record the counters of `queues` (objects with name, messages_added, messages_acked)."""
        now = self._clock()
        if self._samples and not force and now - self._samples[-1].at < MIN_PERIOD:
            return
        added = {q.name: q.messages_added for q in queues}
        acked = {q.name: q.messages_acked for q in queues}
        # Totals from the per-queue counters: a deleted queue's messages leave the totals, so a
        # total can drop; rates below are never negative.
        self._samples.append(Sample(now, added, acked, sum(added.values()), sum(acked.values())))
        # Keep one sample at least WINDOW old, so a rate covers the whole window once it can.
        while len(self._samples) > 2 and now - self._samples[1].at >= WINDOW:
            self._samples.popleft()

    def clear(self) -> None:
        """The broker stopped serving: counters start over with the next post office."""
        self._samples.clear()

    def _ends(self) -> tuple[Sample, Sample] | None:
        if len(self._samples) < 2:
            return None
        newest = self._samples[-1]
        oldest = next((s for s in self._samples if newest.at - s.at <= WINDOW), self._samples[0])
        if oldest is newest:
            oldest = self._samples[-2]
        return oldest, newest

    def totals(self) -> dict[str, float | None]:
        """Broker-wide `{"in", "out"}` msg/s (None until two samples exist)."""
        ends = self._ends()
        if ends is None:
            return {"in": None, "out": None}
        a, b = ends
        dt = b.at - a.at
        return {"in": _rate(a.total_added, b.total_added, dt), "out": _rate(a.total_acked, b.total_acked, dt)}

    def of(self, queue: str) -> dict[str, float | None]:
        """A queue's `{"added", "acked"}` msg/s (None until the queue is in two samples: over the
        window, or since the first sample that has it, for a queue created within the window)."""
        if len(self._samples) < 2:
            return {"added": None, "acked": None}
        b = self._samples[-1]
        if queue not in b.added:
            return {"added": None, "acked": None}
        a = next((s for s in self._samples if b.at - s.at <= WINDOW and queue in s.added), b)
        if a is b:
            older = self._samples[-2]
            if queue not in older.added:
                return {"added": None, "acked": None}
            a = older
        dt = b.at - a.at
        return {
            "added": _rate(a.added[queue], b.added[queue], dt),
            "acked": _rate(a.acked[queue], b.acked[queue], dt),
        }


def _rate(before: int, after: int, dt: float) -> float:
    return round(max(0, after - before) / dt, 3) if dt > 0 else 0.0
