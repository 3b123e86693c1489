"""Failover time of a shared-store pair: kill -9 of the primary → first confirmed send on the backup,
and → first message received by a consumer, with 0, 100k and 1M durable messages in the journal.

Each size is filled once (1 KiB messages in a queue nobody reads); then, --repeat times: start the
primary and the backup on the store, let a producer (auto_dedup, send() after send()) and a
consumer run against the pair URL, kill -9 the active primary and time both events. Medians
are written to bench/results/failover.json.

    .venv/bin/python bench/failover.py --sizes 0,100000,1000000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from memory import _cpu  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pair:
    def __init__(self, root: Path, ports: tuple[int, int]) -> None:
        self.root = root
        self.store = root / "store"
        self.ports = ports
        self.procs: list[subprocess.Popen[str] | None] = [None, None]
        names = ("primary", "backup")
        conns = "".join(
            f'[[connectors]]\nname = "{n}"\nurl = "127.0.0.1:{p}"\n' for n, p in zip(names, ports, strict=True)
        )
        for i, name in enumerate(names):
            other = names[1 - i]
            (root / f"{name}.toml").write_text(
                f'name = "{name}"\ndata-directory = "{self.store}"\n'
                f'ha-policy = "shared-store-{name}"\nconnector-ref = "{name}"\nstatic-connectors = ["{other}"]\n'
                f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:{ports[i]}"\n{conns}'
            )

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.ports[0]},tcp://127.0.0.1:{self.ports[1]}"

    def start(self, i: int) -> None:
        name = ("primary", "backup")[i]
        self.procs[i] = subprocess.Popen(
            [sys.executable, "-m", "tandem", "run", "--config", str(self.root / f"{name}.toml"), "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / f"{name}.log", "a"),
        )

    def status(self, i: int) -> dict[str, Any] | None:
        out = subprocess.run(
            [sys.executable, "-m", "tandem", "admin", "status", "--json", "--url", f"tcp://127.0.0.1:{self.ports[i]}"],
            capture_output=True,
            text=True,
        )
        return json.loads(out.stdout) if out.returncode == 0 else None  # type: ignore[no-any-return]

    def state(self, i: int) -> str | None:
        st = self.status(i)
        return st["state"] if st else None

    def wait_warm(self, timeout: float = 600) -> float:
        """Seconds until the passive backup has read the whole store (it follows from then on)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            st = self.status(1)
            if st and st.get("following", {}).get("caught_up"):
                return time.monotonic() - t0
            time.sleep(0.2)
        raise RuntimeError("the backup did not catch up")

    def wait(self, i: int, state: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state(i) == state:
                return
            time.sleep(0.2)
        raise RuntimeError(f"server {i} not {state} in {timeout}s: {(self.root / 'primary.log').read_text()[-2000:]}")

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()

    def stop_all(self) -> None:
        for i in (0, 1):
            self.kill(i)


async def _measure(pair: Pair) -> dict[str, float]:
    import tandem.aio as aio

    conn = await aio.connect(pair.url, retry_interval=20, max_retry_interval=20)
    prod = (await conn.create_session()).create_producer("fo")
    cconn = await aio.connect(pair.url, retry_interval=20, max_retry_interval=20)
    consumer = await (await cconn.create_session()).create_consumer("fo")
    marks: dict[str, float] = {}
    stop = asyncio.Event()

    async def produce() -> None:
        i = 0
        while not stop.is_set():
            await prod.send(f"{i}")
            if "kill" in marks and "send" not in marks:
                marks["send"] = time.monotonic() - marks["kill"]
            i += 1
            await asyncio.sleep(0.002)

    async def consume() -> None:
        while not stop.is_set():
            try:
                msg = await consumer.receive(0.5)
            except Exception:
                continue
            if msg is not None and "kill" in marks and "receive" not in marks:
                marks["receive"] = time.monotonic() - marks["kill"]

    tasks = [asyncio.create_task(produce()), asyncio.create_task(consume())]
    await asyncio.sleep(1.0)
    await asyncio.get_running_loop().run_in_executor(None, pair.kill, 0)
    marks["kill"] = time.monotonic()
    deadline = time.monotonic() + 120
    while ("send" not in marks or "receive" not in marks) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await conn.close()
    await cconn.close()
    return {
        "to_first_send_s": round(marks.get("send", -1), 3),
        "to_first_receive_s": round(marks.get("receive", -1), 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0,100000,1000000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(BENCH / "results"))
    ap.add_argument("--note", default="", help="what the reader should know about this run (machine load, version)")
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    rows = []
    for size in [int(x) for x in a.sizes.split(",")]:
        root = Path(tempfile.mkdtemp(prefix="tandem-failover-"))
        pair = Pair(root, (_free_port(), _free_port()))
        runs: list[dict[str, float]] = []
        try:
            pair.start(0)
            pair.wait(0, "active")
            if size:
                subprocess.run(
                    [sys.executable, "-m", "tandem", "perf", "producer", "--url", f"tcp://127.0.0.1:{pair.ports[0]}",
                     "--queue", "backlog", "--count", str(size), "--producers", "4", "--json"],
                    check=True, capture_output=True,
                )  # fmt: skip
            for r in range(a.repeat):
                if r:  # the store is served by the backup now: restart both, primary first
                    pair.stop_all()
                    pair.start(0)
                    pair.wait(0, "active")
                pair.start(1)
                pair.wait(1, "passive")
                warm_up = pair.wait_warm()
                time.sleep(1.0)
                m = _measure_sync(pair)
                m["messages"] = size
                m["backup_warm_up_s"] = round(warm_up, 1)
                runs.append(m)
                print(json.dumps(m), flush=True)
        finally:
            pair.stop_all()
            shutil.rmtree(root, ignore_errors=True)
        rows.append(
            {
                "messages": size,
                "runs": len(runs),
                "median_to_first_send_s": statistics.median(x["to_first_send_s"] for x in runs),
                "median_to_first_receive_s": statistics.median(x["to_first_receive_s"] for x in runs),
                "all": runs,
            }
        )
    for row in rows:
        print(
            f"{row['messages']:>9,} messages: kill -9 → first confirmed send {row['median_to_first_send_s']:.3f} s, "
            f"→ first receive {row['median_to_first_receive_s']:.3f} s (median of {row['runs']})"
        )
    result = {
        "benchmark": "shared-store-failover",
        "date": started,
        "machine": _cpu(),
        "command": " ".join(["bench/failover.py", *sys.argv[1:]]),
        "target": "< 1 s with 1M messages for a caught-up backup (issue 13); < 2 s before",
        "note": a.note,
        "summary": rows,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "failover.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _measure_sync(pair: Pair) -> dict[str, Any]:
    return asyncio.run(_measure(pair))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
