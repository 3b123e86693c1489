"""The pair a chaos run attacks: real server processes on loopback, every link through a fault proxy.

Two kinds:

- ``replication``: two servers on data directories of their own, coordinated by a private
  ZooKeeper (tandem.testing.zookeeper); each reaches the other (the replication stream, the
  announcements, the failback look-up) through a link proxy in front of that other server;
- ``shared-store``: two servers on one data directory (the file lock decides).

Clients reach each server through a client proxy; each server announces its client proxy as its
connector, so clients that fail over stay behind the proxies. The harness itself talks to the
servers' own ports (status, drain). Each server's journal reads disk-fault rules from a file of
its own (TANDEM_JOURNAL_FAULTS_FILE), so a disk fault is armed in a running server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import aio
from ..journal.faults import ENV_FILE
from ..testing import FaultProxy, free_port
from ..testing.broker import BrokerProcess
from ..testing.zookeeper import ZooKeeperServer
from . import store as stores
from .workload import QUEUE

PAIRS = ("replication", "shared-store")
NAMES = ("primary", "backup")
SESSION_TIMEOUT = 2000  # ms, the coordinator's ZooKeeper session: a dead primary is replaced this fast
SERVER_SETTINGS: dict[str, Any] = {
    "journal_file_size": 1024 * 1024,
    "journal_buffer_timeout": 0,
    "log_level": "info",
    "connection_ttl": 2000,  # a silent peer (a blackholed link) is dropped within seconds
    "call_timeout": 2000,  # a primary waits this long for its backup before carrying on alone
    "retry_replication_wait": 200,
}


class Pair:
    """Two servers of one kind, their proxies and (replication) their ZooKeeper."""

    def __init__(
        self, root: Path, kind: str, log: Callable[[str], None] = lambda s: None, store: str = "plain"
    ) -> None:
        if kind not in PAIRS:
            raise ValueError(f"pair must be one of {PAIRS}, not {kind!r}")
        if store not in stores.STORES:
            raise ValueError(f"store must be one of {stores.STORES}, not {store!r}")
        self.root = root
        self.kind = kind
        self.store = store
        self.log = log
        root.mkdir(parents=True, exist_ok=True)
        self.ports = [free_port(), free_port()]
        self.client_ports = [free_port(), free_port()]
        self.link_ports = [free_port(), free_port()] if kind == "replication" else list(self.ports)
        self.fault_files = [root / f"{n}.faults" for n in NAMES]
        self.zookeeper: ZooKeeperServer | None = ZooKeeperServer(root / "zookeeper") if kind == "replication" else None
        self.client_proxies: list[FaultProxy] = []
        self.link_proxies: list[FaultProxy] = []
        self.servers: list[BrokerProcess] = []
        self.interventions: list[str] = []  # what a heal had to do beyond restarting dead servers
        settings: dict[str, Any] = dict(SERVER_SETTINGS)
        if kind == "shared-store":
            settings["data_directory"] = str(root / "store")
        for i, name in enumerate(NAMES):
            self.fault_files[i].write_text("")
            env = {ENV_FILE: str(self.fault_files[i])}
            self.servers.append(BrokerProcess(root / name, name=name, extra_toml=self._toml(i), env=env, **settings))
        if kind == "shared-store":
            # On a shared store the serving backup decides whether to hand back (it watches for
            # the primary's request): it starts without, so the first failover leaves it serving
            # and the next fault strikes it; each restart then draws anew (Pair.heal).
            self.set_failback(1, False)

    def _toml(self, i: int) -> str:
        role = ("primary", "backup")[i]
        policy = f"{'replication' if self.kind == 'replication' else 'shared-store'}-{role}"
        text = (
            f'ha-policy = "{policy}"\n'
            "allow-failback = true\n"
            'connector-ref = "me"\n'
            'static-connectors = ["peer"]\n'
            f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:{self.ports[i]}"\n'
            f'[[connectors]]\nname = "me"\nurl = "127.0.0.1:{self.client_ports[i]}"\n'
            f'[[connectors]]\nname = "peer"\nurl = "127.0.0.1:{self.link_ports[1 - i]}"\n'
        )
        if self.zookeeper is not None:
            text += (
                f'[ha.coordinator]\nzookeeper = "{self.zookeeper.hosts}"\n'
                f"session-timeout = {SESSION_TIMEOUT}\nconnect-timeout = 1000\n"
            )
        return text + stores.server_toml(self.store, QUEUE)

    # ------------------------------------------------------------ life
    @property
    def url(self) -> str:
        """What clients connect to: both client proxies."""
        return ",".join(f"tcp://127.0.0.1:{p}" for p in self.client_ports)

    def url_of(self, i: int) -> str:
        """Server i's own port (the harness's status calls and the final drain)."""
        return f"tcp://127.0.0.1:{self.ports[i]}"

    def start(self, timeout: float = 60.0) -> Pair:
        if self.zookeeper is not None:
            self.zookeeper.start()
        for i in range(2):
            self.client_proxies.append(FaultProxy(self.ports[i], port=self.client_ports[i]).start())
            if self.kind == "replication":
                self.link_proxies.append(FaultProxy(self.ports[i], port=self.link_ports[i]).start())
        self.servers[0].start()
        self.wait_state(0, "active", timeout)
        self.servers[1].start()
        if self.wait_pair(timeout) is None:
            raise RuntimeError(f"the {self.kind} pair did not form within {timeout}s:\n{self.describe()}")
        return self

    def close(self) -> None:
        for s in self.servers:
            with contextlib.suppress(Exception):
                s.kill()
        for p in self.client_proxies + self.link_proxies:
            with contextlib.suppress(Exception):
                p.close()
        if self.zookeeper is not None:
            with contextlib.suppress(Exception):
                self.zookeeper.stop()

    # ------------------------------------------------------------ looking
    def status(self, i: int) -> dict[str, Any] | None:
        """Server i's `broker.status`, None when it does not answer within a second or two."""
        if not self.servers[i].running:
            return None

        async def go() -> dict[str, Any]:
            conn = await aio.connect(self.url_of(i), allow_passive=True, connect_timeout=1000, call_timeout=2000)
            try:
                return await conn.manage("broker.status")  # type: ignore[no-any-return]
            finally:
                await conn.close()

        try:
            return asyncio.run(asyncio.wait_for(go(), 4.0))
        except Exception:
            return None

    def states(self) -> list[dict[str, Any] | None]:
        return [self.status(0), self.status(1)]

    def active(self) -> int | None:
        """The index of the server that says it is active (the first, if both did)."""
        for i, st in enumerate(self.states()):
            if st is not None and st.get("state") == "active":
                return i
        return None

    def wait_state(self, i: int, state: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status(i)
            if st is not None and st.get("state") == state:
                return True
            time.sleep(0.1)
        return False

    def _paired(self) -> int | None:
        """The active server's index when the pair is whole: one active, the other ready to take
        over (replication: passive and in sync on both sides; shared store: announced to the
        active one)."""
        sts = self.states()
        act = [i for i, st in enumerate(sts) if st is not None and st.get("state") == "active"]
        if len(act) != 1:
            return None
        a, b = act[0], 1 - act[0]
        sa, sb = sts[a], sts[b]
        assert sa is not None
        # A shared-store primary behind a serving backup waits for the live lock ("waiting"),
        # ready all the same: it takes over when the backup goes.
        ready = ("passive",) if self.kind == "replication" else ("passive", "waiting")
        if sb is None or sb.get("state") not in ready:
            return None
        if self.kind == "replication":
            if sa.get("replication") != "in-sync" or sb.get("replication") != "in-sync":
                return None
        elif sa.get("peer") is None:
            return None
        return a

    def wait_pair(self, timeout: float) -> int | None:
        """Until the pair is whole and stays so for a second (a failback under way changes it
        again at once); the active server's index, or None after `timeout`."""
        deadline = time.monotonic() + timeout
        seen: int | None = None
        since = 0.0
        while time.monotonic() < deadline:
            a = self._paired()
            now = time.monotonic()
            if a is None or a != seen:
                seen, since = a, now
            elif now - since >= 1.0:
                return a
            time.sleep(0.2)
        return None

    def describe(self) -> str:
        out = []
        for i, st in enumerate(self.states()):
            s = self.servers[i]
            if st is None:
                rc = s.proc.poll() if s.proc is not None else None
                out.append(f"{NAMES[i]}: {'not answering' if s.running else f'down (exit {rc})'}")
            else:
                out.append(f"{NAMES[i]}: {st.get('state')} replication={st.get('replication')} peer={st.get('peer')}")
        return "; ".join(out)

    def log_tail(self, i: int, chars: int = 3000) -> str:
        return self.servers[i].log_text()[-chars:]

    # ------------------------------------------------------------ healing
    def set_failback(self, i: int, on: bool) -> None:
        """Server i's `allow-failback` from its next start: a restarted primary that may not fail
        back stays the backup, so the next fault strikes the other server."""
        path = self.servers[i].config_path
        old, new = (f"allow-failback = {'true' if v else 'false'}\n" for v in (not on, on))
        path.write_text(path.read_text().replace(old, new))

    def heal(self, timeout: float = 90.0, failback: bool = True) -> int | None:
        """Undo every fault and bring the pair back whole: proxies healed, ZooKeeper up, paused
        servers resumed, disk faults disarmed, dead servers started again (with `allow-failback`
        as `failback` says). Returns the active server's index, None if the pair did not form."""
        for p in self.client_proxies + self.link_proxies:
            p.heal()
        for f in self.fault_files:
            f.write_text("")
        for s in self.servers:
            if s.running:
                s.resume()
        if self.zookeeper is not None and self.zookeeper.proc is None:
            self.zookeeper.start()
        deadline = time.monotonic() + timeout
        stuck_since = time.monotonic()
        while time.monotonic() < deadline:
            for i, s in enumerate(self.servers):
                if not s.running:
                    self.set_failback(i, failback)
                    self._restart(i)
            # Short slices: a server refused at start (it raced the other's activation for the
            # lock, as documented) is started again a moment later, not after a long wait.
            a = self.wait_pair(min(3.0, max(1.0, deadline - time.monotonic())))
            if a is not None:
                return a
            if self.active() is not None:
                stuck_since = time.monotonic()
            elif time.monotonic() - stuck_since > 20:
                # Both wait for the other (the server that served died while the other was a
                # backup waiting for it): restart the primary, which looks for an active server,
                # finds none, and serves if its copy is current (an operator's first move too).
                why = f"no server active for 20 s: restarting the primary ({self.describe()})"
                self.log(why)
                self.interventions.append(why)
                self.servers[0].kill()
                stuck_since = time.monotonic()
        return None

    def _restart(self, i: int) -> None:
        try:
            self.servers[i].start(timeout=30)
            self.log(f"{NAMES[i]} started again")
        except RuntimeError as exc:  # refused at start (stale data, lock not to be had): try again later
            self.log(f"{NAMES[i]} did not start: {str(exc).splitlines()[0]}")
            time.sleep(1.0)
