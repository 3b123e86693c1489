"""Tandem vs RabbitMQ vs ActiveMQ Classic over STOMP, the same client against all three, in one run.

Workload: 1 KiB persistent messages to one queue (/queue/NAME), 1 producer sending with a
receipt on every SEND and at most 256 unconfirmed, 1 consumer with client-individual acks
and prefetch 256 (--pairs 4+4: 4 of each, the limits per connection). The client is
bench/drivers/stomp.py for all three brokers, each started by this harness on 127.0.0.1
with its own data directory:

* Tandem: `TandemBroker` (production defaults) with a STOMP acceptor;
* RabbitMQ: Debian's rabbitmq-server with its STOMP plugin (`RabbitMQNode`); the durable
  queue is deleted and re-declared over AMQP before every run;
* ActiveMQ Classic: Debian's activemq 5.17 (`ActiveMQNode`), STOMP connector, KahaDB with
  its defaults (journal forced to disk before a send is confirmed); the prefetch is also
  sent as `activemq.prefetchSize`, the header ActiveMQ reads instead of `prefetch-count`.

Each broker gets an unrecorded warm-up run (--warmup messages, 1+1) first: ActiveMQ's JIT
needs it. Each configuration then runs --repeat times; medians are reported, with Tandem's
ratios to RabbitMQ and to ActiveMQ. Target: Tandem >= 3x RabbitMQ's msgs/s, with a p99
latency below RabbitMQ's.

    bash bench/setup-rabbitmq.sh            # once: Debian's rabbitmq-server
    bash bench/setup-activemq.sh            # once: Debian's activemq
    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/stomp.py --count 100000 --repeat 3 [--pairs 1+1,4+4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from brokers.activemq import KAHADB_DEFAULTS, PACKAGE_JVM_OPTS, ActiveMQNode  # noqa: E402
from brokers.rabbitmq import RabbitMQNode  # noqa: E402
from brokers.tandem import TandemBroker  # noqa: E402
from compare import _fmt, _run_json, summarize  # noqa: E402
from memory import _cpu  # noqa: E402

BROKERS = ("tandem", "rabbitmq", "activemq")
SIZE, WINDOW, PREFETCH = 1024, 256, 256
TARGET_RATIO = 3.0
TANDEM_STOMP_TOML = '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
ACTIVEMQ_SUBSCRIBE_HEADERS = ["activemq.prefetchSize:{prefetch}"]
DRIVER = str(BENCH / "drivers" / "stomp.py")


class BrokerUnavailable(Exception):
    """A broker could not be started for the benchmark."""


@contextlib.contextmanager
def tandem_target() -> Iterator[tuple[list[str], int]]:
    """Start Tandem with a STOMP acceptor; yield the driver's extra options and its PID."""
    b = TandemBroker(extra_toml=TANDEM_STOMP_TOML)
    try:
        try:
            b.start()
        except RuntimeError as exc:
            raise BrokerUnavailable(
                "Tandem did not start with a STOMP acceptor; this Tandem may not have one yet, "
                f"or rejects its configuration:\n{TANDEM_STOMP_TOML}{exc}"
            ) from None
        port = b.ports.get("stomp")
        if not port:
            raise BrokerUnavailable(f"Tandem started but announced no 'stomp' acceptor (listening: {b.ports})")
        yield ["--port", str(port)], b.pid
    finally:
        b.cleanup()


@contextlib.contextmanager
def rabbitmq_target() -> Iterator[tuple[list[str], int]]:
    """Start a private RabbitMQ node; the driver re-declares the queue over AMQP per run."""
    with RabbitMQNode() as node:
        yield ["--port", str(node.stomp_port), "--amqp-port", str(node.amqp_port)], node.vm_pid or 0


@contextlib.contextmanager
def activemq_target() -> Iterator[tuple[list[str], int]]:
    """Start a private ActiveMQ Classic broker; prefetch also as activemq.prefetchSize."""
    with ActiveMQNode() as node:
        extra = [x for h in ACTIVEMQ_SUBSCRIBE_HEADERS for x in ("--subscribe-header", h)]
        yield ["--port", str(node.stomp_port), *extra], node.pid or 0


TARGETS: dict[str, Callable[[], contextlib.AbstractContextManager[tuple[list[str], int]]]] = {
    "tandem": tandem_target,
    "rabbitmq": rabbitmq_target,
    "activemq": activemq_target,
}


def broker_runs(
    broker: str, count: int, repeat: int, pairs: list[tuple[int, int]], warmup: int
) -> list[dict[str, Any]]:
    """Start ``broker``, warm it up, run every pair ``repeat`` times; return the driver reports."""
    out = []
    t0 = time.monotonic()
    with TARGETS[broker]() as (extra, pid):
        print(f"{broker}: ready in {time.monotonic() - t0:.1f}s", flush=True)
        base = [sys.executable, DRIVER, *extra, "--size", str(SIZE), "--window", str(WINDOW),
                "--prefetch", str(PREFETCH), "--json", "--broker", broker, "--broker-pid", str(pid)]  # fmt: skip
        if warmup:
            _run_json([*base, "--producers", "1", "--consumers", "1", "--count", str(warmup)], 900)
        for p, c in pairs:
            for _ in range(repeat):
                r = _run_json([*base, "--producers", str(p), "--consumers", str(c), "--count", str(count)], 900)
                r["driver"] = "stomp"
                out.append(r)
                print(_fmt(r), flush=True)
    return out


def _median_cpu(runs: list[dict[str, Any]], broker: str, pair: str) -> float | None:
    """Median CPU use of the broker process over its runs (% of one core)."""
    vals = [
        r["cpu_pct"]["broker"]
        for r in runs
        if r["broker"] == broker and f"{r['producers']}+{r['consumers']}" == pair and r["cpu_pct"].get("broker")
    ]
    return round(statistics.median(vals), 1) if vals else None


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pair: Tandem's throughput ratio and p99 against RabbitMQ and ActiveMQ."""
    out = []
    for pair in sorted({r["pair"] for r in rows}):
        by = {r["broker"]: r for r in rows if r["pair"] == pair}
        t = by.get("tandem")
        if t is None:
            continue
        x: dict[str, Any] = {"pair": pair, "tandem_msgs_per_s": t["msgs_per_s"], "tandem_p99_ms": t["p99_ms"]}
        for other in ("rabbitmq", "activemq"):
            o = by.get(other)
            if o is None:
                continue
            x[f"{other}_msgs_per_s"] = o["msgs_per_s"]
            x[f"{other}_p99_ms"] = o["p99_ms"]
            # Three decimals, and the verdict from the exact ratio: 2.998 must not round up to 3.0.
            x[f"throughput_ratio_vs_{other}"] = round(t["msgs_per_s"] / o["msgs_per_s"], 3)
            x[f"p99_below_{other}"] = t["p99_ms"] < o["p99_ms"]
        if "rabbitmq" in by:
            r = by["rabbitmq"]
            x["target_met"] = t["msgs_per_s"] >= TARGET_RATIO * r["msgs_per_s"] and x["p99_below_rabbitmq"]
        out.append(x)
    return out


def _versions(brokers: list[str]) -> dict[str, str]:
    out = {}
    for name, pkg in (("rabbitmq", "rabbitmq-server"), ("activemq", "activemq")):
        if name in brokers:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                out[name] = subprocess.run(
                    ["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True, timeout=30
                ).stdout.strip()
    if "tandem" in brokers:
        with contextlib.suppress(ImportError):
            from tandem import __version__

            out["tandem"] = __version__
    return out


def _parse_pairs(text: str) -> list[tuple[int, int]]:
    pairs = []
    for item in text.split(","):
        p, sep, c = item.strip().partition("+")
        if not sep or not p.isdigit() or not c.isdigit() or int(p) < 1 or int(c) < 1:
            raise argparse.ArgumentTypeError(f"bad pair {item!r}: expected PRODUCERS+CONSUMERS, e.g. 1+1,4+4")
        pairs.append((int(p), int(c)))
    return pairs


def _parse_brokers(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in names if b not in BROKERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown broker(s) {unknown}: choose from {','.join(BROKERS)}")
    return [b for b in BROKERS if b in names]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100_000, help="messages per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per broker and pair")
    ap.add_argument("--pairs", type=_parse_pairs, default=[(1, 1)], help="producers+consumers, e.g. 1+1,4+4")
    ap.add_argument("--brokers", type=_parse_brokers, default=list(BROKERS), help="subset of tandem,rabbitmq,activemq")
    ap.add_argument("--warmup", type=int, default=40_000, help="messages of the unrecorded 1+1 warm-up run (0: none)")
    ap.add_argument("--out", default=str(BENCH / "results"), help="directory for stomp.json")
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    runs: list[dict[str, Any]] = []
    for broker in a.brokers:
        try:
            runs += broker_runs(broker, a.count, a.repeat, a.pairs, a.warmup)
        except BrokerUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    rows = summarize(runs)
    for row in rows:
        row["broker_cpu_pct"] = _median_cpu(runs, row["broker"], row["pair"])
    rat = ratios(rows)
    print()
    print(f"{'broker':9} {'driver':18} {'pair':5} {'msgs/s':>9} {'p50':>7} {'p99':>7} {'p99.9':>7} {'cpu%':>6}")
    for r in rows:
        cpu = f"{r['broker_cpu_pct']:6.0f}" if r["broker_cpu_pct"] is not None else f"{'-':>6}"
        print(
            f"{r['broker']:9} {r['driver']:18} {r['pair']:5} {r['msgs_per_s']:>9,} {r['p50_ms']:7.2f} "
            f"{r['p99_ms']:7.2f} {r['p999_ms']:7.2f} {cpu}"
        )
    print()
    if not rat:
        print("no Tandem runs, so no ratios")
    for x in rat:
        parts = [f"{x['pair']}: Tandem {x['tandem_msgs_per_s']:,} msg/s, p99 {x['tandem_p99_ms']} ms"]
        for other, label in (("rabbitmq", "RabbitMQ"), ("activemq", "ActiveMQ")):
            if f"{other}_msgs_per_s" in x:
                parts.append(
                    f"vs {label} {x[f'{other}_msgs_per_s']:,} msg/s → {x[f'throughput_ratio_vs_{other}']}x, "
                    f"p99 {x[f'{other}_p99_ms']} ms"
                )
        if "target_met" in x:
            verdict = "met" if x["target_met"] else "NOT met"
            parts.append(f"target (>= {TARGET_RATIO:g}x RabbitMQ, p99 below): {verdict}")
        print("; ".join(parts))
    result = {
        "benchmark": "stomp-tandem-vs-rabbitmq-vs-activemq",
        "date": started,
        "machine": _cpu(),
        "command": " ".join(["bench/stomp.py", *sys.argv[1:]]),
        "workload": {
            "size": SIZE,
            "window": WINDOW,
            "prefetch": PREFETCH,
            "count": a.count,
            "repeat": a.repeat,
            "warmup": a.warmup,
            "client": "bench/drivers/stomp.py: SEND persistent:true + receipt, SUBSCRIBE ack:client-individual",
        },
        "versions": _versions(a.brokers),
        "config": {
            "tandem": {"acceptor": TANDEM_STOMP_TOML.strip()},
            "rabbitmq": {"queue": "durable classic queue, re-declared over AMQP before every run"},
            "activemq": {
                "jvm_opts": list(PACKAGE_JVM_OPTS),
                "connector": "stomp:// (blocking I/O)",
                "kahadb": KAHADB_DEFAULTS,
                "subscribe_headers": ACTIVEMQ_SUBSCRIBE_HEADERS,
            },
        },
        "target": {"throughput_ratio_vs_rabbitmq": TARGET_RATIO, "p99_below_rabbitmq": True},
        "summary": rows,
        "ratios": rat,
        "runs": runs,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stomp.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"\nwrote {out / 'stomp.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
