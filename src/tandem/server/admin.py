"""Management operations, reachable over the native protocol (MANAGE packets), the CLI and the
HTTP management API (management/app.py): one implementation, one permission check, one audit line."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ..core import queueops
from ..core.dedup import tx_key
from ..core.message import MessageRef, RoutingType
from ..core.postoffice import check_name
from ..errors import (
    ConnectionDoesNotExist,
    IllegalState,
    InvalidArgument,
    InvalidSelector,
    QueueDoesNotExist,
    ResourceLimit,
    TandemError,
    Unauthorized,
)
from ..store import disk_usage
from ..store.journal_storage import JournalStorage
from . import inventory
from .audit import audit
from .authorization import authorize_management
from .queue_view import MAX_PREVIEW, describe, large_preview
from .rates import RateTracker
from .security import is_cluster_pair

if TYPE_CHECKING:
    from ..core.permissions import Access
    from .context import BrokerContext
    from .security import Subject

Reply = Callable[[Any], None]

MAX_PAGE_SIZE = 1000  # queues in one page of queue.list
MAX_FILES_LISTED = 10_000  # files broker.journal lists per page store and of large messages (all are counted)
# queue.list's `sort` values -> the value sorted on
QUEUE_SORT_KEYS: dict[str, Callable[[Any], Any]] = {
    "name": lambda q: q.name,
    "address": lambda q: q.address,
    "message_count": lambda q: q.message_count,
    "delivering_count": lambda q: q.delivering_count,
    "consumer_count": lambda q: len(q.consumers),
    "messages_added": lambda q: q.messages_added,
    "messages_acknowledged": lambda q: q.messages_acked,
    "paged_count": lambda q: q.paged_count,
}


class Caller(Protocol):
    """Who runs an operation: a native connection (server/native.py) or an HTTP request
    (management/app.py). A caller may also have `temp_queues` (a set of names): the temporary
    queues it creates are its own, deleted when it closes."""

    @property
    def subject(self) -> Subject | None:
        """Who logged in (None or ANONYMOUS: security off)."""
        ...

    @property
    def peer(self) -> str:
        """host:port of the client, for the audit log."""
        ...

    @property
    def access(self) -> Access | None:
        """Its permissions (None: security off, nothing is checked)."""
        ...


def _routing(text: object) -> RoutingType:
    if not isinstance(text, str):
        raise InvalidArgument(f"routing type must be a string, got {type(text).__name__}")
    try:
        return RoutingType.parse(text)
    except ValueError as exc:
        raise InvalidArgument(f"`routing_type`: {exc}") from None


@cache
def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The argument types of an operation (annotations are strings here; conn/reply are skipped)."""
    ann = inspect.get_annotations(fn)
    return {k: eval(v, globals()) for k, v in ann.items() if k not in ("conn", "reply", "return")}


class Admin:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self._pending: set[asyncio.Task[Any]] = set()  # answers that wait for ZooKeeper
        self.rates = RateTracker()  # msg/s in and out, per queue and in all (server/rates.py)
        self.connection_ids = inventory.ConnectionIds()
        self._ops: dict[str, Callable[..., Any]] = {
            "queue.create": self.queue_create,
            "queue.delete": self.queue_delete,
            "queue.purge": self.queue_purge,
            "queue.stat": self.queue_stat,
            "queue.list": self.queue_list,
            "connection.list": self.connection_list,
            "connection.close": self.connection_close,
            "consumer.list": self.consumer_list,
            "broker.ha": self.broker_ha,
            "broker.journal": self.broker_journal,
            "address.create": self.address_create,
            "address.delete": self.address_delete,
            "address.list": self.address_list,
            "broker.status": self.broker_status,
            "broker.overview": self.broker_overview,
            "broker.activation": self.broker_activation,
            "broker.stop": self.broker_stop,
            "cluster.announce": self.cluster_announce,
            "tx.status": self.tx_status,
            **self._queue_ops(),
        }

    @property
    def ops(self) -> list[str]:
        return sorted(self._ops)

    def handle(self, op: str, args: dict[str, Any], conn: Caller | None, reply: Reply) -> None:
        """Run `op` for `conn` (None: not over a connection, nothing checked); every attempt,
        known or not, goes to the audit log (server/audit.py)."""
        subject = conn.subject if conn is not None else None
        peer = conn.peer if conn is not None else "local"
        target = args.get("name", args.get("dedup_id", args.get("id")))  # a queue, a tx, a connection
        try:
            self._run(op, args, conn, reply)
        except TandemError as exc:
            # A permission denial is "not allowed"; any other failure was allowed and failed.
            audit(op, subject, peer, target, not isinstance(exc, Unauthorized), error=exc.code.name)
            raise
        audit(op, subject, peer, target, True)

    def _run(self, op: str, args: dict[str, Any], conn: Caller | None, reply: Reply) -> None:
        fn = self._ops.get(op)
        if fn is None:
            raise InvalidArgument(f"unknown management operation {op!r}; known: {', '.join(self.ops)}")
        params = inspect.signature(fn).parameters
        hints = _hints(fn)
        checked: dict[str, Any] = {}
        for key, value in args.items():
            if key not in params or key in ("conn", "reply"):
                raise InvalidArgument(f"{op}: unknown argument `{key}`")
            try:
                checked[key] = msgspec.convert(value, hints[key], strict=True)
            except msgspec.ValidationError as exc:
                raise InvalidArgument(f"{op}: argument `{key}`: {exc}") from None
        try:
            bound = inspect.signature(fn).bind(conn=conn, reply=reply, **checked)
        except TypeError as exc:
            raise InvalidArgument(f"{op}: {exc}") from None
        access = conn.access if conn is not None else None  # None: security off, or not over a connection
        if access is not None:
            authorize_management(access, self.broker.require_active, op, checked)
        fn(*bound.args, **bound.kwargs)

    def _after_bindings(self, reply: Reply, result: Any) -> None:
        self.broker.storage.after_bindings_durable(lambda: reply(result))

    # ---------------------------------------------------------------- queues
    def queue_create(
        self,
        conn: Caller | None,
        reply: Reply,
        name: str,
        address: str | None = None,
        routing_type: str = "anycast",
        durable: bool = True,
        filter: str | None = None,
        max_consumers: int = -1,
        temporary: bool = False,
        exists_ok: bool = False,
        exclusive: bool | None = None,
        last_value_key: str | None = None,
        reader_only: bool = False,
    ) -> None:
        po = self.broker.require_active()
        existed = name in po.queues
        owned = getattr(conn, "temp_queues", None)
        limit = self.broker.config.max_temporary_queues_per_connection
        if temporary and owned is not None and not existed and len(owned) >= limit:
            raise ResourceLimit(
                f"this connection has {len(owned)} temporary queues (max-temporary-queues-per-connection)"
            )
        q = po.create_queue(
            name,
            address,
            _routing(routing_type),
            durable=durable,
            filter_text=filter,
            temporary=temporary,
            max_consumers=max_consumers,
            exists_ok=exists_ok,
            exclusive=exclusive,
            last_value_key=last_value_key,
            reader_only=reader_only,
        )
        if temporary and owned is not None and not existed:  # never adopt a queue this call did not make
            owned.add(q.name)
            q.owner = conn
        self._after_bindings(reply, q.stat())

    def queue_delete(self, conn: Caller | None, reply: Reply, name: str, force: bool = False) -> None:
        removed = self.broker.require_active().delete_queue(name, force=force)
        owned = getattr(conn, "temp_queues", None)
        if owned is not None:
            owned.discard(name)
        self.broker.storage.after_durable(lambda: self._after_bindings(reply, {"removed": removed}))

    def queue_purge(self, conn: Caller | None, reply: Reply, name: str) -> None:
        removed = self.broker.require_active().queue(name).purge()
        self.broker.storage.after_durable(lambda: reply({"removed": removed}))

    def queue_stat(self, conn: Caller | None, reply: Reply, name: str | None = None, detail: bool = False) -> None:
        """Every queue's counters, or one queue's; with `detail` (one queue) also its rates, the
        address settings in force and its consumers (`GET /api/queues/{name}`)."""
        po = self.broker.require_active()
        if name is not None:
            q = po.queues.get(name)
            if q is None:
                raise QueueDoesNotExist(f"queue {name!r} does not exist")
            row = q.stat()
            if detail:
                self.sample_rates()
                row["rates"] = self.rates.of(name)
                row["max_consumers"] = q.max_consumers
                row["settings"] = inventory.settings_in_force(q.settings)
                consumers = [*q.consumers, *q.browsers]
                row["consumers"] = [inventory.describe_consumer(c, self.connection_ids) for c in consumers]
            reply([row])
            return
        if detail:
            raise InvalidArgument("queue.stat: `detail` needs a queue `name`")
        reply([q.stat() for _n, q in sorted(po.queues.items())])

    def queue_list(
        self,
        conn: Caller | None,
        reply: Reply,
        name: str | None = None,
        page: int = 1,
        page_size: int = 100,
        sort: str = "name",
    ) -> None:
        """A page of queues whose names hold `name`, sorted by a stat field (`-field`: descending),
        each with its rates (`GET /api/queues`): thousands of queues come a page at a time."""
        if page < 1:
            raise InvalidArgument(f"queue.list: `page` must be >= 1, got {page}")
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidArgument(f"queue.list: `page_size` must be between 1 and {MAX_PAGE_SIZE}, got {page_size}")
        field = sort.removeprefix("-")
        if field not in QUEUE_SORT_KEYS:
            raise InvalidArgument(f"queue.list: cannot sort by {sort!r}; by: {', '.join(sorted(QUEUE_SORT_KEYS))}")
        po = self.broker.require_active()
        self.sample_rates()
        queues = [q for n, q in po.queues.items() if name is None or name in n]
        queues.sort(key=lambda q: q.name)  # ties in name order, whichever the direction
        if field != "name" or sort.startswith("-"):
            queues.sort(key=QUEUE_SORT_KEYS[field], reverse=sort.startswith("-"))
        start = (page - 1) * page_size
        items = []
        for q in queues[start : start + page_size]:
            row = q.stat()
            row["rates"] = self.rates.of(q.name)
            items.append(row)
        reply({"total": len(queues), "page": page, "page_size": page_size, "items": items})

    # ------------------------------------------------------------- addresses
    def address_create(
        self, conn: Caller | None, reply: Reply, name: str, routing_types: list[str] | None = None
    ) -> None:
        if routing_types is not None and not isinstance(routing_types, list):
            raise InvalidArgument(f"address.create: `routing_types` must be a list, got {type(routing_types).__name__}")
        rts = {_routing(t) for t in (routing_types or ["anycast"])}
        addr = self.broker.require_active().create_address(name, rts)
        self._after_bindings(reply, addr.stat())

    def address_delete(self, conn: Caller | None, reply: Reply, name: str, force: bool = False) -> None:
        self.broker.require_active().delete_address(name, force=force)
        self.broker.storage.after_durable(lambda: self._after_bindings(reply, None))

    def address_list(self, conn: Caller | None, reply: Reply) -> None:
        reply([a.stat() for _n, a in sorted(self.broker.require_active().addresses.items())])

    # ----------------------------------------------------------- connections
    def connection_list(self, conn: Caller | None, reply: Reply) -> None:
        """Every open connection, native and STOMP (`GET /api/connections`, `tandem connection list`)."""
        rows = [inventory.describe_connection(c, self.connection_ids.of(c)) for c in list(self.broker.connections)]
        reply(sorted(rows, key=lambda r: r["id"]))

    def connection_close(self, conn: Caller | None, reply: Reply, id: int) -> None:
        """Close one connection with an ERROR saying why (its client does not reconnect by itself)."""
        for c in list(self.broker.connections):
            if self.connection_ids.of(c) == id:
                who = conn.subject.user if conn is not None and conn.subject is not None else None
                by = f" by {who}" if who else ""
                if getattr(c, "detached", False):
                    c.close()  # its socket is gone already: drop the sessions it kept for a reattach
                else:
                    c.fatal(IllegalState(f"connection closed by an administrator{by} (connection.close)"))
                reply({"closed": id})
                return
        raise ConnectionDoesNotExist(f"no open connection {id} (see connection.list)")

    def consumer_list(self, conn: Caller | None, reply: Reply) -> None:
        """Every consumer and browser of every queue (`GET /api/consumers`)."""
        po = self.broker.require_active()
        busy = sorted((q for q in po.queues.values() if q.consumers or q.browsers), key=lambda q: q.name)
        reply([inventory.describe_consumer(c, self.connection_ids) for q in busy for c in [*q.consumers, *q.browsers]])

    # ---------------------------------------------------------------- broker
    def broker_status(self, conn: Caller | None, reply: Reply) -> None:
        reply(self.broker.status())

    def sample_rates(self, force: bool = False) -> None:
        """Take a sample of the queues' counters (at most one a second unless `force`)."""
        if self.broker.active:
            self.rates.sample(self.broker.postoffice.queues.values(), force)
        else:
            self.rates.clear()

    def broker_overview(self, conn: Caller | None, reply: Reply) -> None:
        """broker.status and the totals a dashboard shows first (`GET /api/overview`)."""
        out = self.broker.status()
        if self.broker.active:
            queues = self.broker.postoffice.queues.values()
            out["delivering"] = sum(q.delivering_count for q in queues)
            out["paged"] = sum(q.paged_count for q in queues)
            self.sample_rates()
        out["rates"] = self.rates.totals()
        reply(out)

    def broker_activation(self, conn: Caller | None, reply: Reply) -> None:
        """The activation sequence, this server's copy and ZooKeeper's (`tandem admin activation show`)."""
        task = asyncio.get_running_loop().create_task(self.broker.activation_info())
        self._pending.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._pending.discard(t)
            if not t.cancelled():
                reply(t.result())

        task.add_done_callback(done)

    def broker_ha(self, conn: Caller | None, reply: Reply) -> None:
        """The pair as this server sees it (`GET /api/ha`): its role and state, the servers of its
        node, replication and its lag, the activation sequence (read from ZooKeeper if coordinated)."""
        status = self.broker.status()
        keys = (
            "name",
            "node_id",
            "role",
            "ha_policy",
            "state",
            "peer",
            "replication",
            "replication_peer",
            "replication_lag",
            "coordinator",
            "activation_sequence",
            "following",
            "warm_activation",
            "active_for_s",
            "uptime_s",
        )
        out: dict[str, Any] = {k: status[k] for k in keys if k in status}
        out["active"] = self.broker.active
        out["activated_at"] = status.get("activated_at")
        # A backup serving its node took it over: when (None for a primary, which had it from the start).
        out["last_failover"] = out["activated_at"] if status.get("role") == "backup" else None
        out["members"] = self.broker.topology()
        task = asyncio.get_running_loop().create_task(self.broker.activation_info())
        self._pending.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._pending.discard(t)
            if t.cancelled():
                return
            exc = t.exception()
            info = {"error": str(exc)} if exc is not None else t.result()
            out["activation"] = {k: v for k, v in info.items() if k not in out}
            reply(out)

        task.add_done_callback(done)

    def broker_journal(self, conn: Caller | None, reply: Reply, max_files: int = 100) -> None:
        """The store's journals (`GET /api/journal`): files, sizes, live records, compactions; its
        page files per paged address and its large messages' files (at most `max_files` listed
        per store, every file counted). The files are listed and sized in a worker thread."""
        if not 0 <= max_files <= MAX_FILES_LISTED:
            raise InvalidArgument(
                f"broker.journal: argument `max_files` must be 0 to {MAX_FILES_LISTED}, got {max_files}"
            )
        po = self.broker.require_active()
        storage = self.broker.storage
        if not isinstance(storage, JournalStorage):  # persistence-enabled = false
            reply({"persistence": False, "journals": {}})
            return
        out: dict[str, Any] = {
            "persistence": True,
            "data_directory": str(self.broker.config.data_path),
            "journals": {j.prefix: inventory.journal_info(j) for j in storage.journals},
        }
        paging_dir, large_dir = storage.pages.directory, storage.large.directory
        pagers = inventory.page_store_memory(po.addresses.values())  # on the loop, before the listing
        large_records = len(storage.large.records)

        def scan() -> tuple[dict[str, Any], dict[str, Any]]:  # a worker thread: the filesystem only
            paging = inventory.paging_info(paging_dir, pagers, disk_usage.scan_pages(paging_dir), max_files)
            return paging, disk_usage.scan_large(large_dir, max_files)

        def done(f: asyncio.Future[tuple[dict[str, Any], dict[str, Any]]]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                out["paging"] = out["large_messages"] = {"error": str(exc)}
            else:
                out["paging"], files = f.result()
                out["large_messages"] = {"directory": str(large_dir), "messages": large_records, **files}
            reply(out)

        asyncio.get_running_loop().run_in_executor(None, scan).add_done_callback(done)

    def broker_stop(self, conn: Caller | None, reply: Reply, failover: bool = False) -> None:
        """Stop the broker: cleanly (state P: no failover) or leaving state L so its backup takes over."""
        reply({"stopping": True, "failover": failover})
        asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(self.broker.stop(failover)))

    def tx_status(self, conn: Caller | None, reply: Reply, dedup_id: str) -> None:
        """Was a transaction with this dedup id committed? (A client asks after a commit lost in a failover.)"""
        user = getattr(getattr(conn, "subject", None), "user", None)
        seen = self.broker.require_active().transaction_seen(tx_key(user, dedup_id))
        # "Committed" must hold after a crash: answer once that commit (if still in flight) is durable.
        self.broker.storage.after_durable(lambda: reply(seen))

    def cluster_announce(
        self, conn: Caller | None, reply: Reply, user: str, password: str, node_id: str, connector: str
    ) -> None:
        """A waiting server of the same store tells us where it is; we pass it on to clients."""
        self.broker.require_active()
        from .native import NativeConnection

        cfg = self.broker.config
        if not is_cluster_pair(cfg, user, password):
            refused = Unauthorized("cluster.announce: wrong cluster-user or cluster-password")
            if isinstance(conn, NativeConnection):
                # Closed, and counted as a failed login: each guess costs a new, slowed one.
                self.broker.authenticator.refused(user, conn.peer, "native (cluster.announce)")
                conn.fatal(refused)
            raise refused  # (audited as refused by `handle`)
        if node_id != self.broker.node_id:
            raise InvalidArgument(f"cluster.announce: node {node_id} is not this store's node {self.broker.node_id}")
        if not isinstance(conn, NativeConnection):
            raise InvalidArgument("cluster.announce needs a native connection")
        self.broker.backup_announced(conn, connector)
        reply(self.broker.topology())

    # ----------------------------------------------- queue operations (issue 18, decisions 0066/0067)
    BROWSE_SECONDS = 20.0  # a browse answers with what it found by then (pages it waits for)
    TRANSFER_SECONDS = 600.0  # a move or retry stops by then: what is moved stays moved

    def _queue_ops(self) -> dict[str, Callable[..., Any]]:
        return {
            "queue.browse": self.queue_browse,
            "queue.move": self.queue_move,
            "queue.retry": self.queue_retry,
            "queue.pause": self.queue_pause,
            "queue.resume": self.queue_resume,
        }

    def _accept(self, op: str, selector: str | None) -> queueops.Accept | None:
        if not selector:
            return None
        try:
            return self.broker.require_active().compile_filter(selector).matches
        except InvalidSelector as exc:
            raise InvalidSelector(f"{op}: argument `selector`: {exc.message}") from None

    def queue_browse(
        self,
        conn: Caller | None,
        reply: Reply,
        name: str,
        count: int = 20,
        selector: str | None = None,
        preview: int = 256,
    ) -> None:
        """Up to `count` (at most 1000) queued messages, memory then pages, with a body preview of
        `preview` bytes (at most 64 KiB); nothing moves."""
        if count < 0:
            raise InvalidArgument(f"queue.browse: argument `count` must be 0 or more, got {count}")
        if not 0 <= preview <= MAX_PREVIEW:
            raise InvalidArgument(f"queue.browse: argument `preview` must be 0 to {MAX_PREVIEW}, got {preview}")
        po = self.broker.require_active()
        q = po.queue(name)
        peek = queueops.Peek(po, q, count, self._accept("queue.browse", selector))
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.BROWSE_SECONDS, peek.stop)

        def found(refs: list[tuple[MessageRef, bool]]) -> None:
            timer.cancel()
            rows = [describe(ref, paged, preview) for ref, paged in refs]
            large = [(i, ref.message) for i, (ref, _p) in enumerate(refs) if ref.message.large is not None]
            store = getattr(self.broker.storage, "large", None)
            if not large or not preview or store is None:
                reply(rows)
                return

            def read() -> None:  # a worker thread: the messages held here keep their files
                for i, m in large:
                    lg = m.large
                    assert lg is not None
                    try:
                        rows[i].update(large_preview(store.path(lg.name), lg.size, lg.compressed, preview))
                    except OSError as exc:
                        rows[i]["preview_error"] = str(exc)

            task = loop.run_in_executor(None, read)
            task.add_done_callback(lambda _f: reply(rows))

        peek.start(found)

    def _transfer(self, reply: Reply, t: queueops.Transfer, key: str) -> None:
        timer = asyncio.get_running_loop().call_later(self.TRANSFER_SECONDS, t.stop)

        def done(result: dict[str, Any]) -> None:
            timer.cancel()
            result[key] = result.pop("moved")
            self.broker.storage.after_durable(lambda: reply(result))

        t.start(done)

    def queue_move(
        self,
        conn: Caller | None,
        reply: Reply,
        name: str,
        to: str,
        selector: str | None = None,
        copy: bool = False,
        limit: int | None = None,
    ) -> None:
        """Move (or `copy`) queued messages matching `selector` to the address `to`: each copy is
        routed and its original acknowledged in one transaction; messages in delivery stay."""
        if limit is not None and limit < 0:
            raise InvalidArgument(f"queue.move: argument `limit` must be 0 or more, got {limit}")
        try:
            check_name("address", to)
        except InvalidArgument as exc:
            raise InvalidArgument(f"queue.move: argument `to`: {exc.message}") from None
        po = self.broker.require_active()
        q = po.queue(name)
        if to == q.address:
            raise InvalidArgument(f"queue.move: queue {name!r} is on address {to!r} already")
        accept = self._accept("queue.move", selector)
        plan = queueops.move_plan(po, q, to)
        t = queueops.Transfer(po, q, plan, accept, -1 if limit is None else limit, keep=copy)
        self._transfer(reply, t, "copied" if copy else "moved")

    def queue_retry(self, conn: Caller | None, reply: Reply, name: str, selector: str | None = None) -> None:
        """Send dead letters (or expired messages) of queue `name` back to their original address."""
        po = self.broker.require_active()
        q = po.queue(name)
        t = queueops.Transfer(po, q, queueops.retry_plan(po, q), self._accept("queue.retry", selector))
        self._transfer(reply, t, "retried")

    def queue_pause(self, conn: Caller | None, reply: Reply, name: str) -> None:
        """Deliver nothing more to the queue's consumers until resumed; kept across restarts."""
        self._set_paused(reply, name, True)

    def queue_resume(self, conn: Caller | None, reply: Reply, name: str) -> None:
        self._set_paused(reply, name, False)

    def _set_paused(self, reply: Reply, name: str, paused: bool) -> None:
        q = self.broker.require_active().queue(name)
        q.set_paused(paused)
        self._after_bindings(reply, {"name": name, "paused": q.paused})
