"""The plot's series from a hand-written history, and the PNG itself (matplotlib: the `chaos` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem.chaos import plot


def ev(t: float, ev: str, *vs: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "ev": ev, "p": "x", "vs": list(vs), **fields}


EVENTS = [
    ev(0.1, "ok", "a", "b", lat=0.004),
    ev(0.5, "ok", "c", lat=0.010),
    ev(0.7, "deliver", "a"),
    ev(1.2, "fault", kind="kill", target="primary"),
    ev(1.3, "ack", "a", "b"),
    ev(2.9, "ok", "d", lat=1.5),
    ev(3.4, "healed", kind="kill"),
    ev(3.6, "fault", kind="zookeeper", target="primary"),
    ev(4.0, "note", msg="not healed after zookeeper: ..."),
]


def test_series_buckets_per_second_and_spans_each_fault_until_healed() -> None:
    s = plot.series(EVENTS)
    assert s["t"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert s["confirmed"] == [3, 0, 1, 0, 0]
    assert s["acknowledged"] == [0, 2, 0, 0, 0] and s["delivered"] == [1, 0, 0, 0, 0]
    assert s["lat_p50"][0] == 0.010 and s["lat_max"][2] == 1.5 and s["lat_p50"][1] is None
    assert s["faults"] == [(1.2, 3.4, "kill"), (3.6, 4.0, "zookeeper")]


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "chaos.png"
    assert plot.plot(EVENTS, path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
