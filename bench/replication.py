"""A replicated pair against one server and against a RabbitMQ 3-node quorum queue, in one run.

Four parts, each printing its progress:

1. Throughput and latency, `tandem perf pair` (1 KiB durable, window 256, 1+1 and 4+4): a
   live-only server (no HA), then a replicated pair (uncoordinated, `allow-uncoordinated`) with
   `backup-fsync = true`, then with `false`; the ratio replicated / live-only (target >= 0.6).
2. RabbitMQ: three private rabbitmq-server nodes on loopback sharing one epmd and one Erlang
   cookie, joined with `rabbitmqctl join_cluster` (bench/brokers/rabbitmq.py's RabbitMQCluster),
   a queue declared with `x-queue-type: quorum`, bench/drivers/amqp.py with publisher confirms
   and the same workload (target: Tandem replicated >= 3x its throughput, p99 below).
3. Initial sync: the primary holds --backlog messages (1 KiB, in a queue nobody reads); a
   producer sends confirmed messages continuously (window --stall-window) while the backup joins;
   the longest gap between two consecutive confirmations while the backup syncs, and while it
   warms up after (target < 100 ms), with the confirm latency (send -> confirmation).
4. Failover: with that backlog still in the store and the backup warm, kill -9 of the primary ->
   first confirmed send on the backup (bench/failover.py's measurement; target < 3 s).

Parts 1 and 2 report two latencies: end to end (the send stamp to the receipt, as bench/compare.py)
and confirm (the send to its confirmation).

    bash bench/setup-rabbitmq.sh; .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/replication.py                 # full: 100k per run, 3 repeats, 1M backlog
    .venv/bin/python bench/replication.py --quick         # a few minutes: small counts, 1 repeat
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from brokers.rabbitmq import RabbitMQCluster  # noqa: E402
from brokers.tandem import TandemBroker  # noqa: E402
from compare import _run_json  # noqa: E402
from failover import Pair, _free_port, _measure  # noqa: E402
from memory import _cpu  # noqa: E402

T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def print_targets(targets: list[dict[str, Any]]) -> None:
    """One line a target: met, NOT met, or n/a (`met` None: a part skipped or failed)."""
    for x in targets:
        met = {True: "met    ", False: "NOT met", None: "n/a    "}[x["met"]]
        print(f"{met}  {x['what']}: {x['value']} (target {x['target']})")


def _fmt(r: dict[str, Any]) -> str:
    lat, conf = r["latency_ms"], r.get("confirm_latency_ms") or {"p50": 0, "p99": 0}
    return (
        f"{r['driver']:22} {r['producers']}+{r['consumers']}  {r['msgs_per_s']:>9,.0f} msg/s  "
        f"end to end p50 {lat['p50']:7.2f} p99 {lat['p99']:7.2f}  confirm p50 {conf['p50']:7.2f} "
        f"p99 {conf['p99']:7.2f} ms"
    )


# ----------------------------------------------------------------------------- the pair
class ReplicatedPair(Pair):
    """Server 0 the replication primary, server 1 its backup, each on its own data directory
    (bench/failover.py's pair of processes with the replication policies)."""

    def __init__(self, root: Path, backup_fsync: bool, backup_root: Path | None = None) -> None:
        self.root = root
        dirs = (root / "primary", (backup_root or root) / "backup")
        self.ports = (_free_port(), _free_port())
        self.procs: list[subprocess.Popen[bytes] | None] = [None, None]
        names = ("primary", "backup")
        conns = "".join(
            f'[[connectors]]\nname = "{n}"\nurl = "127.0.0.1:{p}"\n' for n, p in zip(names, self.ports, strict=True)
        )
        for i, name in enumerate(names):
            (root / f"{name}.toml").write_text(
                f'name = "{name}"\ndata-directory = "{dirs[i]}"\n'
                f'ha-policy = "replication-{name}"\nallow-uncoordinated = true\n'
                f"backup-fsync = {'true' if backup_fsync else 'false'}\nretry-replication-wait = 200\n"
                f'connector-ref = "{name}"\nstatic-connectors = ["{names[1 - i]}"]\n'
                f'cluster-user = "bench"\ncluster-password = "bench"\n'
                f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:{self.ports[i]}"\n{conns}'
            )

    def server_url(self, i: int) -> str:
        return f"tcp://127.0.0.1:{self.ports[i]}"

    def status(self, i: int) -> dict[str, Any] | None:
        return _status(self.server_url(i))

    def wait(self, i: int, pred: Any, what: str, timeout: float = 600) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            st = self.status(i)
            if st is not None and pred(st):
                return time.monotonic() - t0
            p = self.procs[i]
            if p is not None and p.poll() is not None:
                break
            time.sleep(0.2)
        name = ("primary", "backup")[i]
        raise RuntimeError(f"{name} not {what}: {(self.root / f'{name}.log').read_text()[-3000:]}")

    def start_both(self) -> None:
        self.start(0)
        self.wait(0, lambda s: s["state"] == "active", "active")
        self.start(1)
        self.wait(1, lambda s: s.get("replication") == "in-sync", "in sync")


def _status(url: str) -> dict[str, Any] | None:
    """`tandem admin status` in this process (a child process per poll would load the cores)."""

    async def main() -> Any:
        from tandem.client.connection import connect

        conn = await connect(url, allow_passive=True, reconnect_attempts=0)
        try:
            return await conn.manage("broker.status")
        finally:
            await conn.close()

    try:
        return asyncio.run(main())  # type: ignore[no-any-return]
    except Exception:
        return None


# ----------------------------------------------------------------------------- part 1
def _perf(url: str, p: int, c: int, count: int) -> dict[str, Any]:
    return _run_json(
        [sys.executable, "-m", "tandem", "perf", "pair", "--url", url, "--producers", str(p),
         "--consumers", str(c), "--count", str(count), "--size", "1024", "--window", "256",
         "--consumer-window", str(256 * 1024), "--json"],
        900,
    )  # fmt: skip


def tandem_runs(mode: str, url: str, count: int, repeat: int, pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    _perf(url, 1, 1, min(20_000, count))  # warm-up, not reported
    out = []
    for p, c in pairs:
        for _ in range(repeat):
            r = _perf(url, p, c, count)
            r["broker"] = "tandem"
            r["driver"] = mode
            out.append(r)
            say(_fmt(r))
    return out


def part_throughput(a: argparse.Namespace, pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    say("live-only server")
    with TandemBroker() as b:
        runs += tandem_runs("live-only", b.url, a.count, a.repeat, pairs)
    for fsync in (True, False):
        mode = f"replicated-fsync-{'true' if fsync else 'false'}"
        say(f"replicated pair, backup-fsync = {str(fsync).lower()}")
        root = Path(tempfile.mkdtemp(prefix="tandem-replbench-"))
        pair = ReplicatedPair(root, fsync)
        try:
            pair.start_both()
            runs += tandem_runs(mode, pair.server_url(0), a.count, a.repeat, pairs)
            st = pair.status(0)
            if not st or st.get("replication") != "in-sync":  # the figures would be live-only ones
                raise RuntimeError(f"the backup is not in sync after the runs: {st and st.get('replication')}")
        finally:
            pair.stop_all()
            shutil.rmtree(root, ignore_errors=True)
    return runs


# ----------------------------------------------------------------------------- part 2
def part_rabbitmq(a: argparse.Namespace, pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    say("RabbitMQ: starting 3 nodes and joining them")
    out = []
    with RabbitMQCluster(3) as cluster:
        node = cluster.nodes[0]
        say(f"RabbitMQ cluster up: {', '.join(n.nodename for n in cluster.nodes)}")
        amqp = [sys.executable, str(BENCH / "drivers" / "amqp.py"), "--port", str(node.amqp_port),
                "--size", "1024", "--window", "256", "--prefetch", "256", "--json",
                "--broker", "rabbitmq-quorum-3", "--queue-type", "quorum", "--ack", "multiple"]  # fmt: skip
        _run_json([*amqp, "--producers", "1", "--consumers", "1", "--count", str(min(20_000, a.count))], 600)
        for p, c in pairs:
            for _ in range(a.repeat):
                r = _run_json([*amqp, "--producers", str(p), "--consumers", str(c), "--count", str(a.count)], 900)
                r["broker"] = "rabbitmq"
                r["driver"] = "amqp-quorum-3"
                out.append(r)
                say(_fmt(r))
    return out


# ----------------------------------------------------------------------------- part 3 and 4
def _stall_producer(url: str, window: int, stop: Any, conn_out: Any) -> None:
    """(Child process) send durable 1 KiB messages, at most `window` unconfirmed, until `stop`;
    report every confirmation's time and latency (CLOCK_MONOTONIC, comparable across processes)."""

    async def run() -> dict[str, Any]:
        from tandem.client.connection import connect
        from tandem.client.message import Message

        conn = await connect(url, send_window=window, auto_dedup=False)
        prod = (await conn.create_session()).create_producer("stall")
        body = b"x" * 1024
        at = array("d")
        lat = array("d")
        errors: list[str] = []
        mono = time.monotonic

        def done(sent: float) -> Any:
            def cb(exc: BaseException | None) -> None:
                if exc is not None:
                    errors.append(repr(exc))
                now = mono()
                at.append(now)
                lat.append(now - sent)

            return cb

        while not stop.is_set():
            if not prod.has_room("stall", 1024):
                await prod.ready("stall", 1024)
            prod.send_nowait(Message(body, durable=True), done(mono()))
        await prod.flush()
        await conn.close()
        return {"at": at.tobytes(), "lat": lat.tobytes(), "errors": errors[:5]}

    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    try:
        conn_out.send(asyncio.run(run()))
    except BaseException as exc:
        conn_out.send({"error": repr(exc)})


def _gaps(at: list[float], lat: list[float], t0: float, t1: float) -> dict[str, Any]:
    """The longest gap between consecutive confirmations in [t0, t1], and the confirm latency."""
    idx = [i for i, t in enumerate(at) if t0 <= t <= t1]
    if len(idx) < 2:
        return {"confirmations": len(idx)}
    gap, where = 0.0, t0
    prev = at[idx[0] - 1] if idx[0] > 0 else at[idx[0]]
    for i in idx:
        if at[i] - prev > gap:
            gap, where = at[i] - prev, prev
        prev = at[i]
    ls = sorted(lat[i] for i in idx)
    return {
        "seconds": round(t1 - t0, 2),
        "confirmations": len(idx),
        "msgs_per_s": round(len(idx) / (t1 - t0)),
        "longest_gap_ms": round(gap * 1000, 1),
        "longest_gap_at_s": round(where - t0, 2),
        "confirm_p50_ms": round(ls[len(ls) // 2] * 1000, 2),
        "confirm_p99_ms": round(ls[min(len(ls) - 1, int(len(ls) * 0.99))] * 1000, 2),
        "confirm_max_ms": round(ls[-1] * 1000, 1),
    }


def part_sync_and_failover(a: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tandem-replbench-sync-"))
    backup_root = None
    if a.backup_root:
        backup_root = Path(tempfile.mkdtemp(prefix="tandem-replbench-backup-", dir=a.backup_root))
    pair = ReplicatedPair(root, True, backup_root)
    result: dict[str, Any] = {"backlog_messages": a.backlog, "stall_window": a.stall_window, "backup_fsync": True}
    try:
        pair.start(0)
        pair.wait(0, lambda s: s["state"] == "active", "active")
        say(f"initial sync: filling the primary with {a.backlog:,} messages")
        t = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "tandem", "perf", "producer", "--url", pair.server_url(0), "--queue", "backlog",
             "--count", str(a.backlog), "--producers", "4", "--json"],
            check=True, capture_output=True,
        )  # fmt: skip
        du = sum(f.stat().st_size for f in (root / "primary").rglob("*") if f.is_file())
        result["store_bytes"] = du
        say(f"filled in {time.monotonic() - t:.1f}s; store {du / 2**20:.0f} MiB; producer starts, then the backup")
        ctx = mp.get_context("fork")
        stop = ctx.Event()
        rx, tx = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_stall_producer, args=(pair.server_url(0), a.stall_window, stop, tx), daemon=True)
        proc.start()
        time.sleep(3.0)  # a baseline before the backup joins
        marks = {"backup_start": time.monotonic()}
        pair.start(1)
        last = ""
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            st = pair.status(1)
            rep = st.get("replication", "") if st else ""
            if rep != last:
                say(f"backup: {rep or 'starting'}")
                last = rep
            if rep == "in-sync" and "in_sync" not in marks:
                marks["in_sync"] = time.monotonic()
            if st and st.get("following", {}).get("caught_up") and "in_sync" in marks:
                marks["warm"] = time.monotonic()
                break
            time.sleep(0.25)
        else:
            raise RuntimeError("the backup did not sync and warm up in 30 minutes")
        say(f"backup in sync after {marks['in_sync'] - marks['backup_start']:.1f}s, warm after "
            f"{marks['warm'] - marks['backup_start']:.1f}s")  # fmt: skip
        time.sleep(2.0)
        marks["end"] = time.monotonic()
        stop.set()
        if not rx.poll(120):
            raise RuntimeError("the sync producer did not report")
        got = rx.recv()
        proc.join(10)
        if "error" in got:
            raise RuntimeError(f"the sync producer failed: {got['error']}")
        at = list(array("d", got["at"]))
        lat = list(array("d", got["lat"]))
        result["producer_errors"] = got["errors"]
        result["baseline"] = _gaps(at, lat, marks["backup_start"] - 2.5, marks["backup_start"])
        result["syncing"] = _gaps(at, lat, marks["backup_start"], marks["in_sync"])
        result["warming"] = _gaps(at, lat, marks["in_sync"], marks["warm"])
        result["sync_s"] = round(marks["in_sync"] - marks["backup_start"], 2)
        result["warm_up_s"] = round(marks["warm"] - marks["in_sync"], 2)
        result["longest_gap_ms"] = max(result[k].get("longest_gap_ms", 0) for k in ("syncing", "warming"))
        say(f"sync: {json.dumps(result['syncing'])}")
        say(f"warm-up: {json.dumps(result['warming'])}")
        say("failover: kill -9 of the primary under a producer and a consumer")
        fo = asyncio.run(_measure(pair))  # type: ignore[arg-type]
        result["failover"] = fo
        say(f"failover: {json.dumps(fo)}")
    finally:
        pair.stop_all()
        if a.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
            if backup_root is not None:
                shutil.rmtree(backup_root, ignore_errors=True)
    return result


# ----------------------------------------------------------------------------- summary
def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["driver"], r["producers"], r["consumers"]), []).append(r)
    return [
        {
            "mode": mode,
            "pair": f"{p}+{c}",
            "runs": len(rs),
            "msgs_per_s": round(statistics.median(r["msgs_per_s"] for r in rs)),
            "p50_ms": round(statistics.median(r["latency_ms"]["p50"] for r in rs), 2),
            "p99_ms": round(statistics.median(r["latency_ms"]["p99"] for r in rs), 2),
            "confirm_p50_ms": round(statistics.median(r["confirm_latency_ms"]["p50"] for r in rs), 2),
            "confirm_p99_ms": round(statistics.median(r["confirm_latency_ms"]["p99"] for r in rs), 2),
            "all_msgs_per_s": [round(r["msgs_per_s"]) for r in rs],
        }
        for (mode, p, c), rs in groups.items()
    ]


def targets(rows: list[dict[str, Any]], sync: dict[str, Any] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    by = {(r["mode"], r["pair"]): r for r in rows}
    for pair in sorted({r["pair"] for r in rows}):
        live = by.get(("live-only", pair))
        rmq = by.get(("amqp-quorum-3", pair))
        for mode in ("replicated-fsync-true", "replicated-fsync-false"):
            rep = by.get((mode, pair))
            if rep is None:
                continue
            if live:
                ratio = rep["msgs_per_s"] / live["msgs_per_s"]
                out.append({"what": f"{pair} {mode} / live-only", "value": round(ratio, 3), "target": ">= 0.6",
                            "met": ratio >= 0.6})  # fmt: skip
            if rmq:
                ratio = rep["msgs_per_s"] / rmq["msgs_per_s"]
                out.append({"what": f"{pair} {mode} / RabbitMQ quorum", "value": round(ratio, 3), "target": ">= 3",
                            "met": ratio >= 3})  # fmt: skip
                out.append({"what": f"{pair} {mode} p99 vs RabbitMQ quorum p99, end to end (ms)",
                            "value": f"{rep['p99_ms']} vs {rmq['p99_ms']}", "target": "below",
                            "met": rep["p99_ms"] < rmq["p99_ms"]})  # fmt: skip
                out.append({"what": f"{pair} {mode} p99 vs RabbitMQ quorum p99, confirm (ms)",
                            "value": f"{rep['confirm_p99_ms']} vs {rmq['confirm_p99_ms']}", "target": "below",
                            "met": rep["confirm_p99_ms"] < rmq["confirm_p99_ms"]})  # fmt: skip
    if sync:
        gap = sync["longest_gap_ms"]
        out.append({"what": f"longest write stall while a backup syncs {sync['backlog_messages']:,} messages (ms)",
                    "value": gap, "target": "< 100", "met": gap < 100})  # fmt: skip
        fo = sync["failover"]["to_first_send_s"]
        out.append({"what": f"kill -9 -> first confirmed send, {sync['backlog_messages']:,} messages (s)",
                    "value": fo, "target": "< 3", "met": 0 <= fo < 3})  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts, one repeat: a development run")
    ap.add_argument("--count", type=int, help="messages per throughput run (100000; --quick 20000)")
    ap.add_argument("--repeat", type=int, help="runs per configuration (3; --quick 1)")
    ap.add_argument("--backlog", type=int, help="messages in the store for the sync and failover (1M; --quick 100k)")
    ap.add_argument("--stall-window", type=int, default=16, help="unconfirmed sends of the producer during the sync")
    ap.add_argument("--pairs", default="1+1,4+4")
    ap.add_argument("--parts", default="throughput,rabbitmq,sync", help="which parts to run")
    ap.add_argument(
        "--backup-root",
        help="where the sync part's backup keeps its data (another disk; by default beside the primary's)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the sync part's data directories and logs")
    ap.add_argument("--out", default=str(BENCH / "results"))
    ap.add_argument("--note", default="", help="what the reader should know about this run (machine load)")
    a = ap.parse_args()
    a.count = a.count or (20_000 if a.quick else 100_000)
    a.repeat = a.repeat or (1 if a.quick else 3)
    a.backlog = a.backlog if a.backlog is not None else (100_000 if a.quick else 1_000_000)
    pairs = [(int(x.split("+")[0]), int(x.split("+")[1])) for x in a.pairs.split(",")]
    parts = set(a.parts.split(","))
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    runs: list[dict[str, Any]] = []
    if "throughput" in parts:
        runs += part_throughput(a, pairs)
    if "rabbitmq" in parts:
        runs += part_rabbitmq(a, pairs)
    sync = part_sync_and_failover(a) if "sync" in parts else None
    rows = summarize(runs)
    tg = targets(rows, sync)
    print()
    print(f"{'mode':24} {'pair':5} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'conf p50':>8} {'conf p99':>8}  runs")
    for r in rows:
        print(f"{r['mode']:24} {r['pair']:5} {r['msgs_per_s']:>9,} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
              f"{r['confirm_p50_ms']:8.2f} {r['confirm_p99_ms']:8.2f}  {r['all_msgs_per_s']}")  # fmt: skip
    print()
    print_targets(tg)
    result = {
        "benchmark": "replication",
        "date": started + " UTC",
        "machine": _cpu(),
        "command": " ".join(["bench/replication.py", *sys.argv[1:]]),
        "note": a.note,
        "latency": "p50_ms/p99_ms: end to end (send stamp -> receipt); confirm_*: send -> confirmation",
        "summary": rows,
        "targets": tg,
        "initial_sync_and_failover": sync,
        "runs": runs,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replication.json").write_text(json.dumps(result, indent=2) + "\n")
    say(f"written {out / 'replication.json'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
