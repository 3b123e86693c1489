"""`network-check-list`: is this server still on the network, or cut off with its peer on the other side?

A server of a replicated pair that reaches none of the listed hosts does not activate, and
an active one that loses them all stops serving: on the isolated side of a partition, the
peer is likely active already. The check is a TCP connection, not an ICMP ping (raw ICMP
needs privileges or the `ping` binary's capabilities): `host:port` counts as reachable when
the port accepts the connection; a bare `host` when the host answers at all on TCP port 7
(echo), accepting or refusing, since a refusal also proves it and the path to it are up. A
host that drops packets silently (a firewall) never answers: give it with a port that is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from ..config import BrokerConfig, parse_check_target

log = logging.getLogger("tandem.ha.network")

PROBE_PORT = 7  # for a bare host: any answer on it, accept or refuse, counts

__all__ = ["PROBE_PORT", "NetworkCheck", "parse_check_target"]


class NetworkCheck:
    """Probe the targets together; any one answering in time is enough; no targets is always reachable."""

    def __init__(self, targets: Sequence[str], *, timeout: int = 1000, period: int = 5000) -> None:
        self.targets = [parse_check_target(t) for t in targets]
        self.timeout = timeout / 1000
        self.period = period / 1000

    @classmethod
    def from_config(cls, cfg: BrokerConfig) -> NetworkCheck:
        return cls(cfg.network_check_list, timeout=cfg.network_check_timeout, period=cfg.network_check_period)

    async def reachable(self) -> bool:
        if not self.targets:
            return True
        probes = [asyncio.ensure_future(self._probe(host, port)) for host, port in self.targets]
        try:
            for done in asyncio.as_completed(probes):
                if await done:
                    return True
            return False
        finally:
            for p in probes:
                p.cancel()
            await asyncio.gather(*probes, return_exceptions=True)

    async def _probe(self, host: str, port: int | None) -> bool:
        try:
            async with asyncio.timeout(self.timeout):
                _, writer = await asyncio.open_connection(host, port or PROBE_PORT)
        except ConnectionRefusedError:
            return port is None  # a bare host answered; a named port is closed
        except (OSError, TimeoutError):
            return False  # no route, no such name, or no answer in time
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def monitor(self, on_change: Callable[[bool], None]) -> None:
        """Check every `network-check-period` until cancelled; report changes (starting from reachable)."""
        ok = True
        while True:
            now = await self.reachable()
            if now != ok:
                ok = now
                if ok:
                    log.warning("network check: a target answers again", extra={"targets": self._names()})
                else:
                    log.warning("network check: no target answers", extra={"targets": self._names()})
                on_change(ok)
            await asyncio.sleep(self.period)

    def _names(self) -> str:
        return ",".join(h if p is None else f"{h}:{p}" for h, p in self.targets)
