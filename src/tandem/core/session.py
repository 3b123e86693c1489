"""A protocol-neutral session: sends, consumers, acknowledgements and transactions.

Native and STOMP connections both drive this; they only translate frames and
decide when to reply (after `Storage.after_durable` for anything journaled).

In a transacted session sends and acknowledgements are held until commit,
which applies them as one atomic journal record; rollback drops the sends
and returns the acknowledged messages to their queues (delivery count + 1).
Sends to an address that pages are paged as they arrive instead of held
(decision 0055): a rollback deletes them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

import msgspec

from ..errors import (
    ConsumerDoesNotExist,
    DuplicateId,
    IllegalState,
    InternalError,
    InvalidArgument,
    TandemError,
    TransactionRolledBack,
)
from .consumer import Consumer, DeliverySink
from .message import Message, MessageRef, RoutingType
from .permissions import Access, Permission

if TYPE_CHECKING:
    from .postoffice import PostOffice
    from .queue import Queue
    from .txpaging import PagedTx

log = logging.getLogger("tandem.session")
_SEND = Permission.SEND  # (a module global: no class attribute lookup per message)


class Transaction:
    __slots__ = ("acks", "failure", "held", "held_by", "messages", "paged")

    def __init__(self) -> None:
        self.messages: list[Message] = []  # held until the commit
        self.acks: list[tuple[Queue, list[MessageRef]]] = []
        self.failure: TandemError | None = None
        self.held = 0  # bytes of `messages`
        self.held_by: dict[int, int] = {}  # address id -> bytes held for it (counted as memory counts them)
        self.paged: PagedTx | None = None  # sends paged as they arrived (decision 0055)

    @property
    def empty(self) -> bool:
        return not self.messages and not self.acks and self.failure is None and self.paged is None


class ServerSession:
    __slots__ = ("access", "closed", "consumers", "name", "owner", "postoffice", "tx")

    def __init__(
        self,
        postoffice: PostOffice,
        owner: object,
        name: str = "",
        transacted: bool = False,
        access: Access | None = None,
    ) -> None:
        self.postoffice = postoffice
        self.access = access  # None: security is off, nothing is checked
        self.owner = owner
        self.name = name
        self.consumers: dict[int, Consumer] = {}
        self.closed = False
        self.tx: Transaction | None = Transaction() if transacted else None

    @property
    def transacted(self) -> bool:
        return self.tx is not None

    # -------------------------------------------------------------- sending
    def send_run(self, raws: list[msgspec.Raw | bytes]) -> list[bool | TandemError]:
        """Route encoded messages in order: per message, True if a journal record was written
        (reply after sync), False if not, or the error that refused it (the others go on).

        One call for a producer's whole burst: the per-message work is the loop below."""
        po = self.postoffice
        next_id = po.ids.next
        decode = Message.decode
        send = po.send if self.tx is None else None
        access = self.access
        out: list[bool | TandemError] = []
        append = out.append
        for raw in raws:
            try:
                message = decode(next_id(), raw, True)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                append(InvalidArgument(f"malformed message: {exc}"))
                continue
            except UnicodeDecodeError as exc:  # msgspec's error for a str that is not UTF-8
                append(InvalidArgument(f"malformed message: a string is not valid UTF-8 ({exc.reason})"))
                continue
            try:
                if send is None:
                    append(self.send_message(message))
                    continue
                if access is not None:
                    self.authorize_send(message)
                append(send(message)[1])
            except TandemError as exc:
                append(exc)
            except Exception as exc:  # a bug, not bad input: this message fails, the run goes on
                log.exception("error routing a message to %r", message.address)
                append(InternalError(f"internal error: {exc!r}"))
        return out

    def send_message(self, message: Message, tx: Transaction | None = None) -> bool:
        """Route now, or (in a transaction: `tx`, else the session's own) at commit."""
        tx = tx or self.tx
        if tx is None:
            if self.access is not None:
                self.authorize_send(message)
            return self.postoffice.send(message)[1]
        try:
            if self.access is not None:
                self.authorize_send(message)  # a denied send rolls its transaction back, as a failed route does
            queues = self.postoffice.route(message)  # errors now rather than at commit (no side effects)
        except TandemError as exc:
            tx.failure = tx.failure or exc
            raise
        self.postoffice.hold(tx, message, queues)
        return False

    def authorize_send(self, message: Message) -> None:
        """`send` on the message's address; a send that would create it needs the create permissions
        too (never a silent create). Raises Unauthorized; nothing happens without an `access`."""
        access = self.access
        if access is None:
            return
        address = message.address
        access.check(_SEND, address)
        po = self.postoffice
        if address not in po.addresses:
            s = po.settings_for(address)
            if s.auto_create_addresses:  # else routing refuses: the address does not exist
                access.check(Permission.CREATE_ADDRESS, address)
                rt = RoutingType(message.routing_type) if message.routing_type else s.default_address_routing_type
                if rt == RoutingType.ANYCAST and s.auto_create_queues:
                    access.check(Permission.CREATE_DURABLE_QUEUE, address)

    def authorize_producer(self, address: str) -> None:
        """A producer asks for credit on `address`: `send`. Refused in a transaction, it rolls the
        transaction back at commit, as a refused send does (the SEND never comes)."""
        if self.access is None:
            return
        try:
            self.access.check(_SEND, address)
        except TandemError as exc:
            if self.tx is not None:
                self.tx.failure = self.tx.failure or exc
            raise

    def authorize_queue(self, name: str, address: str, durable: bool) -> None:
        """Creating queue `name` on `address` (a subscription's, or a consumer's auto-created one)."""
        access = self.access
        if access is None:
            return
        access.check(Permission.CREATE_DURABLE_QUEUE if durable else Permission.CREATE_NON_DURABLE_QUEUE, address)
        if address not in self.postoffice.addresses:
            access.check(Permission.CREATE_ADDRESS, address)

    # ------------------------------------------------------------ consumers
    def create_consumer(
        self,
        cid: int,
        queue_name: str,
        sink: DeliverySink,
        window: int = -2,
        filter_text: str | None = None,
        browse_only: bool = False,
    ) -> Consumer:
        if cid in self.consumers:
            raise IllegalState(f"consumer id {cid} is already in use on this session")
        if window < -2:
            raise InvalidArgument(f"consumer window must be -1, 0 or a byte count, got {window}")
        filt = self.postoffice.compile_filter(filter_text) if filter_text else None  # before any side effect
        if self.access is not None:
            self._authorize_consumer(queue_name, browse_only)
        q = self.postoffice.queue_for_consumer(queue_name)
        q.check_owner(self.owner)
        if window == -2:
            window = q.settings.default_consumer_window_size
        if q.reader_only and not browse_only:
            raise IllegalState(f"queue {queue_name!r} is reserved for range readers (reader-only): no consumers")
        if not browse_only and q.max_consumers >= 0 and len(q.consumers) >= q.max_consumers:
            raise IllegalState(f"queue {queue_name!r} already has its maximum of {q.max_consumers} consumer(s)")
        c = Consumer(cid, q, sink, window, filt, browse_only, owner=self)
        c.account = getattr(self.owner, "delivery_account", None)  # the connection's unacked limit
        if window > 0:
            c.credits = window
        self.consumers[cid] = c
        q.add_consumer(c)
        return c

    def _authorize_consumer(self, queue_name: str, browse_only: bool) -> None:
        """`consume` (`browse` for a browser) on the queue's address; a queue that a consumer would
        auto-create needs `create-durable-queue` (and `create-address`) as well."""
        access = self.access
        assert access is not None
        po = self.postoffice
        q = po.queues.get(queue_name)
        address = q.address if q is not None else queue_name
        access.check(Permission.BROWSE if browse_only else Permission.CONSUME, address)
        if q is None and po.settings_for(queue_name).auto_create_queues:
            self.authorize_queue(queue_name, queue_name, durable=True)

    def consumer(self, cid: int) -> Consumer:
        c = self.consumers.get(cid)
        if c is None:
            raise ConsumerDoesNotExist(f"consumer {cid} does not exist on this session")
        return c

    def close_consumer(self, cid: int, unseen: Collection[int] = ()) -> None:
        """`unseen`: ids the client never handed to its application (they keep their delivery count)."""
        c = self.consumers.pop(cid, None)
        if c is None:
            raise ConsumerDoesNotExist(f"consumer {cid} does not exist on this session")
        c.queue.remove_consumer(c, unseen)

    def forget_consumer(self, consumer: Consumer) -> None:
        """The queue went away under the consumer; drop our handle."""
        self.consumers.pop(consumer.id, None)

    def flow(self, cid: int, credits: int) -> None:
        c = self.consumers.get(cid)
        if c is not None:  # a FLOW may cross a close on the wire
            c.add_credits(credits)

    def ack(self, cid: int, message_id: int, cumulative: bool, tx: Transaction | None = None) -> bool:
        """Acknowledge (in `tx`, else the session's own transaction, if any); True if journaled now."""
        c = self.consumer(cid)
        refs = c.take_acked(message_id, cumulative)
        q = c.queue
        tx = tx or self.tx
        if tx is not None:
            tx.acks.append((q, refs))
            return False
        return q.acknowledge(refs)

    def nack(self, cid: int, message_id: int) -> None:
        """Negative ack: the message goes back (after redelivery-delay) or to the dead-letter address."""
        c = self.consumer(cid)
        c.queue.cancel(c.take_acked(message_id, cumulative=False))

    # --------------------------------------------------------- transactions
    def _require_tx(self) -> Transaction:
        if self.tx is None:
            raise IllegalState("this session is not transacted")
        return self.tx

    def commit(self, dedup_id: str | None = None, tx: Transaction | None = None, retried: bool = False) -> bool:
        """Commit atomically; True if a journal record was written (reply after sync).

        A `dedup_id` already committed makes this a no-op that succeeds. Without `tx`, the
        session's own transaction is committed and a new one begins. `retried`: a client's
        retry_commit; one with nothing in its transaction marks the id as taken by an empty retry
        (decision 0084).
        """
        if tx is None:
            tx = self._require_tx()
            self.tx = Transaction()
        if tx.failure is not None:
            self._undo(tx)
            raise TransactionRolledBack(f"transaction rolled back: {tx.failure.message}")
        po = self.postoffice
        if dedup_id is not None and po.transaction_seen(dedup_id):
            self._undo(tx)
            return po.storage.persistent  # "already committed" holds only once that commit is on disk
        try:
            wrote = po.commit_transaction(tx.messages, tx.acks, dedup_id, tx.paged, empty_retry=retried and tx.empty)
            po.release(tx, discard=False)
            return wrote
        except DuplicateId:
            self._undo(tx)
            raise
        except TandemError as exc:
            self._undo(tx)
            raise TransactionRolledBack(f"transaction rolled back: {exc.message}") from None

    def rollback(self, tx: Transaction | None = None) -> None:
        if tx is None:
            tx = self._require_tx()
            self.tx = Transaction()
        self._undo(tx)

    def _undo(self, tx: Transaction) -> None:
        self.postoffice.release(tx, discard=True)
        for q, refs in tx.acks:
            q.cancel(refs)

    def close(self, unseen: Mapping[int, Collection[int]] | None = None) -> None:
        """Close every consumer and roll back an open transaction; unacked messages go back.

        `unseen`: per consumer id, what the client never handed to its application.
        """
        if self.closed:
            return
        self.closed = True
        if self.tx is not None:
            tx, self.tx = self.tx, None
            self._undo(tx)
        for cid, c in list(self.consumers.items()):
            c.queue.remove_consumer(c, (unseen or {}).get(cid, ()))
        self.consumers.clear()
