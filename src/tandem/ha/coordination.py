"""What a replication activation does with its ZooKeeper coordinator (decision 0034).

One object per server: the session (opened when the node id is known: a backup learns its
primary's), the activation itself (network check, live lock, claim of the next activation
sequence), the bump of a primary that carries on alone, the watches that stop an active
server (session lost, network lost), and the two status lines. The coordinator itself
(ha/coordinator.py) knows nothing of brokers; the activations call this.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from ..config import BrokerConfig, CoordinatorConfig
from ..errors import TandemError
from .activation_sequence import judge, read_local_sequence, write_local_sequence
from .coordinator import AsyncCoordinator, Coordinator
from .host import ActivationHost
from .network_check import NetworkCheck

log = logging.getLogger("tandem.ha")


class Coordination:
    def __init__(self, host: ActivationHost, zk: CoordinatorConfig) -> None:
        self.host = host
        self.zk = zk
        cfg: BrokerConfig = host.config
        self.data_dir: Path = cfg.data_path
        self.network = NetworkCheck.from_config(cfg)
        self.coord: AsyncCoordinator | None = None
        self.sequence: int | None = None  # the last value this server claimed, bumped or copied
        self.active = False
        self._monitor: asyncio.Task[None] | None = None
        # A server that restarts after kill -9 waits for its own old session to expire.
        self.lock_wait = (2 * zk.session_timeout + zk.connect_timeout) / 1000

    async def open(self, node_id: str) -> AsyncCoordinator:
        """The session for `node_id` (a new one if the node id changed or the old session was lost)."""
        c = self.coord
        if c is not None and (c.node_id != node_id or c.lost is not None):
            self.coord = None
            await c.close()
            c = None
        if c is None:
            c = AsyncCoordinator(Coordinator.from_config(self.zk, node_id, holder=self.host.config.name))
            await c.start()
            self.coord = c
        return c

    async def activate(self, node_id: str) -> str | None:
        """Take the live lock and claim the next activation; None on success, else why not (nothing
        held). Raises StaleActivation when this copy is behind (it never may), CoordinatorUnavailable
        when ZooKeeper cannot be reached (it may, later)."""
        if not await self.network.reachable():
            return "no host of network-check-list answers (this server may be the isolated one)"
        c = await self.open(node_id)
        if not await c.try_lock_live(self.lock_wait):
            return f"another server holds the live lock of node {node_id}"
        directory = self.data_dir
        try:
            self.sequence = await c.claim_activation(
                read_local_sequence(directory), lambda v: write_local_sequence(directory, v)
            )
        except BaseException:
            await c.unlock()
            raise
        return None

    def watch(self) -> None:
        """Serving from now on: a lost session or a lost network stops the server at once."""
        assert self.coord is not None
        self.active = True
        self.coord.on_session_lost(lambda reason: self.host.lock_lost(f"ZooKeeper: {reason}"))
        if self.network.targets:

            def changed(ok: bool) -> None:
                if not ok:
                    self.host.lock_lost("network check: no host of network-check-list answers")

            self._monitor = asyncio.get_running_loop().create_task(self.network.monitor(changed), name="network-check")

    async def bump(self) -> None:
        """Carry on without the backup: claim the next value, so the dropped replica is stale from now on.

        The claim's transaction checks our lock node, so it also proves the session still stands:
        a primary paused and superseded gets SessionLost here, before it confirms anything more."""
        c = self.coord
        if c is None:
            return
        directory = self.data_dir
        expected = self.sequence if self.sequence is not None else read_local_sequence(directory)
        self.sequence = await c.claim_activation(expected, lambda v: write_local_sequence(directory, v))
        log.warning("carrying on without a backup: activation sequence now %d", self.sequence)

    def copy_sequence(self, value: int) -> None:
        """An in-sync backup's data is as current as the value its primary took it on with."""
        write_local_sequence(self.data_dir, value)
        self.sequence = value

    def state(self) -> str:
        c = self.coord
        if c is None:
            return "not connected"
        if c.lost is not None:
            return f"session lost ({c.lost})"
        return "live lock held" if c.holds_live_lock else "connected"

    async def describe(self) -> dict[str, Any]:
        """This server's copy of the activation sequence beside ZooKeeper's value, read now over
        its own session (`tandem admin activation show`); never raises: a failed read is named."""
        local = self.local_sequence()
        out: dict[str, Any] = {"local": local, "zookeeper": None, "verdict": None, "coordinator": self.state()}
        c = self.coord
        if c is None or c.lost is not None:
            out["zookeeper_error"] = "no ZooKeeper session (yet)" if c is None else f"session lost ({c.lost})"
            return out
        try:
            value = await asyncio.wait_for(c.activation_sequence(), self.zk.connect_timeout / 1000)
        except (TandemError, TimeoutError) as exc:
            out["zookeeper_error"] = f"cannot read ZooKeeper's value: {exc or 'no answer'}"
            return out
        out["zookeeper"] = value
        if local is not None:
            out["verdict"] = judge(local, value).value
        return out

    def local_sequence(self) -> int | None:
        if self.sequence is not None:
            return self.sequence
        try:
            return read_local_sequence(self.data_dir)
        except TandemError:
            return None

    def close(self) -> None:
        """At the broker's stop: closing the session gives the live lock up at once (blocks briefly)."""
        if self._monitor is not None:
            self._monitor.cancel()
            self._monitor = None
        c, self.coord = self.coord, None
        if c is not None:
            c.sync.close()
