"""Connection limits: per acceptor, per logged-in user, per peer IP address (decision 0062).

A connection is counted from `connection_made` to its close (`release`, idempotent). One refused
at accept gets ERROR `RESOURCE_LIMIT` at once and is closed after REFUSED_LINGER (or when the
client closes first): its HELLO or CONNECT, arriving meanwhile, is read and dropped, so the close
does not reset the connection before the client has read why. Refusals are counted for
`tandem admin status`.
"""

from __future__ import annotations

import resource
from collections import Counter
from typing import Any

from ..config import BrokerConfig
from ..errors import ResourceLimit

FD_RESERVE = 256  # descriptors kept for the journal, page and large-message files, and server links
MIN_DEFAULT_CONNECTIONS = 64
UNLIMITED_FDS_DEFAULT = 65_536  # an acceptor's default when the soft limit is "unlimited"
REFUSED_LINGER = 1.0  # s a refused connection stays open for its client to read the ERROR


def default_max_connections(acceptors: int) -> int:
    """An acceptor's `max-connections` when the file leaves it out: the process's soft limit on
    open files less FD_RESERVE, shared evenly between the acceptors, at least 64."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return UNLIMITED_FDS_DEFAULT
    return max(MIN_DEFAULT_CONNECTIONS, (soft - FD_RESERVE) // max(acceptors, 1))


def peer_host(peer: str) -> str:
    """The IP address of a `host:port` peer (IPv6 hosts have colons of their own)."""
    host, sep, _ = peer.rpartition(":")
    return host if sep else peer


class ConnectionLimits:
    def __init__(self, config: BrokerConfig) -> None:
        derived = default_max_connections(len(config.acceptors))
        self.max_per_acceptor = {
            a.name: a.max_connections if a.max_connections is not None else derived for a in config.acceptors
        }
        self.max_per_user = config.max_connections_per_user
        self.max_per_peer = config.max_connections_per_peer
        self.by_acceptor: Counter[str] = Counter()
        self.by_peer: Counter[str] = Counter()
        self.by_user: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # by limit: acceptor, peer, user; and cut connections: slow-client

    def admit(self, conn: Any) -> ResourceLimit | None:
        """At accept: count `conn` (it has `acceptor` and `peer`), or the error to refuse it with."""
        acceptor, host = conn.acceptor, peer_host(conn.peer)
        limit = self.max_per_acceptor.get(acceptor, -1)
        if 0 <= limit <= self.by_acceptor[acceptor]:
            self.refused["acceptor"] += 1
            return ResourceLimit(
                f"acceptor {acceptor!r} has its maximum of {limit} connections (its `max-connections`): try later"
            )
        if 0 <= self.max_per_peer <= self.by_peer[host]:
            self.refused["peer"] += 1
            return ResourceLimit(
                f"{host} has its maximum of {self.max_per_peer} connections (`max-connections-per-peer`)"
            )
        self.by_acceptor[acceptor] += 1
        self.by_peer[host] += 1
        conn.counted = (acceptor, host)
        return None

    def login(self, conn: Any, user: str | None, cluster: bool) -> None:
        """At HELLO or CONNECT, once authenticated: count the user's connection, or raise
        ResourceLimit. The cluster pair (server links) is not an application user: not counted."""
        if user is None or cluster:
            return
        if 0 <= self.max_per_user <= self.by_user[user]:
            self.refused["user"] += 1
            raise ResourceLimit(
                f"user {user!r} has its maximum of {self.max_per_user} connections (`max-connections-per-user`)"
            )
        self.by_user[user] += 1
        conn.counted_user = user

    def release(self, conn: Any) -> None:
        """`conn` is closed: it counts no more (once, however often called)."""
        counted = getattr(conn, "counted", None)
        if counted is not None:
            conn.counted = None
            acceptor, host = counted
            _decrement(self.by_acceptor, acceptor)
            _decrement(self.by_peer, host)
        user = getattr(conn, "counted_user", None)
        if user is not None:
            conn.counted_user = None
            _decrement(self.by_user, user)

    def status(self) -> dict[str, Any]:
        return {
            "max_connections": dict(self.max_per_acceptor),
            "max_connections_per_user": self.max_per_user,
            "max_connections_per_peer": self.max_per_peer,
            "open": dict(self.by_acceptor),
            "refused": dict(self.refused),
        }


def _decrement(counter: Counter[str], key: str) -> None:
    n = counter[key] - 1
    if n > 0:
        counter[key] = n
    else:
        del counter[key]


class OutputWatch:
    """Whether a connection's pending output stays stuck: past the high-water mark (deliveries
    stopped) and not shrinking for `timeout` seconds. A client that reads slowly makes progress
    and stays; one that stopped reading is cut, so its buffer and descriptor do not stay for ever."""

    __slots__ = ("since", "size", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.since: float | None = None  # when the buffer last shrank while over the mark
        self.size = 0

    def stuck(self, now: float, writable: bool, size: int) -> bool:
        if writable:
            self.since = None
            return False
        if self.since is None or size < self.size:
            self.since, self.size = now, size
            return False
        self.size = size
        return now - self.since > self.timeout


def abort_later(loop: Any, transport: Any, delay: float) -> None:
    """After a close: a transport still holding output (its peer does not read) is aborted after
    `delay` s instead of waiting for ever with its buffer and descriptor."""
    if transport is not None and transport.get_write_buffer_size():
        loop.call_later(delay, transport.abort)
