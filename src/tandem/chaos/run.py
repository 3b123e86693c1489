"""One chaos run, start to verdict: pair up, clients on, faults, heal, drain, check, plot.

Bounded: the faults take about `seconds` (more if healing is slow; never more than three
times that plus two minutes), the drain at most a minute, and every wait has a limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import checker, history, plot
from . import store as stores
from .faults import Nemesis, plan
from .topology import Pair
from .workload import PRODUCERS, Shape, Workload, drain, left_in_queue, queue_stat

QUIET = 3.0  # seconds without a delivery that end the consumers' drain
DRAIN_LIMIT = 60.0


@dataclass
class Options:
    pair: str = "replication"
    faults: int = 10
    seconds: float = 60.0
    seed: int = 0
    out: Path | None = None
    mode: str = "exactly-once"
    store: str = "plain"  # store pressure: plain, paging, large (store.py)
    shape: Shape = field(default_factory=Shape)


def stderr(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(opts: Options, progress: Callable[[str], None] = stderr) -> dict[str, Any]:
    """Run it all; returns the verdict (also written to `out`/verdict.json)."""
    if opts.faults < 0 or opts.seconds <= 0:
        raise ValueError("faults must be >= 0 and seconds > 0")
    out = opts.out or Path(tempfile.mkdtemp(prefix="tandem-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    if opts.store not in stores.STORES:
        raise ValueError(f"store must be one of {stores.STORES}")
    shape = dataclasses.replace(opts.shape, mode=opts.mode, store=opts.store)
    hist = history.History(out / "history.jsonl")
    pair = Pair(out / "pair", opts.pair, log=progress, store=opts.store)
    # The clients' own warnings (hundreds of "reconnecting" per fault) go to a file, not the screen.
    client_log = logging.FileHandler(out / "clients.log")
    client_log.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    tandem_log = logging.getLogger("tandem")
    saved = tandem_log.propagate
    tandem_log.addHandler(client_log)
    tandem_log.propagate = False
    extra: dict[str, Any] = {}
    t0 = time.monotonic()
    try:
        progress(f"starting a {opts.pair} pair ({opts.store} store) in {out}")
        pair.start()
        progress(f"pair up: {pair.describe()}")
        extra = asyncio.run(_main(pair, hist, opts, shape, progress))
        extra["store_pressure"] = _pressure(pair, extra.pop("max_paged", 0), out / "history.jsonl", opts.store)
    finally:
        pair.close()
        hist.close()
        tandem_log.removeHandler(client_log)
        tandem_log.propagate = saved
        client_log.close()
    events = list(history.read(out / "history.jsonl"))
    verdict = checker.check(events, opts.mode)
    verdict.update(
        {
            "pair": opts.pair,
            "store": opts.store,
            "seed": opts.seed,
            "faults_planned": opts.faults,
            "seconds": opts.seconds,
            "elapsed_s": round(time.monotonic() - t0, 1),
            **extra,
            "history": str(out / "history.jsonl"),
        }
    )
    store = "" if opts.store == "plain" else f", {opts.store} store"
    title = f"tandem chaos: {opts.pair} pair{store}, {opts.mode}, {verdict['faults']} faults, seed {opts.seed}"
    png = out / "chaos.png"
    verdict["plot"] = str(png) if plot.plot(events, png, title) else None
    (out / "verdict.json").write_text(json.dumps(verdict, indent=2) + "\n")
    (out / "summary.txt").write_text(checker.summary(verdict) + "\n")
    return verdict


async def _main(
    pair: Pair, hist: history.History, opts: Options, shape: Shape, progress: Callable[[str], None]
) -> dict[str, Any]:
    wl = Workload(pair.url, hist, shape)
    await wl.start()
    nemesis = Nemesis(pair, hist, plan(opts.pair, opts.faults, opts.seed), opts.seconds, progress).start()
    started = time.monotonic()
    limit = 3 * opts.seconds + 120
    last = 0.0
    max_paged = 0
    last_stat = 0.0
    paged = ""
    while nemesis.thread.is_alive():
        await asyncio.sleep(0.5)
        now = time.monotonic() - started
        if stores.pages(opts.store) and now - last_stat >= 2:
            # how far the backlog reaches into the pages (when a server answers)
            last_stat = now
            st = await queue_stat(pair.url, timeout=3.0)
            if st is not None:
                max_paged = max(max_paged, int(st.get("paged_count") or 0))
                paged = f"  queued {st.get('message_count')} (paged {st.get('paged_count')}, at most {max_paged})"
        if now - last >= 5:
            last = now
            progress(
                f"{now:5.0f}s  faults {nemesis.done}/{opts.faults}  confirmed {len(wl.confirmed)}  "
                f"delivered {len(wl.delivered)}{paged}"
            )
        if now > limit:
            progress(f"faults still running after {limit:.0f}s: stopping them")
            nemesis.stop.set()
            await asyncio.to_thread(nemesis.thread.join, 120)
            break
    if nemesis.error is not None:
        progress(f"the nemesis failed: {nemesis.error!r}")
    active = await asyncio.to_thread(pair.heal)
    progress(f"faults over; pair: {await asyncio.to_thread(pair.describe)}; producers stop in 2 s")
    await asyncio.sleep(2.0)
    wl.stop_producers()
    producers = [t for t in wl.tasks if t.get_name()[0] in PRODUCERS]
    await asyncio.wait(producers, timeout=RETRY_BOUND)
    # The consumers go on until every confirmed value came and nothing more comes for a while.
    deadline = time.monotonic() + DRAIN_LIMIT
    while time.monotonic() < deadline:
        missing = len(wl.confirmed - wl.delivered)
        if missing == 0 and time.monotonic() - wl.last_delivery > QUIET:
            break
        await asyncio.sleep(0.5)
    progress(f"draining: {len(wl.confirmed - wl.delivered)} confirmed values not delivered yet; consumers stop")
    wl.stop_consumers()
    await wl.wait(30)
    taken = await drain(pair.url, hist, store=opts.store)
    left = await left_in_queue(pair.url)
    progress(f"final drain took {taken}; left in the queue: {left}")
    return {
        "unhealed": nemesis.unhealed,
        "late_disk_stops": nemesis.late_disk_stops,
        "interventions": len(pair.interventions),
        "nemesis_error": repr(nemesis.error) if nemesis.error else None,
        "final_drain": taken,
        "left_in_queue": left,
        "active_at_end": None if active is None else ("primary", "backup")[active],
        "max_paged": max_paged,
    }


def _pressure(pair: Pair, max_paged: int, hist: Path, store: str) -> dict[str, int]:
    """Evidence that the run pressed the store as asked: paging started (the servers' logs) and
    the most messages seen in the pages; large values confirmed."""
    out: dict[str, int] = {}
    logs = [s.log_text() for s in pair.servers]
    if stores.pages(store):
        out["paging_started"] = sum(t.count("address paging ") for t in logs)
        out["paging_stopped"] = sum(t.count("address stopped paging") for t in logs)
        out["max_paged"] = max_paged
        # disk faults that struck the page files rather than the journal (faults._disk arms both)
        out["page_disk_faults"] = sum(
            1 for t in logs for line in t.splitlines() if "storage failure:" in line and ", tandem-paging " in line
        )
    if stores.streams(store):  # a large message's file failed (one disk fault may strike several uploads)
        out["large_file_errors"] = sum(
            1 for t in logs for line in t.splitlines() if "cannot store a large message:" in line
        )
    if store != "plain":
        out["server_tracebacks"] = sum(t.count("\nTraceback (most recent call last)") for t in logs)
    if stores.streams(store):
        large = 0
        for e in history.read(hist):
            if e["ev"] == "ok":
                large += sum(1 for v in e.get("vs", ()) if stores.is_large(v))
        out["large_confirmed"] = large
    return out


RETRY_BOUND = 90.0  # a producer's last value: its retries, each bounded by the client's call timeout


# -------------------------------------------------------------------- the command
def add_parser(sub: Any) -> None:
    """`tandem chaos ...` (cli.py)."""
    from .topology import PAIRS

    c = sub.add_parser(
        "chaos",
        help="a Jepsen-style run on loopback: a pair, clients, faults, then a check that nothing was lost",
        description="Start a pair and clients on 127.0.0.1, inject N faults, heal, drain and check the history "
        "(docs/chaos.md). Progress goes to stderr; the summary and, as the last line, the JSON verdict to "
        "stdout. Exit status 0 only when nothing was lost, duplicated or unexpected.",
    )
    c.add_argument("--pair", choices=PAIRS, default="replication", help="the kind of pair (default replication)")
    c.add_argument("--faults", type=int, default=10, metavar="N", help="how many faults (default 10)")
    c.add_argument("--seconds", type=float, default=60.0, metavar="S", help="spread the faults over S s (default 60)")
    c.add_argument("--seed", type=int, default=None, metavar="K", help="fault order and timing (default: random)")
    c.add_argument("--out", type=Path, default=None, metavar="DIR", help="history, verdict, plot, logs (default: tmp)")
    c.add_argument(
        "--mode",
        choices=("exactly-once", "at-least-once"),
        default="exactly-once",
        help="at-least-once: no duplicate ids, no transactions; duplicates are reported, not failed",
    )
    c.add_argument(
        "--store",
        choices=stores.STORES,
        default="plain",
        help="store pressure: paging (a tiny max-size-bytes: nearly every message is paged and read back), "
        "large (a third of the values are large messages), paging-large (both), "
        "plain (default: short queue, tiny bodies)",
    )
    c.set_defaults(func=main)


def main(args: Any) -> int:
    import random

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    opts = Options(pair=args.pair, faults=args.faults, seconds=args.seconds, seed=seed, out=args.out, mode=args.mode)
    opts.store = args.store
    stderr(f"seed {seed}")
    verdict = run(opts)
    print(checker.summary(verdict))
    print(f"history: {verdict['history']}" + (f"  plot: {verdict['plot']}" if verdict["plot"] else "  (no plot)"))
    print(json.dumps(verdict, separators=(",", ":")))
    return 0 if verdict["valid"] else 1
