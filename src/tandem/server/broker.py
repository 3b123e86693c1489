"""A broker instance: acceptors always, storage and post office while active.

The acceptors listen from start to stop so that management (status, stop) and
clients waiting for a backup to take over can connect at any time. Whether
the broker *serves* — holds the journal and the post office — is decided by
its activation (live-only, shared-store primary or backup, see ha/activation.py).

The broker is the one module that knows its parts. It sees its activation through
`Activation` below and is seen by it through ha/host.py's `ActivationHost`; its
connections and management operations see it through server/context.py's
`BrokerContext`. None of them imports this module.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import ssl
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .. import __version__
from ..config import BrokerConfig, parse_host_port
from ..core.ids import IdGenerator
from ..core.message import MessageRef, RoutingType
from ..core.permissions import Authorizer
from ..core.postoffice import PostOffice
from ..errors import IllegalState, JournalIOError, LockLost, NotActive, TandemError, Unauthorized
from ..ha.activation import make_activation
from ..ha.node_manager import FileNodeManager, InMemoryNodeManager, NodeManager, SharedStore
from ..ha.source import DirectoryWriter
from ..journal import JournalSettings
from ..journal.storeio import Tap
from ..protocol import native as p
from ..store.journal_storage import JournalStorage, LoadedState, NullStorage
from . import allocator, audit
from .admin import Admin
from .limits import ConnectionLimits
from .memory import ConnectionChurn
from .native import NativeConnection
from .pacing import PAGE_WRITER, Pacer
from .security import Authenticator, Subject
from .tls import AcceptorTls

if TYPE_CHECKING:
    from ..management.app import ManagementServer

log = logging.getLogger("tandem.broker")

ACCEPT_BACKLOG = 4096
# Seconds between a warm backup's reads of the store once it has caught up. Each read lists both
# journals' files (opening each one's header), and a message added and acknowledged within one
# read costs the backup almost nothing; a takeover reads what came since the last read (at
# 40,000 msgs/s, 8,000 messages: a few tens of ms).
FOLLOW_PERIOD = 0.2


def restore_state(po: PostOffice, storage: JournalStorage | NullStorage, state: LoadedState) -> int:
    """Build the post office's addresses, queues, messages and paging state from what the store loaded;
    returns how many messages were loaded."""
    from ..core.address import Address

    for aid, arec in state.addresses:
        po.restore_address(Address(aid, arec.name, {RoutingType(r) for r in arec.routing_types}, arec.auto_created))
    for lq in state.queues:
        r = lq.record
        q = po.new_queue(
            lq.id,
            r.name,
            r.address,
            RoutingType(r.routing_type),
            True,
            filter_text=r.filter,
            auto_created=r.auto_created,
            max_consumers=r.max_consumers,
            exclusive=r.exclusive,
            last_value_key=r.last_value_key,
            reader_only=r.reader_only,
            next_seq=max(lq.seq_reserved, 1),
            seq_reserved=lq.seq_reserved,
        )
        q.paused = lq.paused
        po.restore_queue(q)
    for address, dedup_id, rid in state.dedup:
        po.restore_dedup(address, dedup_id, rid)
    by_id = po.queues_by_id
    n = 0
    if state.queue_refs is not None:  # warm: the follower built the references already
        refs_by_queue = state.queue_refs
        for q in po.queues.values():
            n += q.adopt(refs_by_queue.pop(q.id, []))
        for qid, refs in refs_by_queue.items():  # queues deleted since: their messages go with them
            po.ids.seen(qid)  # (see below)
            for ref in refs:
                if not ref.removed:
                    ref.message.durable_refs -= 1
                    if ref.message.durable_refs <= 0:
                        storage.delete_message(ref.message.rid or ref.message.id)
    for lm in state.messages:
        m = lm.message
        kept = 0
        for qid, seq, dc in lm.refs:
            target = by_id.get(qid)
            if target is not None:
                target.add_loaded(MessageRef(m, target, seq, dc))
                kept += 1
            else:
                # A queue deleted, or cut by a crash before its record was stored: the record
                # still names it, so its id must never name another queue.
                po.ids.seen(qid)
        if not kept:
            storage.delete_message(m.rid or m.id)
            continue
        m.durable_refs = kept
        n += 1
    for q in po.queues.values():
        q.sort_loaded()
    if isinstance(storage, JournalStorage):
        pages = storage.pages
        pages.on_durable = po.pages_durable
        gone = po.restore_paging(
            pages.listing(),
            state.page_cursors,
            state.page_txs,
            state.page_tx_seqs,
            state.page_acks,
            state.page_counts,
            state.page_skips,
        )
        for qid in gone:
            storage.delete_cursor_record(qid)
    return n


def journal_settings(cfg: BrokerConfig) -> JournalSettings:
    return JournalSettings(
        file_size=cfg.journal_file_size,
        min_files=cfg.journal_min_files,
        pool_files=cfg.journal_pool_files,
        buffer_timeout_ns=cfg.journal_buffer_timeout,
        buffer_size=cfg.journal_buffer_size,
        compact_percentage=cfg.journal_compact_percentage,
        compact_min_files=cfg.journal_compact_min_files,
        datasync=cfg.journal_datasync,
    )


class Activation(Protocol):
    """The broker's side of its HA mode: ha/activation.py implements it, one class per mode."""

    @property
    def role(self) -> str: ...

    async def start(self) -> None:
        """Before the broker listens: a live-only server serves now, or refuses a store in use."""
        ...

    async def run(self) -> None:
        """The rest of its life (waiting, passive, live), as a task the broker owns and cancels on stop."""
        ...

    def stop_state(self, failover: bool) -> bytes:
        """What a stop of the serving server leaves in the store: fail over (L) or not (P)."""
        ...

    def release(self, state: bytes | None) -> None:
        """The broker stopped serving: leave `state` (if any), let go of every lock."""
        ...

    async def activation_info(self) -> dict[str, Any]:
        """The activation sequence: this server's copy, ZooKeeper's value, the verdict."""
        ...

    @property
    def store_tap(self) -> Tap | None:
        """Where the store's file operations go besides the disk (a replicating primary's stream)."""
        ...

    def accept_replica(self, link: Any, pkt: p.ReplicaStart, writers: list[DirectoryWriter], data_dir: Path) -> None:
        """A backup asks to replicate this server's store (raises if it may not)."""
        ...

    def replication(self) -> dict[str, Any]:
        """Replication state for `status`."""
        ...


def _compile_filter(text: str) -> Any:
    from ..core.selector import compile_selector

    return compile_selector(text)


def _audit_denied(user: str | None, peer: str, permission: str, address: str) -> None:
    audit.audit("denied", Subject(user), peer, address, False, permission=permission)


class Broker:
    def __init__(self, config: BrokerConfig, node_manager: NodeManager | None = None) -> None:
        self.config = config
        self.node_manager = node_manager
        self.storage: JournalStorage | NullStorage = NullStorage()
        self.postoffice: PostOffice
        self.admin = Admin(self)
        self.authenticator = Authenticator(config)
        self.authorizer = Authorizer(config.security_repository()) if config.security_enabled else None
        if self.authorizer is not None:
            self.authorizer.on_denied = _audit_denied
        if config.security_enabled and not config.security_settings:
            log.warning("security-enabled with no security-settings: every operation of every user will be refused")
        self.limits = ConnectionLimits(config)
        audit.configure(config.audit_log)
        self.connections: set[Any] = set()  # NativeConnection and StompConnection
        self.reattachable: dict[str, Any] = {}  # connection id -> NativeConnection with a confirmation window
        self.pacer = Pacer()  # writes nothing else bounds wait for a full backup link or page writer
        self.servers: list[asyncio.Server] = []
        self.bound: dict[str, tuple[str, int]] = {}
        self.tls: dict[str, AcceptorTls] = {}  # acceptor name -> its TLS contexts (ssl-enabled ones)
        self.management: ManagementServer | None = None  # the HTTP management API, with [management]
        self.started_at = 0.0
        self.activated_at = 0.0
        self.load_seconds = 0.0
        self.loaded_messages = 0
        self.active = False
        self._ha_state = "starting"  # starting | waiting | passive | active | stopped
        self.warm_activation = False
        self.failovers = 0  # times this server took its node over from another (a backup activating)
        self.on_state: Callable[[str], None] | None = None
        self.activation: Activation | None = None
        self.backups: dict[NativeConnection, str] = {}  # waiting servers that announced themselves
        self.failure: BaseException | None = None
        self._activation_task: asyncio.Task[None] | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._follower: Any = None
        self._housekeeper: asyncio.Task[None] | None = None
        self._users_watch: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._stopping = False

    @property
    def node_id(self) -> str:
        """The node this server serves (a replicating backup takes its primary's)."""
        return self.node_manager.node_id if self.node_manager is not None else ""

    @property
    def ha_state(self) -> str:
        return self._ha_state

    @ha_state.setter
    def ha_state(self, state: str) -> None:
        if state != self._ha_state:
            self._ha_state = state
            log.info("state", extra={"broker": self.config.name, "state": state})
            if self.on_state is not None:
                self.on_state(state)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Listen, then activate (live-only) or begin the HA dance in the background."""
        cfg = self.config
        if self.node_manager is None:
            self.node_manager = (
                FileNodeManager(cfg.data_path) if cfg.persistence_enabled else InMemoryNodeManager(SharedStore())
            )
        self.activation = make_activation(self, self.node_manager)
        self.started_at = time.time()
        try:
            await self.activation.start()
            await self._listen()
            if cfg.management is not None:  # HTTP management (docs/management.md), as long as the acceptors
                from ..management.app import ManagementServer

                self.management = ManagementServer(self, cfg.management)
                await self.management.start()
        except BaseException:
            await self._abort_start()
            raise
        self._activation_task = asyncio.create_task(self._run_activation(), name="activation")
        self._housekeeper = asyncio.create_task(self._housekeeping(), name="housekeeping")
        if cfg.security_enabled:
            self._users_watch = asyncio.create_task(self._watch_users(), name="users-file")

    async def _run_activation(self) -> None:
        assert self.activation is not None
        try:
            await self.activation.run()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.critical("activation failed: %r", exc)
            self.failure = exc
            asyncio.get_running_loop().create_task(self.stop())

    def report(self, state: str) -> None:
        self.ha_state = state

    async def start_live(self, again: bool = False) -> None:
        """Load the journal and serve (we hold the live lock); `again`: after a failback that was
        abandoned halfway, this server serves its node again (not a takeover: not counted)."""
        t0 = time.monotonic()
        cfg = self.config
        if not again and (
            (self.activation is not None and self.activation.role == "backup") or self._ha_state == "passive"
        ):
            self.failovers += 1
        follower = await self._stop_following()
        warm = follower.finish() if follower is not None else None
        self.warm_activation = warm is not None
        tap = self.activation.store_tap if self.activation is not None else None
        if warm is not None:
            warm.set_tap(tap)
            self.storage = warm
        elif cfg.persistence_enabled:
            if follower is not None:
                log.warning("warm takeover not possible (%s): loading the journal", follower.problem or "compaction")
            self.storage = JournalStorage(cfg.data_path, journal_settings(cfg), tap)
        else:
            self.storage = NullStorage(cfg.data_path / "large-messages")
        self._load()
        self.load_seconds = time.monotonic() - t0
        leftovers = self.storage.take_leftovers()
        if leftovers:
            _release_in_chunks(asyncio.get_running_loop(), leftovers)
        self.active = True
        self.ha_state = "active"
        self.activated_at = time.time()
        log.info(
            "broker active",
            extra={"broker": cfg.name, "node_id": self.node_id, "messages": self.loaded_messages},
        )
        for conn in list(self.connections):
            if isinstance(conn, NativeConnection):
                conn.send(p.Activated(self.topology()))

    async def stop_live(self) -> None:
        """Stop serving: clients are disconnected (they fail over), the journal is closed.

        The locks are the activation's: it lets go of the live lock once this returns."""
        if not self.active:
            return
        self.active = False
        self.ha_state = "stopped"
        for conn in list(self.connections):
            if getattr(conn, "replica", None) is None:  # a backup's link stays for the last batches
                conn.close()
        await self.storage.stop()
        self.storage = NullStorage()

    async def stop(self, failover: bool = False, leave_state: bool = True) -> None:
        """Stop for good; `failover` leaves the store marked live so a backup takes over.

        `leave_state=False` keeps the state byte as it is (a failed journal; a backup
        stepping down for failback that must not restart).
        """
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        for task in (self._activation_task, self._housekeeper, self._users_watch):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        await self._stop_following()
        for server in self.servers:
            server.close()
        if self.management is not None:
            await self.management.stop()
        was_active = self.active
        await self.stop_live()
        if self.activation is not None:
            state = self.activation.stop_state(failover) if leave_state and was_active else None
            self.activation.release(state)
        elif self.node_manager is not None:
            self.node_manager.close()
        for conn in list(self.connections):
            try:
                conn.close()
            except TandemError as e:  # after a storage failure a teardown write fails; go on
                log.debug("closing %s: %s", conn, e)
        for server in self.servers:
            try:
                await asyncio.wait_for(server.wait_closed(), 5)
            except TimeoutError:
                pass
        self.authenticator.close()
        self.ha_state = "stopped"
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def storage_failed(self, err: BaseException) -> None:
        """An I/O error in the store (or a replicating backup's replica): tell every client, stop
        serving, leave the store to a backup.

        Artemis's critical I/O error: a server never goes on with a journal it cannot write. The
        state byte stays live, so a shared-store backup takes over at once."""
        if self.failure is not None:
            return
        if isinstance(err, OSError) and err.errno is not None and err.errno in errno.errorcode:
            what = f"{errno.errorcode[err.errno]} {err}"  # the name users search for: ENOSPC, EIO, EROFS
        else:
            what = str(err)
        log.critical("storage failure: %s; stopping so that a backup takes over", what)
        self._fail_stop(
            JournalIOError(
                f"server {self.config.name!r} stopped: its store failed ({what}); "
                "what it had not confirmed may or may not have been stored"
            )
        )

    def lock_lost(self, reason: str) -> None:
        """Our live lock no longer guards the store: another server may serve it now. Stop at once
        and write nothing more to it — no journal record, no state byte (Artemis's lock monitor)."""
        if self.failure is not None:
            return
        log.critical("lost its live lock (%s): stopping now, writing nothing more to the store", reason)
        exc = LockLost(
            f"server {self.config.name!r} lost its live lock ({reason}) and stopped: "
            "another server may be serving its store"
        )
        self.storage.halt(exc)
        self._fail_stop(exc)

    def _fail_stop(self, exc: TandemError) -> None:
        """Tell every client why, and stop without touching the state byte."""
        self.failure = exc
        asyncio.get_running_loop().create_task(self.stop(leave_state=False))
        for conn in list(self.connections):
            if getattr(conn, "replica", None) is not None:
                continue  # a backup's link: the activation tells it to take over as the broker stops
            try:
                conn.fatal(exc)
            except TandemError as e:  # a teardown that would write: the store is gone, close anyway
                log.debug("closing %s after %s: %s", conn, exc.code.name, e)
                conn.close()

    async def _abort_start(self) -> None:
        for server in self.servers:
            server.close()
        if self.management is not None:
            await self.management.stop()
        try:
            await self.storage.stop()
        finally:
            if self.node_manager is not None:
                self.node_manager.close()
            self._stopped.set()

    # ------------------------------------------------------------- following
    async def start_backup(self) -> None:
        """Passive: read the store as the active server writes it (a warm backup, store/follower.py)."""
        self.ha_state = "passive"
        if self.config.persistence_enabled and self._follow_task is None:
            self._follow_task = asyncio.create_task(self._follow(), name="follower")

    async def _follow(self) -> None:
        from ..store.follower import StoreFollower

        cfg = self.config
        period = FOLLOW_PERIOD
        self._follower = StoreFollower(cfg.data_path, journal_settings(cfg))
        # The warm-up builds an object per message, as a reload does (see _load): no collections
        # meanwhile (each would walk the heap on the loop, holding up a replicating backup's
        # acknowledgements and so the primary's confirmations), then freeze what it built.
        warming = gc.isenabled()  # (off already: whoever turned it off turns it on again)
        gc.disable()
        try:
            while True:
                done = self._follower.poll()
                if done is False:
                    log.info("follower starting over: %s", self._follower.problem)
                    self._follower = StoreFollower(cfg.data_path, journal_settings(cfg))
                    if not warming and gc.isenabled():  # a new warm-up
                        warming = True
                        gc.disable()
                    await asyncio.sleep(period)
                elif done is None:
                    await asyncio.sleep(0)  # more to read: let the loop serve in between slices
                else:
                    if warming:
                        warming = False
                        gc.enable()
                        gc.freeze()
                    await asyncio.sleep(period)
        finally:
            if warming:
                gc.enable()

    async def stop_backup(self) -> None:
        """Stop following (a replicating backup's store is about to be replaced by a new sync)."""
        await self._stop_following()
        self.ha_state = "waiting"

    async def _stop_following(self) -> Any:
        """Stop polling; returns the follower (or None)."""
        task, self._follow_task = self._follow_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        follower, self._follower = self._follower, None
        return follower

    def replica_start(self, conn: NativeConnection, pkt: p.ReplicaStart) -> None:
        """A backup asks to replicate our store: the activation decides and streams; clients are
        told of the backup as of one that announced itself."""
        if self.activation is None:
            raise IllegalState("not started")
        storage = self.storage
        if not self.active or not isinstance(storage, JournalStorage):
            raise NotActive(
                f"server {self.config.name!r} is not active ({self.ha_state}): it has no store to replicate"
            )
        try:
            self.activation.accept_replica(conn, pkt, storage.writers, storage.data_dir)
        except Unauthorized:  # a wrong cluster pair: counted as a failed login (the link closes)
            self.authenticator.refused(pkt.user, conn.peer, "native (replication)")
            audit.audit("replica.start", conn.subject, conn.peer, None, False, login=pkt.user)
            raise
        self.backup_announced(conn, pkt.connector)

    def backup_announced(self, conn: NativeConnection, connector: str) -> None:
        self.backups[conn] = connector
        self._topology_changed()

    def backup_gone(self, conn: NativeConnection) -> None:
        if self.backups.pop(conn, None) is not None:
            self._topology_changed()

    def _topology_changed(self) -> None:
        nodes = self.topology()
        for conn in list(self.connections):
            if isinstance(conn, NativeConnection) and conn.handshaken and conn not in self.backups:
                conn.send(p.Topology(nodes))

    # ---------------------------------------------------------------- reload
    def _load(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        # Reload makes millions of long-lived objects: no collections while building them, and
        # afterwards freeze them so later collections do not walk the whole heap again and again.
        gc.disable()
        try:
            state = self.storage.load()
            self.storage.set_failure_handler(self.storage_failed)
            self.storage.start()
            ids = IdGenerator(state.max_id + 1, state.id_reserved, self.storage.reserve_ids)
            self.postoffice = PostOffice(
                self.storage,
                ids,
                loop.call_soon,
                cfg.settings_repository(),
                _compile_filter,
                loop.call_later,
                cfg.persist_id_cache,
                cfg.memory_limits(),
                self.storage.pages if isinstance(self.storage, JournalStorage) else None,
            )
            self._restore(state)
            if isinstance(self.storage, JournalStorage):
                self.storage.pages.on_backlog = partial(self.pacer.full, PAGE_WRITER)
            if audit.enabled():
                self.postoffice.auto_created = []
        finally:
            gc.enable()
            gc.freeze()
        self._declare()

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        for acc in self.config.acceptors:
            host, port = parse_host_port(acc.host_port)
            if acc.protocol == "stomp":
                from .stomp import StompConnection

                factory: Callable[[], asyncio.Protocol] = partial(StompConnection, self, acc.name)
            else:
                factory = partial(NativeConnection, self, acc.name)
            ssl_args: dict[str, Any] = {}
            if acc.ssl_enabled:
                try:
                    self.tls[acc.name] = tls = AcceptorTls(acc)
                except (OSError, ssl.SSLError) as exc:
                    raise IllegalState(f"acceptor {acc.name!r}: cannot load its TLS files: {exc}") from None
                # The TLS handshake comes before connection_made: it has its own deadline.
                ssl_args = {"ssl": tls.listening, "ssl_handshake_timeout": self.config.handshake_timeout / 1000}
            try:
                # A deep accept queue: a burst of connections (clients reconnecting after a failover)
                # waits there instead of retrying its SYN a second later (the kernel caps it at somaxconn).
                server = await loop.create_server(
                    factory, host, port, reuse_address=True, backlog=ACCEPT_BACKLOG, **ssl_args
                )
            except OSError as exc:
                raise IllegalState(f"acceptor {acc.name!r} cannot listen on {host}:{port}: {exc.strerror}") from None
            self.servers.append(server)
            sock = server.sockets[0].getsockname()
            self.bound[acc.name] = (sock[0], sock[1])

    def _restore(self, state: LoadedState) -> None:
        self.loaded_messages = restore_state(self.postoffice, self.storage, state)

    def _declare(self) -> None:
        po = self.postoffice
        for a in self.config.addresses:
            rt = RoutingType.parse(a.routing_type)
            po.create_address(a.name, {rt}, exists_ok=True)
            for qc in a.queues:
                if qc.name not in po.queues:
                    po.create_queue(qc.name, a.name, rt, qc.durable, qc.filter, max_consumers=qc.max_consumers)

    # ----------------------------------------------------------- operations
    def require_active(self) -> PostOffice:
        if not self.active:
            raise NotActive(f"server {self.config.name!r} is not active ({self.ha_state}): it is a waiting backup")
        return self.postoffice

    async def authenticate(
        self,
        username: str | None,
        password: str | None,
        peer: str = "?",
        protocol: str = "native",
        cert_user: str | None = None,
    ) -> Subject | None:
        """With `security-enabled`, only the users of the users file (and the cluster pair, for
        announcements); the hash is checked off the loop (server/security.py). `cert_user`: the
        user a verified client certificate maps to (cert-user-mapping); a login without a
        password and with no other user name is that user's."""
        if cert_user is not None and self.authenticator.enabled and not password and username in (None, "", cert_user):
            return self.authenticator.subject_for(cert_user)
        return await self.authenticator.check(username, password, peer, protocol)

    def reload_users(self) -> None:
        """(SIGHUP) read the users file again now."""
        self.authenticator.reload(force=True)
        self._revoke(self.authenticator.take_changed())

    def _revoke(self, users: set[str]) -> None:
        """Close the connections of users a reload removed or changed (as RabbitMQ closes a deleted
        user's): a client that reconnects is checked against the file as it is now."""
        if not users:
            return
        for conn in list(self.connections):
            subject = getattr(conn, "subject", None)
            if subject is None or subject.cluster or subject.user not in users:
                continue
            audit.audit("connection.revoked", subject, conn.peer, None, True)
            if getattr(conn, "detached", False):
                conn.close()  # its sessions waited for a reattachment: they go now
            else:
                conn.fatal(
                    Unauthorized(f"user {subject.user!r} was removed or changed in the users file: log in again")
                )

    async def _watch_users(self) -> None:
        """Pick up changes to the users file every `security-invalidation-interval`."""
        period = self.config.security_invalidation_interval / 1000
        while True:
            await asyncio.sleep(period)
            self.authenticator.reload()
            self._revoke(self.authenticator.take_changed())
            self.authenticator.housekeeping()

    def reload_tls(self, force: bool = False) -> None:
        """New TLS contexts for new connections (server/tls.py): on SIGHUP (`force`) and when files change."""
        for tls in self.tls.values():
            tls.reload(force)
        if self.management is not None:
            self.management.reload_tls(force)

    def own_connector(self) -> str:
        cfg = self.config
        if cfg.connector_ref:
            return cfg.connector_url(cfg.connector_ref)
        for acc in cfg.acceptors:
            if acc.protocol == "native" and acc.name in self.bound:
                host, port = self.bound[acc.name]
                return f"tcps://{host}:{port}" if acc.ssl_enabled else f"{host}:{port}"
        return ""

    def topology(self) -> list[Any]:
        """For our node id: the connector of the server serving it and of the one waiting to."""
        me = self.own_connector()
        if self.active:
            backup = next(iter(self.backups.values()), None)
            return [{"node_id": self.node_id, "live": me, "backup": backup}]
        peers = [self.config.connector_url(n) for n in self.config.static_connectors]
        return [{"node_id": self.node_id, "live": peers[0] if peers else None, "backup": me}]

    async def activation_info(self) -> dict[str, Any]:
        """`broker.activation`: which server this is, and its activation sequence beside ZooKeeper's."""
        out: dict[str, Any] = {
            "name": self.config.name,
            "node_id": self.node_id,
            "ha_policy": self.config.ha_policy,
            "state": self.ha_state,
            "data_directory": str(self.config.data_path),
        }
        if self.activation is not None:
            out.update(await self.activation.activation_info())
        return out

    def status(self) -> dict[str, Any]:
        now = time.time()
        out: dict[str, Any] = {
            "name": self.config.name,
            "version": __version__,
            "node_id": self.node_id,
            "role": self.activation.role if self.activation is not None else "live-only",
            "ha_policy": self.config.ha_policy,
            "state": self.ha_state,
            "uptime_s": round(now - self.started_at, 3),
            "active_for_s": round(now - self.activated_at, 3) if self.active else 0.0,
            "activated_at": round(self.activated_at, 3) if self.active else None,  # Unix time
            "peer": self._peer(),
            "connections": sum(1 for c in self.connections if not getattr(c, "detached", False)),
            "detached_connections": sum(1 for c in self.connections if getattr(c, "detached", False)),
            "sessions": sum(len(getattr(c, "sessions", ())) for c in self.connections),
            "acceptors": {k: f"{h}:{p}" for k, (h, p) in self.bound.items()},
            "management": self.management.url if self.management is not None else None,
            "connection_limits": self.limits.status(),
            "persistence": self.config.persistence_enabled,
            "memory_allocator": allocator.running(),
            # connections not read for a while because a buffer before the disk or the backup was full
            "pacing_pauses": self.pacer.pauses,
            "pacing_waiting": self.pacer.waiting,
        }
        if self.activation is not None:
            out.update(self.activation.replication())
        if self._follower is not None:
            f = self._follower
            out["following"] = {
                "caught_up": f.caught_up,
                "messages_seen": f.messages_seen,
                "bytes_read": f.messages.bytes_read,
            }
        if self.active:
            out["reload_s"] = round(self.load_seconds, 3)
            out["warm_activation"] = self.warm_activation
            out.update(self.postoffice.stat())
            if isinstance(self.storage, JournalStorage):
                out["journal"] = vars(self.storage.messages.stats())
                out["bindings_journal"] = vars(self.storage.bindings.stats())
        return out

    def _peer(self) -> str | None:
        if self.active:
            return next(iter(self.backups.values()), None)
        peers = [self.config.connector_url(n) for n in self.config.static_connectors]
        return peers[0] if peers else None

    def _check_alive(self, now: float) -> None:
        """Its own frame: a loop variable left in the housekeeping coroutine would keep the last
        connection checked, dead or not, alive until the next round (for ever, once none is left)."""
        for conn in list(self.connections):
            conn.check_alive(now)

    async def _housekeeping(self) -> None:
        period = self.config.connection_check_period / 1000
        scan_every = self.config.message_expiry_scan_period / 1000
        loop = asyncio.get_running_loop()
        last_scan = loop.time()
        churn = ConnectionChurn()
        while True:
            await asyncio.sleep(min(period, scan_every) if scan_every > 0 else period)
            now = loop.time()
            self._check_alive(now)
            self.reload_tls()
            if self.management is not None:  # rates are the management API's (a sample walks every queue)
                self.admin.sample_rates()
            if churn.observe(len(self.connections)):
                await churn.release(len(self.connections))
            if not self.active:
                last_scan = now  # a backup that takes over scans a period later, not in its first second
            elif scan_every > 0 and now - last_scan >= scan_every:
                last_scan = now
                expired = self.postoffice.expire_scan()
                if expired:
                    log.info("expiry scan", extra={"expired": expired})


def _release_in_chunks(loop: asyncio.AbstractEventLoop, leftovers: dict[Any, Any], chunk: int = 20_000) -> None:
    """Free a follower's records a chunk per loop pass: a million of them would hold a takeover
    back by a good part of a second if freed at once, before the first send is served."""
    for _ in range(min(chunk, len(leftovers))):
        leftovers.popitem()
    if leftovers:
        loop.call_soon(_release_in_chunks, loop, leftovers, chunk)
