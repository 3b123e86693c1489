"""Fault injection for tests, benchmarks and the chaos suite: one kit, shipped with tandem.

`proxy`: a TCP proxy that delays, blackholes, cuts, resets and refuses (docs/testing.md).
`procs`: SIGKILL, SIGSTOP/SIGCONT and bounded waits on processes.
`broker`: a broker as a child process; `zookeeper`: a private ZooKeeper (both import on demand).
This package itself and `proxy` and `procs` use the standard library only and import nothing of the broker.
"""

from __future__ import annotations

import random
import socket

from .proxy import AsyncFaultProxy, FaultProxy, ProxyStats

# Below Linux's ephemeral range (32768-60999 by default): the OS hands those to every outgoing
# connection, so a port picked there and released can be taken by some client's socket before the
# server binds it ("address already in use", seen under parallel test runs).
_LOW, _HIGH = 20000, 32768


_given: set[int] = set()  # ports handed out by this process: never twice (a test asks for several at once)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, outside the ephemeral range when one can be found, and not one this
    process was given before (another process could still take it before it is bound)."""
    for _ in range(50):
        port = random.randrange(_LOW, _HIGH)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            _given.add(port)
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


__all__ = ["AsyncFaultProxy", "FaultProxy", "ProxyStats", "free_port"]
