"""The ZooKeeper coordinator of a replicated pair: who may be active, and on which data.

Per node id, under `<root>/<node id>/`:

    live/<token>__<seq>     the live lock: ephemeral sequential nodes in line, the lowest holds it;
                            each holds its server's name (`tandem data activation show` prints them)
    activation-sequence     the coordinated activation sequence (decimal text; see activation_sequence.py)

A node of the line lives as long as its ZooKeeper session: a server that dies or is cut off
loses the lock when ZooKeeper expires its session, and the next in line gets it. Every
activation-sequence write is a transaction that first checks our node in the line still
exists, so a server whose session expired unnoticed (a paused process) cannot claim; and a
server whose session is lost, or whose connection stays suspended past `session-percent` of
the session, is told through `on_session_lost` and must stop serving (decision 0031).

kazoo runs its own threads. `Coordinator` is the blocking API (every ZooKeeper request is
bounded by `connect-timeout`); `AsyncCoordinator` runs it off the event loop and calls the
session-lost callbacks on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, KazooState

from ..config import CoordinatorConfig
from ..errors import ErrorCode, IllegalState, InvalidArgument, TandemError
from .activation_sequence import judge

log = logging.getLogger("tandem.ha.coordinator")
# kazoo's own lines (connection drops, retries), under the broker's log set-up.
KAZOO_LOG = "tandem.ha.coordinator.kazoo"

__all__ = [
    "AsyncCoordinator",
    "Coordinator",
    "CoordinatorUnavailable",
    "SessionLost",
    "StaleActivation",
]

_RECHECK = 1.0  # s: a lock waiter looks at the line again at least this often (a watch can be lost on reconnect)


class CoordinatorUnavailable(TandemError):
    """ZooKeeper did not answer in time: nothing was decided."""

    code = ErrorCode.NOT_CONNECTED


class SessionLost(TandemError):
    """The ZooKeeper session is gone (or presumed gone): this server may not be active."""

    code = ErrorCode.NOT_ACTIVE


class StaleActivation(IllegalState):
    """This data directory's activation sequence is behind the coordinated one: activating would serve old data."""


def _seq(name: str) -> int:
    return int(name.rsplit("__", 1)[1])


class Coordinator:
    """One server's view of its node id in ZooKeeper (blocking).

    kazoo's threads may report session changes at any time; the calls themselves come from
    one caller at a time (the server's activation, directly or through AsyncCoordinator).
    """

    def __init__(
        self,
        hosts: str,
        node_id: str,
        *,
        session_timeout: int = 18_000,
        session_percent: int = 25,
        connect_timeout: int = 8_000,
        root: str = "/tandem",
        holder: str | None = None,
    ) -> None:
        if not node_id or "/" in node_id or node_id in (".", ".."):
            raise InvalidArgument(f"a node id is one ZooKeeper path element, got {node_id!r}")
        self.hosts = hosts
        self.node_id = node_id
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        self.base = f"{root}/{node_id}"
        self.live_path = f"{self.base}/live"
        self.sequence_path = f"{self.base}/activation-sequence"
        self.holder = holder or f"{socket.gethostname()} pid {os.getpid()}"
        self._grace = session_timeout * session_percent / 100_000  # s suspended before the session counts as lost
        self._op_timeout = connect_timeout / 1000
        self._token = uuid.uuid4().hex  # names our node in the line, so a create whose answer was lost is found
        self._guard = threading.Lock()
        self._client: KazooClient | None = None
        self._callbacks: list[Callable[[str], object]] = []
        self._lost: str | None = None
        self._closing = False
        self._timer: threading.Timer | None = None
        self._own: str | None = None  # our node in the line (waiting or holding)
        self._held = False

    @classmethod
    def from_config(cls, cfg: CoordinatorConfig, node_id: str, holder: str | None = None) -> Coordinator:
        return cls(
            cfg.zookeeper,
            node_id,
            session_timeout=cfg.session_timeout,
            session_percent=cfg.session_percent,
            connect_timeout=cfg.connect_timeout,
            root=cfg.root,
            holder=holder,
        )

    # ------------------------------------------------------------- life cycle
    def start(self) -> None:
        """Open the session (within `connect-timeout`), or raise CoordinatorUnavailable."""
        if self._client is not None or self._closing:
            raise IllegalState("a coordinator starts once")
        client = KazooClient(
            hosts=self.hosts,
            timeout=self.session_timeout / 1000,
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
            logger=logging.getLogger(KAZOO_LOG),
        )
        client.add_listener(self._on_state)
        try:
            client.start(timeout=self._op_timeout)
        except KazooTimeoutError:
            self._stop_client(client)
            raise CoordinatorUnavailable(
                f"cannot reach ZooKeeper at {self.hosts} within {self.connect_timeout} ms"
            ) from None
        self._client = client
        self._wait(client.ensure_path_async(self.live_path), "create " + self.live_path)

    def close(self) -> None:
        """Close the session: ZooKeeper drops our place in the line (and the lock) at once."""
        with self._guard:
            if self._closing:
                return
            self._closing = True
            self._held = False
            self._cancel_timer()
            client, self._client = self._client, None
        if client is not None:
            self._stop_client(client)

    @staticmethod
    def _stop_client(client: KazooClient) -> None:
        try:
            client.stop()
        except Exception:  # a connection thread that does not end in time: nothing more to do
            log.warning("ZooKeeper client did not stop cleanly", exc_info=True)
        client.close()

    # ----------------------------------------------------------- session loss
    @property
    def lost(self) -> str | None:
        """Why the session counts as lost; None while it holds."""
        return self._lost

    def on_session_lost(self, callback: Callable[[str], object]) -> None:
        """Call `callback(reason)` once when the session is lost (at once if it already is).

        It runs on a kazoo or timer thread and must not block; AsyncCoordinator moves it to the loop.
        """
        with self._guard:
            self._callbacks.append(callback)
            reason = self._lost
        if reason is not None:
            callback(reason)

    def _on_state(self, state: str) -> None:
        # kazoo's connection thread: never block here.
        if state == KazooState.LOST:
            self._declare_lost("its ZooKeeper session expired")
        elif state == KazooState.SUSPENDED:
            with self._guard:
                if self._closing or self._lost is not None:
                    return
                self._cancel_timer()
                timer = threading.Timer(self._grace, self._suspended_too_long, (time.monotonic(),))
                timer.daemon = True
                self._timer = timer
            log.warning("ZooKeeper connection suspended", extra={"node_id": self.node_id, "grace_s": self._grace})
            timer.start()
        else:  # CONNECTED again, same session
            with self._guard:
                self._cancel_timer()

    def _suspended_too_long(self, since: float) -> None:
        with self._guard:
            if self._timer is None or self._client is None:
                return
            still = self._client.state == KazooState.SUSPENDED
        if still:
            waited = int((time.monotonic() - since) * 1000)
            self._declare_lost(f"its connection to ZooKeeper has been suspended for {waited} ms")

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _declare_lost(self, reason: str) -> None:
        with self._guard:
            if self._lost is not None or self._closing:
                return
            self._lost = reason
            self._held = False
            self._cancel_timer()
            callbacks = list(self._callbacks)
        log.warning("ZooKeeper session lost: %s", reason, extra={"node_id": self.node_id})
        for cb in callbacks:
            try:
                cb(reason)
            except Exception:
                log.exception("session-lost callback failed")

    # --------------------------------------------------------------- requests
    def _usable(self) -> KazooClient:
        if self._lost is not None:
            raise SessionLost(f"node {self.node_id}: {self._lost}")
        client = self._client
        if client is None:
            raise IllegalState("the coordinator is closed" if self._closing else "the coordinator is not started")
        return client

    def _wait(self, result: Any, what: str) -> Any:
        """One ZooKeeper request's answer, within `connect-timeout`."""
        try:
            return result.get(timeout=self._op_timeout)
        except KazooTimeoutError:
            raise CoordinatorUnavailable(
                f"ZooKeeper did not answer ({what}) within {self.connect_timeout} ms"
            ) from None
        except SessionExpiredError:
            self._declare_lost("its ZooKeeper session expired")
            raise SessionLost(f"node {self.node_id}: its ZooKeeper session expired ({what})") from None
        except (ConnectionLoss, ConnectionClosedError) as exc:
            raise CoordinatorUnavailable(f"ZooKeeper connection lost ({what}): {type(exc).__name__}") from None
        except NoNodeError:
            raise  # an answer the caller reads (no such node)
        except KazooException as exc:  # any other ZooKeeper failure is typed too, never a raw kazoo error
            raise CoordinatorUnavailable(f"ZooKeeper failed ({what}): {type(exc).__name__}") from None

    # --------------------------------------------------------------- the lock
    @property
    def holds_live_lock(self) -> bool:
        return self._held and self._lost is None

    def try_lock_live(self, timeout: float) -> bool:
        """Take the node id's live lock, waiting at most `timeout` seconds; False if another server keeps it."""
        client = self._usable()
        if self._held:
            return True
        deadline = time.monotonic() + max(0.0, timeout)
        acquired = False
        try:
            while True:
                line = self._line(client)
                mine = [n for n in line if n.startswith(self._token)]
                if not mine:
                    if self._own is not None:
                        self._own = None
                        self._declare_lost("its place in the live lock's line was deleted")
                        raise SessionLost(f"node {self.node_id}: {self._lost}")
                    self._create_own(client)
                    continue
                for extra in mine[1:]:  # from a create retried after its answer was lost
                    with contextlib.suppress(TandemError, NoNodeError):
                        self._wait(client.delete_async(f"{self.live_path}/{extra}"), "tidy the line")
                self._own = f"{self.live_path}/{mine[0]}"
                ahead = line.index(mine[0])
                if ahead == 0:
                    self._hold(client, self._own)
                    acquired = True
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                gone = threading.Event()
                before = f"{self.live_path}/{line[ahead - 1]}"
                watch = client.exists_async(before, watch=lambda _e, gone=gone: gone.set())
                if self._wait(watch, "watch the line") is not None:
                    gone.wait(min(remaining, _RECHECK))
                self._usable()
        finally:
            if not acquired:
                self._leave_line(client)

    def verify_live_lock(self) -> bool:
        """Ask ZooKeeper whether our lock node still exists (one round trip); False, and reported, if not.

        For an active server that has reason to doubt (its backup went quiet, it was paused):
        the node lives exactly as long as the session that holds the lock.
        """
        if not self.holds_live_lock or self._own is None:
            return False
        client = self._usable()
        try:
            gone = self._wait(client.exists_async(self._own), "check our lock node") is None
        except SessionLost:
            return False
        if gone:
            self._declare_lost("its live lock node was deleted")
        return not gone

    def _line(self, client: KazooClient) -> list[str]:
        children: list[str] = self._wait(client.get_children_async(self.live_path), "list the live lock's line")
        return sorted((c for c in children if "__" in c), key=_seq)

    def _create_own(self, client: KazooClient) -> None:
        # If the answer is lost the node may exist anyway: a later listing finds it by our token.
        self._own = self._wait(
            client.create_async(
                f"{self.live_path}/{self._token}__", self.holder.encode(), ephemeral=True, sequence=True
            ),
            "join the live lock's line",
        )

    def _hold(self, client: KazooClient, own: str) -> None:
        with self._guard:
            self._held = True
        # Our node deleted while we hold it means our session is gone: report it without waiting for kazoo.
        if self._wait(client.exists_async(own, watch=self._on_own_event), "watch our lock node") is None:
            self._declare_lost("its live lock node was deleted")
            raise SessionLost(f"node {self.node_id}: {self._lost}")
        log.info("live lock taken", extra={"node_id": self.node_id, "path": own})

    def _on_own_event(self, event: Any) -> None:
        if event.type == EventType.DELETED and self._held and event.path == self._own:
            self._declare_lost("its live lock node was deleted")
        elif event.type != EventType.DELETED and self._held and self._client is not None:
            # Watches fire once: set it again. A node event names our node; a connection event
            # (kazoo drops every watch when the connection goes) names none: our node again,
            # sent once the connection is back (if the session survived).
            path = event.path or self._own
            if path is not None:
                self._client.exists_async(path, watch=self._on_own_event)

    def _leave_line(self, client: KazooClient) -> None:
        own, self._own = self._own, None
        if own is None or self._lost is not None or self._closing:
            return
        with contextlib.suppress(TandemError, NoNodeError):
            self._wait(client.delete_async(own), "leave the live lock's line")

    def unlock(self) -> None:
        """Give the live lock up (the next server in line gets it)."""
        with self._guard:
            self._held = False
        if self._client is not None:
            self._leave_line(self._client)

    def live_lock_holders(self) -> list[str]:
        """The names of the servers in the lock's line, the holder first."""
        client = self._usable()
        names = []
        for child in self._line(client):
            with contextlib.suppress(NoNodeError):  # left meanwhile
                data, _ = self._wait(client.get_async(f"{self.live_path}/{child}"), "read the live lock's line")
                names.append(data.decode(errors="replace"))
        return names

    # ---------------------------------------------------- activation sequence
    def activation_sequence(self) -> int:
        """The coordinated value: 0 for a node id ZooKeeper never saw; negative while a claim is in progress."""
        return self._read_sequence(self._usable())[0]

    def _read_sequence(self, client: KazooClient) -> tuple[int, int | None]:
        try:
            data, stat = self._wait(client.get_async(self.sequence_path), "read the activation sequence")
        except NoNodeError:
            return 0, None
        try:
            return int(data.decode("ascii")), stat.version
        except (UnicodeDecodeError, ValueError):
            raise IllegalState(
                f"ZooKeeper's {self.sequence_path} holds {data[:40]!r}, not a number: "
                "set it with `tandem data activation set` (docs/cli.md)"
            ) from None

    def claim_activation(self, expected: int, write_local: Callable[[int], None]) -> int:
        """Claim the next activation for a data directory whose copy of the sequence is `expected`.

        Holding the live lock: mark the next value claimed in ZooKeeper, `write_local(next)`
        (the caller's durable copy), commit it in ZooKeeper; returns it. StaleActivation if
        `expected` is behind (the caller must not activate), SessionLost if our lock went.
        """
        client = self._usable()
        own = self._own
        if not self.holds_live_lock or own is None:
            raise IllegalState(f"node {self.node_id}: claiming an activation needs the live lock")
        value, version = self._read_sequence(client)
        verdict = judge(expected, value)
        if not verdict.may_activate:
            raise StaleActivation(
                f"node {self.node_id}: this data is stale (its activation sequence is {expected}, "
                f"ZooKeeper's is {value}): it missed a later activation, so it must sync from the active server"
            )
        target = abs(value) + 1
        version = self._cas(client, own, -target, version)
        write_local(target)
        self._cas(client, own, target, version)
        log.info("activation claimed", extra={"node_id": self.node_id, "sequence": target})
        return target

    def _cas(self, client: KazooClient, own: str, value: int, version: int | None) -> int:
        """Write `value` if the sequence node is still at `version` and our lock node still exists."""
        data = str(value).encode("ascii")
        tx = client.transaction()
        tx.check(own, -1)
        if version is None:
            tx.create(self.sequence_path, data)
        else:
            tx.set_data(self.sequence_path, data, version)
        check, result = self._wait(tx.commit_async(), "write the activation sequence")
        if isinstance(check, NoNodeError):
            self._declare_lost("its live lock node is gone (session expired)")
            raise SessionLost(f"node {self.node_id}: {self._lost}")
        if isinstance(result, (BadVersionError, NodeExistsError, NoNodeError)):
            raise StaleActivation(f"node {self.node_id}: the activation sequence changed while we claimed it")
        if isinstance(result, Exception):
            raise CoordinatorUnavailable(f"ZooKeeper refused the activation sequence write: {result!r}")
        return 0 if version is None else int(result.version)

    def set_activation_sequence(self, value: int) -> None:
        """Overwrite the coordinated value (repair by hand: see `tandem data activation set`)."""
        if value < 0:
            raise InvalidArgument(f"an activation sequence is set to a value >= 0, got {value}")
        client = self._usable()
        data = str(value).encode("ascii")
        try:
            self._wait(client.set_async(self.sequence_path, data), "set the activation sequence")
        except NoNodeError:
            self._wait(client.create_async(self.sequence_path, data, makepath=True), "set the activation sequence")


class AsyncCoordinator:
    """`Coordinator` for asyncio code: requests run in worker threads, callbacks on the loop."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.sync = coordinator

    @property
    def node_id(self) -> str:
        return self.sync.node_id

    @property
    def lost(self) -> str | None:
        return self.sync.lost

    @property
    def holds_live_lock(self) -> bool:
        return self.sync.holds_live_lock

    async def start(self) -> None:
        await asyncio.to_thread(self.sync.start)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    def on_session_lost(self, callback: Callable[[str], object]) -> None:
        """Call `callback(reason)` on the running loop once the session is lost."""
        loop = asyncio.get_running_loop()

        def on_loop(reason: str) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody left to tell
                loop.call_soon_threadsafe(callback, reason)

        self.sync.on_session_lost(on_loop)

    async def try_lock_live(self, timeout: float) -> bool:
        return await asyncio.to_thread(self.sync.try_lock_live, timeout)

    async def unlock(self) -> None:
        await asyncio.to_thread(self.sync.unlock)

    async def verify_live_lock(self) -> bool:
        return await asyncio.to_thread(self.sync.verify_live_lock)

    async def live_lock_holders(self) -> list[str]:
        return await asyncio.to_thread(self.sync.live_lock_holders)

    async def activation_sequence(self) -> int:
        return await asyncio.to_thread(self.sync.activation_sequence)

    async def claim_activation(self, expected: int, write_local: Callable[[int], None]) -> int:
        """As Coordinator.claim_activation; `write_local` runs in the worker thread (it may fsync)."""
        return await asyncio.to_thread(self.sync.claim_activation, expected, write_local)
