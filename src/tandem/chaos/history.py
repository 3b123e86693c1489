"""The history of a chaos run: one JSON object per line, every operation and fault, timestamped.

The checker reads nothing else, so a history kept from a failed run can be checked again, and a
hand-written one tests the checker. Fields:

- ``t``: seconds since the run started (monotonic clock); ``ev``: the event; ``p``: who (a
  producer ``p0``, a consumer ``c1``, the drainer ``d``, the nemesis ``n``);
- ``vs``: the values the event is about (message bodies, unique per run).

Events about values:

=============  ============================================================================
``attempt``    a send (or a transaction of sends) is about to go out
``ok``         confirmed: the broker has it (``lat``: seconds since the attempt)
``info``       outcome unknown (``err``): it may or may not have been applied
``fail``       definitely not applied (a transaction rolled back, ``err``)
``deliver``    handed to a consumer (``ack``: ``"auto"`` for an auto-acknowledging consumer,
               ``"tx"`` or ``"client"`` when an acknowledgement is to follow)
``ack``        the acknowledgement of these deliveries is confirmed (a commit that went
               through, or an awaited acknowledgement)
``ack-info``   the acknowledgement's outcome is unknown
``ack-fail``   not acknowledged (rolled back, stale): they come again
=============  ============================================================================

Events of the nemesis: ``fault`` (``kind``, ``target``), ``healed`` (``kind``, ``took``),
``note`` (``msg``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

VALUE_EVENTS = ("attempt", "ok", "info", "fail", "deliver", "ack", "ack-info", "ack-fail")


class History:
    """Appends events to a JSON-lines file; thread-safe (the workload's loop and the nemesis thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._file: IO[str] = path.open("w", buffering=1 << 16)
        self.counts: dict[str, int] = {}

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, ev: str, p: str, vs: Iterable[str] = (), **fields: Any) -> None:
        event: dict[str, Any] = {"t": round(self.now(), 4), "ev": ev, "p": p}
        values = list(vs)
        if values:
            event["vs"] = values
        event.update(fields)
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self.counts[ev] = self.counts.get(ev, 0) + len(values or [None])
            self._file.write(line + "\n")

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read(path: Path) -> Iterator[dict[str, Any]]:
    """The events of a history file, in order."""
    with path.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
