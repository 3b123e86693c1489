"""Paging: a backlog far bigger than memory, filled with no consumer, then drained (issue 16).

Three parts in one run, one broker process each, its data under --workdir (deleted after the part):

1. Tandem, in memory: `global-max-size = -1` (nothing pages), --memory-messages 1 KiB durable
   messages sent with no consumer (`tandem perf producer`), then drained (`tandem perf consumer
   --verify`): the in-memory drain rate the paged one is held against.
2. Tandem, paged: the queue's address PAGE (`address-full-policy`, the default, set explicitly),
   `global-max-size` --global-max-size MiB; --messages messages filled and drained the same way.
3. RabbitMQ (Debian's rabbitmq-server, a private node, bench/brokers/rabbitmq.py): a classic
   queue version 2 in lazy mode (`x-queue-version: 2`, `x-queue-mode: lazy`), --messages messages
   sent by bench/drivers/amqp.py with no consumer (publisher confirms, persistent), then drained
   (prefetch 256, `multiple` acks, --verify). --skip-rabbitmq when it is not installed.

Each message carries its number (0 .. N-1) after the send stamp; each drain checks in a bitmap
that every number arrived exactly once. Reported per part: produce and drain rates, the broker's
peak RSS (VmHWM, and RSS polled at 10 Hz), the data directory's peak size; the targets of issue 16
(peak RSS <= global-max-size + 200 MiB; paged drain >= 0.8x in-memory; Tandem >= 2x RabbitMQ's
produce and drain rates with a lower peak RSS) and whether each was met. Writes
bench/results/paging.json (--out).

    bash bench/setup-rabbitmq.sh; .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/paging.py                                  # full: 10M messages
    .venv/bin/python bench/paging.py --messages 50000 --memory-messages 20000 --out /tmp/x   # a try
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from brokers.rabbitmq import RabbitMQNode  # noqa: E402
from brokers.tandem import TandemBroker  # noqa: E402
from drivers.common import _proc_cpu_s  # noqa: E402
from memory import _cpu  # noqa: E402
from replication import print_targets, say  # noqa: E402
from tandem.testing.procs import memory  # noqa: E402

MIB = 1 << 20
QUEUE = "paging"
DISK_OVERHEAD = 512  # bytes a message takes on disk beyond its body at the peak (measured ~200), either broker


class Watch(threading.Thread):
    """Samples a process's RSS (10 Hz) and a directory's size (1 Hz) until stopped: the peaks."""

    def __init__(self, pid: int, directory: Path) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.directory = directory
        self.peak_rss = 0
        self.peak_disk = 0
        self._halt = threading.Event()

    def run(self) -> None:
        tick = 0
        while not self._halt.wait(0.1):
            self.peak_rss = max(self.peak_rss, _mem(self.pid, "VmRSS"))
            if tick % 10 == 0:
                self.peak_disk = max(self.peak_disk, _du(self.directory))
            tick += 1

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.peak_disk = max(self.peak_disk, _du(self.directory))


def _mem(pid: int, key: str) -> int:
    """VmRSS or VmHWM in bytes; 0 once the process is gone."""
    try:
        return memory(pid, key)
    except (OSError, LookupError):
        return 0


def _du(path: Path) -> int:
    """Bytes allocated on disk below `path` (pre-allocated files count as what they hold on the disk)."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        elif e.is_file(follow_symlinks=False):
                            total += e.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:  # removed while we looked
                        pass
        except OSError:
            pass
    return total


def _drive(
    cmd: list[str], label: str, total: int, depth: Callable[[], int], broker_pid: int, a: argparse.Namespace
) -> dict[str, Any]:
    """Run one driver (it prints one JSON line), printing the queue's depth every --progress seconds;
    add the broker's CPU use over the run (% of one core)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        cpu0 = _proc_cpu_s(broker_pid)
        # Its own process group: a driver given up on goes with its worker processes.
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True)
        t0 = last_t = time.monotonic()
        last = None
        try:
            while True:
                try:
                    proc.wait(a.progress)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() - t0 > a.timeout:
                    raise RuntimeError(f"{label}: not done after --timeout {a.timeout:.0f}s")
                try:
                    n = depth()
                except Exception as exc:  # the broker is busy: skip this line
                    say(f"{label}: (queue depth unavailable: {type(exc).__name__})")
                    continue
                now = time.monotonic()
                rate = "" if last is None else f", {abs(n - last) / (now - last_t):,.0f} msg/s"
                done = n if "fill" in label else total - n
                say(f"{label}: {done:,} of {total:,} ({n:,} queued{rate})")
                last, last_t = n, now
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # workers left behind, if any
            proc.wait(10)
        wall = time.monotonic() - t0
        broker_cpu = _proc_cpu_s(broker_pid) - cpu0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"{label}: {' '.join(cmd[:4])}... exited {proc.returncode}:\n{stdout[-3000:]}\n{stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    result["broker_cpu_pct"] = round(100 * broker_cpu / wall, 1)  # over the driver's whole run, start-up included
    rate, cpu = result["msgs_per_s"], result["broker_cpu_pct"]
    say(f"{label}: {rate:,.0f} msg/s over {result['duration_s']:.1f}s, broker CPU {cpu}%")
    return result


# ----------------------------------------------------------------------------- Tandem
def _manage(url: str, command: str, **kw: Any) -> Any:
    async def go() -> Any:
        from tandem.client.connection import connect

        conn = await connect(url, reconnect_attempts=0, call_timeout=30_000)
        try:
            return await conn.manage(command, **kw)
        finally:
            await conn.close()

    return asyncio.run(go())


def tandem_part(a: argparse.Namespace, part: dict[str, Any], name: str, count: int, toml: str) -> None:
    data = Path(tempfile.mkdtemp(prefix=f"tandem-{name}-", dir=a.workdir))
    say(f"Tandem, {name}: {count:,} messages; data in {data}")
    b = TandemBroker(data_dir=data / "data", extra_toml=toml).start()
    watch = Watch(b.pid, data)
    watch.start()
    part.update(broker="tandem", part=name, messages=count, config=toml.strip())
    try:
        perf = [sys.executable, "-m", "tandem", "perf"]
        common = ["--url", b.url, "--queue", QUEUE, "--count", str(count), "--json", "--timeout", str(a.timeout)]

        def depth() -> int:
            return int(_manage(b.url, "queue.stat", name=QUEUE)[0]["message_count"])

        fill = [*perf, "producer", *common, "--producers", str(a.producers), "--size", str(a.size), "--window", "256"]
        part["produce"] = _drive(fill, f"tandem {name} fill", count, depth, b.pid, a)
        stat = _manage(b.url, "queue.stat", name=QUEUE)[0]
        part["after_fill"] = {k: stat[k] for k in ("message_count", "paging", "paged_count", "memory_bytes")}
        part["rss_after_fill_mib"] = round(_mem(b.pid, "VmRSS") / MIB, 1)
        say(f"tandem {name} filled: {json.dumps(part['after_fill'])}, RSS {part['rss_after_fill_mib']} MiB")
        if stat["message_count"] != count:
            raise RuntimeError(f"{stat['message_count']} messages queued after {count:,} confirmed sends")
        if name == "in-memory" and (stat["paging"] or stat["paged_count"]):
            raise RuntimeError(f"the in-memory broker paged: {part['after_fill']}")
        drain = [*perf, "consumer", *common, "--consumers", str(a.consumers), "--verify"]
        drain += ["--consumer-window", str(256 * 1024)]
        part["drain"] = _drive(drain, f"tandem {name} drain", count, depth, b.pid, a)
        left = _manage(b.url, "queue.stat", name=QUEUE)[0]["message_count"]
        part["left_after_drain"] = left
        if left:
            raise RuntimeError(f"{left} messages still queued after the drain")
    finally:
        part["peak_rss_bytes"] = _mem(b.pid, "VmHWM")
        watch.stop()
        b.cleanup()
        shutil.rmtree(data, ignore_errors=True)
        part["peak_rss_polled_bytes"] = watch.peak_rss
        part["peak_disk_bytes"] = watch.peak_disk
        say(f"tandem {name}: {_peaks(part)}")


# ----------------------------------------------------------------------------- RabbitMQ
def rabbitmq_part(a: argparse.Namespace, part: dict[str, Any]) -> None:
    from drivers.amqp import queue_depth  # needs pamqp: only when RabbitMQ runs

    base = Path(tempfile.mkdtemp(prefix="rabbitmq-paging-", dir=a.workdir))
    say(f"RabbitMQ, classic queue v2, lazy: {a.messages:,} messages; data in {base}")
    node = RabbitMQNode(base_dir=base).start()
    part.update(broker="rabbitmq", part="classic-v2-lazy", messages=a.messages)
    watch: Watch | None = None
    vm = None
    try:
        part["version"] = node.ctl("version").strip()
        vm = node.vm_pid
        if vm is None:
            raise RuntimeError("no beam process found for the RabbitMQ node")
        watch = Watch(vm, base / "mnesia")
        watch.start()
        amqp = [sys.executable, str(BENCH / "drivers" / "amqp.py"), "--port", str(node.amqp_port),
                "--queue", QUEUE, "--size", str(a.size), "--window", "256", "--prefetch", "256",
                "--count", str(a.messages), "--queue-type", "classic-v2-lazy", "--broker", "rabbitmq",
                "--json", "--timeout", str(a.timeout)]  # fmt: skip

        def depth() -> int:
            return queue_depth("127.0.0.1", node.amqp_port, QUEUE)

        fill = [*amqp, "--producers", str(a.producers), "--consumers", "0"]
        part["produce"] = _drive(fill, "rabbitmq fill", a.messages, depth, vm, a)
        queued = depth()
        part["after_fill"] = {"message_count": queued}
        # What the node says the queue is (its x-queue-mode and x-queue-version arguments).
        part["queue"] = node.ctl("list_queues", "name", "arguments", "messages", "--no-table-headers").strip()
        part["rss_after_fill_mib"] = round(_mem(vm, "VmRSS") / MIB, 1)
        if queued != a.messages:
            raise RuntimeError(f"RabbitMQ holds {queued} messages after {a.messages:,} confirmed sends")
        drain = [*amqp, "--producers", "0", "--consumers", str(a.consumers), "--no-prepare", "--ack", "multiple"]
        part["drain"] = _drive([*drain, "--verify"], "rabbitmq drain", a.messages, depth, vm, a)
        part["left_after_drain"] = depth()
        if part["left_after_drain"]:
            raise RuntimeError(f"{part['left_after_drain']} messages still queued after the drain")
    finally:
        part["peak_rss_bytes"] = _mem(vm, "VmHWM") if vm else 0
        if watch is not None:
            watch.stop()
            part["peak_rss_polled_bytes"] = watch.peak_rss
            part["peak_disk_bytes"] = watch.peak_disk
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
        if watch is not None:
            say(f"rabbitmq: {_peaks(part)}")


# ----------------------------------------------------------------------------- summary
def _peaks(part: dict[str, Any]) -> str:
    rss, disk = part["peak_rss_bytes"] / MIB, part["peak_disk_bytes"] / MIB
    return f"peak RSS {rss:,.0f} MiB, data dir at most {disk:,.0f} MiB"


def _target(what: str, value: Any, target: str, met: bool | None) -> dict[str, Any]:
    return {"what": what, "value": value, "target": target, "met": met}


def targets(a: argparse.Namespace, parts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 16's targets; `met` is None where a part was skipped or failed (no figure to judge)."""
    ok = {k: p for k, p in parts.items() if "error" not in p and not p.get("skipped")}
    paged, mem, rmq = ok.get("paged"), ok.get("in-memory"), ok.get("rabbitmq")
    limit = a.global_max_size + 200
    out = []
    rss = paged["peak_rss_bytes"] // MIB if paged else None
    out.append(_target("Tandem paged: peak RSS (MiB)", rss, f"<= {limit} (global-max-size {a.global_max_size} + 200)",
                       None if rss is None else rss <= limit))  # fmt: skip
    ratio = paged["drain"]["msgs_per_s"] / mem["drain"]["msgs_per_s"] if paged and mem else None
    out.append(_target("Tandem drain rate, paged / in memory", ratio and round(ratio, 3), ">= 0.8",
                       None if ratio is None else ratio >= 0.8))  # fmt: skip
    for phase in ("produce", "drain"):
        ratio = paged[phase]["msgs_per_s"] / rmq[phase]["msgs_per_s"] if paged and rmq else None
        out.append(_target(f"{phase} rate, Tandem paged / RabbitMQ classic v2 lazy", ratio and round(ratio, 3),
                           ">= 2", None if ratio is None else ratio >= 2))  # fmt: skip
    both = paged and rmq
    out.append(_target("peak RSS (MiB), Tandem paged vs RabbitMQ",
                       f"{paged['peak_rss_bytes'] // MIB} vs {rmq['peak_rss_bytes'] // MIB}" if both else None,
                       "below", paged["peak_rss_bytes"] < rmq["peak_rss_bytes"] if both else None))  # fmt: skip
    return out


def _run(fn: Callable[[dict[str, Any]], None], name: str, count: int, a: argparse.Namespace) -> dict[str, Any]:
    """One part, once the disk has room for it; a failure is recorded with what was measured before
    it (and printed), and the run goes on with the next part."""
    part: dict[str, Any] = {"part": name}
    need = count * (a.size + DISK_OVERHEAD) + 2 * 2**30
    free = shutil.disk_usage(a.workdir).free
    try:
        if free < need:
            raise RuntimeError(f"{count:,} messages need about {need / 2**30:.0f} GiB free in {a.workdir}: "
                               f"{free / 2**30:.1f} GiB (--workdir)")  # fmt: skip
        fn(part)
    except (Exception, SystemExit) as exc:  # SystemExit: a driver module's missing dependency (pamqp)
        say(f"{name} FAILED: {exc}")
        part["error"] = f"{type(exc).__name__}: {exc}"
    return part


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000_000, help="the paged backlog (and RabbitMQ's)")
    ap.add_argument("--memory-messages", type=int, default=500_000, help="the in-memory comparison's backlog")
    ap.add_argument(
        "--global-max-size",
        type=int,
        default=64,
        help="MiB, the paged broker's global-max-size (256 before 2026-11-27 11:00)",
    )
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--parts", default="in-memory,paged,rabbitmq", help="which parts to run")
    ap.add_argument("--skip-rabbitmq", action="store_true", help="no RabbitMQ part (recorded as skipped)")
    ap.add_argument("--workdir", default=tempfile.gettempdir(),
                    help="where the brokers' data directories go (a 10M run needs about 20 GB free)")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds each fill or drain may take")
    ap.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines")
    ap.add_argument("--note", default="", help="what the reader should know about this run (machine load)")
    ap.add_argument("--out", default=str(BENCH / "results" / "paging.json"), help="the result file")
    a = ap.parse_args()
    if a.size < 16:
        raise SystemExit("--size must be at least 16 (the send stamp and the message number)")
    wanted = set(a.parts.split(","))
    say(f"workdir {a.workdir}: {shutil.disk_usage(a.workdir).free / 2**30:.1f} GiB free")
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    parts: dict[str, dict[str, Any]] = {}
    paged_toml = (
        f'global-max-size = {a.global_max_size * MIB}\n[address-settings."{QUEUE}"]\naddress-full-policy = "PAGE"\n'
    )
    plan: list[tuple[str, int, Callable[[dict[str, Any]], None]]] = [
        ("in-memory", a.memory_messages,
         lambda p: tandem_part(a, p, "in-memory", a.memory_messages, "global-max-size = -1\n")),
        ("paged", a.messages, lambda p: tandem_part(a, p, "paged", a.messages, paged_toml)),
        ("rabbitmq", a.messages, lambda p: rabbitmq_part(a, p)),
    ]  # fmt: skip
    for name, count, fn in plan:
        if name not in wanted:
            continue
        if name == "rabbitmq" and a.skip_rabbitmq:
            parts[name] = {"part": name, "skipped": True, "why": "--skip-rabbitmq"}
        else:
            parts[name] = _run(fn, name, count, a)
        write(a, started, parts)  # after each part: a run cut short keeps what it measured
    print()
    for name, p in parts.items():
        if "produce" in p and "drain" in p and "error" not in p:
            rates = f"produce {p['produce']['msgs_per_s']:>9,.0f} msg/s, drain {p['drain']['msgs_per_s']:>9,.0f} msg/s"
            print(f"{name:10} {rates}, {_peaks(p)}")
        else:
            print(f"{name:10} {p.get('error') or p.get('why')}")
    print()
    print_targets(targets(a, parts))
    say(f"written {write(a, started, parts)}")
    return 1 if any("error" in p for p in parts.values()) else 0


def write(a: argparse.Namespace, started: str, parts: dict[str, dict[str, Any]]) -> Path:
    result = {
        "benchmark": "paging",
        "date": started + " UTC",
        "machine": _cpu(),
        "command": " ".join(["bench/paging.py", *sys.argv[1:]]),
        "note": a.note,
        "workload": {
            "messages": a.messages,
            "memory_messages": a.memory_messages,
            "size": a.size,
            "durable": True,
            "producers": a.producers,
            "consumers": a.consumers,
            "window": 256,
            "global_max_size_mib": a.global_max_size,
        },
        "targets": targets(a, parts),
        "parts": parts,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
