"""Fault injection for tests, benchmarks and the chaos suite: one kit, shipped with tandem.

`proxy`: a TCP proxy that delays, blackholes, cuts, resets and refuses (docs/testing.md).
`procs`: SIGKILL, SIGSTOP/SIGCONT and bounded waits on processes.
`broker`: a broker as a child process; `zookeeper`: a private ZooKeeper (both import on demand).
This package itself and `proxy` and `procs` use the standard library only and import nothing of the broker.
"""

from __future__ import annotations

import socket

from .proxy import AsyncFaultProxy, FaultProxy, ProxyStats


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS has just handed out and released (another process could take it meanwhile)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


__all__ = ["AsyncFaultProxy", "FaultProxy", "ProxyStats", "free_port"]
