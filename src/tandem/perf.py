"""`tandem perf producer|consumer|pair`: throughput and latency over the native protocol.

Producers and consumers run in their own processes (a Python client is
CPU-bound; sharing one interpreter with the broker or each other would
measure the GIL). Each body starts with the send time (CLOCK_MONOTONIC,
comparable across processes on one machine) so consumers measure latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import struct
import sys
import time
import uuid
from array import array
from collections import deque
from typing import Any

STAMP = struct.Struct(">q")
STAMP_SEQ = struct.Struct(">qq")  # the send stamp, then the message's number in the run (0 .. count-1)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("perf", help="measure throughput and latency")
    ps = p.add_subparsers(dest="mode", required=True)
    for mode in ("producer", "consumer", "pair"):
        x = ps.add_parser(mode)
        x.add_argument("--url", default=os.environ.get("TANDEM_URL", "tcp://127.0.0.1:61616"))
        x.add_argument("--destination", "--queue", dest="queue", default="perf")
        x.add_argument("--count", type=int, default=100_000, help="messages in all")
        x.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
        x.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
        x.add_argument("--no-progress", action="store_true")
        x.add_argument("--tx-batch", type=int, default=0, help="send / acknowledge in transactions of N")
        if mode in ("consumer", "pair"):
            x.add_argument(
                "--verify", action="store_true", help="check every message number 0..count-1 arrives exactly once"
            )
        if mode in ("producer", "pair"):
            x.add_argument("--dedup", action="store_true", help="give every message a dedup id")
            x.add_argument("--producers", type=int, default=1)
            x.add_argument("--size", type=int, default=1024)
            x.add_argument("--window", type=int, default=256, help="unconfirmed sends per producer")
            x.add_argument("--non-durable", action="store_true")
        if mode in ("consumer", "pair"):
            x.add_argument("--consumers", type=int, default=1)
            x.add_argument("--consumer-window", type=int, default=256 * 1024, help="consumer credit in bytes")
        if mode == "pair":
            x.add_argument("--keep", action="store_true", help="do not purge the queue first")
    p.set_defaults(func=lambda a: main(a))


def _install_loop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


# ------------------------------------------------------------------ producers
async def _produce(
    args: dict[str, Any], index: int, first: int, count: int, sent: Any, confirm_lat: array[int]
) -> None:
    """Send `count` messages numbered from `first` (after the stamp, when the body has room)."""
    from .client.connection import connect
    from .client.message import Message

    queue, size, tx_batch = args["queue"], args["size"], args["tx_batch"]
    # Plain durable sends: no automatic dedup id (the client's default), which `--dedup` measures.
    conn = await connect(args["url"], send_window=args["window"], auto_dedup=False)
    session = await conn.create_session(transacted=tx_batch > 0)
    prod = session.create_producer(queue)
    numbered = size >= STAMP_SEQ.size
    pad = b"x" * max(size - (STAMP_SEQ.size if numbered else STAMP.size), 0)
    pack = STAMP_SEQ.pack
    durable = args["durable"]
    dedup = f"{args['run_id']}-{index}-" if args.get("dedup") else None
    errors: list[BaseException] = []
    confirmed = 0
    stamps: deque[int] = deque()  # send times not confirmed yet: confirmations come in send order
    mono = time.monotonic_ns

    def done(exc: BaseException | None) -> None:
        nonlocal confirmed
        if exc is not None:
            errors.append(exc)
        if stamps:
            confirm_lat.append(mono() - stamps.popleft())
        confirmed += 1
        if not tx_batch and confirmed % 256 == 0:
            with sent.get_lock():
                sent.value += 256

    for i in range(count):
        if not prod.has_room(queue, size):
            await prod.ready(queue, size)  # stamp after waiting for window and credit: latency is broker + network
        stamp = mono()
        body = (pack(stamp, first + i) if numbered else STAMP.pack(stamp)) + pad
        if not tx_batch:
            stamps.append(stamp)
        prod.send_nowait(Message(body, durable=durable, dedup_id=f"{dedup}{i}" if dedup else None), done)
        if tx_batch and ((i + 1) % tx_batch == 0 or i + 1 == count):
            await session.commit()  # durable once this returns
            with sent.get_lock():
                sent.value += (i % tx_batch) + 1
    await prod.flush()
    if not tx_batch:
        with sent.get_lock():
            sent.value += confirmed % 256
    await conn.close()
    if errors:
        raise errors[0]


def _producer_proc(args: dict[str, Any], sent: Any, out: Any, start: Any) -> None:
    _install_loop()

    async def run() -> dict[str, Any]:
        start.wait()
        t0 = time.monotonic_ns()
        counts = _split(args["count"], args["producers"])
        lat: array[int] = array("q")
        firsts = [sum(counts[:i]) for i in range(len(counts))]
        await asyncio.gather(*(_produce(args, i, firsts[i], n, sent, lat) for i, n in enumerate(counts)))
        return {"first_send_ns": t0, "last_confirm_ns": time.monotonic_ns(), "confirm_lat": lat.tobytes()}

    try:
        out.send(asyncio.run(run()))
    except BaseException as exc:
        out.send({"error": repr(exc)})


# ------------------------------------------------------------------ consumers
class Numbers:
    """Which message numbers (STAMP_SEQ) arrived, in a bitmap: `--verify` finds a lost or doubled
    message among millions for one bit each."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.bits = bytearray((count + 7) // 8)
        self.seen = 0
        self.duplicates = 0
        self.strays = 0  # too short to carry a number, or a number outside 0..count-1

    def mark(self, body: bytes) -> None:
        """Count the number a body carries."""
        if len(body) < STAMP_SEQ.size:
            self.strays += 1
            return
        self.add(STAMP_SEQ.unpack_from(body)[1])

    def add(self, n: int) -> None:
        if not 0 <= n < self.count:
            self.strays += 1
            return
        byte, bit = n >> 3, 1 << (n & 7)
        if self.bits[byte] & bit:
            self.duplicates += 1
        else:
            self.bits[byte] |= bit
            self.seen += 1

    def missing(self, most: int = 10) -> list[int]:
        """The first `most` numbers that never arrived."""
        out: list[int] = []
        for byte, v in enumerate(self.bits):
            if v != 0xFF:
                out += [n for n in range(byte * 8, min(byte * 8 + 8, self.count)) if not v >> (n & 7) & 1]
                if len(out) >= most:
                    break
        return out[:most]

    def report(self) -> dict[str, Any]:
        return {
            "distinct": self.seen,
            "missing": self.count - self.seen,
            "duplicates": self.duplicates,
            "strays": self.strays,
            "first_missing": self.missing(),
        }


async def _open_consumer(url: str, queue: str, window: int, transacted: bool) -> Any:
    from .client.connection import connect

    conn = await connect(url, consumer_window_size=window)
    session = await conn.create_session(ack_mode="auto", transacted=transacted)
    return conn, await session.create_consumer(queue)


async def _consume(
    conn: Any,
    consumer: Any,
    count: int,
    recv: Any,
    lat: array[int],
    deadline: float,
    tx_batch: int,
    numbers: Numbers | None = None,
) -> int:
    got = 0
    uncommitted = 0
    unpack = STAMP.unpack_from
    mono = time.monotonic_ns
    append = lat.append
    batch = 0
    while got < count:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        msg = await consumer.receive(left)
        if msg is None:
            break
        append(mono() - unpack(msg.body)[0])
        if numbers is not None:
            numbers.mark(msg.body)
        got += 1
        batch += 1
        uncommitted += 1
        while got < count and (not tx_batch or uncommitted < tx_batch):  # drain the buffer without awaiting
            m2 = consumer.receive_nowait()
            if m2 is None:
                break
            append(mono() - unpack(m2.body)[0])
            if numbers is not None:
                numbers.mark(m2.body)
            got += 1
            batch += 1
            uncommitted += 1
        if tx_batch and (uncommitted >= tx_batch or got == count):
            await consumer.session.commit()
            uncommitted = 0
        if batch >= 256:
            with recv.get_lock():
                recv.value += batch
            batch = 0
    with recv.get_lock():
        recv.value += batch
    await consumer.close()
    await conn.close()
    return got


def _consumer_proc(args: dict[str, Any], recv: Any, out: Any, ready: Any) -> None:
    _install_loop()

    async def run() -> dict[str, Any]:
        deadline = time.monotonic() + args["timeout"]
        lats = [array("q") for _ in range(args["consumers"])]
        counts = _split(args["count"], args["consumers"])
        tx = args["tx_batch"]
        numbers = Numbers(args["count"]) if args.get("verify") else None
        opened = [await _open_consumer(args["url"], args["queue"], args["consumer_window"], tx > 0) for _ in counts]
        ready.set()
        started = time.monotonic_ns()
        got = await asyncio.gather(
            *(
                _consume(c, k, n, recv, lats[i], deadline, tx, numbers)
                for i, ((c, k), n) in enumerate(zip(opened, counts, strict=True))
            )
        )
        merged = array("q")
        for a in lats:
            merged.extend(a)
        return {
            "received": sum(got),
            "started_ns": started,
            "last_receive_ns": time.monotonic_ns(),
            "lat": merged.tobytes(),
            "numbers": numbers.report() if numbers is not None else None,
        }

    try:
        out.send(asyncio.run(run()))
    except BaseException as exc:
        out.send({"error": repr(exc)})


# ------------------------------------------------------------------- driving
def percentiles(samples_ns: array[int]) -> dict[str, float]:
    if not samples_ns:
        return {"p50": 0.0, "p99": 0.0, "p999": 0.0}
    s = sorted(samples_ns)
    n = len(s)

    def pick(q: float) -> float:
        return round(s[min(n - 1, int(q * n))] / 1e6, 3)

    return {"p50": pick(0.50), "p99": pick(0.99), "p999": pick(0.999)}


def _progress(
    total: int, counter: Any, procs: list[Any], pipes: dict[str, Any], disable: bool, label: str
) -> dict[str, Any]:
    """Show progress until the children finish; read their results as they come (a full pipe would block them)."""
    from tqdm import tqdm

    results: dict[str, Any] = {}
    with tqdm(total=total, unit="msg", desc=label, disable=disable, file=sys.stderr, smoothing=0.1) as bar:
        last = 0
        while len(results) < len(pipes):
            for name, rx in pipes.items():
                if name not in results and rx.poll(0.1):
                    results[name] = rx.recv()
            if len(results) < len(pipes) and not any(p.is_alive() for p in procs):
                for name, rx in pipes.items():
                    if name not in results:
                        results[name] = rx.recv() if rx.poll(1) else {"error": f"{name} process died"}
            v = counter.value
            bar.update(v - last)
            last = v
    return results


def _prepare(url: str, queue: str, purge: bool) -> None:
    async def go() -> None:
        from .client.connection import connect

        conn = await connect(url)
        try:
            await conn.manage("queue.create", name=queue, exists_ok=True)
            if purge:
                await conn.manage("queue.purge", name=queue)
        finally:
            await conn.close()

    asyncio.run(go())


def main(a: argparse.Namespace) -> int:
    ctx = mp.get_context("spawn")
    args = {k: v for k, v in vars(a).items() if k != "func"}
    args["durable"] = not args.get("non_durable", False)
    args["run_id"] = uuid.uuid4().hex[:12]
    _prepare(a.url, a.queue, purge=(a.mode == "pair" and not a.keep))
    start = ctx.Event()
    procs: list[Any] = []
    pipes: dict[str, Any] = {}
    sent = ctx.Value("q", 0)
    recv = ctx.Value("q", 0)
    if a.mode in ("consumer", "pair"):
        pipes["consumer"], tx = ctx.Pipe(duplex=False)
        procs.append(ctx.Process(target=_consumer_proc, args=(args, recv, tx, start)))
    if a.mode in ("producer", "pair"):
        pipes["producer"], tx2 = ctx.Pipe(duplex=False)
        procs.append(ctx.Process(target=_producer_proc, args=(args, sent, tx2, start)))
    for p in procs:
        p.start()
    if a.mode == "producer":
        start.set()
    counter = recv if a.mode != "producer" else sent
    label = "received" if a.mode != "producer" else "confirmed"
    results = _progress(a.count, counter, procs, pipes, a.no_progress or a.json, label)
    for p in procs:
        p.join(5)
    result: dict[str, Any] = {
        "broker": "tandem",
        "client": "tandem-python",
        "mode": a.mode,
        "producers": getattr(a, "producers", 0),
        "consumers": getattr(a, "consumers", 0),
        "size": getattr(a, "size", 0),
        "count": a.count,
        "window": getattr(a, "window", 0),
        "durable": args["durable"],
        "tx_batch": a.tx_batch,
        "dedup": bool(getattr(a, "dedup", False)),
    }
    prod = results.get("producer")
    cons = results.get("consumer")
    for part in (prod, cons):
        if part is not None and "error" in part:
            print(f"tandem perf: client failed: {part['error']}", file=sys.stderr)
            return 1
    if prod and prod.get("confirm_lat"):
        confirm = array("q")
        confirm.frombytes(prod["confirm_lat"])
        result["confirm_latency_ms"] = percentiles(confirm)  # send -> confirmation (not with --tx-batch)
    if a.mode == "producer" and prod:
        dur = (prod["last_confirm_ns"] - prod["first_send_ns"]) / 1e9
        result.update(msgs_per_s=round(a.count / dur, 1), duration_s=round(dur, 3))
    elif cons:
        lat = array("q")
        lat.frombytes(cons["lat"])
        # Pair: from the first send; consumer alone (draining a filled queue): from its start.
        first = prod["first_send_ns"] if prod else cons["started_ns"]
        dur = (cons["last_receive_ns"] - first) / 1e9
        result.update(received=cons["received"], latency_ms=percentiles(lat))
        result.update(msgs_per_s=round(cons["received"] / dur, 1) if dur > 0 else 0.0, duration_s=round(dur, 3))
        if cons.get("numbers") is not None:
            nums = result["numbers"] = cons["numbers"]
            if nums["missing"] or nums["duplicates"] or nums["strays"]:
                result["error"] = (
                    f"{nums['missing']} numbers missing (first: {nums['first_missing']}), "
                    f"{nums['duplicates']} duplicates, {nums['strays']} strays"
                )
        if cons["received"] < a.count:
            result["error"] = f"only {cons['received']} of {a.count} messages arrived"
    if a.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:12} {v}")
    return 0 if "error" not in result else 1
