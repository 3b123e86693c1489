"""What a connection (native, STOMP) and the management operations see of their broker.

The broker satisfies this Protocol; server/native.py, server/stomp.py and server/admin.py
are given a `BrokerContext` and never import the broker, so only the broker knows its
parts: a new protocol or HA mode is added without touching the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..config import BrokerConfig
from ..core.permissions import Authorizer
from ..core.postoffice import PostOffice
from ..core.storage import Storage
from ..protocol.native import ReplicaStart
from .limits import ConnectionLimits
from .pacing import Pacer
from .security import Authenticator, Subject


class Management(Protocol):
    def handle(self, op: str, args: dict[str, Any], conn: Any, reply: Callable[[Any], None]) -> None:
        """Run management operation `op` for `conn` (None: not over a connection); `reply` gets its result."""
        ...


class BrokerContext(Protocol):
    @property
    def config(self) -> BrokerConfig: ...

    @property
    def authenticator(self) -> Authenticator:
        """Who may log in (server/security.py); `enabled` False: everyone, at once."""
        ...

    @property
    def node_id(self) -> str: ...

    @property
    def active(self) -> bool:
        """Serving (holds the live lock); a waiting or passive backup is not."""
        ...

    @property
    def connections(self) -> set[Any]:
        """Every open connection: each adds itself on connect and removes itself on close."""
        ...

    @property
    def pacer(self) -> Pacer:
        """Writes nothing else bounds wait while a backup link or the page writer is full (server/pacing.py)."""
        ...

    @property
    def limits(self) -> ConnectionLimits:
        """Connection counts and limits (server/limits.py): each connection is admitted, counted, released."""
        ...

    @property
    def reattachable(self) -> dict[str, Any]:
        """Connections with a confirmation window, by connection id: their sessions may be reattached."""
        ...

    @property
    def postoffice(self) -> PostOffice:
        """Only while active: use `require_active()` where a client may ask a waiting server."""
        ...

    @property
    def storage(self) -> Storage: ...

    @property
    def admin(self) -> Management: ...

    def require_active(self) -> PostOffice:
        """The post office, or NotActive for a server that is not serving."""
        ...

    @property
    def authorizer(self) -> Authorizer | None:
        """Decides permissions (core/permissions.py); None when security is off."""
        ...

    async def authenticate(
        self,
        username: str | None,
        password: str | None,
        peer: str = "?",
        protocol: str = "native",
        cert_user: str | None = None,
    ) -> Subject | None:
        """Who logs in with these (or with a client certificate mapped to `cert_user`; security
        off: ANONYMOUS); None: refused. Slow on purpose (a password hash): the caller handles
        nothing more of the connection meanwhile."""
        ...

    def topology(self) -> list[Any]:
        """The connectors of this node's live and backup servers, for clients to fail over."""
        ...

    def status(self) -> dict[str, Any]: ...

    async def activation_info(self) -> dict[str, Any]: ...

    def backup_announced(self, conn: Any, connector: str) -> None:
        """A waiting server of our store announced itself on `conn`."""
        ...

    def backup_gone(self, conn: Any) -> None: ...

    def replica_start(self, conn: Any, pkt: ReplicaStart) -> None:
        """A backup asks to replicate the store over `conn` (raises if it may not)."""
        ...

    async def stop(self, failover: bool = False, leave_state: bool = True) -> None: ...
