"""Tandem vs RabbitMQ, side by side in one run on this machine.

Workload (docs/decisions/0005-benchmark-method.md): 1 KiB persistent messages to one durable
queue, 1+1 and 4+4 producers+consumers, at most 256 unconfirmed sends per producer, consumer
window 256 messages (Tandem: 256 KiB of credit). Tandem is driven by `tandem perf pair`;
RabbitMQ (Debian's rabbitmq-server, a private node on loopback) by pipelined AMQP 0-9-1 and
STOMP drivers. Each configuration runs --repeat times; medians are reported, with the ratio
of Tandem to the better RabbitMQ client.

    bash bench/setup-rabbitmq.sh            # once: Debian's rabbitmq-server
    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/compare.py --count 100000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from brokers.rabbitmq import RabbitMQNode  # noqa: E402
from brokers.tandem import TandemBroker  # noqa: E402
from memory import _cpu  # noqa: E402

PAIRS = [(1, 1), (4, 4)]


def _run_json(cmd: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)  # type: ignore[no-any-return]


def tandem_runs(count: int, repeat: int, pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    out = []
    with TandemBroker() as b:
        warm = [sys.executable, "-m", "tandem", "perf", "pair", "--url", b.url, "--count", "20000", "--json"]
        _run_json(warm, 300)
        for p, c in pairs:
            for _ in range(repeat):
                r = _run_json(
                    [sys.executable, "-m", "tandem", "perf", "pair", "--url", b.url, "--producers", str(p),
                     "--consumers", str(c), "--count", str(count), "--size", "1024", "--window", "256",
                     "--consumer-window", str(256 * 1024), "--json"],
                    900,
                )  # fmt: skip
                r["driver"] = "native"
                out.append(r)
                print(_fmt(r), flush=True)
    return out


def rabbit_runs(count: int, repeat: int, pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    out = []
    with RabbitMQNode() as node:
        base = ["--size", "1024", "--window", "256", "--prefetch", "256", "--json", "--broker", "rabbitmq"]
        amqp = [sys.executable, str(BENCH / "drivers" / "amqp.py"), "--port", str(node.amqp_port), *base]
        stomp = [
            sys.executable, str(BENCH / "drivers" / "stomp.py"), "--port", str(node.stomp_port),
            "--amqp-port", str(node.amqp_port), *base,
        ]  # fmt: skip
        _run_json([*amqp, "--producers", "1", "--consumers", "1", "--count", "20000"], 300)
        for p, c in pairs:
            pc = ["--producers", str(p), "--consumers", str(c), "--count", str(count)]
            for _ in range(repeat):
                for name, cmd in (
                    ("amqp", [*amqp, *pc, "--ack", "single"]),
                    ("amqp-multiple-ack", [*amqp, *pc, "--ack", "multiple"]),
                    ("stomp", [*stomp, *pc]),
                ):
                    r = _run_json(cmd, 900)
                    r["driver"] = name
                    out.append(r)
                    print(_fmt(r), flush=True)
    return out


def _fmt(r: dict[str, Any]) -> str:
    lat = r["latency_ms"]
    return (
        f"{r['broker']:9} {r['driver']:18} {r['producers']}+{r['consumers']}  {r['msgs_per_s']:>9,.0f} msg/s  "
        f"p50 {lat['p50']:7.2f}  p99 {lat['p99']:7.2f}  p99.9 {lat['p999']:7.2f} ms"
    )


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, int, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["broker"], r["driver"], r["producers"], r["consumers"]), []).append(r)
    rows = []
    for (broker, driver, p, c), rs in groups.items():
        rows.append(
            {
                "broker": broker,
                "driver": driver,
                "pair": f"{p}+{c}",
                "runs": len(rs),
                "msgs_per_s": round(statistics.median(r["msgs_per_s"] for r in rs)),
                "p50_ms": round(statistics.median(r["latency_ms"]["p50"] for r in rs), 2),
                "p99_ms": round(statistics.median(r["latency_ms"]["p99"] for r in rs), 2),
                "p999_ms": round(statistics.median(r["latency_ms"]["p999"] for r in rs), 2),
                "all_msgs_per_s": [round(r["msgs_per_s"]) for r in rs],
            }
        )
    return rows


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for pair in sorted({r["pair"] for r in rows}):
        t = [r for r in rows if r["pair"] == pair and r["broker"] == "tandem"]
        rb = [r for r in rows if r["pair"] == pair and r["broker"] == "rabbitmq"]
        if not t or not rb:
            continue
        best = max(rb, key=lambda r: r["msgs_per_s"])
        out.append(
            {
                "pair": pair,
                "tandem_msgs_per_s": t[0]["msgs_per_s"],
                "best_rabbitmq": f"{best['driver']} {best['msgs_per_s']}",
                "throughput_ratio": round(t[0]["msgs_per_s"] / best["msgs_per_s"], 3),
                "tandem_p99_ms": t[0]["p99_ms"],
                "rabbitmq_p99_ms": best["p99_ms"],
                "p99_below_rabbitmq": t[0]["p99_ms"] < best["p99_ms"],
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pairs", default="1+1,4+4")
    ap.add_argument("--out", default=str(BENCH / "results"))
    a = ap.parse_args()
    pairs = [(int(x.split("+")[0]), int(x.split("+")[1])) for x in a.pairs.split(",")]
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    runs = tandem_runs(a.count, a.repeat, pairs) + rabbit_runs(a.count, a.repeat, pairs)
    rows = summarize(runs)
    rat = ratios(rows)
    print()
    print(f"{'broker':9} {'driver':18} {'pair':5} {'msgs/s':>9} {'p50':>7} {'p99':>7} {'p99.9':>7}")
    for r in rows:
        print(
            f"{r['broker']:9} {r['driver']:18} {r['pair']:5} {r['msgs_per_s']:>9,} {r['p50_ms']:7.2f} "
            f"{r['p99_ms']:7.2f} {r['p999_ms']:7.2f}"
        )
    print()
    for x in rat:
        print(
            f"{x['pair']}: Tandem {x['tandem_msgs_per_s']:,} msg/s vs RabbitMQ {x['best_rabbitmq']} → "
            f"{x['throughput_ratio']}x; p99 {x['tandem_p99_ms']} vs {x['rabbitmq_p99_ms']} ms"
        )
    result = {
        "benchmark": "compare-native-vs-rabbitmq",
        "date": started,
        "machine": _cpu(),
        "command": " ".join(["bench/compare.py", *sys.argv[1:]]),
        "summary": rows,
        "ratios": rat,
        "runs": runs,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
