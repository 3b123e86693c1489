"""What a Prometheus scraper costs the broker: `tandem perf pair` with and without a scraper
polling GET /metrics every second, interleaved (A B B A ...) on one broker so drift hits both
alike (the target: within 2 %, docs/metrics.md).

Two methods. `windows` (the default, the judged one): one long perf pair, and the scraper
switched on and off for alternate windows of `--window-seconds`; each window's throughput is
read from the queue's acknowledged counter, and each adjacent off/on pair gives one ratio.
Without a client process started per sample, the windows differ far less than whole runs do.
`runs`: one perf pair run of `--count` per sample, the ratio of the medians.

The broker runs with its management listener on in both modes; only the scraper differs.
`--queues N` adds N idle queues first, so each scrape walks N more queues (cardinality).

    .venv/bin/python bench/metrics_overhead.py --windows 40 --window-seconds 8
    .venv/bin/python bench/metrics_overhead.py --method runs --count 100000 --repeat 5
    .venv/bin/python bench/metrics_overhead.py --windows 2 --window-seconds 2   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from brokers.tandem import TandemBroker  # noqa: E402
from compare import _fmt, _run_json  # noqa: E402
from cpu_per_message import cpu  # noqa: E402
from memory import _cpu  # noqa: E402

MANAGEMENT = '[management]\nbind = "127.0.0.1:0"\n'


class Scraper:
    """GET /metrics every `interval` seconds on a thread of this (the bench's) process."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.times: list[float] = []
        self.sizes: list[int] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    self.sizes.append(len(r.read()))
                self.times.append(time.monotonic() - t0)
            except OSError:
                self.errors += 1
            self._stop.wait(max(self.interval - (time.monotonic() - t0), 0.0))

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


def scrape_cost(pid: int, url: str, n: int = 50) -> float:
    """The broker's CPU seconds per scrape: `n` scrapes back to back on an idle broker, less what
    it spends idle over the same time. Steady where throughput is not: multiplied by the scrape
    rate and divided by the broker's CPU per second under load, it is the scraper's share."""
    c0, t0 = cpu(pid), time.monotonic()
    for _ in range(n):
        with urllib.request.urlopen(url, timeout=10) as r:
            r.read()
    busy, took = cpu(pid) - c0, time.monotonic() - t0
    c1 = cpu(pid)
    time.sleep(took)
    idle = cpu(pid) - c1
    return max(busy - idle, 0.0) / n


async def _make_queues(url: str, n: int) -> None:
    import tandem.aio as aio

    conn = await aio.connect(url)
    try:
        for i in range(n):
            await conn.manage("queue.create", name=f"idle.{i}", exists_ok=True)
    finally:
        await conn.close()


def _acked(api: str) -> int:
    with urllib.request.urlopen(api, timeout=10) as r:
        return int(json.loads(r.read())["messages_acknowledged"])


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` on `cpus` (its writer and executor threads too)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task.name), cpus)


def windowed(b: TandemBroker, perf: list[str], metrics_url: str, a: argparse.Namespace) -> list[dict[str, Any]]:
    """One perf pair for every window; the scraper on in alternate ones (A B B A ...)."""
    api = f"http://127.0.0.1:{b.ports['management']}/api/queues/perf"
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([*perf, "--count", "1000000000"], stdout=subprocess.DEVNULL, stderr=err)
    if a.pin:  # the broker on CPU 0; the clients, the scraper and this process on CPU 1
        pin(b.pid, {0})
        pin(proc.pid, {1})
        pin(os.getpid(), {1})
    runs: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 60
        while True:  # the queue exists once the pair has started
            try:
                _acked(api)
                break
            except OSError as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err.seek(0)
                    raise RuntimeError(f"perf pair did not start: {err.read().decode(errors='replace')}") from e
                time.sleep(0.2)
        if a.pin:
            pin(b.pid, {0})  # (threads started since)
            pin(proc.pid, {1})
        time.sleep(a.window_seconds)  # warm up
        order = [m for i in range(0, a.windows, 2) for m in (("off", "scraper") if i % 4 == 0 else ("scraper", "off"))]
        for mode in order[: a.windows]:
            if proc.poll() is not None:
                raise RuntimeError("perf pair ended before the windows did")
            scraper = Scraper(metrics_url, a.interval) if mode == "scraper" else None
            if scraper:
                scraper.__enter__()
            n0, c0, t0 = _acked(api), cpu(b.pid), time.monotonic()
            time.sleep(a.window_seconds)
            n1, c1, t1 = _acked(api), cpu(b.pid), time.monotonic()
            if scraper:
                scraper.__exit__()
            r: dict[str, Any] = {
                "driver": mode,
                "msgs_per_s": (n1 - n0) / (t1 - t0),
                "broker_cpu_us_per_msg": round((c1 - c0) * 1e6 / max(n1 - n0, 1), 2),
            }
            if scraper:
                r["scrapes"] = len(scraper.times)
                r["scrape_ms_median"] = round(statistics.median(scraper.times) * 1000, 2) if scraper.times else None
            runs.append(r)
            print(f"{mode:8} {r['msgs_per_s']:>9,.0f} msg/s  broker {r['broker_cpu_us_per_msg']} us/msg", flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        err.close()
    return runs


def paired(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Scraper/off ratios of `key` over adjacent windows, their median and a bootstrap 95 % interval
    of their mean (2,000 resamples, fixed seed)."""
    ratios = [
        on[key] / off[key]
        for x, y in zip(runs[::2], runs[1::2], strict=False)
        for off, on in [(x, y) if x["driver"] == "off" else (y, x)]
    ]
    rng = random.Random(1)
    means = sorted(statistics.fmean(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return {
        "ratios": [round(r, 4) for r in ratios],
        "median": round(statistics.median(ratios), 4),
        "mean": round(statistics.fmean(ratios), 4),
        "ci95": [round(means[49], 4), round(means[1949], 4)],
    }


def by_runs(perf: list[str], metrics_url: str, pid: int, a: argparse.Namespace) -> list[dict[str, Any]]:
    """One perf pair run per sample, A B B A ..."""
    runs: list[dict[str, Any]] = []
    order = []
    for i in range(a.repeat):  # A B B A A B ...: each mode as often first as second
        order += ["off", "scraper"] if i % 2 == 0 else ["scraper", "off"]
    for mode in order:
        cpu0 = cpu(pid)
        if mode == "scraper":
            with Scraper(metrics_url, a.interval) as s:
                r = _run_json([*perf, "--count", str(a.count)], 1800)
            r["scrapes"] = len(s.times)
            r["scrape_errors"] = s.errors
            r["scrape_ms_median"] = round(statistics.median(s.times) * 1000, 2) if s.times else None
            r["scrape_ms_max"] = round(max(s.times) * 1000, 2) if s.times else None
            r["scrape_bytes"] = s.sizes[-1] if s.sizes else None
        else:
            r = _run_json([*perf, "--count", str(a.count)], 1800)
        r["broker_cpu_us_per_msg"] = round((cpu(pid) - cpu0) * 1e6 / a.count, 2)
        r["driver"] = mode
        r["broker"] = "tandem"
        runs.append(r)
        extra = f"  broker {r['broker_cpu_us_per_msg']} us/msg"
        extra += f"  scrapes {r['scrapes']} median {r['scrape_ms_median']} ms" if mode == "scraper" else ""
        print(_fmt(r) + extra, flush=True)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", choices=("windows", "runs"), default="windows")
    ap.add_argument("--windows", type=int, default=40, help="windows (even: half with the scraper)")
    ap.add_argument("--window-seconds", type=float, default=8.0)
    ap.add_argument("--non-durable", action="store_true", help="non-durable messages")
    ap.add_argument("--data-parent", help="where the broker's data directory goes (/dev/shm: no disk latency)")
    ap.add_argument("--pin", action="store_true", help="broker on CPU 0, clients and scraper on CPU 1 (windows)")
    ap.add_argument("--count", type=int, default=100_000, help="messages per perf run (runs)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per mode (runs)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    ap.add_argument("--queues", type=int, default=0, help="idle queues to add (each scrape walks them)")
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--consumers", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=20_000)
    ap.add_argument("--out", default=str(BENCH / "results" / "metrics_overhead.json"))
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    runs: list[dict[str, Any]] = []
    data = Path(tempfile.mkdtemp(prefix="tandem-metrics-", dir=a.data_parent)) / "data" if a.data_parent else None
    try:
        with TandemBroker(data_dir=data, extra_toml=MANAGEMENT) as b:
            metrics_url = f"http://127.0.0.1:{b.ports['management']}/metrics"
            if a.queues:
                asyncio.run(_make_queues(b.url, a.queues))
            perf = [sys.executable, "-m", "tandem", "perf", "pair", "--url", b.url, "--json", "--no-progress",
                    "--producers", str(a.producers), "--consumers", str(a.consumers),
                    *(["--non-durable"] if a.non_durable else [])]  # fmt: skip
            _run_json([*perf, "--count", str(a.warmup)], 600)
            per_scrape = scrape_cost(b.pid, metrics_url)
            if a.method == "windows":
                runs = windowed(b, perf, metrics_url, a)
            else:
                runs = by_runs(perf, metrics_url, b.pid, a)
    finally:
        if data is not None:
            shutil.rmtree(data.parent, ignore_errors=True)
    summary: dict[str, Any] = {"method": a.method}
    for mode in ("off", "scraper"):
        rs = [r for r in runs if r["driver"] == mode]
        summary[mode] = {
            "msgs_per_s": round(statistics.median(r["msgs_per_s"] for r in rs)),
            "all_msgs_per_s": [round(r["msgs_per_s"]) for r in rs],
            "broker_cpu_us_per_msg": round(statistics.median(r["broker_cpu_us_per_msg"] for r in rs), 2),
            "all_broker_cpu_us_per_msg": [r["broker_cpu_us_per_msg"] for r in rs],
        }
        if a.method == "runs":
            summary[mode]["p99_ms"] = round(statistics.median(r["latency_ms"]["p99"] for r in rs), 2)
    # Each off/on pair taken side by side (drift cancels), and how sure the mean of their ratios is.
    thr, cpu_ = paired(runs, "msgs_per_s"), paired(runs, "broker_cpu_us_per_msg")
    summary["throughput_ratio"] = thr
    summary["broker_cpu_ratio"] = cpu_
    summary["difference_pct"] = round((1 - thr["mean"]) * 100, 2)
    summary["broker_cpu_difference_pct"] = round((cpu_["mean"] - 1) * 100, 2)
    # The scrapes' own cost, measured alone: CPU per scrape x scrapes per second, against the CPU
    # the broker spends per second at the off runs' rate.
    load = summary["off"]["broker_cpu_us_per_msg"] * 1e-6 * summary["off"]["msgs_per_s"]
    share = per_scrape / a.interval / load
    summary["broker_cpu_ms_per_scrape"] = round(per_scrape * 1000, 3)
    summary["scrape_share_of_broker_cpu_pct"] = round(share * 100, 3)
    # The target (within 2 %) is judged on the mean of the paired ratios; whether the whole 95 %
    # interval is within it too (what a proof would need) is kept next to it.
    summary["target_met"] = abs(1 - thr["mean"]) <= 0.02
    summary["interval_within_target"] = thr["ci95"][0] >= 0.98 and thr["ci95"][1] <= 1.02
    slower = summary["difference_pct"]
    how = f"{slower} % slower" if slower >= 0 else f"{-slower} % faster"
    met = "met" if summary["target_met"] else "NOT met"
    print(
        f"\noff {summary['off']['msgs_per_s']:,} msg/s, scraper every {a.interval} s "
        f"{summary['scraper']['msgs_per_s']:,} msg/s (medians)\n"
        f"paired throughput ratio scraper/off: mean {thr['mean']} ({how}), 95 % interval "
        f"{thr['ci95'][0]}-{thr['ci95'][1]} over {len(thr['ratios'])} pairs (target within 2 %: {met}; "
        f"interval within it: {summary['interval_within_target']})\n"
        f"paired broker CPU per message ratio: mean {cpu_['mean']}, 95 % interval {cpu_['ci95'][0]}-{cpu_['ci95'][1]}\n"
        f"one scrape costs the broker {summary['broker_cpu_ms_per_scrape']} ms of CPU: every {a.interval} s that is "
        f"{summary['scrape_share_of_broker_cpu_pct']} % of its CPU at the off runs' rate"
    )
    result = {
        "benchmark": "metrics-overhead",
        "date": started,
        "machine": _cpu(),
        "command": " ".join(["bench/metrics_overhead.py", *sys.argv[1:]]),
        "settings": {
            "method": a.method,
            "pin": a.pin,
            "non_durable": a.non_durable,
            "data_parent": a.data_parent,
            "windows": a.windows,
            "window_seconds": a.window_seconds,
            "count": a.count,
            "repeat": a.repeat,
            "interval_s": a.interval,
            "queues": a.queues,
            "producers": a.producers,
            "consumers": a.consumers,
        },
        "summary": summary,
        "runs": runs,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
