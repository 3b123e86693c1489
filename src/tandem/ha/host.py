"""What an activation needs of the broker it decides for.

The broker satisfies this Protocol; ha/ never imports server/. These are the only calls
an activation makes into its broker: start as a backup (passive, following the store),
start as live (serve), stop serving, stop, stop at once after losing the live lock or
on a disk error, and the state it reports while waiting. A new HA mode is a new class in ha/ written against
this interface; the broker does not change.
"""

from __future__ import annotations

from typing import Protocol

from ..config import BrokerConfig


class ActivationHost(Protocol):
    @property
    def config(self) -> BrokerConfig: ...

    def own_connector(self) -> str:
        """host:port that clients and the other servers of the pair reach this server at."""
        ...

    def report(self, state: str) -> None:
        """The HA state shown in status and on the console ("waiting")."""
        ...

    async def start_backup(self) -> None:
        """Passive: follow the store as the active server writes it (a warm backup)."""
        ...

    async def stop_backup(self) -> None:
        """Stop following the store (a replica about to be replaced by a new sync)."""
        ...

    async def start_live(self, again: bool = False) -> None:
        """We hold the live lock: load the store and serve (`again`: this server served the node
        already and stopped for a failback that did not happen; not a takeover)."""
        ...

    async def stop_live(self) -> None:
        """Stop serving (clients fail over); the process stays."""
        ...

    async def stop(self, failover: bool = False, leave_state: bool = True) -> None:
        """Stop the server for good."""
        ...

    def lock_lost(self, reason: str) -> None:
        """The live lock is no longer ours: stop at once, writing nothing more to the store."""
        ...

    def storage_failed(self, err: BaseException) -> None:
        """An I/O error on this server's disk: stop (status 3), as after a journal's disk error."""
        ...
