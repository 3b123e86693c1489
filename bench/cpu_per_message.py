"""Broker CPU per message: each server's and the clients' CPU seconds over one `tandem perf pair`
run (1 KiB, 1+1, window 256), read from /proc, for a live-only server or a replicated pair.

The clients' figure is the `tandem perf` processes' CPU per message in steady state: a run of
2,000 messages first measures their start-up, which is taken off.

CPU time per message moves far less than throughput when other work shares the machine, so
two versions can be compared on a busy box: run this alternately with PYTHONPATH pointing at
each version's src/ (the servers are started with `python -m tandem`, so they inherit it).

    .venv/bin/python bench/cpu_per_message.py repl 100000
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/cpu_per_message.py live 100000
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replication as R

SMALL = 2_000


def cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "repl"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    root = Path(tempfile.mkdtemp(prefix="tandem-cpu-"))
    pair = R.ReplicatedPair(root, True)
    try:
        if mode == "repl":
            pair.start_both()
        else:
            pair.start(0)
            pair.wait(0, lambda s: s["state"] == "active", "active")
        url = pair.server_url(0)
        R._perf(url, 1, 1, 20_000)  # warm-up, not counted
        pids = [p.pid for p in pair.procs if p is not None]
        # The clients' CPU is read from the finished `tandem perf` processes, start-up included
        # (three interpreters importing the client: 10-13 µs per message at 100,000). A run of
        # SMALL messages measures that part, which is taken off.
        c0 = os.times()
        R._perf(url, 1, 1, SMALL)
        c1 = os.times()
        before = [cpu(p) for p in pids]
        t0 = os.times()
        r = R._perf(url, 1, 1, count)
        t1 = os.times()
        after = [cpu(p) for p in pids]

        def per(a: float, b: float) -> float:
            return round((b - a) / count * 1e6, 1)

        def children(t: os.times_result) -> float:
            return t.children_user + t.children_system

        small = children(c1) - children(c0)
        clients = round((children(t1) - children(t0) - small) / (count - SMALL) * 1e6, 1)
        servers = [per(a, b) for a, b in zip(before, after, strict=True)]
        conf = (r.get("confirm_latency_ms") or {}).get("p50")
        print(f"{mode} {r['msgs_per_s']:.0f} msg/s  us of CPU per message: servers {servers} clients {clients}  "
              f"confirm p50 {conf} ms")  # fmt: skip
    finally:
        pair.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
