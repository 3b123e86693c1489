"""The clients of a chaos run: producers and consumers on one event loop, each on its own connection.

exactly-once mode (duplicate detection and transactions, the product's guarantee 2):
- senders: durable sends; half give each value a duplicate id of its own (its body) and send
  it again under that id when the outcome is unknown (a bounded number of times), half leave
  the id to the client (`auto_dedup`: it sends unconfirmed messages again after a failover by
  itself) and never send a value twice;
- transactional producers: batches of sends in a transaction; a commit whose outcome is unknown
  is redone and retried under its transaction id (`retry_commit`), as docs/client.md shows;
- transacted consumers: receive a few, commit; an unknown commit is resolved by asking
  (`retry_commit()` with nothing done);
- auto-acknowledging consumers: plain `receive` (their acknowledgements are never confirmed).

at-least-once mode (no duplicate ids, no transactions): senders without ids that send again
after an unknown outcome, auto-acknowledging consumers, and consumers that await each ack.

Both modes: pipelining senders, `send_nowait` without an id (not replayable) with up to
PIPELINE sends in flight, so that a fault catches sends written and unconfirmed, or written
while the client is between servers; each must end confirmed (and then be delivered) or
unknown. They never send a value twice.

Every operation goes to the history (history.py) before and after it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from .. import aio
from ..errors import (
    CallTimeout,
    ConnectionLost,
    IllegalState,
    StaleAcknowledge,
    TandemError,
    TransactionOutcomeUnknown,
    TransactionRolledBack,
)
from . import store as stores
from .history import History

QUEUE = "chaos"
RETRIES = 8  # sends of one value, or retries of one commit, before its outcome stays unknown
PIPELINE = 16  # a pipelining sender's sends in flight
PRODUCERS = "spt"  # the first letters of the producing clients' names
CLIENT_OPTIONS: dict[str, Any] = {
    "reconnect_attempts": -1,
    "retry_interval": 100,
    "max_retry_interval": 500,
    "client_failure_check_period": 1500,
    "connect_timeout": 1000,
    "call_timeout": 8000,
    # A session the client left behind (a blackholed link) keeps its unacknowledged messages until
    # the broker's TTL for it expires: short, so they come again before the drain ends.
    "connection_ttl": 4000,
}


@dataclass
class Shape:
    """How many clients of each kind, and how fast the producers go."""

    mode: str = "exactly-once"
    senders: int = 2
    pipelined: int = 1
    tx_producers: int = 2
    tx_consumers: int = 2
    auto_consumers: int = 2
    batch: int = 5  # sends per producer transaction, deliveries per consumer commit
    rate: float = 40.0  # values per second per producer
    store: str = "plain"  # store pressure (store.py): plain, paging or large

    def __post_init__(self) -> None:
        if self.mode == "at-least-once":
            self.senders += self.tx_producers
            self.tx_producers = 0


def _err(exc: BaseException) -> str:
    return getattr(getattr(exc, "code", None), "name", None) or type(exc).__name__


class Workload:
    """Starts the clients on the running loop; `stop_producers()`, then `stop_consumers()`."""

    def __init__(self, url: str, history: History, shape: Shape) -> None:
        self.url = url
        self.h = history
        self.shape = shape
        self.dedup = shape.mode == "exactly-once"
        self.options = {**CLIENT_OPTIONS, **stores.client_options(shape.store)}
        self.started = time.monotonic()
        self.producing = True
        self.consuming = True
        self.confirmed: set[str] = set()
        self.delivered: set[str] = set()
        self.last_delivery = time.monotonic()
        self.tasks: list[asyncio.Task[None]] = []
        self.counters: dict[str, int] = {}

    # ------------------------------------------------------------ life
    async def start(self) -> None:
        conn = await aio.connect(self.url, **self.options)
        try:
            session = await conn.create_session()
            await session.create_queue(QUEUE, exists_ok=True)
        finally:
            await conn.close()
        s = self.shape
        for i in range(s.senders):
            self._spawn(f"s{i}", self._sender)
        for i in range(s.pipelined):
            self._spawn(f"p{i}", self._pipelined_sender)
        for i in range(s.tx_producers):
            self._spawn(f"t{i}", self._tx_producer)
        for i in range(s.tx_consumers if self.dedup else 0):
            self._spawn(f"c{i}", self._tx_consumer)
        for i in range(s.auto_consumers):
            self._spawn(f"a{i}", self._auto_consumer)
        for i in range(0 if self.dedup else s.tx_consumers):
            self._spawn(f"k{i}", self._client_ack_consumer)

    def _spawn(self, name: str, work: Callable[[str, aio.AsyncConnection], Awaitable[None]]) -> None:
        self.tasks.append(asyncio.create_task(self._client(name, work), name=name))

    async def _client(self, name: str, work: Callable[[str, aio.AsyncConnection], Awaitable[None]]) -> None:
        """One client: connect, work; on a connection lost for good, connect again."""
        options = {**self.options, "auto_dedup": self.dedup and name[0] != "p"}
        while self.producing if name[0] in PRODUCERS else self.consuming:
            try:
                conn = await asyncio.wait_for(aio.connect(self.url, **options), 30)
            except (TandemError, OSError, TimeoutError) as exc:
                self.h.add("note", name, msg=f"connect failed: {_err(exc)}")
                await asyncio.sleep(0.5)
                continue
            try:
                await work(name, conn)
            except TandemError as exc:
                self.h.add("note", name, msg=f"client restarts: {_err(exc)} {exc}")
            except Exception as exc:  # a bug of the harness: on record, and the client goes on
                self.h.add("note", name, msg=f"client failed: {exc!r}")
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), 5)

    def stop_producers(self) -> None:
        self.producing = False

    def stop_consumers(self) -> None:
        self.consuming = False

    async def wait(self, timeout: float) -> None:
        """Until every client has finished (bounded); stragglers are cancelled."""
        _, pending = await asyncio.wait(self.tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _next(self, name: str) -> str:
        """A value never used before in this run (a client's count survives its reconnections)."""
        n = self.counters.get(name, 0)
        self.counters[name] = n + 1
        return f"{name}-{n}"

    def _body(self, v: str) -> str:
        return stores.body_of(self.shape.store, v)

    async def _pause(self) -> None:
        """While producers run, a paging run's consumers all stop now and then (store.paused), so
        that a backlog forms in the pages; bounded by the pause's length."""
        if self.producing and self.consuming:
            await asyncio.sleep(stores.pause_left(self.shape.store, time.monotonic() - self.started))

    async def _pace(self, started: float, values: int) -> None:
        await asyncio.sleep(max(0.0, values / self.shape.rate - (time.monotonic() - started)))

    # ------------------------------------------------------------ producers
    async def _sender(self, name: str, conn: aio.AsyncConnection) -> None:
        prod = (await conn.create_session()).create_producer(QUEUE)
        # Exactly-once: even senders give each value its own id and send it again under that id
        # after an unknown outcome; odd ones leave the id to the client (auto_dedup), which sends
        # unconfirmed messages again by itself after a failover, and never send a value twice.
        own_id = self.dedup and int(name[1:]) % 2 == 0
        tries = RETRIES if own_id or not self.dedup else 1
        while self.producing:
            v = self._next(name)
            t0 = time.monotonic()
            for _ in range(tries):
                self.h.add("attempt", name, [v])
                a0 = time.monotonic()
                try:
                    if own_id:
                        await prod.send(self._body(v), dedup_id=v)
                    else:
                        await prod.send(self._body(v))
                except TandemError as exc:
                    self.h.add("info", name, [v], err=_err(exc))
                    if conn.closed:
                        raise
                    continue
                self.h.add("ok", name, [v], lat=round(time.monotonic() - a0, 4))
                self.confirmed.add(v)
                break
            await self._pace(t0, 1)

    async def _pipelined_sender(self, name: str, conn: aio.AsyncConnection) -> None:
        prod = (await conn.create_session()).create_producer(QUEUE)
        loop = asyncio.get_running_loop()
        inflight: set[asyncio.Future[None]] = set()

        def settled(v: str, a0: float, fut: asyncio.Future[None]) -> None:
            inflight.discard(fut)
            exc = fut.exception() if not fut.cancelled() else ConnectionLost("cancelled")
            if exc is None:
                self.h.add("ok", name, [v], lat=round(loop.time() - a0, 4))
                self.confirmed.add(v)
            else:  # written, or perhaps not: unknown either way (never sent again)
                self.h.add("info", name, [v], err=_err(exc))

        try:
            while self.producing:
                while len(inflight) >= PIPELINE:
                    await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                v = self._next(name)
                t0 = time.monotonic()
                self.h.add("attempt", name, [v])
                try:
                    fut = prod.send_nowait(self._body(v))
                except TandemError as exc:  # refused before anything was written
                    self.h.add("fail", name, [v], err=_err(exc))
                    if conn.closed:
                        raise
                    await asyncio.sleep(0.1)
                    continue
                assert fut is not None
                inflight.add(fut)
                fut.add_done_callback(partial(settled, v, loop.time()))
                await self._pace(t0, 1)
        finally:
            if inflight:  # the last ones settle (or the connection's close fails them: unknown)
                await asyncio.wait(inflight, timeout=10)

    async def _tx_producer(self, name: str, conn: aio.AsyncConnection) -> None:
        session = await conn.create_session(transacted=True)
        prod = session.create_producer(QUEUE)
        while self.producing:
            tx = self._next(name)
            vs = [f"{tx}-{k}" for k in range(self.shape.batch)]
            t0 = time.monotonic()
            self.h.add("attempt", name, vs)
            try:
                for v in vs:
                    await prod.send(self._body(v))
            except TandemError as exc:  # the commit is never sent: nothing of it is applied
                with contextlib.suppress(TandemError):
                    await session.rollback()
                self.h.add("fail", name, vs, err=_err(exc))
                if conn.closed:
                    raise
                continue
            try:
                await session.commit()
            except TransactionOutcomeUnknown as exc:
                self.h.add("info", name, vs, err=_err(exc))
                if await self._redo_and_retry(name, session, prod.send, vs):
                    self.h.add("ok", name, vs, lat=round(time.monotonic() - t0, 4), retried=True)
                    self.confirmed.update(vs)
            except TransactionRolledBack as exc:  # DuplicateId too: the broker says it applied nothing
                self.h.add("fail", name, vs, err=_err(exc))
            except TandemError as exc:  # anything else from a commit that was sent: unknown
                self.h.add("info", name, vs, err=_err(exc))
                if conn.closed:
                    raise
            else:
                self.h.add("ok", name, vs, lat=round(time.monotonic() - t0, 4))
                self.confirmed.update(vs)
            await self._pace(t0, len(vs))

    async def _redo_and_retry(
        self, name: str, session: aio.AsyncSession, send: Callable[[str], Awaitable[Any]], vs: list[str]
    ) -> bool:
        """The same sends again, committed under the unknown commit's id: applied once either way."""
        for _ in range(RETRIES):
            try:
                for v in vs:
                    await send(self._body(v))
                await session.retry_commit()
                return True
            except IllegalState as exc:  # nothing to retry under
                self.h.add("note", name, msg=f"retry_commit: {exc}")
                return False
            except TandemError:
                await asyncio.sleep(0.2)
        return False

    # ------------------------------------------------------------ consumers
    def _delivered(self, name: str, v: str, ack: str, redelivered: bool) -> None:
        self.h.add("deliver", name, [v], ack=ack, **({"re": True} if redelivered else {}))
        self.delivered.add(v)
        self.last_delivery = time.monotonic()

    async def _tx_consumer(self, name: str, conn: aio.AsyncConnection) -> None:
        session = await conn.create_session(transacted=True)
        consumer = await session.create_consumer(QUEUE)
        batch: list[str] = []
        try:
            while self.consuming or batch:
                msg = None
                if not batch:
                    await self._pause()
                if self.consuming:
                    try:
                        msg = await consumer.receive(0.3)
                    except (ConnectionLost, CallTimeout):
                        if conn.closed:
                            raise
                        # a receive that crossed a failover: the transaction is rollback-only,
                        # and its next commit says so
                        continue
                if msg is not None:
                    v = stores.value_of(msg.body)
                    self._delivered(name, v, "tx", msg.redelivered)
                    batch.append(v)
                if not batch or (len(batch) < self.shape.batch and msg is not None):
                    continue
                try:
                    await session.commit()
                except TransactionRolledBack as exc:
                    self.h.add("ack-fail", name, batch, err=_err(exc))
                except TransactionOutcomeUnknown as exc:
                    self.h.add("ack-info", name, batch, err=_err(exc))
                    applied = await self._ask(name, session)
                    if applied is not None:
                        self.h.add("ack" if applied else "ack-fail", name, batch, resolved=True)
                except TandemError as exc:  # sent, no clear answer: unknown
                    self.h.add("ack-info", name, batch, err=_err(exc))
                    batch = []
                    if conn.closed:
                        raise
                else:
                    self.h.add("ack", name, batch)
                batch = []
        finally:
            if batch:  # the connection is gone: the broker rolls the transaction back
                self.h.add("ack-fail", name, batch, err="connection closed")

    async def _ask(self, name: str, session: aio.AsyncSession) -> bool | None:
        """Whether a commit whose answer was lost went through: an empty commit under its id."""
        for _ in range(RETRIES):
            try:
                return not await session.retry_commit()
            except IllegalState as exc:
                self.h.add("note", name, msg=f"retry_commit: {exc}")
                return None
            except TandemError:
                await asyncio.sleep(0.2)
        return None

    async def _auto_consumer(self, name: str, conn: aio.AsyncConnection) -> None:
        consumer = await (await conn.create_session()).create_consumer(QUEUE)
        while self.consuming:
            await self._pause()
            try:
                msg = await consumer.receive(0.3)
            except (ConnectionLost, CallTimeout):
                if conn.closed:
                    raise
                continue
            if msg is not None:
                self._delivered(name, stores.value_of(msg.body), "auto", msg.redelivered)

    async def _client_ack_consumer(self, name: str, conn: aio.AsyncConnection) -> None:
        consumer = await (await conn.create_session(ack_mode="individual")).create_consumer(QUEUE)
        while self.consuming:
            await self._pause()
            try:
                msg = await consumer.receive(0.3)
            except (ConnectionLost, CallTimeout):
                if conn.closed:
                    raise
                continue
            if msg is None:
                continue
            v = stores.value_of(msg.body)
            self._delivered(name, v, "client", msg.redelivered)
            try:
                await msg.ack()
            except StaleAcknowledge as exc:
                self.h.add("ack-fail", name, [v], err=_err(exc))
            except TandemError as exc:
                self.h.add("ack-info", name, [v], err=_err(exc))
                if conn.closed:
                    raise
            else:
                self.h.add("ack", name, [v])


async def drain(url: str, history: History, quiet: float = 5.0, limit: float = 60.0, store: str = "plain") -> int:
    """After the run: a transacted consumer takes what is left until `quiet` seconds pass
    without a message (at most `limit`); returns how many it took."""
    conn = await aio.connect(url, **CLIENT_OPTIONS, **stores.client_options(store))
    taken = 0
    deadline = time.monotonic() + limit
    try:
        session = await conn.create_session(transacted=True)
        consumer = await session.create_consumer(QUEUE)
        batch: list[str] = []
        while time.monotonic() < deadline:
            try:
                msg = await consumer.receive(quiet)
                if msg is not None:
                    v = stores.value_of(msg.body)
                    history.add("deliver", "d", [v], ack="tx", **({"re": True} if msg.redelivered else {}))
                    batch.append(v)
                if batch and (len(batch) >= 50 or msg is None):
                    await session.commit()
                    history.add("ack", "d", batch)
                    taken += len(batch)
                    batch = []
                if msg is None:
                    break
            except TransactionRolledBack as exc:
                history.add("ack-fail", "d", batch, err=_err(exc))
                batch = []
            except TransactionOutcomeUnknown as exc:
                history.add("ack-info", "d", batch, err=_err(exc))
                batch = []
            except (ConnectionLost, CallTimeout):
                if conn.closed:
                    raise
        return taken
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 5)


async def queue_stat(url: str, timeout: float = 30.0) -> dict[str, Any] | None:
    """The queue's `queue.stat` row, None if no server says within `timeout` seconds."""

    async def ask() -> dict[str, Any]:
        conn = await aio.connect(url, **CLIENT_OPTIONS)
        try:
            return dict((await conn.manage("queue.stat", name=QUEUE))[0])
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)

    try:
        return await asyncio.wait_for(ask(), timeout)
    except (TandemError, OSError, TimeoutError, LookupError, TypeError, ValueError):
        return None


async def left_in_queue(url: str) -> int | None:
    """Messages the queue still holds (`queue.stat`), None if the server does not say."""
    row = await queue_stat(url)
    try:
        return None if row is None else int(row["message_count"])
    except (LookupError, TypeError, ValueError):
        return None
