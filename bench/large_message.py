"""One large message end to end: time, and peak RSS of the broker and of the client.

Starts a fresh broker, sends one message of `--size` MiB with `send_stream` from a generated
stream (the client never holds the body either), receives it, checks its SHA-256 while reading
it back from the client's spool, and reports the send and receive times and the peak RSS
(VmHWM) of both processes. The issue's targets: 1 GiB and 2 GiB, broker RSS under 200 MiB.

    .venv/bin/python bench/large_message.py --size 1024
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from brokers.tandem import TandemBroker
from tandem.testing.procs import memory
from tandem.testing.streams import GeneratedBody

MIB = 1 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1024, help="MiB")
    ap.add_argument("--chunk", type=int, default=1024, help="the client's min_large_message_size, KiB")
    ap.add_argument("--compress", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    a = ap.parse_args()
    import tandem

    size = a.size * MIB
    b = TandemBroker().start()
    try:
        url = f"{b.url}?min_large_message_size={a.chunk * 1024}&compress_large_messages={str(a.compress).lower()}"
        broker_base = memory(b.pid, "VmRSS")
        client_base = memory("self", "VmRSS")
        with tandem.connect(url, call_timeout=600_000) as conn, conn.session() as s:
            s.create_queue("big")
            src = GeneratedBody(size)
            t0 = time.monotonic()
            s.create_producer("big").send_stream(src, size=size)
            send_s = time.monotonic() - t0
            t0 = time.monotonic()
            m = s.create_consumer("big").receive(600)
            assert m is not None and m.large
            receive_s = time.monotonic() - t0
            digest = hashlib.sha256()
            stream = m.body_stream()
            while block := stream.read(MIB):
                digest.update(block)
            intact = digest.hexdigest() == src.digest.hexdigest()
        broker_peak = memory(b.pid, "VmHWM")
        client_peak = memory("self", "VmHWM")
    finally:
        b.cleanup()
    result = {
        "benchmark": "large-message",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "command": " ".join(["bench/large_message.py", *sys.argv[1:]]),
        "size_mib": a.size,
        "chunk_kib": a.chunk,
        "compress": a.compress,
        "send_s": round(send_s, 2),
        "send_mib_per_s": round(a.size / send_s, 1),
        "receive_s": round(receive_s, 2),
        "receive_mib_per_s": round(a.size / receive_s, 1),
        "broker_rss_base_mib": broker_base // MIB,
        "broker_rss_peak_mib": broker_peak // MIB,
        "client_rss_base_mib": client_base // MIB,
        "client_rss_peak_mib": client_peak // MIB,
        "intact": intact,
        "targets": {"broker_rss_peak_mib": 200},
    }
    print(json.dumps(result, indent=2))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"large_message_{a.size}mib.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if intact else 1


if __name__ == "__main__":
    raise SystemExit(main())
