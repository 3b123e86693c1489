"""Memory and reload time: a broker holding N queued 1 KiB durable messages.

Fills a fresh broker (production defaults: 10 MiB journal files) with N
messages through `tandem perf producer`, reads its RSS, stops it cleanly,
starts it again and measures the reload: wall time to serving and RSS after.

    .venv/bin/python bench/memory.py --count 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from brokers.tandem import TandemBroker

GIB = 1024 * 1024  # KiB per GiB


async def _queue_count(url: str, queue: str) -> int:
    import tandem.aio as aio

    conn = await aio.connect(url)
    try:
        return int((await conn.manage("queue.stat", name=queue))[0]["message_count"])
    finally:
        await conn.close()


async def _status(url: str) -> dict[str, object]:
    import tandem.aio as aio

    conn = await aio.connect(url)
    try:
        return await conn.manage("broker.status")  # type: ignore[no-any-return]
    finally:
        await conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    a = ap.parse_args()
    b = TandemBroker().start()
    try:
        t0 = time.monotonic()
        fill = subprocess.run(
            [sys.executable, "-m", "tandem", "perf", "producer", "--url", b.url, "--queue", "mem",
             "--count", str(a.count), "--size", str(a.size), "--producers", str(a.producers), "--json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        fill_s = time.monotonic() - t0
        filled = json.loads(fill.stdout)
        rss_filled = b.rss_kib()
        assert asyncio.run(_queue_count(b.url, "mem")) == a.count
        b.stop()
        b.start()
        status = asyncio.run(_status(b.url))
        rss_reloaded = b.rss_kib()
        held = asyncio.run(_queue_count(b.url, "mem"))
    finally:
        b.cleanup()
    result = {
        "benchmark": "memory-and-reload",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}, {_cpu()}",
        "command": " ".join(["bench/memory.py", *sys.argv[1:]]),
        "count": a.count,
        "size": a.size,
        "fill_msgs_per_s": filled["msgs_per_s"],
        "fill_s": round(fill_s, 1),
        "rss_filled_gib": round(rss_filled["VmRSS"] / GIB, 3),
        "rss_peak_filled_gib": round(rss_filled["VmHWM"] / GIB, 3),
        "reload_s": status["reload_s"],
        "start_to_serving_s": round(b.start_seconds, 2),
        "rss_reloaded_gib": round(rss_reloaded["VmRSS"] / GIB, 3),
        "rss_peak_reloaded_gib": round(rss_reloaded["VmHWM"] / GIB, 3),
        "messages_after_reload": held,
        "targets": {"rss_gib": 1.6, "reload_s": 20},
    }
    print(json.dumps(result, indent=2))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if held == a.count else 1


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" x{_ncpu()}"
    except OSError:
        pass
    return platform.processor()


def _ncpu() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    raise SystemExit(main())
