"""The cost of transactions and duplicate detection against plain durable sends, in one run.

Runs `tandem perf pair` on one broker three ways — plain durable sends, `--tx-batch 100`
(transactions of 100 sends and of 100 acks) and `--dedup` (a dedup id on every message) —
for 1+1 and 4+4, --repeat times each, and writes the medians and ratios.

    .venv/bin/python bench/tx_dedup.py --count 100000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from brokers.tandem import TandemBroker  # noqa: E402
from compare import _fmt, _run_json  # noqa: E402
from memory import _cpu  # noqa: E402

MODES = {"plain": [], "tx-batch-100": ["--tx-batch", "100"], "dedup": ["--dedup"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(BENCH / "results"))
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    runs: list[dict[str, Any]] = []
    with TandemBroker() as b:
        _run_json([sys.executable, "-m", "tandem", "perf", "pair", "--url", b.url, "--count", "20000", "--json"], 300)
        for p, c in ((1, 1), (4, 4)):
            for _ in range(a.repeat):
                for mode, extra in MODES.items():  # interleaved so drift hits every mode alike
                    r = _run_json(
                        [sys.executable, "-m", "tandem", "perf", "pair", "--url", b.url, "--producers", str(p),
                         "--consumers", str(c), "--count", str(a.count), "--json", *extra],
                        900,
                    )  # fmt: skip
                    r["driver"] = mode
                    runs.append(r)
                    print(_fmt(r), flush=True)
    rows = []
    for pair in ("1+1", "4+4"):
        base = None
        for mode in MODES:
            rs = [r for r in runs if r["driver"] == mode and f"{r['producers']}+{r['consumers']}" == pair]
            row = {
                "pair": pair,
                "mode": mode,
                "msgs_per_s": round(statistics.median(r["msgs_per_s"] for r in rs)),
                "p50_ms": round(statistics.median(r["latency_ms"]["p50"] for r in rs), 2),
                "p99_ms": round(statistics.median(r["latency_ms"]["p99"] for r in rs), 2),
                "all_msgs_per_s": [round(r["msgs_per_s"]) for r in rs],
            }
            base = base or row["msgs_per_s"]
            row["vs_plain"] = round(row["msgs_per_s"] / base, 2)
            rows.append(row)
    print()
    for r in rows:
        lat = f"p50 {r['p50_ms']:6.2f}  p99 {r['p99_ms']:6.2f} ms"
        print(f"{r['pair']} {r['mode']:13} {r['msgs_per_s']:>8,} msg/s  {lat}  x{r['vs_plain']} of plain")
    result = {
        "benchmark": "transactions-and-dedup-cost",
        "date": started,
        "machine": _cpu(),
        "command": " ".join(["bench/tx_dedup.py", *sys.argv[1:]]),
        "summary": rows,
        "runs": runs,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tx_dedup.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
