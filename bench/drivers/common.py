"""Process model, timing and JSON report shared by the benchmark drivers.

Every producer and every consumer runs in its own OS process. The parent:

1. runs the driver's ``prepare`` step (e.g. delete and re-declare the queue),
2. starts the consumers, then the producers, and waits until all have
   connected and subscribed (each reports ``ready``),
3. sets one shared start event; producers start publishing,
4. waits until every worker has reported (bounded by ``--timeout``).

Consumers publish their running receive counts in a shared array (one slot
each, no lock); a consumer stops once the sum reaches ``--count``. Timing is
CLOCK_MONOTONIC (``time.monotonic_ns``), which is system-wide on Linux, so
the first send and last receive of different processes can be compared, and
so can the 8-byte big-endian send stamp at the start of each message body.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import math
import multiprocessing as mp
import os
import queue
import sys
import time
import traceback
from array import array
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from typing import Any, cast

from tandem.perf import Numbers  # the bitmap of --verify, shared with `tandem perf consumer --verify`

STAMP_BYTES = 8
SEQ_BYTES = 8  # after the stamp, bodies of 16 bytes or more carry the message's number in the run
READY_TIMEOUT_S = 60.0


class WorkerTimeout(Exception):
    """The run was aborted or timed out before this worker finished."""


@dataclass
class Shared:
    """Objects shared between the parent and all worker processes."""

    start: Event
    abort: Event
    received: ctypes.Array[ctypes.c_longlong]
    results: mp.Queue[tuple[str, str, int, Any]]


@dataclass
class Worker:
    """What one worker process knows about its role in the run."""

    role: str  # "producer" or "consumer"
    index: int
    count: int  # messages to send (producer) or the run's total (consumer)
    args: argparse.Namespace
    shared: Shared
    first: int = 0  # producer: the number of its first message (the run's are 0 .. count-1)

    def ready(self) -> None:
        """Tell the parent this worker is connected and set up."""
        self.shared.results.put(("ready", self.role, self.index, None))

    def wait_start(self) -> bool:
        """Block until the parent starts the run; False if it aborted."""
        deadline = time.monotonic() + READY_TIMEOUT_S + self.args.timeout
        while time.monotonic() < deadline:
            if self.shared.start.wait(0.05):
                return True
            if self.shared.abort.is_set():
                return False
        return False

    def aborted(self) -> bool:
        """True once the parent gave up on the run."""
        return self.shared.abort.is_set()

    def note_received(self, n: int) -> bool:
        """Publish this consumer's count; True once all consumers got ``count``."""
        received = self.shared.received
        received[self.index] = n
        return sum(received) >= self.count


@dataclass
class ProducerStats:
    """What a producer reports back."""

    sent: int = 0
    confirmed: int = 0
    first_send_ns: int = 0
    last_confirm_ns: int = 0
    cpu_s: float = 0.0
    server: str = ""
    error: str = ""
    timed_out: bool = False
    confirm_latencies: array[int] = field(default_factory=lambda: array("q"))  # send -> confirmation, ns


@dataclass
class ConsumerStats:
    """What a consumer reports back; latencies are nanoseconds."""

    received: int = 0
    first_recv_ns: int = 0
    last_recv_ns: int = 0
    cpu_s: float = 0.0
    server: str = ""
    error: str = ""
    timed_out: bool = False
    latencies: array[int] = field(default_factory=lambda: array("q"))
    numbers: bytes = b""  # --verify: a bitmap of the message numbers received
    duplicates: int = 0  # --verify: numbers received again
    strays: int = 0  # --verify: numbers outside 0 .. count-1


def merge_numbers(count: int, cons: list[ConsumerStats]) -> dict[str, Any]:
    """All consumers' bitmaps together (tandem perf's report): what is missing, what came twice."""
    merged = Numbers(count)
    bits = merged.bits
    merged.duplicates = sum(s.duplicates for s in cons)
    for s in cons:
        for i, v in enumerate(s.numbers):
            merged.duplicates += (bits[i] & v).bit_count()
            bits[i] |= v
    merged.seen = sum(v.bit_count() for v in bits)
    merged.strays = sum(s.strays for s in cons)
    return merged.report()


def add_common_args(parser: argparse.ArgumentParser, default_port: int) -> None:
    """Add the options every driver accepts."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port)
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--count", type=int, default=100_000, help="messages in total")
    parser.add_argument("--size", type=int, default=1024, help="body bytes (>= 8)")
    parser.add_argument("--window", type=int, default=256, help="unconfirmed per producer")
    parser.add_argument("--prefetch", type=int, default=256, help="unacked per consumer")
    parser.add_argument("--queue", default="tandem-bench")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the run")
    parser.add_argument("--broker", default="", help="broker name for the report")
    parser.add_argument("--broker-pid", type=int, default=0, help="broker PID whose CPU use to report")
    parser.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="event loop; auto = uvloop when installed, else asyncio",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def check_args(args: argparse.Namespace) -> None:
    """Reject option values the drivers cannot honour."""
    if args.size < STAMP_BYTES:
        raise SystemExit("--size must be at least 8 (the send stamp)")
    for name in ("count", "window", "prefetch"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be at least 1")
    for name in ("producers", "consumers"):
        if getattr(args, name) < 0:
            raise SystemExit(f"--{name} must be at least 0")
    if args.producers + args.consumers == 0:
        raise SystemExit("--producers and --consumers cannot both be 0")
    if getattr(args, "verify", False) and args.size < STAMP_BYTES + SEQ_BYTES:
        raise SystemExit("--verify needs --size of at least 16 (the stamp and the number)")
    if args.count < args.producers:
        raise SystemExit("--count must be at least --producers")


def resolve_loop(name: str) -> str:
    """Turn ``auto`` into ``uvloop`` when it can be imported, else ``asyncio``."""
    if name != "auto":
        return name
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run_loop(args: argparse.Namespace, main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on the chosen event loop implementation."""
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def make_body_filler(size: int) -> bytes:
    """Return the constant part of a body: everything after the stamp."""
    return bytes(i % 251 for i in range(size - STAMP_BYTES))


async def wait_done(fut: asyncio.Future[None], worker: Worker) -> None:
    """Await ``fut``, giving up (WorkerTimeout) on abort or ``--timeout``."""
    deadline = time.monotonic() + worker.args.timeout
    while not fut.done():
        if worker.aborted() or time.monotonic() > deadline:
            raise WorkerTimeout
        await asyncio.wait([fut], timeout=0.05)
    fut.result()


ProducerFn = Callable[[Worker, ProducerStats], None]
ConsumerFn = Callable[[Worker, ConsumerStats], None]


def _worker_entry(fn: ProducerFn | ConsumerFn, worker: Worker) -> None:
    """Run one worker and send its stats (and any failure) to the parent."""
    stats: ProducerStats | ConsumerStats
    stats = ProducerStats() if worker.role == "producer" else ConsumerStats()
    try:
        fn(worker, stats)  # type: ignore[arg-type]
    except WorkerTimeout:
        stats.timed_out = True
    except OSError as exc:  # connection refused / reset: no traceback needed
        stats.error = f"{type(exc).__name__}: {exc}"
    except BaseException as exc:
        stats.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    worker.shared.results.put(("done", worker.role, worker.index, stats))


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user+system) used so far by process ``pid``."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def _system_busy_s() -> float:
    """CPU seconds all cores spent busy (not idle, not iowait) so far."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return math.nan
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def percentile(sorted_values: array[int], q: float) -> float:
    """Nearest-rank percentile of pre-sorted values (0 if empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_values)))
    return float(sorted_values[rank - 1])


def run_benchmark(
    args: argparse.Namespace,
    client: str,
    producer: ProducerFn,
    consumer: ConsumerFn,
    prepare: Callable[[argparse.Namespace], None] | None = None,
) -> dict[str, Any]:
    """Run one benchmark and return the report; raise SystemExit on failure."""
    check_args(args)
    args.loop = resolve_loop(args.loop)
    if prepare is not None:
        prepare(args)
    ctx = mp.get_context("fork")
    shared = Shared(
        start=ctx.Event(),
        abort=ctx.Event(),
        received=cast(ctypes.Array[ctypes.c_longlong], ctx.Array(ctypes.c_longlong, args.consumers, lock=False)),
        results=ctx.Queue(),
    )
    base, extra = divmod(args.count, max(args.producers, 1))
    workers = [Worker("consumer", i, args.count, args, shared) for i in range(args.consumers)] + [
        Worker("producer", i, base + (1 if i < extra else 0), args, shared, first=i * base + min(i, extra))
        for i in range(args.producers)
    ]
    procs = [
        ctx.Process(
            target=_worker_entry,
            args=(producer if w.role == "producer" else consumer, w),
            name=f"{client}-{w.role}-{w.index}",
            daemon=True,
        )
        for w in workers
    ]
    for proc in procs:
        proc.start()
    stats: dict[tuple[str, int], ProducerStats | ConsumerStats] = {}
    try:
        _wait_ready(shared, procs, stats)
        broker_cpu0 = _proc_cpu_s(args.broker_pid) if args.broker_pid else math.nan
        system0 = _system_busy_s()
        wall0 = time.monotonic()
        shared.start.set()
        deadline = wall0 + args.timeout
        while len(stats) < len(procs):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                kind, role, index, payload = shared.results.get(timeout=min(left, 0.5))
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break
                continue
            if kind == "done":
                stats[(role, index)] = payload
                if payload.error:
                    break
        wall = time.monotonic() - wall0
        broker_cpu = _proc_cpu_s(args.broker_pid) - broker_cpu0 if args.broker_pid else math.nan
        system_cpu = _system_busy_s() - system0
    finally:
        shared.abort.set()
        _collect_stragglers(shared, procs, stats)
    report = _report(args, client, stats, wall, broker_cpu)
    # Everything busy on the machine during the run, in % of one core (2
    # cores = 200%): compare with broker + clients to spot foreign load.
    report["cpu_pct"]["system"] = None if math.isnan(system_cpu) else round(100 * system_cpu / wall, 1)
    return report


def _wait_ready(
    shared: Shared,
    procs: list[Any],
    stats: dict[tuple[str, int], ProducerStats | ConsumerStats],
) -> None:
    """Wait until every worker is connected; fail fast on a worker error."""
    ready = 0
    deadline = time.monotonic() + READY_TIMEOUT_S
    while ready < len(procs):
        left = deadline - time.monotonic()
        if left <= 0:
            raise SystemExit(f"error: only {ready} of {len(procs)} workers got ready")
        try:
            kind, role, index, payload = shared.results.get(timeout=min(left, 0.5))
        except queue.Empty:
            continue
        if kind == "ready":
            ready += 1
        elif kind == "done":
            stats[(role, index)] = payload
            if payload.error:
                raise SystemExit(f"error: {role} {index} failed: {payload.error}")


def _collect_stragglers(
    shared: Shared,
    procs: list[Any],
    stats: dict[tuple[str, int], ProducerStats | ConsumerStats],
) -> None:
    """Give aborted workers a moment to report, then kill what is left."""
    deadline = time.monotonic() + 10
    while len(stats) < len(procs) and time.monotonic() < deadline:
        try:
            kind, role, index, payload = shared.results.get(timeout=0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        if kind == "done":
            stats[(role, index)] = payload
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def _report(
    args: argparse.Namespace,
    client: str,
    stats: dict[tuple[str, int], ProducerStats | ConsumerStats],
    wall: float,
    broker_cpu: float,
) -> dict[str, Any]:
    """Check completeness and build the JSON report."""
    ordered = [stats[key] for key in sorted(stats)]
    prods = [s for s in ordered if isinstance(s, ProducerStats)]
    cons = [s for s in ordered if isinstance(s, ConsumerStats)]
    both: list[ProducerStats | ConsumerStats] = [*prods, *cons]
    errors = [s.error for s in both if s.error]
    received = sum(s.received for s in cons)
    confirmed = sum(s.confirmed for s in prods)
    problems = []
    if len(prods) < args.producers or len(cons) < args.consumers:
        problems.append(
            f"only {len(prods)}/{args.producers} producers and {len(cons)}/{args.consumers} consumers reported"
        )
    # A producer-only run (--consumers 0) fills the queue; a consumer-only one (--producers 0) drains it.
    if (args.consumers and received != args.count) or (args.producers and confirmed != args.count):
        problems.append(
            f"after {wall:.1f}s (timeout {args.timeout:.0f}s): received {received} "
            f"and confirmed {confirmed} of {args.count} messages"
        )
    if errors:
        problems.append("worker error: " + errors[0])
    if problems:
        raise SystemExit("error: " + "; ".join(problems))
    # Drain only: from the first receipt (consumers ack what they get from the moment they
    # subscribe, before the start signal; the start signal would miss that part of the drain).
    first = min(s.first_send_ns for s in prods) if prods else min(s.first_recv_ns for s in cons if s.received)
    last = max(s.last_recv_ns for s in cons) if cons else max(s.last_confirm_ns for s in prods)
    duration = (last - first) / 1e9
    lat = array("q")
    for s in cons:
        lat.extend(s.latencies)
    lat = array("q", sorted(lat))
    confirm = array("q")
    for p in prods:
        confirm.extend(p.confirm_latencies)
    confirm = array("q", sorted(confirm))
    servers = [s.server for s in both if s.server]
    report: dict[str, Any] = {
        "broker": args.broker or (servers[0] if servers else "unknown"),
        "client": client,
        "producers": args.producers,
        "consumers": args.consumers,
        "size": args.size,
        "count": args.count,
        "window": args.window,
        "prefetch": args.prefetch,
        "msgs_per_s": round(args.count / duration, 1),
        "latency_ms": {
            "p50": round(percentile(lat, 0.50) / 1e6, 3),
            "p99": round(percentile(lat, 0.99) / 1e6, 3),
            "p999": round(percentile(lat, 0.999) / 1e6, 3),
            "max": round(float(lat[-1]) / 1e6, 3) if lat else 0.0,
        },
        "confirm_latency_ms": {
            "p50": round(percentile(confirm, 0.50) / 1e6, 3),
            "p99": round(percentile(confirm, 0.99) / 1e6, 3),
            "p999": round(percentile(confirm, 0.999) / 1e6, 3),
        },
        "duration_s": round(duration, 4),
        "cpu_pct": {
            "producers": [round(100 * s.cpu_s / duration, 1) for s in prods],
            "consumers": [round(100 * s.cpu_s / duration, 1) for s in cons],
            "broker": None if math.isnan(broker_cpu) else round(100 * broker_cpu / wall, 1),
        },
        "loop": args.loop,
    }
    if getattr(args, "verify", False) and cons:
        nums = report["numbers"] = merge_numbers(args.count, cons)
        if nums["missing"] or nums["duplicates"] or nums["strays"]:
            raise SystemExit(
                f"error: {nums['missing']} message numbers missing (first: {nums['first_missing']}), "
                f"{nums['duplicates']} received twice, {nums['strays']} out of range"
            )
    return report


def print_report(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Print the report as JSON (``--json``) or as one readable line."""
    if args.json:
        print(json.dumps(report), flush=True)
        return
    lat = report["latency_ms"]
    print(
        f"{report['broker']} {report['client']} {report['producers']}+"
        f"{report['consumers']}: {report['msgs_per_s']:.0f} msg/s, "
        f"p50 {lat['p50']} ms, p99 {lat['p99']} ms, p99.9 {lat['p999']} ms, "
        f"{report['duration_s']} s, cpu% {report['cpu_pct']}",
        flush=True,
    )


def main_guard(fn: Callable[[], None]) -> None:
    """Run a driver's main; Ctrl-C and connection failures exit non-zero."""
    try:
        fn()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
