"""In-process cost of the STOMP parser (no broker, no socket): large frames and small ones.

- one SEND with a `--size` MB body fed in `--chunk` byte reads, framed by content-length and
  by the NUL alone (what a client can make the broker do before it has logged in);
- `--frames` small frames fed in `--chunk` byte reads, as a producer and a consumer send them:
  SEND with persistent, receipt and a 1 KiB body, and one-header ACKs (their fast path).

Each case runs `--repeat` times; the best run is reported (seconds, MB/s, frames/s). With
`--record LABEL` the figures are stored under LABEL in `--out` (other labels are kept), so
the same command run before and after a change leaves both side by side.

    PYTHONPATH=src .venv/bin/python bench/stomp_parser.py --record after
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tandem.protocol.stomp import StompParser, encode

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from memory import _cpu  # noqa: E402


def _large(size: int, content_length: bool) -> bytes:
    body = b"x" * size
    if content_length:
        return encode("SEND", [("destination", "/queue/big")], body, "1.2")
    return b"SEND\ndestination:/queue/big\n\n" + body + b"\0"


def _sends(n: int) -> bytes:
    one = encode("SEND", [("destination", "/queue/perf"), ("persistent", "true"), ("receipt", "r-1")], b"b" * 1024)
    return one * n


def _acks(n: int) -> bytes:
    return b"".join(b"ACK\nid:%d.%d\n\n\0" % (3, 1_000_000 + i) for i in range(n))


def _feed(data: bytes, chunk: int, max_frame_size: int) -> tuple[float, int]:
    """Seconds to parse `data` fed in `chunk`-byte reads, and the frames it gave."""
    reads = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    p = StompParser(max_frame_size, "1.2")
    frames = 0
    t0 = time.perf_counter()
    for r in reads:
        frames += len(p.feed(r))
    return time.perf_counter() - t0, frames


def _best(data: bytes, chunk: int, max_frame_size: int, repeat: int) -> tuple[float, int]:
    return min(_feed(data, chunk, max_frame_size) for _ in range(repeat))


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(BENCH), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:
        return ""
    return out.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=100, help="large body in MB (10^6 bytes)")
    ap.add_argument("--chunk", type=int, default=64 * 1024, help="bytes per read")
    ap.add_argument("--frames", type=int, default=200_000, help="small frames per case")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--record", metavar="LABEL", help="store the figures under LABEL in --out")
    ap.add_argument("--out", default=str(BENCH / "results" / "stomp_parser.json"))
    a = ap.parse_args()
    size = a.size * 1_000_000
    limit = size + (1 << 20)
    rows: list[dict[str, Any]] = []
    for name, content_length in (("large, content-length", True), ("large, NUL-terminated", False)):
        data = _large(size, content_length)
        # one run of a large frame is enough to see the shape; it is the slow case before the fix
        secs, frames = _best(data, a.chunk, limit, 1)
        assert frames == 1
        rows.append({"case": name, "bytes": len(data), "seconds": round(secs, 3), "mb_per_s": round(size / secs / 1e6)})
    for name, data in (("small SEND (1 KiB body)", _sends(a.frames)), ("small ACK", _acks(a.frames))):
        secs, frames = _best(data, a.chunk, limit, a.repeat)
        assert frames == a.frames
        rows.append(
            {
                "case": name,
                "frames": frames,
                "bytes": len(data),
                "seconds": round(secs, 4),
                "frames_per_s": round(frames / secs),
                "mb_per_s": round(len(data) / secs / 1e6),
            }
        )
    for r in rows:
        rate = f"{r['frames_per_s']:>10,} frames/s" if "frames_per_s" in r else ""
        print(f"{r['case']:24} {r['bytes']:>12,} B {r['seconds']:>9.3f} s {r['mb_per_s']:>7,} MB/s {rate}")
    if a.record:
        out = Path(a.out)
        doc: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
        doc.setdefault("benchmark", "stomp-parser-in-process")
        doc.setdefault("runs", {})[a.record] = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": _cpu(),
            "commit": _commit(),
            "command": " ".join(["PYTHONPATH=src .venv/bin/python bench/stomp_parser.py", *sys.argv[1:]]),
            "chunk": a.chunk,
            "results": rows,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
