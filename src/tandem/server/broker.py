"""A broker instance: storage, post office, acceptors and housekeeping, started and stopped as one."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
from functools import partial
from typing import Any

from .. import __version__
from ..config import BrokerConfig, parse_host_port
from ..core.ids import IdGenerator
from ..core.message import MessageRef, RoutingType
from ..core.postoffice import PostOffice
from ..errors import IllegalState
from ..ha.lockfile import LIVE, PAUSED, LockFile
from ..journal import JournalSettings
from ..store.journal_storage import JournalStorage, LoadedState, NullStorage
from .admin import Admin
from .native import NativeConnection

log = logging.getLogger("tandem.broker")


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


def _compile_filter(text: str) -> Any:
    from ..core.selector import compile_selector

    return compile_selector(text)


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.storage: JournalStorage | NullStorage
        if config.persistence_enabled:
            self.storage = JournalStorage(config.data_path, journal_settings(config))
        else:
            self.storage = NullStorage()
        self.postoffice: PostOffice
        self.admin = Admin(self)
        self.connections: set[NativeConnection] = set()
        self.servers: list[asyncio.Server] = []
        self.bound: dict[str, tuple[str, int]] = {}
        self.node_id = ""
        self.started_at = 0.0
        self.load_seconds = 0.0
        self.loaded_messages = 0
        self._housekeeper: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._stopping = False
        self._lock: LockFile | None = None
        self.failure: BaseException | None = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        t0 = time.monotonic()
        self.node_id = self._take_lock()
        try:
            self._load()
            self.load_seconds = time.monotonic() - t0
            await self._listen()
        except BaseException:
            await self._abort_start()
            raise
        self.started_at = time.time()
        self._housekeeper = asyncio.create_task(self._housekeeping(), name="housekeeping")
        log.info(
            "broker started",
            extra={"broker": self.config.name, "node_id": self.node_id, "messages": self.loaded_messages},
        )

    def _load(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        # Reload makes millions of long-lived objects: no collections while building them, and
        # afterwards freeze them so later collections do not walk the whole heap again and again.
        gc.disable()
        try:
            state = self.storage.load()
            self.storage.set_failure_handler(self._storage_failed)
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
            )
            self._restore(state)
        finally:
            gc.enable()
            gc.freeze()
        self._declare()

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        for acc in self.config.acceptors:
            host, port = parse_host_port(acc.bind)
            factory = partial(NativeConnection, self, acc.name)
            try:
                server = await loop.create_server(factory, host, port, reuse_address=True)
            except OSError as exc:
                raise IllegalState(f"acceptor {acc.name!r} cannot listen on {host}:{port}: {exc.strerror}") from None
            self.servers.append(server)
            sock = server.sockets[0].getsockname()
            self.bound[acc.name] = (sock[0], sock[1])

    async def _abort_start(self) -> None:
        for server in self.servers:
            server.close()
        try:
            await self.storage.stop()
        finally:
            self._release_lock(PAUSED)
            self._stopped.set()

    async def stop(self) -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        for server in self.servers:
            server.close()
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            try:
                await self._housekeeper
            except asyncio.CancelledError:
                pass
        for conn in list(self.connections):
            conn.close()
        for server in self.servers:
            try:
                await asyncio.wait_for(server.wait_closed(), 5)
            except TimeoutError:
                pass
        await self.storage.stop()
        self._release_lock(PAUSED)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def _storage_failed(self, err: BaseException) -> None:
        log.critical("storage failure, stopping the broker: %r", err)
        self.failure = err
        asyncio.get_running_loop().create_task(self.stop())

    def _take_lock(self) -> str:
        """Hold the live lock on the data directory so no second broker writes the same journal."""
        if not self.config.persistence_enabled:
            return str(uuid.uuid4())
        lock = LockFile(self.config.data_path)
        if not lock.try_lock_live():
            lock.close()
            raise IllegalState(
                f"data directory {self.config.data_path} is in use by another running broker (server.lock is held)"
            )
        self._lock = lock
        lock.write_state(LIVE)
        return lock.node_id()

    def _release_lock(self, state: bytes) -> None:
        if self._lock is not None:
            self._lock.write_state(state)
            self._lock.unlock_live()
            self._lock.close()
            self._lock = None

    # ---------------------------------------------------------------- reload
    def _restore(self, state: LoadedState) -> None:
        po = self.postoffice
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
                next_seq=max(lq.seq_reserved, 1),
                seq_reserved=lq.seq_reserved,
            )
            po.restore_queue(q)
        for address, dedup_id, rid in state.dedup:
            po.restore_dedup(address, dedup_id, rid)
        by_id = po.queues_by_id
        n = 0
        for lm in state.messages:
            m = lm.message
            kept = 0
            for qid, seq, dc in lm.refs:
                target = by_id.get(qid)
                if target is not None:
                    target.add_loaded(MessageRef(m, target, seq, dc))
                    kept += 1
            if not kept:
                self.storage.delete_message(m.id)
                continue
            m.durable_refs = kept
            n += 1
        for q in po.queues.values():
            q.sort_loaded()
        self.loaded_messages = n

    def _declare(self) -> None:
        po = self.postoffice
        for a in self.config.addresses:
            rt = RoutingType.parse(a.routing_type)
            po.create_address(a.name, {rt}, exists_ok=True)
            for qc in a.queues:
                if qc.name not in po.queues:
                    po.create_queue(qc.name, a.name, rt, qc.durable, qc.filter, max_consumers=qc.max_consumers)

    # ----------------------------------------------------------- operations
    def authenticate(self, username: str | None, password: str | None) -> bool:
        return True

    def topology(self) -> list[Any]:
        native = self.bound.get(self._native_acceptor_name() or "", None)
        connector = f"{native[0]}:{native[1]}" if native else ""
        return [{"node_id": self.node_id, "primary": connector, "backup": None}]

    def _native_acceptor_name(self) -> str | None:
        for acc in self.config.acceptors:
            if acc.protocol == "native":
                return acc.name
        return None

    def status(self) -> dict[str, Any]:
        po = self.postoffice
        out: dict[str, Any] = {
            "name": self.config.name,
            "version": __version__,
            "node_id": self.node_id,
            "role": "live-only",
            "state": "active",
            "uptime_s": round(time.time() - self.started_at, 3),
            "connections": len(self.connections),
            "acceptors": {k: f"{h}:{p}" for k, (h, p) in self.bound.items()},
            "persistence": self.config.persistence_enabled,
            "reload_s": round(self.load_seconds, 3),
            **po.stat(),
        }
        if isinstance(self.storage, JournalStorage):
            out["journal"] = vars(self.storage.messages.stats())
            out["bindings_journal"] = vars(self.storage.bindings.stats())
        return out

    async def _housekeeping(self) -> None:
        period = self.config.connection_check_period / 1000
        scan_every = self.config.message_expiry_scan_period / 1000
        loop = asyncio.get_running_loop()
        last_scan = loop.time()
        while True:
            await asyncio.sleep(min(period, scan_every) if scan_every > 0 else period)
            now = loop.time()
            for conn in list(self.connections):
                conn.check_alive(now)
            if scan_every > 0 and now - last_scan >= scan_every:
                last_scan = now
                expired = self.postoffice.expire_scan()
                if expired:
                    log.info("expiry scan", extra={"expired": expired})
