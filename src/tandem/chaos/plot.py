"""A picture of a chaos run: throughput and send latency over time, the faults marked.

Needs matplotlib (the optional extra `chaos`); without it no plot is drawn and the run says so.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def series(events: Iterable[dict[str, Any]], bucket: float = 1.0) -> dict[str, Any]:
    """Per `bucket` seconds: confirmed values, acknowledged values, deliveries, send latencies;
    and the faults as (start, end, kind)."""
    ok: dict[int, int] = defaultdict(int)
    acked: dict[int, int] = defaultdict(int)
    delivered: dict[int, int] = defaultdict(int)
    lat: dict[int, list[float]] = defaultdict(list)
    faults: list[tuple[float, float, str]] = []
    open_fault: tuple[float, str] | None = None
    end = 0.0
    for e in events:
        t = float(e["t"])
        end = max(end, t)
        b = int(t // bucket)
        n = len(e.get("vs", ()))
        ev = e["ev"]
        if ev == "ok":
            ok[b] += n
            if "lat" in e:
                lat[b].append(float(e["lat"]))
        elif ev == "ack":
            acked[b] += n
        elif ev == "deliver":
            delivered[b] += n
        elif ev == "fault":
            open_fault = (t, str(e.get("kind", "?")))
        elif ev in ("healed", "note") and open_fault is not None and (ev == "healed" or "not healed" in e["msg"]):
            faults.append((open_fault[0], t, open_fault[1]))
            open_fault = None
    if open_fault is not None:
        faults.append((open_fault[0], end, open_fault[1]))
    buckets = list(range(int(end // bucket) + 1))
    return {
        "t": [b * bucket for b in buckets],
        "confirmed": [ok[b] / bucket for b in buckets],
        "acknowledged": [acked[b] / bucket for b in buckets],
        "delivered": [delivered[b] / bucket for b in buckets],
        "lat_p50": [sorted(lat[b])[len(lat[b]) // 2] if lat[b] else None for b in buckets],
        "lat_max": [max(lat[b]) if lat[b] else None for b in buckets],
        "faults": faults,
    }


def plot(events: Iterable[dict[str, Any]], path: Path, title: str) -> bool:
    """Draw the run into the PNG `path`; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    s = series(events)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(12, 6.5))
    top.plot(s["t"], s["confirmed"], label="confirmed sends/s", lw=1)
    top.plot(s["t"], s["acknowledged"], label="acknowledged/s (confirmed acks)", lw=1)
    top.plot(s["t"], s["delivered"], label="deliveries/s", lw=0.8, alpha=0.6)
    top.set_ylabel("values per second")
    top.legend(loc="upper right", fontsize=8)
    # NaN where nothing was confirmed: the line breaks there instead of bridging the outage.
    p50 = [v * 1000 if v is not None else math.nan for v in s["lat_p50"]]
    mx = [v * 1000 if v is not None else math.nan for v in s["lat_max"]]
    if any(v is not None for v in s["lat_p50"]):
        bottom.plot(s["t"], p50, label="send latency p50", lw=1, marker=".", ms=2)
        bottom.plot(s["t"], mx, label="send latency max", lw=0.8, alpha=0.7, marker=".", ms=2)
        bottom.set_yscale("log")
    bottom.set_ylabel("ms")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper right", fontsize=8)
    for start, end, kind in s["faults"]:
        for ax in (top, bottom):
            ax.axvspan(start, max(end, start + 0.2), color="tab:red", alpha=0.12)
        top.annotate(kind, (start, 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7, va="top")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
