"""The nemesis: faults at seeded random moments, each healed before the next.

Each fault acts on the server that is active when it strikes (or on its links), holds for a
seeded moment, and is then healed (`Pair.heal`): the run goes on with a whole pair again, so a
later fault never meets a pair still broken by an earlier one (a primary killed while its
backup is behind cannot be survived by anyone, and is not what the suite asks).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..store.large_messages import FAULTS_PREFIX as LARGE_PREFIX
from ..store.pages import FAULTS_PREFIX as PAGES_PREFIX
from . import store as stores
from .history import History
from .topology import NAMES, Pair

# kind -> which pairs it applies to
KINDS: dict[str, tuple[str, ...]] = {
    "kill": ("replication", "shared-store"),  # kill -9 of the active server
    "zombie": ("replication", "shared-store"),  # SIGSTOP past the session, then SIGCONT
    "stop-failover": ("replication", "shared-store"),  # clean stop, its backup takes over
    "kill-backup": ("replication", "shared-store"),  # kill -9 of the waiting server: the active one goes on alone
    "client-blackhole": ("replication", "shared-store"),  # the active server's client links go silent
    "client-reset": ("replication", "shared-store"),  # ... or are reset
    "link-blackhole": ("replication",),  # the replication link goes silent
    "link-reset": ("replication",),  # ... or is reset
    "zookeeper": ("replication",),  # ZooKeeper stopped, then started again
    "disk-enospc": ("replication", "shared-store"),  # the active journal's next sync: ENOSPC
    "disk-eio": ("replication", "shared-store"),  # the active journal's next write: EIO
}


def kinds_for(pair: str) -> list[str]:
    return [k for k, pairs in KINDS.items() if pair in pairs]


@dataclass
class Plan:
    """The seeded schedule: which fault, and the random fractions that time it."""

    kind: str
    gap: float  # fraction of the time left per fault to wait before it
    hold: float  # seconds the fault lasts before the heal
    failback: bool  # whether the server started again after it may take its node back


def plan(pair: str, n: int, seed: int) -> list[Plan]:
    """`n` faults: every kind once per round, in a seeded order, with seeded gaps and holds, and
    whether the server started again after each may fail back (else the other one goes on
    serving, and the next fault strikes it)."""
    rng = random.Random(seed)
    kinds = kinds_for(pair)
    out: list[Plan] = []
    while len(out) < n:
        round_ = kinds[:]
        rng.shuffle(round_)
        for k in round_[: n - len(out)]:
            out.append(Plan(k, rng.uniform(0.2, 0.8), rng.uniform(1.0, 3.0), rng.random() < 0.6))
    return out


class Nemesis:
    """Runs the plan against a pair on a thread of its own, writing each step to the history."""

    def __init__(
        self,
        pair: Pair,
        history: History,
        schedule: list[Plan],
        seconds: float,
        progress: Callable[[str], None],
    ) -> None:
        self.pair = pair
        self.history = history
        self.schedule = schedule
        self.seconds = seconds
        self.progress = progress
        self.done = 0
        self.unhealed = 0
        self.late_disk_stops = 0  # disk faults the struck server outlived by 15 s (it should stop at once)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> Nemesis:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            deadline = time.monotonic() + self.seconds
            for k, step in enumerate(self.schedule):
                left = max(0.0, deadline - time.monotonic())
                wait = max(0.3, step.gap * left / (len(self.schedule) - k))
                if self.stop.wait(wait):
                    return
                self._strike(k, step)
        except BaseException as exc:  # reported by the run, which stops
            self.error = exc
            self.history.add("note", "n", msg=f"nemesis failed: {exc!r}")

    def _strike(self, k: int, step: Plan) -> None:
        pair, h = self.pair, self.history
        a = pair.active()
        if a is None:
            a = pair.heal() or 0
        target = NAMES[a]
        self.progress(f"fault {k + 1}/{len(self.schedule)}: {step.kind} on {target} ({pair.describe()})")
        h.add("fault", "n", kind=step.kind, target=target)
        t0 = time.monotonic()
        inject = getattr(self, "_" + step.kind.replace("-", "_"))
        inject(a, step.hold)
        t1 = time.monotonic()
        h.add("heal", "n", kind=step.kind, failback=step.failback)
        seen = len(pair.interventions)
        active = pair.heal(failback=step.failback)
        for why in pair.interventions[seen:]:
            h.add("note", "n", msg=f"intervention after {step.kind}: {why}")
        took = round(time.monotonic() - t1, 2)
        if active is None:
            self.unhealed += 1
            h.add("note", "n", msg=f"not healed after {step.kind}: {pair.describe()}")
            self.progress(f"  not healed: {pair.describe()}")
        else:
            h.add("healed", "n", kind=step.kind, took=took, active=NAMES[active], lasted=round(t1 - t0, 2))
            self.progress(f"  healed in {took}s, {NAMES[active]} active")
        self.done += 1

    # ------------------------------------------------------------ the faults
    def _kill(self, a: int, hold: float) -> None:
        self.pair.servers[a].kill()
        self.pair.wait_state(1 - a, "active", hold + 10)

    def _kill_backup(self, a: int, hold: float) -> None:
        self.pair.servers[1 - a].kill()
        time.sleep(hold)  # the active server carries on alone (replication: drops its backup first)

    def _zombie(self, a: int, hold: float) -> None:
        s = self.pair.servers[a]
        s.pause()
        try:
            # Past the ZooKeeper session: the backup takes over; on SIGCONT the zombie must stop
            # without confirming anything (shared store: it keeps its lock, clients just wait).
            time.sleep(hold + SESSION_S)
        finally:
            s.resume()
        if self.pair.kind == "replication":
            try:
                s.wait_exit(10)
            except Exception:  # still running: the heal restarts it if needed
                self.history.add("note", "n", msg=f"the zombie {NAMES[a]} still runs 10 s after SIGCONT")

    def _stop_failover(self, a: int, hold: float) -> None:
        import asyncio

        from .. import aio

        async def stop() -> None:
            conn = await aio.connect(self.pair.url_of(a), allow_passive=True, connect_timeout=2000)
            try:
                await conn.manage("broker.stop", failover=True)
            finally:
                await conn.close()

        try:
            asyncio.run(asyncio.wait_for(stop(), 10))
        except Exception as exc:  # the stop may cut its own answer short
            self.history.add("note", "n", msg=f"broker.stop: {exc!r}")
        try:
            self.pair.servers[a].wait_exit(20)
        except Exception:
            self.pair.servers[a].signal(signal.SIGTERM)
        self.pair.wait_state(1 - a, "active", hold + 10)

    def _client_blackhole(self, a: int, hold: float) -> None:
        self.pair.client_proxies[a].blackhole()
        time.sleep(hold + 1.5)  # past the clients' failure check

    def _client_reset(self, a: int, hold: float) -> None:
        self.pair.client_proxies[a].reset()
        time.sleep(hold / 2)

    def _link_blackhole(self, a: int, hold: float) -> None:
        self.pair.link_proxies[a].blackhole()  # the backup's link to the active server
        time.sleep(hold + 2.0)  # past call-timeout: the active server drops its backup

    def _link_reset(self, a: int, hold: float) -> None:
        self.pair.link_proxies[a].reset()
        time.sleep(hold / 2)

    def _zookeeper(self, a: int, hold: float) -> None:
        zk = self.pair.zookeeper
        assert zk is not None
        zk.stop()
        time.sleep(hold)
        zk.start()

    def _disk(self, a: int, hold: float, rule: str) -> None:
        # The disk fails for the page files and the large messages' files too: whichever writes first.
        base = rule
        if stores.pages(self.pair.store):
            rule += "\n" + base.replace("tandem-data:", f"{PAGES_PREFIX}:")
        if stores.streams(self.pair.store):
            rule += "\n" + base.replace("tandem-data:", f"{LARGE_PREFIX}:")
        self.pair.fault_files[a].write_text(rule + "\n")
        try:
            code = self.pair.servers[a].wait_exit(15 + hold)
            self.history.add("note", "n", msg=f"{NAMES[a]} stopped on the disk fault, exit {code}")
        except Exception:
            self.late_disk_stops += 1
            self.history.add("note", "n", msg=f"{NAMES[a]} still runs 15 s after the disk fault ({rule})")
        finally:
            self.pair.fault_files[a].write_text("")

    def _disk_enospc(self, a: int, hold: float) -> None:
        self._disk(a, hold, "tandem-data:sync=ENOSPC")

    def _disk_eio(self, a: int, hold: float) -> None:
        self._disk(a, hold, "tandem-data:write=EIO")


SESSION_S = 2.5  # a bit more than the coordinator's session (topology.SESSION_TIMEOUT)
