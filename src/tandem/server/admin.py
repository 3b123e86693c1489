"""Management operations, reachable over the native protocol (MANAGE packets) and the CLI."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import msgspec

from ..core import queueops
from ..core.message import MessageRef, RoutingType
from ..core.postoffice import check_name
from ..errors import InvalidArgument, InvalidSelector, QueueDoesNotExist, TandemError, Unauthorized
from .audit import audit
from .authorization import authorize_management
from .queue_view import MAX_PREVIEW, describe, large_preview
from .security import is_cluster_pair

if TYPE_CHECKING:
    from .context import BrokerContext
    from .native import NativeConnection

Reply = Callable[[Any], None]


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
        self._ops: dict[str, Callable[..., Any]] = {
            "queue.create": self.queue_create,
            "queue.delete": self.queue_delete,
            "queue.purge": self.queue_purge,
            "queue.stat": self.queue_stat,
            "address.create": self.address_create,
            "address.delete": self.address_delete,
            "address.list": self.address_list,
            "broker.status": self.broker_status,
            "broker.activation": self.broker_activation,
            "broker.stop": self.broker_stop,
            "cluster.announce": self.cluster_announce,
            "tx.status": self.tx_status,
            **self._queue_ops(),
        }

    @property
    def ops(self) -> list[str]:
        return sorted(self._ops)

    def handle(self, op: str, args: dict[str, Any], conn: NativeConnection | None, reply: Reply) -> None:
        """Run `op`; every attempt, known or not, goes to the audit log (server/audit.py)."""
        subject = getattr(conn, "subject", None)
        peer = getattr(conn, "peer", "local")
        target = args.get("name", args.get("dedup_id"))
        try:
            self._run(op, args, conn, reply)
        except TandemError as exc:
            # A permission denial is "not allowed"; any other failure was allowed and failed.
            audit(op, subject, peer, target, not isinstance(exc, Unauthorized), error=exc.code.name)
            raise
        audit(op, subject, peer, target, True)

    def _run(self, op: str, args: dict[str, Any], conn: NativeConnection | None, reply: Reply) -> None:
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
        access = getattr(conn, "access", None)  # None: security off, or not over a connection
        if access is not None:
            authorize_management(access, self.broker.require_active, op, checked)
        fn(*bound.args, **bound.kwargs)

    def _after_bindings(self, reply: Reply, result: Any) -> None:
        self.broker.storage.after_bindings_durable(lambda: reply(result))

    # ---------------------------------------------------------------- queues
    def queue_create(
        self,
        conn: NativeConnection | None,
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
        q = self.broker.require_active().create_queue(
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
        if temporary and conn is not None:
            conn.temp_queues.add(q.name)
            q.owner = conn
        self._after_bindings(reply, q.stat())

    def queue_delete(self, conn: NativeConnection | None, reply: Reply, name: str, force: bool = False) -> None:
        removed = self.broker.require_active().delete_queue(name, force=force)
        if conn is not None:
            conn.temp_queues.discard(name)
        self.broker.storage.after_durable(lambda: self._after_bindings(reply, {"removed": removed}))

    def queue_purge(self, conn: NativeConnection | None, reply: Reply, name: str) -> None:
        removed = self.broker.require_active().queue(name).purge()
        self.broker.storage.after_durable(lambda: reply({"removed": removed}))

    def queue_stat(self, conn: NativeConnection | None, reply: Reply, name: str | None = None) -> None:
        po = self.broker.require_active()
        if name is not None:
            if name not in po.queues:
                raise QueueDoesNotExist(f"queue {name!r} does not exist")
            reply([po.queues[name].stat()])
            return
        reply([q.stat() for _n, q in sorted(po.queues.items())])

    # ------------------------------------------------------------- addresses
    def address_create(
        self, conn: NativeConnection | None, reply: Reply, name: str, routing_types: list[str] | None = None
    ) -> None:
        if routing_types is not None and not isinstance(routing_types, list):
            raise InvalidArgument(f"address.create: `routing_types` must be a list, got {type(routing_types).__name__}")
        rts = {_routing(t) for t in (routing_types or ["anycast"])}
        addr = self.broker.require_active().create_address(name, rts)
        self._after_bindings(reply, addr.stat())

    def address_delete(self, conn: NativeConnection | None, reply: Reply, name: str, force: bool = False) -> None:
        self.broker.require_active().delete_address(name, force=force)
        self.broker.storage.after_durable(lambda: self._after_bindings(reply, None))

    def address_list(self, conn: NativeConnection | None, reply: Reply) -> None:
        reply([a.stat() for _n, a in sorted(self.broker.require_active().addresses.items())])

    # ---------------------------------------------------------------- broker
    def broker_status(self, conn: NativeConnection | None, reply: Reply) -> None:
        reply(self.broker.status())

    def broker_activation(self, conn: NativeConnection | None, reply: Reply) -> None:
        """The activation sequence, this server's copy and ZooKeeper's (`tandem admin activation show`)."""
        task = asyncio.get_running_loop().create_task(self.broker.activation_info())
        self._pending.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._pending.discard(t)
            if not t.cancelled():
                reply(t.result())

        task.add_done_callback(done)

    def broker_stop(self, conn: NativeConnection | None, reply: Reply, failover: bool = False) -> None:
        """Stop the broker: cleanly (state P: no failover) or leaving state L so its backup takes over."""
        reply({"stopping": True, "failover": failover})
        asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(self.broker.stop(failover)))

    def tx_status(self, conn: NativeConnection | None, reply: Reply, dedup_id: str) -> None:
        """Was a transaction with this dedup id committed? (A client asks after a commit lost in a failover.)"""
        seen = self.broker.require_active().transaction_seen(dedup_id)
        # "Committed" must hold after a crash: answer once that commit (if still in flight) is durable.
        self.broker.storage.after_durable(lambda: reply(seen))

    def cluster_announce(
        self, conn: NativeConnection | None, reply: Reply, user: str, password: str, node_id: str, connector: str
    ) -> None:
        """A waiting server of the same store tells us where it is; we pass it on to clients."""
        self.broker.require_active()
        cfg = self.broker.config
        if not is_cluster_pair(cfg, user, password):
            refused = Unauthorized("cluster.announce: wrong cluster-user or cluster-password")
            if conn is not None:  # closed, and counted as a failed login: each guess costs a new, slowed one
                self.broker.authenticator.refused(user, conn.peer, "native (cluster.announce)")
                conn.fatal(refused)
                return
            raise refused
        if node_id != self.broker.node_id:
            raise InvalidArgument(f"cluster.announce: node {node_id} is not this store's node {self.broker.node_id}")
        if conn is None:
            raise InvalidArgument("cluster.announce needs a connection")
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
        conn: NativeConnection | None,
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
        conn: NativeConnection | None,
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

    def queue_retry(self, conn: NativeConnection | None, reply: Reply, name: str, selector: str | None = None) -> None:
        """Send dead letters (or expired messages) of queue `name` back to their original address."""
        po = self.broker.require_active()
        q = po.queue(name)
        t = queueops.Transfer(po, q, queueops.retry_plan(po, q), self._accept("queue.retry", selector))
        self._transfer(reply, t, "retried")

    def queue_pause(self, conn: NativeConnection | None, reply: Reply, name: str) -> None:
        """Deliver nothing more to the queue's consumers until resumed; kept across restarts."""
        self._set_paused(reply, name, True)

    def queue_resume(self, conn: NativeConnection | None, reply: Reply, name: str) -> None:
        self._set_paused(reply, name, False)

    def _set_paused(self, reply: Reply, name: str, paused: bool) -> None:
        q = self.broker.require_active().queue(name)
        q.set_paused(paused)
        self._after_bindings(reply, {"name": name, "paused": q.paused})
