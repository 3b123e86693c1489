"""Activations: the life of a server under each HA policy, one class each (as Artemis's activations).

An activation decides *when* its broker may serve, from the node manager's locks
and state byte; the broker does the serving (`activate`) and the stepping down
(`deactivate`). The live lock is the only licence to serve: whoever holds it is
the one active server of the shared store, so two never serve at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..errors import IllegalState
from .node_manager import FAILBACK, LIVE, NOT_STARTED, PAUSED, NodeManager

if TYPE_CHECKING:
    from ..server.broker import Broker

log = logging.getLogger("tandem.ha")


class Activation:
    role = "live-only"

    def __init__(self, broker: Broker, nm: NodeManager) -> None:
        self.broker = broker
        self.nm = nm
        self.poll = broker.config.lock_check_period / 1000

    async def run(self) -> None:
        raise NotImplementedError

    def stop_state(self, failover: bool) -> bytes | None:
        """State to leave on a stop: P (clean, no failover) or L (let a backup take over)."""
        return LIVE if failover or self.broker.config.failover_on_shutdown else PAUSED


class LiveOnlyActivation(Activation):
    async def run(self) -> None:
        if not self.nm.try_live():
            raise IllegalState(
                f"data directory {self.broker.config.data_path} is in use by another running broker "
                "(its server.lock is held)"
            )
        self.nm.set_state(LIVE)
        await self.broker.activate()

    def stop_state(self, failover: bool) -> bytes | None:
        return PAUSED


class SharedStorePrimaryActivation(Activation):
    role = "primary"

    async def run(self) -> None:
        b = self.broker
        if self.nm.live_held_elsewhere():
            # Our backup is serving: ask for failback and wait for it to step down.
            log.warning("the backup is active; requesting failback")
            self.nm.set_state(FAILBACK)
        b.ha_state = "waiting"
        b.start_announcing()
        await self.nm.wait_live(self.poll)
        self.nm.set_state(LIVE)
        await b.stop_announcing()
        await b.activate()


class SharedStoreBackupActivation(Activation):
    role = "backup"

    async def run(self) -> None:
        b = self.broker
        cfg = b.config
        while True:
            b.ha_state = "waiting"
            await self.nm.wait_backup(self.poll)
            b.ha_state = "passive"
            b.start_announcing()
            await b.start_following()
            await self._await_primary_failure()
            self.nm.set_state(LIVE)
            self.nm.release_backup()  # the next backup may queue up now
            await b.stop_announcing()
            log.warning("primary is gone: backup activating", extra={"node_id": self.nm.node_id})
            await b.activate()
            if not cfg.allow_failback:
                return
            if not await self._await_failback_request():
                return  # stopped meanwhile
            log.warning("primary asks for failback: backup stepping down")
            await b.deactivate(state=None)  # leave F: the primary takes the live lock and writes L
            if not cfg.restart_backup:
                await b.stop(leave_state=False)
                return

    async def _await_primary_failure(self) -> None:
        """Hold the live lock only when the primary crashed (state L), or stopped with failover."""
        while True:
            await self.nm.wait_live(self.poll)
            state = self.nm.state()
            if state == LIVE or (state == PAUSED and self.broker.config.failover_on_shutdown):
                return
            # P: a clean stop; N: never started; F: the primary itself is coming back.
            self.nm.release_live()
            await asyncio.sleep(self.poll)

    async def _await_failback_request(self) -> bool:
        """True once the primary asks for failback; False if we stopped serving first."""
        while self.broker.active:
            if self.nm.state() == FAILBACK:
                return True
            await asyncio.sleep(self.poll)
        return False


def make_activation(broker: Broker, nm: NodeManager) -> Activation:
    policy = broker.config.ha_policy
    if policy == "shared-store-primary":
        return SharedStorePrimaryActivation(broker, nm)
    if policy == "shared-store-backup":
        return SharedStoreBackupActivation(broker, nm)
    return LiveOnlyActivation(broker, nm)


__all__ = ["NOT_STARTED", "Activation", "make_activation"]
