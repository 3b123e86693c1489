"""RabbitMQ-only benchmark: both drivers, 1+1 and 4+4, against a private node.

Starts a private RabbitMQ node (bench/brokers/rabbitmq.py), runs a short
unreported warm-up, then runs bench/drivers/amqp.py and bench/drivers/stomp.py
for each producer+consumer pair, each as its own child process, prints a
table, and stops the node. Every run uses a freshly deleted and re-declared
durable classic queue.

Example::

    python bench/rabbitmq_only.py --count 100000
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH / "brokers"))

from rabbitmq import RabbitMQNode  # noqa: E402

DRIVERS = {"amqp": BENCH / "drivers" / "amqp.py", "stomp": BENCH / "drivers" / "stomp.py"}


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """Parse "1+1,4+4" into [(1, 1), (4, 4)]."""
    pairs = []
    for item in text.split(","):
        prod, _, cons = item.partition("+")
        pairs.append((int(prod), int(cons or prod)))
    return pairs


def run_driver(
    node: RabbitMQNode, driver: str, producers: int, consumers: int, count: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Run one driver as a child process and return its JSON report."""
    port = node.amqp_port if driver == "amqp" else node.stomp_port
    cmd = [
        sys.executable,
        str(DRIVERS[driver]),
        "--host",
        node.host,
        "--port",
        str(port),
        "--producers",
        str(producers),
        "--consumers",
        str(consumers),
        "--count",
        str(count),
        "--size",
        str(args.size),
        "--window",
        str(args.window),
        "--prefetch",
        str(args.prefetch),
        "--timeout",
        str(args.timeout),
        "--loop",
        args.loop,
        "--broker",
        "rabbitmq-3.10",
        "--broker-pid",
        str(node.vm_pid or 0),
        "--json",
    ]
    if driver == "stomp":
        cmd += ["--amqp-port", str(node.amqp_port)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 120, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{driver} {producers}+{consumers} failed ({proc.returncode}):\n{proc.stderr.strip()}")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def foreign_cpu(report: dict[str, Any]) -> float:
    """CPU % used during a run by processes other than the broker and clients."""
    cpu = report["cpu_pct"]
    if cpu.get("system") is None or cpu.get("broker") is None:
        return float("nan")
    return float(cpu["system"] - cpu["broker"] - sum(cpu["producers"]) - sum(cpu["consumers"]))


def print_table(rows: list[dict[str, Any]]) -> None:
    """Print the results as an aligned text table."""
    head = f"{'driver':<6} {'P+C':>4} {'count':>7} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} "
    head += f"{'dur s':>6} {'other%':>6}  cpu% broker / producers / consumers"
    print(head)
    print("-" * len(head))
    for r in rows:
        lat, cpu = r["latency_ms"], r["cpu_pct"]
        print(
            f"{r['driver']:<6} {r['producers']}+{r['consumers']:<2} {r['count']:>7} {r['msgs_per_s']:>9.0f} "
            f"{lat['p50']:>8.2f} {lat['p99']:>8.2f} {lat['p999']:>9.2f} {r['duration_s']:>6.2f} "
            f"{foreign_cpu(r):>6.0f}  "
            f"{cpu['broker']} / {'+'.join(map(str, cpu['producers']))} / {'+'.join(map(str, cpu['consumers']))}"
        )


def main() -> int:
    """Start RabbitMQ, run the matrix, print the table, stop RabbitMQ."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="messages per run")
    parser.add_argument("--count-4x4", type=int, default=0, help="messages per run for P,C > 1 (default --count)")
    parser.add_argument("--pairs", default="1+1,4+4", help="producer+consumer pairs, e.g. 1+1,4+4")
    parser.add_argument("--drivers", default="amqp,stomp")
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration")
    parser.add_argument("--warmup", type=int, default=20_000, help="messages for the unreported warm-up")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--prefetch", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    parser.add_argument("--json-out", help="also write all reports to this JSON file")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the node on SIGTERM too

    drivers = [d for d in args.drivers.split(",") if d]
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with RabbitMQNode() as node:
        print(
            f"# RabbitMQ node {node.nodename} ready in {time.monotonic() - t0:.1f}s "
            f"(amqp {node.amqp_port}, stomp {node.stomp_port}, beam pid {node.vm_pid})",
            flush=True,
        )
        if args.warmup:
            for driver in drivers:
                run_driver(node, driver, 1, 1, args.warmup, args)
        for producers, consumers in parse_pairs(args.pairs):
            count = args.count_4x4 if args.count_4x4 and (producers > 1 or consumers > 1) else args.count
            for driver in drivers:
                for _ in range(args.repeat):
                    report = run_driver(node, driver, producers, consumers, count, args)
                    report["driver"] = driver
                    rows.append(report)
                    print(f"# {driver} {producers}+{consumers}: {report['msgs_per_s']:.0f} msg/s", flush=True)
    print_table(rows)
    busy = [r for r in rows if foreign_cpu(r) > 20]
    if busy:
        print(f"# warning: {len(busy)} run(s) shared the CPUs with other busy processes (other% > 20)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
