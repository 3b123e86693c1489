"""Sessions, producers and consumers (asyncio API), and how each rides through a failover.

After a failover a session is recreated on the new server with its consumers
(same filters and windows) and temporary queues. Messages delivered by the
old server and not acknowledged come again from the new one; acknowledging an
old delivery raises StaleAcknowledge (it did nothing: the message comes again). A transaction that
had work when the connection failed can only be rolled back; a commit that was
in flight has an unknown outcome (TransactionOutcomeUnknown): the application
does the work again and `retry_commit()` commits it under the same transaction
id, which the broker answers "already committed" if the first one went through.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from ..core.message import MessageData
from ..errors import (
    CallTimeout,
    ConnectionLost,
    IllegalState,
    InvalidArgument,
    NotConnected,
    ProtocolError,
    StaleAcknowledge,
    TandemError,
    TransactionOutcomeUnknown,
    TransactionRolledBack,
    Unblocked,
)
from ..protocol import native as p
from .large import LargeBody, Rewind, Source, body_size, pieces
from .message import Message, ReceivedMessage
from .range import RANGE_READ_ATTEMPTS, RECORDS_BODY_LIMIT, RangeBodies

if TYPE_CHECKING:
    from .connection import AsyncConnection, Channel, Pending

log = logging.getLogger("tandem.client")
_closing: set[asyncio.Task[None]] = set()  # consumers being closed in the background (held: a task needs a reference)

ACK_MODES = ("auto", "client", "individual")
_NOT_RESTORED = "not sent: its session is not restored yet after a connection loss (send it again once connected)"
_PARKED = "the send was waiting to be sent again after a connection loss; its outcome is unknown"
_UNREPLAYABLE = "sent while the connection was failing over and not replayable; its outcome is unknown"
# Consumed bytes go back as credit once they reach a quarter of the window: at half, a consumer
# of a busy broker sat with an empty window while its credit waited for a turn (4+4 p99 halved).
_CREDIT_RETURN_PART = 4
_decode_data = msgspec.msgpack.Decoder(MessageData).decode
_encode = msgspec.msgpack.Encoder().encode

Listener = Callable[[ReceivedMessage], Any]
SendCallback = Callable[[BaseException | None], None]
Frames = list[bytes | bytearray]  # encoded frames held back to go out with a later one
# Artemis's SendAcknowledgementHandler: (the message sent, None once confirmed or the error).
SendAckHandler = Callable[[Message, BaseException | None], Any]


def _size(msg: Message) -> int:
    body = msg.body
    return len(body.encode()) if isinstance(body, str) else len(body)


def as_message(body: Message | bytes | str, **fields: Any) -> Message:
    if isinstance(body, Message):
        if fields:
            raise InvalidArgument("pass either a Message or a body with keyword fields, not both")
        return body
    if not isinstance(body, (bytes, bytearray, memoryview, str)):
        raise InvalidArgument(f"message body must be bytes or str, got {type(body).__name__}")
    return Message(body if isinstance(body, str) else bytes(body), **fields)


class RangeRead(NamedTuple):
    first_seq: int  # lowest sequence still in the queue (last_seq + 1 when empty)
    last_seq: int  # highest sequence given out so far
    messages: list[ReceivedMessage]


class AsyncSession:
    def __init__(self, conn: AsyncConnection, channel: Channel, transacted: bool, ack_mode: str) -> None:
        if ack_mode not in ACK_MODES:
            raise InvalidArgument(f"ack_mode must be one of {', '.join(ACK_MODES)}, got {ack_mode!r}")
        self.conn = conn
        self.channel = channel
        self.transacted = transacted
        self.ack_mode = ack_mode
        self.consumers: dict[int, AsyncConsumer] = {}
        self.producers: list[AsyncProducer] = []
        self.temp_queues: dict[str, dict[str, Any]] = {}
        self._consumer_ids = itertools.count(1)
        self._tx_ids = itertools.count(1)
        self._tx_work = False  # the open transaction has sent or acknowledged something
        self._rollback_only = False
        self.unresolved_commit: str | None = None  # id of the last commit whose outcome is unknown
        self._resend: list[Pending] = []  # sends with a dedup id, parked until the session is on a server again
        # The server lost this session with the link (set by _unblock), until a restore has
        # created it again: sends on its channel wait for that restore meanwhile.
        self._unrestored = False
        self._restore_begun = False  # its restore's CREATE_SESSION is written: frames after it are valid
        # Set while the server has this session or its restore has begun: a call waits for it.
        self._callable = asyncio.Event()
        self._callable.set()
        self.send_ack_handler: SendAckHandler | None = None
        self.closed = False
        self.sending_large = False  # a large message's chunks are going out (one at a time per session)
        # Large sends begun on a link and not answered yet: their chunks are not kept for a
        # reattach, so a connection lost meanwhile reconnects instead (the send starts again from
        # its start). One written while away is kept whole (`_send_large_now`): not counted.
        self.large_open = 0
        self._large_done: asyncio.Future[None] | None = None
        self._range_reads: dict[int, RangeBodies] = {}  # by READ_RANGE command id: answers and bodies arriving

    def set_send_acknowledgement_handler(self, handler: SendAckHandler | None) -> None:
        """Confirm sends asynchronously: from now on a producer's `send()` of this session returns
        once the message is written, and `handler(message, error)` is called on the client's
        event loop when the broker confirms it (`error` None: durable sends are on disk) or
        refuses it. Needs `confirmation_window_size` (as Artemis): a send written before a
        network failure is then replayed by the reattach, so the confirmation still comes.
        `None` makes `send()` wait again."""
        if handler is not None and self.conn.window <= 0:
            raise IllegalState("a send-acknowledgement handler needs a confirmation window (confirmation_window_size)")
        self.send_ack_handler = handler

    # --------------------------------------------------------------- factories
    def create_producer(self, address: str | None = None, window: int | None = None) -> AsyncProducer:
        self._check()
        if window is not None and window < 1:
            raise InvalidArgument(f"producer window must be >= 1 unconfirmed sends, got {window}")
        prod = AsyncProducer(self, address, window or self.conn.options.send_window, len(self.producers) + 1)
        self.producers.append(prod)
        return prod

    async def create_consumer(
        self, queue: str, filter: str | None = None, window: int | None = None, browse_only: bool = False
    ) -> AsyncConsumer:
        self._check()
        cid = next(self._consumer_ids)
        w = self.conn.options.consumer_window_size if window is None else window
        consumer = AsyncConsumer(self, cid, queue, browse_only, filter, w)
        self.consumers[cid] = consumer
        try:
            result = await self.conn.call(self.channel, consumer._create_packet)
        except BaseException as exc:
            self.consumers.pop(cid, None)
            if isinstance(exc, (CallTimeout, asyncio.CancelledError)) and not self.closed:
                self._close_unseen_consumer(cid)
            raise
        consumer._created(result)
        return consumer

    def _close_unseen_consumer(self, cid: int) -> None:
        """The client gave up on creating consumer `cid` (its call timed out, or was cancelled),
        but the broker may have made it: closed as one that received nothing, so what the broker
        delivered to it goes back to the queue uncounted. Left alone, it would take the queue's
        messages, which the client drops (no consumer of its), for the session's life."""
        ch = self.channel

        async def close() -> None:
            with contextlib.suppress(TandemError):  # none made, or the session gone: nothing to close
                await self.conn.call(ch, lambda cmd: p.CloseConsumer(ch.id, cmd, cid, [], 0))

        task = self.conn.loop.create_task(close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    async def create_browser(self, queue: str, filter: str | None = None, window: int | None = None) -> AsyncConsumer:
        """A consumer that sees messages without removing them (no acks)."""
        return await self.create_consumer(queue, filter, window, browse_only=True)

    async def create_queue(
        self,
        name: str,
        address: str | None = None,
        routing_type: str = "anycast",
        durable: bool = True,
        filter: str | None = None,
        temporary: bool = False,
        exists_ok: bool = False,
        max_consumers: int = -1,
        exclusive: bool | None = None,
        last_value_key: str | None = None,
        reader_only: bool = False,
    ) -> dict[str, Any]:
        args: dict[str, Any] = {
            "name": name,
            "address": address,
            "routing_type": routing_type,
            "durable": durable,
            "filter": filter,
            "temporary": temporary,
            "exists_ok": exists_ok,
            "max_consumers": max_consumers,
            "exclusive": exclusive,
            "last_value_key": last_value_key,
            "reader_only": reader_only,
        }
        result = await self.conn.manage("queue.create", **args)
        if temporary:  # it dies with the connection: a failover must make it again
            self.temp_queues[name] = {**args, "exists_ok": True}
        return result  # type: ignore[no-any-return]

    async def delete_queue(self, name: str, force: bool = False) -> int:
        res = await self.conn.manage("queue.delete", name=name, force=force)
        self.temp_queues.pop(name, None)
        return int(res["removed"])

    async def subscribe(
        self, address: str, subscription: str | None = None, durable: bool = False, filter: str | None = None
    ) -> AsyncConsumer:
        """Pub/sub: a multicast queue on `address` (temporary unless named and durable) and a consumer on it."""
        if subscription is None:
            if durable:
                raise InvalidArgument("a durable subscription needs a name")
            subscription = f"{address}.sub.{self.conn.client_uuid[:12]}.{self.channel.id}.{next(self._consumer_ids)}"
        await self.create_queue(
            subscription,
            address,
            "multicast",
            durable=durable,
            filter=filter,
            temporary=not durable,
            exists_ok=durable,
        )
        return await self.create_consumer(subscription)

    # ------------------------------------------------------------ range reads
    async def read_range(self, queue: str, start: int, end: int, limit: int = -1) -> RangeRead:
        """Messages of `queue` with start < seq <= end, in order, without consuming them.

        For a reader that keeps its own offsets (the Spark source); pair it with `ack_upto`.
        A large message's body is in a spooled temporary file (`body_stream()`, or `body`).
        """
        out: list[ReceivedMessage] = []
        first = last = 0
        while True:  # ends: every answer with `more` holds at least one message, and start moves past it
            res, bodies = await self._range(queue, start, end, limit)
            first, last = res.first_seq, res.last_seq
            for i, (seq, mid, dc, raw) in enumerate(res.messages):
                msg = ReceivedMessage.from_data(_decode_data(raw), mid, dc, seq, len(raw))
                msg._large = bodies.get(i)
                out.append(msg)
            if not res.more or not res.messages:
                return RangeRead(first, last, out)
            if limit >= 0:
                limit -= len(res.messages)
                if limit <= 0:
                    return RangeRead(first, last, out)
            start = res.messages[-1][0]

    async def read_range_records(
        self, queue: str, start: int, end: int, limit: int = -1, max_body: int = RECORDS_BODY_LIMIT
    ) -> tuple[int, int, list[tuple[int, int, int, MessageData, int]]]:
        """As `read_range`, as (seq, id, delivery count, message data, encoded size) tuples: for bulk readers.

        Every body is bytes, a large one's read whole into memory: one over `max_body` bytes
        fails the read (IllegalState; `read_range` streams it instead). The answer may hold
        fewer than `limit` messages when the range holds large ones (the broker stops after
        a few MiB of large bodies): ask again from the last sequence given.
        """
        res, bodies = await self._range(queue, start, end, limit)
        decode = _decode_data
        records = [(seq, mid, dc, decode(raw), len(raw)) for seq, mid, dc, raw in res.messages]
        try:
            for i, body in bodies.items():
                seq, mid, dc, data, n = records[i]
                if body.size > max_body:
                    raise IllegalState(
                        f"message {mid} at sequence {seq} of {queue!r} has a body of {body.size} bytes, "
                        f"over this reader's limit of {max_body}"
                    )
                records[i] = (seq, mid, dc, msgspec.structs.replace(data, body=body.read()), n + body.size)
        finally:
            for body in bodies.values():
                body.close()
        return res.first_seq, res.last_seq, records

    async def _range(self, queue: str, start: int, end: int, limit: int) -> tuple[p.RangeResult, dict[int, LargeBody]]:
        """One READ_RANGE and the large bodies after its answer; asked again when the link fails
        meanwhile (a range read changes nothing on the broker)."""
        for attempt in range(1, RANGE_READ_ATTEMPTS + 1):
            try:
                return await self._range_once(queue, start, end, limit)
            except Unblocked:
                if attempt == RANGE_READ_ATTEMPTS or self.closed or self.conn.closed:
                    raise
                log.info("a range read of %r was interrupted by a connection loss: asking again", queue)
        raise AssertionError("unreachable")

    async def _range_once(
        self, queue: str, start: int, end: int, limit: int
    ) -> tuple[p.RangeResult, dict[int, LargeBody]]:
        ch = self.channel
        conn = self.conn
        reads = self._range_reads
        cmds: list[int] = []

        def make(cmd: int) -> p.ReadRange:
            reads[cmd] = RangeBodies(conn.loop, conn.losses)  # before the answer: its chunks follow at once
            cmds.append(cmd)
            return p.ReadRange(ch.id, cmd, queue, start, end, limit)

        try:
            res: p.RangeResult = await conn.call(ch, make)
            bodies = await reads[cmds[0]].wait(conn.options.call_timeout / 1000)
        except BaseException:
            if cmds:
                r = reads.get(cmds[0])
                if r is not None:
                    r.close()
            raise
        finally:
            if cmds:
                reads.pop(cmds[0], None)
        return res, bodies

    async def queue_offsets(self, queue: str) -> tuple[int, int]:
        """(first sequence still in the queue, last sequence given out): cheap, for polling."""
        r = await self.read_range(queue, 0, 0, 0)
        return r.first_seq, r.last_seq

    async def ack_upto(self, queue: str, seq: int) -> int:
        """Acknowledge every message of `queue` up to sequence `seq`; returns how many (durable once returned)."""
        ch = self.channel
        res = await self.conn.call(ch, lambda cmd: p.AckUpTo(ch.id, cmd, queue, seq))
        return int(res["acked"])

    # ------------------------------------------------------------ transactions
    async def commit(self, dedup_id: str | None = None) -> None:
        """Commit the transaction: every send and ack since the last commit, atomically and durably.

        With `dedup_id`, committing an id the broker has already committed does nothing and
        succeeds (safe to retry). Raises DuplicateId or TransactionRolledBack (work undone), or
        TransactionOutcomeUnknown when the commit was sent and its answer lost (see `retry_commit`).
        """
        self._check()
        if not self.transacted:
            raise IllegalState("commit() needs a transacted session")
        if dedup_id is None and self.conn.options.auto_dedup:
            dedup_id = f"{self.conn.client_uuid}:tx:{self.channel.id}:{next(self._tx_ids)}"
        await self._commit(dedup_id)

    async def retry_commit(self) -> bool:
        """Commit what the transaction holds now (the work done again, or nothing) under the id of
        the commit that raised TransactionOutcomeUnknown.

        True: this commit applied it, and the first attempt never will be (its id is used). False:
        the broker had committed the first attempt, so this one changed nothing (its sends are
        dropped, its acknowledged messages come again). It can raise TransactionOutcomeUnknown
        again: call it again (after doing the work again, if that is the way you retry).
        """
        self._check()
        dedup_id = self.unresolved_commit
        if dedup_id is None:
            raise IllegalState(
                "retry_commit() follows a commit that raised TransactionOutcomeUnknown and had a "
                "transaction id (commit(dedup_id=...) or auto_dedup)"
            )
        already = await self._commit(dedup_id, retry=True)
        self.unresolved_commit = None
        return not already

    async def _commit(self, dedup_id: str | None, retry: bool = False) -> bool:
        """COMMIT under `dedup_id`; True if the broker had already committed that id (nothing
        applied). `retry`: a retry_commit (the broker tells a retry from the first attempt)."""
        conn = self.conn
        ch = self.channel
        if not conn.ready:
            try:
                await conn.wait_ready()
            except TandemError:
                if not self._rollback_only:
                    raise  # nothing sent, nothing lost: the transaction stays open
                self._tx_done()  # the work died with the old connection's session
                raise TransactionRolledBack(
                    "the connection failed during this transaction and is not back: it was rolled back; retry it"
                ) from None
        await conn.wait_session(ch)  # nothing sent yet if it times out: the transaction stays open
        for c in self.consumers.values():
            c._emit_pending()  # automatic acks belong to this transaction (or to the rollback below)
        if self._rollback_only:
            # Work done on the new server since the failover belongs to the lost transaction: undo it too.
            try:
                await conn._call_now(ch, lambda cmd: p.Rollback(ch.id, cmd), keep=True)
            except TandemError:
                pass  # still rollback-only: the next commit or rollback undoes it
            else:
                self._tx_done()
            raise TransactionRolledBack(
                "the connection failed over during this transaction: it was rolled back; retry it"
            )
        conn.check_open()  # from here on the COMMIT is written: a lost answer leaves the outcome unknown
        try:
            result = await conn._call_now(ch, lambda cmd: p.Commit(ch.id, cmd, dedup_id, retry), keep=True)
        except (ConnectionLost, CallTimeout) as exc:
            self._tx_done()
            self.unresolved_commit = dedup_id
            how = "retry it with retry_commit()" if dedup_id is not None else "it has no transaction id to retry under"
            raise TransactionOutcomeUnknown(
                f"the commit was sent but its answer was lost ({exc.message}): it may have been applied; {how}",
                dedup_id=dedup_id,
            ) from None
        except TandemError:
            self._tx_done()  # the server rolled it back
            raise
        self._tx_done()
        return result is True

    async def rollback(self) -> None:
        """Undo the transaction: sends are dropped, acknowledged messages come back (delivery count + 1)."""
        self._check()
        if not self.transacted:
            raise IllegalState("rollback() needs a transacted session")
        for c in self.consumers.values():
            c._emit_pending()
        ch = self.channel
        self._tx_done()
        await self.conn.call(ch, lambda cmd: p.Rollback(ch.id, cmd), keep=True)

    def _tx_done(self) -> None:
        self._tx_work = False
        self._rollback_only = False

    # ------------------------------------------------------------ lifecycle
    def _check(self) -> None:
        if self.closed:
            raise IllegalState("session is closed")
        self.conn.check_open()

    async def close(self) -> None:
        if self.closed:
            return
        for c in list(self.consumers.values()):
            c._emit_pending()
        await self.conn.until_reattached()
        if self._resend and self.conn.ready:
            # Parked, the link ready: it reattached to a restore that has not reached this session
            # yet. That restore sends them (confirmed as usual); wait for it as a call would.
            with contextlib.suppress(TandemError):
                await self.conn.wait_session(self.channel)
            if self.conn.ready:  # no restore came within call_timeout: none sends them now
                self._fail_parked(Unblocked(f"the session was closed before it was restored: {_PARKED}"))
        for prod in self.producers:
            try:
                await prod.flush()
            except TandemError:
                pass
        self.closed = True
        ch = self.channel
        await self.conn.until_reattached()
        try:
            # A session whose restore has not begun is not on the server (its restore skips it now).
            if not self.conn.closed and self.conn.ready and self._callable.is_set():
                unseen = {cid: c._unseen() for cid, c in self.consumers.items() if c.buffer}
                received = {cid: c.received for cid, c in self.consumers.items() if not c.browse_only}
                await self.conn.call(ch, lambda cmd: p.CloseSession(ch.id, cmd, unseen, received))
        finally:
            for c in self.consumers.values():
                c._mark_closed(None)
            self.consumers.clear()
            self.conn.channels.pop(ch.id, None)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------ from connection
    def _deliver(self, pkt: p.Deliver) -> None:
        c = self.consumers.get(pkt.consumer_id)
        if c is not None:
            c._on_deliver(pkt)

    def _deliver_large(self, pkt: p.DeliverLarge) -> None:
        c = self.consumers.get(pkt.consumer_id)
        if c is not None:
            c._on_deliver_large(pkt)

    def _deliver_chunk(self, pkt: p.DeliverChunk) -> None:
        if pkt.consumer_id < 0:  # a range read's large body (client/range.py)
            r = self._range_reads.get(-pkt.consumer_id)
            if r is not None:
                r.chunk(pkt)
            return
        c = self.consumers.get(pkt.consumer_id)
        if c is not None:
            c._on_chunk(pkt)

    def _range_answer(self, pkt: p.RangeResult) -> None:
        r = self._range_reads.get(pkt.cmd)
        if r is not None:
            r.answer(pkt, self.conn.losses)

    def _range_link_lost(self, exc: TandemError) -> None:
        """The link failed: range reads whose bodies were arriving are asked again (the rest
        of those bodies is never sent again, even to a reattached session)."""
        for r in self._range_reads.values():
            if r.waiting:
                r.fail(Unblocked(f"{exc.message} (a range read's large bodies were arriving)"))

    def _consumer_closed(self, cid: int, err: TandemError) -> None:
        c = self.consumers.pop(cid, None)
        if c is not None:
            c._mark_closed(err)

    def _connection_failed(self, err: TandemError) -> None:
        self._fail_parked(Unblocked(f"{err.message}: {_PARKED}"))
        self._callable.set()  # a call waiting for this session's restore: it fails on the closed connection
        for c in self.consumers.values():
            c._mark_closed(err)
        for prod in self.producers:
            prod._wake_all()

    def _transport_lost(self, exc: TandemError, resend: list[Pending]) -> None:
        if self.transacted and self._tx_work:
            self._rollback_only = True
        self._unrestored = True
        self._restore_begun = False
        self._callable.clear()
        self._resend.extend(resend)
        for c in self.consumers.values():
            c._transport_lost(exc)
        for prod in self.producers:
            prod._credits.clear()

    async def _restore(self, drops: int) -> None:
        """Recreate this session on the new server (connection is restoring: no waiting for ready).
        `drops`: the connection's count of sessions given up when the restore began."""
        conn, ch = self.conn, self.channel

        def check_link() -> None:
            # An answer in hand when the link was lost with the sessions (in the same read): the
            # server no longer has what it made, and the next link's restore makes it all again.
            if conn.drops != drops:
                raise Unblocked("the link was lost, the sessions with it, while restoring them")

        # What was never confirmed, in the order it was sent, taken before the first await: once a
        # consumer is recreated the new server delivers to it, and what the application sends
        # then (an ack of such a delivery) goes to the new server, to be confirmed there.
        resend, confirms = self._resend, list(ch.confirms)
        pending = [*resend, *confirms]
        self._resend = []
        ch.confirms.clear()
        if self.transacted and self._tx_work:
            # Work done since the link failed (a send written while away) is among what was taken:
            # no server has it, so the transaction can only be rolled back, as for work before.
            self._rollback_only = True
        try:
            self._restore_begun = True
            self._callable.set()
            await conn._call_now(ch, lambda cmd: p.CreateSession(ch.id, cmd, self.transacted))
            check_link()
            self._unrestored = False  # on the server again: sends on this channel go straight out
            for args in self.temp_queues.values():
                await conn._call_now(conn.control, partial(p.Manage, 0, op="queue.create", args=args))
                check_link()
            for c in list(self.consumers.values()):
                if not c.closed:
                    created = await conn._call_now(ch, c._create_packet)
                    check_link()
                    c._created(created)
        except BaseException:
            # Not restored (lost again, or closed). What can be sent again goes back, ahead of
            # what came since, for the next restore. The rest fails now, as the next restore or
            # the connection's failure would fail it: back in the channel's confirms, it could be
            # settled by a confirmation of a later command (the next link may reattach to this
            # restore's sessions, which never had it).
            self._resend[:0] = [pend for pend in pending if pend.resend is not None]
            if self._unrestored:
                self._restore_begun = False  # the server may not have it: the next restore makes it
                self._callable.clear()
            unblocked = Unblocked(_UNREPLAYABLE)
            for pend in pending:
                if pend.resend is None:
                    _fail_waiter(pend.waiter, unblocked)
            if conn.closed:  # the connection gave up (or was closed) while this restore waited
                self._fail_parked(Unblocked(f"{conn._closed_error().message}: {_PARKED}"))
            # Else the next restore sends what is parked: after a loss that took the sessions, or
            # after a failure on a link that reattached to this one (`_restore_afresh`). Failed
            # on its own link, the connection gives up (`_fail`), which fails it.
            raise
        unblocked = Unblocked(_UNREPLAYABLE)
        for pend in pending:
            data = pend.resend
            if data is None:
                _fail_waiter(pend.waiter, unblocked)
            else:
                conn.pipeline(ch, p.SendData(ch.id, ch.cmd(), data), pend.waiter, None if pend.unsent else data)

    def _fail_parked(self, exc: TandemError) -> None:
        """Sends parked for a resend that no server will get now (closed, or the connection failed).
        One never written anywhere was surely not stored: NotConnected, not an unknown outcome."""
        parked, self._resend = self._resend, []
        for pend in parked:
            _fail_waiter(pend.waiter, NotConnected(f"not sent: {exc.message}") if pend.unsent else exc)


def _call_handler(handler: SendAckHandler, msg: Message, exc: BaseException | None) -> None:
    """A handler's own error must not reach the connection's read loop."""
    try:
        handler(msg, exc)
    except Exception:
        log.exception("send-acknowledgement handler raised")


def _fail_waiter(waiter: Any, exc: BaseException) -> None:
    from .connection import _resolve

    _resolve(waiter, exc)


class AsyncProducer:
    """Sends to one address (or to each message's own). Durable sends are confirmed after fsync."""

    def __init__(self, session: AsyncSession, address: str | None, window: int, number: int) -> None:
        self.session = session
        self.address = address
        self.window = window
        self.in_flight = 0
        self._room: asyncio.Future[None] | None = None
        self._idle: asyncio.Future[None] | None = None
        self._credits: dict[str, int] = {}  # bytes this producer may still send per address; -1: no limit
        self._dedup_prefix = f"{session.conn.client_uuid}:{session.channel.id}:{number}:"
        self._sent = itertools.count(1)

    def has_credit(self, address: str, size: int) -> bool:
        c = self._credits.get(address)
        return c is not None and (c < 0 or c >= size)

    async def credit(self, address: str, size: int) -> None:
        """Producer flow control: wait until the broker lets us send `size` bytes to `address`.

        An address with `address-full-policy = BLOCK` that is full answers only when it has
        room again: the producer waits (the connection failing still ends the wait).
        """
        session = self.session
        chunk = max(size, session.conn.options.producer_window_size)
        ch = session.channel
        while not self.has_credit(address, size):
            try:
                granted = await session.conn.call(
                    ch, lambda cmd: p.RequestCredits(ch.id, cmd, address, chunk), forever=True
                )
            except Unblocked:
                continue  # failed over: ask the new server (credit does not carry over)
            c = self._credits.get(address, 0)
            self._credits[address] = -1 if granted < 0 else max(c, 0) + int(granted)

    def send_nowait(
        self, body: Message | bytes | str, callback: SendCallback | None = None, **fields: Any
    ) -> asyncio.Future[None] | None:
        """Send without waiting (ignores the window and flow control). Returns a future unless a callback is given.

        A send with a dedup id (`auto_dedup` gives every durable one an id) is sent again after a
        failover if it was never confirmed; any other unconfirmed send fails with Unblocked.
        """
        # The hot path of every producer: one call here per message, few calls below it.
        session = self.session
        conn = session.conn
        if session.closed or conn.closed:
            session._check()
        msg = body if type(body) is Message and not fields else as_message(body, **fields)
        data = msg.to_data(self.address)
        transacted = session.transacted
        if data.dedup_id is None and data.durable and not transacted and conn.options.auto_dedup:
            data.dedup_id = f"{self._dedup_prefix}{next(self._sent)}"
        threshold = conn.options.min_large_message_size
        if 0 <= threshold < len(data.body):
            return self._send_large_now(data, callback)
        credits = self._credits
        c = credits.get(data.address)
        if c is not None and c >= 0:
            credits[data.address] = c - len(data.body)
        self.in_flight += 1
        if transacted:
            session._tx_work = True
        resend = data if data.dedup_id is not None and not transacted else None
        if session._unrestored and not session._restore_begun and not (conn.ready and conn._restoring is None):
            # Its restore is to come (ready, yet restoring: the link reattached to a restore under way).
            return self._hold_for_restore(data, resend is not None, callback)
        # Between links its bytes stay here: without a dedup id it is kept with its message, for
        # the reattach's replay or the restore to send once (decision 0078).
        unsent = resend is None and not transacted and conn.holding
        if unsent:
            resend = data
        ch = session.channel
        cmd = ch.next_cmd
        ch.next_cmd = cmd + 1
        if callback is None:
            fut: asyncio.Future[None] = conn.loop.create_future()
            fut.add_done_callback(self._done_future)
            conn.pipeline(ch, p.SendData(ch.id, cmd, data), fut, resend, unsent)
            return fut
        conn.pipeline(ch, p.SendData(ch.id, cmd, data), partial(self._confirmed, callback), resend, unsent)
        return None

    def _hold_for_restore(
        self, data: MessageData, replayable: bool, callback: SendCallback | None
    ) -> asyncio.Future[None] | None:
        """A send on a session that lost its server state, made before its restore began: not
        written now (during another session's restore the new server would refuse it: no
        session on its channel yet). Its session's restore sends it. With a dedup id it stays
        replayable; without, it was never written anywhere, so it goes once and is then as any
        send without an id (decision 0078). In a transaction it fails now: the transaction can
        only be rolled back."""
        from .connection import Pending

        session = self.session
        loop = session.conn.loop
        fut: asyncio.Future[None] | None = None
        waiter: Any
        if callback is None:
            fut = waiter = loop.create_future()
            fut.add_done_callback(self._done_future)
        else:
            waiter = partial(self._confirmed, callback)
        if session.transacted:
            loop.call_soon(_fail_waiter, waiter, Unblocked(_NOT_RESTORED))
        else:
            session._resend.append(Pending(0, waiter, data, unsent=not replayable))
        return fut

    # --------------------------------------------------------- large messages
    def _begin_large(self, data: MessageData, size: int, held: Frames | None = None) -> tuple[Channel, int]:
        """LARGE_BEGIN for `data` (its body goes in the chunks); the channel and the chunk size.
        With `held`, the frame goes there instead of out (see `_send_large_now`)."""
        session = self.session
        conn = session.conn
        opts = conn.options
        step = min(opts.min_large_message_size, opts.max_frame_size // 2)
        header = msgspec.structs.replace(data, body=b"")
        ch = session.channel
        compress = opts.compress_large_messages
        # Compressed, the size that goes is known only at the end.
        begin = p.LargeBegin(ch.id, msgspec.Raw(_encode(header)), -1 if compress else size, compress)
        if held is None:
            conn.send_packet(begin)
            session.large_open += 1
        else:
            held.append(p.encode(begin))  # kept whole: a reattach can replay it, it is not "open"
        if session.transacted:
            session._tx_work = True
        return ch, step

    def _end_large(self, ch: Channel, chunks: int, size: int, waiter: Any, held: Frames | None = None) -> None:
        self.in_flight += 1
        cmd = ch.cmd()
        end = p.LargeEnd(ch.id, cmd, chunks, size)
        if held is None:
            self.session.conn.pipeline(ch, end, waiter, None)
        else:
            self.session.conn.pipeline_after(ch, held, end, waiter)

    def _send_large_now(self, data: MessageData, callback: SendCallback | None) -> asyncio.Future[None] | None:
        """A large bytes body from `send_nowait`: every chunk written now (the caller holds the
        body anyway). Not resent after a failover: the send fails with Unblocked.

        Written while the client is between links with a confirmation window, its BEGIN and
        chunks (no command ids) are kept with its END as one frame: a reattach replays the whole
        message or none of it (the broker refuses a reattach with an upload begun), never an END
        alone, which the broker would refuse as a protocol error."""
        session = self.session
        conn = session.conn
        if session.sending_large:
            raise IllegalState("a large message is being streamed on this session: send this one with send()")
        if session._unrestored and not session._restore_begun:
            # The server has no session on this channel yet (the client is restoring its sessions
            # after a failover, or will): its restore would fail this send, which it cannot send
            # again, and its BEGIN written before that restore is a protocol error.
            return self._failed_at_once(callback, Unblocked(_NOT_RESTORED))
        held: Frames | None = [] if conn.window > 0 and not conn.ready else None
        ch, step = self._begin_large(data, len(data.body), held)
        n = total = 0
        for piece in pieces(data.body, step, conn.options.compress_large_messages):
            if held is None:
                conn.send_packet(p.LargeChunk(ch.id, n, piece))
            else:
                held.append(p.encode(p.LargeChunk(ch.id, n, piece)))
            n += 1
            total += len(piece)

        def answered(*_: object) -> None:
            if held is None:
                session.large_open -= 1

        if callback is None:
            fut: asyncio.Future[None] = conn.loop.create_future()
            fut.add_done_callback(self._done_future)
            fut.add_done_callback(answered)
            self._end_large(ch, n, total, fut, held)
            return fut

        def confirmed(exc: BaseException | None) -> None:
            answered()
            self._confirmed(callback, exc)

        self._end_large(ch, n, total, confirmed, held)
        return None

    def _failed_at_once(self, callback: SendCallback | None, exc: TandemError) -> asyncio.Future[None] | None:
        """A send that cannot go, failed as one in flight would be (callback on the next loop pass)."""
        loop = self.session.conn.loop
        if callback is not None:
            loop.call_soon(callback, exc)
            return None
        fut: asyncio.Future[None] = loop.create_future()
        fut.set_exception(exc)
        fut.exception()  # as a send failed in flight: no "never retrieved" warning if it is not awaited
        return fut

    async def send_stream(
        self, source: Source, size: int | None = None, *, message: Message | None = None, **fields: Any
    ) -> None:
        """Send a body read from `source` (a binary file object, or bytes) as a large message,
        a chunk at a time, and wait for the confirmation. `message` (or keyword fields) gives the
        rest of the message (its own body is ignored). A failover mid-send sends it again from
        the start when the source can seek back and the send has a dedup id (durable sends get
        one with `auto_dedup`); otherwise it raises Unblocked and the application sends again."""
        msg = message if message is not None else Message(b"", **fields)
        if message is not None and fields:
            raise InvalidArgument("pass either a message or keyword fields, not both")
        data = msg.to_data(self.address)
        data.body = b""
        session = self.session
        if data.dedup_id is None and data.durable and not session.transacted and session.conn.options.auto_dedup:
            data.dedup_id = f"{self._dedup_prefix}{next(self._sent)}"
        await self._send_large(data, source, body_size(source) if size is None else size)

    async def _send_large(self, data: MessageData, source: Source, size: int) -> None:
        session = self.session
        conn = session.conn
        while session.sending_large:  # one large send at a time per session: wait for the current one
            session._check()
            assert session._large_done is not None
            await asyncio.shield(session._large_done)
        done: asyncio.Future[None] = conn.loop.create_future()
        session._large_done = done
        session.sending_large = True
        rewind = Rewind(source)
        try:
            while True:
                try:
                    await self._send_large_once(data, source, size)
                    return
                except Unblocked:
                    if data.dedup_id is None or session.transacted or not rewind.possible or conn.closed:
                        raise
                    log.warning("a large message was interrupted by a failover: sending it again from its start")
                    rewind.rewind()
                    await conn.wait_ready()
        finally:
            session.sending_large = False
            if session._large_done is done:
                session._large_done = None
            done.set_result(None)

    async def _send_large_once(self, data: MessageData, source: Source, size: int) -> None:
        session = self.session
        conn = session.conn
        await self.ready()
        generation = conn.generation
        ch, step = self._begin_large(data, size)
        try:
            await self._stream_large(ch, step, source, generation)
        finally:
            session.large_open -= 1

    async def _stream_large(self, ch: Channel, step: int, source: Source, generation: int) -> None:
        conn = self.session.conn

        def check() -> None:
            if conn.generation != generation or not conn.ready:
                why = f": {conn.error.message}" if conn.error is not None else ""  # the server's, if it said
                raise Unblocked(f"the connection failed while a large message was being sent{why}")

        try:
            n = total = 0
            for piece in pieces(source, step, conn.options.compress_large_messages):
                check()
                conn.send_packet(p.LargeChunk(ch.id, n, piece))
                n += 1
                total += len(piece)
                await asyncio.sleep(0)  # the chunk goes out (the flush runs): the socket paces us
                await conn.drain()
            check()
        except Unblocked:
            raise
        except BaseException:
            if conn.generation == generation and conn.ready:
                conn.send_packet(p.LargeAbort(ch.id))  # the broker drops what it has
            raise
        fut: asyncio.Future[None] = conn.loop.create_future()
        fut.add_done_callback(self._done_future)
        self._end_large(ch, n, total, fut)
        timeout = conn.options.call_timeout / 1000
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            raise CallTimeout(f"send not confirmed within {timeout:.1f}s (call_timeout)") from None

    def _confirmed(self, callback: SendCallback, exc: BaseException | None) -> None:
        self._done()
        callback(exc)

    def _done_future(self, fut: asyncio.Future[None]) -> None:
        self._done()

    def _done(self) -> None:
        self.in_flight -= 1
        room = self._room
        if room is not None and self.in_flight < self.window and not room.done():
            room.set_result(None)
        idle = self._idle
        if idle is not None and self.in_flight == 0 and not idle.done():
            idle.set_result(None)

    def _wake_all(self) -> None:
        for fut in (self._room, self._idle):
            if fut is not None and not fut.done():
                fut.set_result(None)

    def has_room(self, address: str | None = None, size: int = 0) -> bool:
        """True when a send would not wait: connected, room in the window, credit for `size`
        bytes to `address`, socket writable. `await ready()` only when this is False (a loop
        that sends many messages saves a coroutine per message)."""
        conn = self.session.conn
        if self.in_flight >= self.window or not conn._ready.is_set() or not conn._writable.is_set():
            return False
        if address is None:
            return True
        c = self._credits.get(address)
        return c is not None and (c < 0 or c >= size)

    async def ready(self, address: str | None = None, size: int = 0) -> None:
        """Wait until connected, the window has room, the socket is writable and (with an address) credit allows."""
        conn = self.session.conn
        if not conn.ready:
            await conn.wait_ready()
        if address is not None and not self.has_credit(address, size):
            await self.credit(address, size)
        while self.in_flight >= self.window:
            self.session._check()
            self._room = conn.loop.create_future()
            await self._room
            self._room = None
        await conn.drain()

    async def send_async(
        self, body: Message | bytes | str, callback: SendCallback | None = None, **fields: Any
    ) -> asyncio.Future[None] | None:
        """Wait for room in the window and for credit, then send; the confirmation arrives later."""
        msg = as_message(body, **fields)
        address = msg.address or self.address
        size = _size(msg) if address is not None else 0
        threshold = self.session.conn.options.min_large_message_size
        if 0 <= threshold < size:  # streamed a chunk at a time; confirmed when this returns
            await self.send_stream(msg.body.encode() if isinstance(msg.body, str) else msg.body, message=msg)
            if callback is not None:
                callback(None)
                return None
            fut: asyncio.Future[None] = self.session.conn.loop.create_future()
            fut.set_result(None)
            return fut
        if not self.has_room(address, size):
            await self.ready(address, size)
        return self.send_nowait(msg, callback)

    async def send(self, body: Message | bytes | str, **fields: Any) -> None:
        """Send and wait for the broker's confirmation (durable: after fsync); with the session's
        send-acknowledgement handler, send and leave the confirmation to the handler."""
        handler = self.session.send_ack_handler
        if handler is not None:
            msg = as_message(body, **fields)
            await self.send_async(msg, partial(_call_handler, handler, msg))
            return
        fut = await self.send_async(body, **fields)
        assert fut is not None
        timeout = self.session.conn.options.call_timeout / 1000
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            raise CallTimeout(f"send not confirmed within {timeout:.1f}s (call_timeout)") from None

    async def flush(self) -> None:
        """Wait until every send so far is confirmed (or failed)."""
        while self.in_flight > 0:
            self.session.conn.check_open()
            self._idle = self.session.conn.loop.create_future()
            await self._idle
            self._idle = None


class AsyncConsumer:
    """Receives from one queue with credit-based flow control."""

    def __init__(
        self, session: AsyncSession, cid: int, queue: str, browse_only: bool, filter: str | None, window: int
    ) -> None:
        self.session = session
        self.id = cid
        self.queue = queue
        self.browse_only = browse_only
        self.filter = filter
        self.requested_window = window
        self.window = -1
        self.generation = 0
        self.buffer: deque[ReceivedMessage] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._consumed = 0
        self._pull_pending = False
        self._unblocked: TandemError | None = None
        self._listener: Listener | None = None
        self._listener_task: asyncio.Task[None] | None = None
        self.closed = False
        self.error: TandemError | None = None
        # What a reattach tells the server (deliveries received, credit granted), on this server.
        self.received = 0
        self.flowed = 0
        self._arriving: ReceivedMessage | None = None  # a large message whose chunks are coming

    def _create_packet(self, cmd: int) -> p.CreateConsumer:
        ch = self.session.channel
        self.generation = self.session.conn.generation  # deliveries may arrive before the answer
        self.received = self.flowed = 0
        return p.CreateConsumer(ch.id, cmd, self.id, self.queue, self.filter, self.requested_window, self.browse_only)

    def _created(self, result: dict[str, Any]) -> None:
        self.window = int(result["window"])
        self.queue = result["queue"]

    def _reattach_state(self) -> tuple[int, int, int]:
        return (self.id, self.received, self.flowed)

    # ------------------------------------------------------------ inbound
    def _on_deliver(self, pkt: p.Deliver) -> None:
        raw = pkt.message
        msg = ReceivedMessage.from_data(_decode_data(raw), pkt.message_id, pkt.delivery_count, pkt.seq, len(raw))
        if not self.browse_only:
            msg._consumer = self
        msg._generation = self.generation
        self._pull_pending = False
        self.received += 1
        self.buffer.append(msg)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _on_deliver_large(self, pkt: p.DeliverLarge) -> None:
        raw = pkt.message
        msg = ReceivedMessage.from_data(_decode_data(raw), pkt.message_id, pkt.delivery_count, pkt.seq, len(raw))
        msg._large = LargeBody(pkt.size, pkt.compressed)
        if not self.browse_only:
            msg._consumer = self
        msg._generation = self.generation
        self._pull_pending = False
        old, self._arriving = self._arriving, msg
        if old is not None and old._large is not None:
            old._large.close()

    def _on_chunk(self, pkt: p.DeliverChunk) -> None:
        msg = self._arriving
        if msg is None or msg.id != pkt.message_id or msg._large is None:
            raise ProtocolError(f"a chunk of message {pkt.message_id}, which is not arriving")
        msg._large.add(pkt.index, pkt.data, pkt.last)
        if not pkt.last:
            return
        self._arriving = None
        self.received += 1  # whole: a reattach counts it delivered (a part lost is sent again)
        self.buffer.append(msg)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _mark_closed(self, err: TandemError | None) -> None:
        self.closed = True
        self.error = err
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _transport_lost(self, exc: TandemError) -> None:
        """Deliveries from the old server are void: the new one sends them again."""
        arriving, self._arriving = self._arriving, None
        if arriving is not None and arriving._large is not None:
            arriving._large.close()
        self.buffer.clear()
        self._consumed = 0
        self._pull_pending = False
        self.generation = -1
        w = self._waiter
        if w is not None and not w.done():
            self._unblocked = exc
            w.set_result(None)

    # -------------------------------------------------- handing to the app
    def _handed(self, msg: ReceivedMessage, auto_ack: bool = True) -> ReceivedMessage:
        """Account for a message the application now has: credits back, and (auto mode) the ack."""
        session = self.session
        w = self.window
        if w > 0:
            consumed = self._consumed + msg.size
            if consumed >= w // _CREDIT_RETURN_PART:
                session.conn.send_packet(p.Flow(session.channel.id, self.id, consumed))
                self.flowed += consumed
                consumed = 0
            self._consumed = consumed
        if session.transacted and not self.browse_only:
            session._tx_work = True
        if auto_ack:
            self.auto_ack(msg)
        return msg

    def auto_ack(self, msg: ReceivedMessage) -> None:
        """In `auto` mode, acknowledge `msg` (batched: one cumulative ACK per loop pass)."""
        if (
            self.session.ack_mode == "auto"
            and not self.browse_only
            and not self.closed
            and msg._generation == self.generation
        ):
            self.session.conn.schedule_ack(self, msg.id)

    def _request_one(self) -> None:
        if self.window == 0 and not self._pull_pending and not self.buffer and not self.closed:
            self._pull_pending = True
            self.flowed += 1
            self.session.conn.send_packet(p.Flow(self.session.channel.id, self.id, 1))

    def receive_nowait(self) -> ReceivedMessage | None:
        if self.buffer:
            return self._handed(self.buffer.popleft())
        self._raise_if_closed()
        if self.session.conn.ready:
            self._request_one()
        return None

    async def receive(self, timeout: float | None = None) -> ReceivedMessage | None:
        """The next message, or None after `timeout` seconds (None: wait for ever).

        Raises Unblocked if the connection fails over while waiting (call again to go on).
        """
        return await self._receive(timeout, auto_ack=True)

    async def _receive(self, timeout: float | None, auto_ack: bool) -> ReceivedMessage | None:
        loop = self.session.conn.loop
        deadline = None if timeout is None else loop.time() + timeout
        while not self.buffer:
            self._raise_if_closed()
            if self._unblocked is not None:
                exc, self._unblocked = self._unblocked, None
                raise exc
            if self.session.conn.ready:
                self._request_one()
            self._waiter = loop.create_future()
            try:
                if deadline is None:
                    await self._waiter
                else:
                    left = deadline - loop.time()
                    if left <= 0:
                        return None
                    try:
                        await asyncio.wait_for(self._waiter, left)
                    except TimeoutError:
                        if not self.buffer:
                            return None
            finally:
                self._waiter = None
        return self._handed(self.buffer.popleft(), auto_ack)

    def _raise_if_closed(self) -> None:
        if self.closed:
            err = self.error
            if err is not None:
                raise (
                    type(err)(err.message, err.code)
                    if not isinstance(err, ConnectionLost)
                    else ConnectionLost(err.message)
                )
            raise IllegalState("consumer is closed")

    def __aiter__(self) -> AsyncIterator[ReceivedMessage]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ReceivedMessage]:
        while True:
            try:
                msg = await self.receive()
            except IllegalState:
                return
            except Unblocked:
                continue  # failed over: the new server sends what was not acknowledged
            if msg is not None:
                yield msg

    def set_listener(self, listener: Listener | None, auto_ack: bool = True) -> None:
        """Call `listener(message)` for each message, in order (a coroutine function is awaited).

        In `auto` ack mode a message is acknowledged once the listener has returned.
        `set_listener(None)` stops delivery to the listener; messages stay for `receive()`.
        """
        if self._listener_task is not None:
            self._listener_task.cancel()
            self._listener_task = None
        self._listener = listener
        if listener is not None and not self.closed:
            self._listener_task = self.session.conn.loop.create_task(self._run_listener(listener, auto_ack))

    async def _run_listener(self, listener: Listener, auto_ack: bool) -> None:
        while not self.closed:
            try:
                msg = await self._receive(None, auto_ack=False)
            except Unblocked:
                continue
            except TandemError:
                return
            if msg is None:
                continue
            try:
                res = listener(msg)
                if inspect.isawaitable(res):
                    await res
            except Exception:
                log.exception("message listener raised")
            if auto_ack:
                self.auto_ack(msg)

    # ------------------------------------------------------------------ acks
    def _check_current(self, msg: ReceivedMessage, what: str) -> None:
        """A delivery from before a failover is void (the new server delivers the message again, and
        its id there may name another message): say so rather than do nothing quietly."""
        if msg._generation != self.generation:
            raise StaleAcknowledge(
                f"{what} of message {msg.id} of queue {self.queue!r} did nothing: it was delivered before "
                "the connection failed over or reconnected, and is delivered again (unless an earlier "
                "acknowledgement covered it)"
            )

    def ack_message(self, msg: ReceivedMessage) -> Awaitable[None]:
        session = self.session
        mode = session.ack_mode
        conn = session.conn
        conn.check_open()
        fut: asyncio.Future[None] = conn.loop.create_future()
        if mode == "auto":
            fut.set_result(None)  # already acknowledged automatically (or, if stale, coming again)
            return fut
        self._check_current(msg, "ack")
        ch = session.channel
        conn.pipeline(ch, p.Ack(ch.id, ch.cmd(), self.id, msg.id, mode == "client"), fut)
        return fut

    def nack_message(self, msg: ReceivedMessage) -> Awaitable[None]:
        session = self.session
        conn = session.conn
        conn.check_open()
        self._check_current(msg, "nack")
        fut: asyncio.Future[None] = conn.loop.create_future()
        ch = session.channel
        conn.pipeline(ch, p.Nack(ch.id, ch.cmd(), self.id, msg.id), fut)
        return fut

    def _emit_ack(self, mid: int) -> None:
        ch = self.session.channel
        conn = self.session.conn
        if not conn.closed and not self.closed:
            conn.pipeline(ch, p.Ack(ch.id, ch.cmd(), self.id, mid, True), self._auto_ack_done)

    def _auto_ack_done(self, exc: BaseException | None) -> None:
        if exc is not None and not self.closed and not isinstance(exc, Unblocked):
            log.warning("automatic acknowledgement on queue %r failed: %s", self.queue, exc)

    def _emit_pending(self) -> None:
        conn = self.session.conn
        mid = conn._pending_acks.pop(self, None)
        if mid is not None:
            self._emit_ack(mid)

    def _unseen(self) -> list[int]:
        """Ids of buffered messages the application never got: not failed deliveries."""
        return [m.id for m in self.buffer]

    async def close(self) -> None:
        if self.closed:
            return
        self._emit_pending()
        self.closed = True
        if self._listener_task is not None:
            self._listener_task.cancel()
            self._listener_task = None
        session = self.session
        session.consumers.pop(self.id, None)
        ch = session.channel
        await session.conn.until_reattached()
        if not session.conn.closed and session.conn.ready:
            unseen = self._unseen()
            got = self.received
            await session.conn.call(ch, lambda cmd: p.CloseConsumer(ch.id, cmd, self.id, unseen, got))
        self._mark_closed(None)
