"""Large messages end to end: time, and peak RSS of the broker and of the client, per size.

For each size in `--size` (MiB, a comma list), a fresh broker and a fresh client process: the client
sends one message of that size with `send_stream` from a generated stream (it never holds the body
either), receives it, checks its SHA-256 while reading it back from its spool, and reports the send
and receive times and the peak RSS (VmHWM) of both processes. The issue's targets: 1 GiB and
2 GiB, broker RSS under 200 MiB. Disk: the broker's file and the client's spool (the system's
temporary directory) hold the body once each, so twice the size must be free there.

    .venv/bin/python bench/large_message.py --size 1024,2048     # the issue's figures (~4 GiB of disk)
    .venv/bin/python bench/large_message.py --size 20            # a try
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from brokers.tandem import TandemBroker
from memory import _cpu
from tandem.testing.procs import memory
from tandem.testing.streams import GeneratedBody

MIB = 1 << 20
BROKER_RSS_TARGET_MIB = 200


def one(size_mib: int, chunk_kib: int, compress: bool, timeout: float) -> dict[str, Any]:
    """(The child process) one message of `size_mib` through a fresh broker."""
    import tandem

    size = size_mib * MIB
    b = TandemBroker().start()
    try:
        url = f"{b.url}?min_large_message_size={chunk_kib * 1024}&compress_large_messages={str(compress).lower()}"
        broker_base = memory(b.pid, "VmRSS")
        client_base = memory("self", "VmRSS")
        with tandem.connect(url, call_timeout=int(timeout * 1000)) as conn, conn.session() as s:
            s.create_queue("big")
            src = GeneratedBody(size)
            t0 = time.monotonic()
            s.create_producer("big").send_stream(src, size=size)
            send_s = time.monotonic() - t0
            t0 = time.monotonic()
            m = s.create_consumer("big").receive(timeout)
            receive_s = time.monotonic() - t0
            if m is None or not m.large:
                raise RuntimeError(f"no large message received in {timeout:.0f}s: {m!r}")
            t0 = time.monotonic()
            digest = hashlib.sha256()
            stream = m.body_stream()
            while block := stream.read(MIB):
                digest.update(block)
            check_s = time.monotonic() - t0
            intact = digest.hexdigest() == src.digest.hexdigest()
        broker_peak = memory(b.pid, "VmHWM")
        client_peak = memory("self", "VmHWM")
    finally:
        b.cleanup()
    return {
        "size_mib": size_mib,
        "chunk_kib": chunk_kib,
        "compress": compress,
        "send_s": round(send_s, 2),
        "send_mib_per_s": round(size_mib / send_s, 1),
        "receive_s": round(receive_s, 2),  # from receive() to the whole body spooled at the client
        "receive_mib_per_s": round(size_mib / receive_s, 1),
        "check_s": round(check_s, 2),  # reading the spool back and hashing it: the benchmark's, not Tandem's
        "broker_rss_base_mib": broker_base // MIB,
        "broker_rss_peak_mib": broker_peak // MIB,
        "client_rss_base_mib": client_base // MIB,
        "client_rss_peak_mib": client_peak // MIB,
        "intact": intact,
        "broker_rss_target_met": broker_peak // MIB < BROKER_RSS_TARGET_MIB,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1024", help="MiB, a comma list: 1024,2048 for the issue's figures")
    ap.add_argument("--chunk", type=int, default=1024, help="the client's min_large_message_size, KiB")
    ap.add_argument("--compress", action="store_true")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds each message may take")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "large_message.json"))
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child: one size, JSON out
    a = ap.parse_args()
    sizes = [int(x) for x in a.size.split(",")]
    if a.one:
        print(json.dumps(one(sizes[0], a.chunk, a.compress, a.timeout)))
        return 0
    runs: list[dict[str, Any]] = []
    for size in sizes:
        free = shutil.disk_usage(tempfile.gettempdir()).free
        if free < 2 * size * MIB + 1024 * MIB:
            raise SystemExit(f"{size} MiB needs {2 * size + 1024} MiB free in {tempfile.gettempdir()}: {free // MIB}")
        # A process per size: the client's VmHWM is then this size's peak, not the largest so far.
        cmd = [sys.executable, __file__, "--one", "--size", str(size), "--chunk", str(a.chunk), "--timeout",
               str(a.timeout), *(["--compress"] if a.compress else [])]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * a.timeout + 120)
        if proc.returncode != 0:
            runs.append({"size_mib": size, "error": proc.stderr[-3000:]})
            print(f"{size} MiB: failed\n{proc.stderr[-3000:]}", flush=True)
            continue
        run = json.loads(proc.stdout.splitlines()[-1])
        run["wall_s"] = round(time.monotonic() - t0, 1)
        runs.append(run)
        print(
            f"{size} MiB: send {run['send_s']} s ({run['send_mib_per_s']} MiB/s), receive {run['receive_s']} s "
            f"({run['receive_mib_per_s']} MiB/s), peak RSS broker {run['broker_rss_peak_mib']} MiB, "
            f"client {run['client_rss_peak_mib']} MiB, intact {run['intact']}",
            flush=True,
        )
    result = {
        "benchmark": "large-message",
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()) + " UTC",
        "machine": _cpu(),
        "python": f"{sys.implementation.name} {sys.version.split()[0]}",
        "command": " ".join(["bench/large_message.py", *sys.argv[1:]]),
        "targets": {"broker_rss_peak_mib": f"< {BROKER_RSS_TARGET_MIB}"},
        "runs": runs,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {out}")
    ok = all(r.get("intact") for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
