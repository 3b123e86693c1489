"""The blocking API: the asyncio client on a private event-loop thread.

Each call hands a coroutine to that loop and waits for it; asynchronous sends
use a semaphore for the window so the caller blocks only when it is full.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from ..errors import CallTimeout, IllegalState, TandemError, Unblocked
from .connection import AsyncConnection, FailureEvent
from .message import Message, ReceivedMessage
from .session import (
    AsyncConsumer,
    AsyncProducer,
    AsyncSession,
    SendAckHandler,
    SendCallback,
    _call_handler,
    _size,
    as_message,
)

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="tandem-client", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise IllegalState("blocking call from the client's own thread (inside a listener?)")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise CallTimeout(f"no result within {timeout}s") from None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join(5)
        if not self.loop.is_running():
            self.loop.close()


class Connection:
    """`tandem.connect(url, **options)`: a blocking connection."""

    def __init__(self, lt: _LoopThread, aio: AsyncConnection) -> None:
        self._lt = lt
        self.aio = aio

    @property
    def server(self) -> str:
        return self.aio.server

    @property
    def node_id(self) -> str:
        return self.aio.node_id

    def session(self, transacted: bool = False, ack_mode: str = "auto") -> Session:
        return Session(self, self._lt.run(self.aio.create_session(transacted, ack_mode)))

    def manage(self, op: str, **args: Any) -> Any:
        return self._lt.run(self.aio.manage(op, **args))

    def add_failure_listener(self, listener: Callable[[FailureEvent, TandemError | None], None]) -> None:
        self.aio.add_failure_listener(listener)

    @property
    def closed(self) -> bool:
        return self.aio.closed

    def close(self) -> None:
        try:
            self._lt.run(self.aio.close(), timeout=10)
        finally:
            self._lt.stop()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    def __init__(self, conn: Connection, aio: AsyncSession) -> None:
        self.connection = conn
        self.aio = aio
        self._run = conn._lt.run

    def create_producer(self, address: str | None = None, window: int | None = None) -> Producer:
        prod = self.aio.create_producer(address, window)
        return Producer(self, prod)

    def create_consumer(self, queue: str, filter: str | None = None, window: int | None = None) -> Consumer:
        return Consumer(self, self._run(self.aio.create_consumer(queue, filter, window)))

    def create_browser(self, queue: str, filter: str | None = None, window: int | None = None) -> Consumer:
        return Consumer(self, self._run(self.aio.create_browser(queue, filter, window)))

    def subscribe(
        self, address: str, subscription: str | None = None, durable: bool = False, filter: str | None = None
    ) -> Consumer:
        return Consumer(self, self._run(self.aio.subscribe(address, subscription, durable, filter)))

    def create_queue(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return self._run(self.aio.create_queue(name, **kwargs))

    def delete_queue(self, name: str, force: bool = False) -> int:
        return self._run(self.aio.delete_queue(name, force))

    def commit(self, dedup_id: str | None = None) -> None:
        """Commit the transaction (see AsyncSession.commit)."""
        self._run(self.aio.commit(dedup_id))

    def retry_commit(self) -> bool:
        """Commit the redone work of a commit whose outcome was unknown (see AsyncSession.retry_commit)."""
        return self._run(self.aio.retry_commit())

    @property
    def unresolved_commit(self) -> str | None:
        """Transaction id of the last commit that raised TransactionOutcomeUnknown (until retried)."""
        return self.aio.unresolved_commit

    def rollback(self) -> None:
        self._run(self.aio.rollback())

    def set_send_acknowledgement_handler(self, handler: SendAckHandler | None) -> None:
        """`send()` no longer waits: `handler(message, error)` runs on the client thread once the
        broker confirms (see AsyncSession.set_send_acknowledgement_handler; it must not block)."""
        self.aio.set_send_acknowledgement_handler(handler)

    def close(self) -> None:
        self._run(self.aio.close())

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Producer:
    def __init__(self, session: Session, aio: AsyncProducer) -> None:
        self.session = session
        self.aio = aio
        self._lt = session.connection._lt
        self._window = threading.BoundedSemaphore(aio.window)
        self._failures: list[BaseException] = []

    def send(self, body: Message | bytes | str, **fields: Any) -> None:
        """Send and wait for the confirmation (durable: on disk); with a send-acknowledgement
        handler on the session, wait only for room in the window and leave it to the handler."""
        handler = self.session.aio.send_ack_handler
        if handler is not None:
            msg = as_message(body, **fields)
            self.send_async(msg, lambda exc: _call_handler(handler, msg, exc))
            return
        self._lt.run(self.aio.send(body, **fields))

    def send_stream(
        self, source: Any, size: int | None = None, *, message: Message | None = None, **fields: Any
    ) -> None:
        """Send a body read from `source` (a binary file object, or bytes) as a large message, a chunk
        at a time, and wait for the confirmation (see AsyncProducer.send_stream)."""
        self._lt.run(self.aio.send_stream(source, size, message=message, **fields), timeout=None)

    def send_async(self, body: Message | bytes | str, callback: SendCallback | None = None, **fields: Any) -> None:
        """Send without waiting for the confirmation; blocks only while the window is full.

        `callback(error_or_None)` runs on the client thread when the broker answers.
        """
        self.session.aio._check()
        msg = as_message(body, **fields)
        address = msg.address or self.aio.address
        if address is not None and not self.aio.has_credit(address, _size(msg)):
            self._lt.run(self.aio.credit(address, _size(msg)))  # blocks while the address is full (BLOCK)
        timeout = self.aio.session.conn.options.call_timeout / 1000
        if not self._window.acquire(timeout=timeout):
            raise CallTimeout(f"send window stayed full for {timeout:.1f}s")
        release = self._window.release

        def done(exc: BaseException | None) -> None:
            release()
            if callback is not None:
                callback(exc)
            elif exc is not None:
                self._failures.append(exc)  # reported by flush()

        def go() -> None:
            try:
                self.aio.send_nowait(msg, done)
            except BaseException as exc:
                done(exc)

        self._lt.call_soon(go)

    def flush(self) -> None:
        """Wait until every send so far is confirmed; raise the first failure of a `send_async`
        that had no callback since the last flush."""

        async def _flush() -> None:
            await asyncio.sleep(0)
            await self.aio.flush()

        self._lt.run(_flush())
        if self._failures:
            first, self._failures = self._failures[0], []
            raise first


class Consumer:
    def __init__(self, session: Session, aio: AsyncConsumer) -> None:
        self.session = session
        self.aio = aio
        self._run = session.connection._lt.run
        self._lt = session.connection._lt
        self._worker: _ListenerThread | None = None

    def receive(self, timeout: float | None = None) -> ReceivedMessage | None:
        """The next message, or None after `timeout` seconds."""
        msg = self._run(self.aio.receive(timeout))
        return _Blocking.wrap(msg, self._lt) if msg is not None else None

    def __iter__(self) -> Iterator[ReceivedMessage]:
        """Messages until the consumer closes; a failover in between is ridden through, as `async for` does."""
        while True:
            try:
                msg = self.receive()
            except IllegalState:
                return
            except Unblocked:
                continue  # failed over: the new server sends what was not acknowledged
            if msg is not None:
                yield msg

    def set_listener(self, listener: Callable[[ReceivedMessage], Any] | None) -> None:
        """Pass messages to `listener` on a dedicated thread, in order (auto mode: acked after it returns)."""

        async def detach() -> None:
            self.aio.set_listener(None)

        self._run(detach())
        if self._worker is not None:
            self._worker.stop()  # runs what it already holds first
            self._worker = None
        if listener is None:
            return
        worker = self._worker = _ListenerThread(listener, self._lt, self.aio)

        async def attach() -> None:
            self.aio.set_listener(worker.submit, auto_ack=False)

        self._run(attach())

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self._run(self.aio.close())

    @property
    def queue(self) -> str:
        return self.aio.queue


class _Blocking(ReceivedMessage):
    """A received message whose ack() blocks until the broker confirms it."""

    _lt: _LoopThread

    @classmethod
    def wrap(cls, msg: ReceivedMessage, lt: _LoopThread) -> ReceivedMessage:
        msg.__class__ = cls
        msg._lt = lt  # type: ignore[attr-defined]
        return msg

    def ack(self) -> Any:
        inner = ReceivedMessage.ack

        async def _ack() -> None:
            await inner(self)

        return self._lt.run(_ack())

    def nack(self) -> Any:
        inner = ReceivedMessage.nack

        async def _nack() -> None:
            await inner(self)

        return self._lt.run(_nack())


class _ListenerThread:
    """Runs a blocking listener off the client's loop; auto-acks each message after the listener returns."""

    def __init__(self, listener: Callable[[ReceivedMessage], Any], lt: _LoopThread, consumer: AsyncConsumer) -> None:
        self.listener = listener
        self.lt = lt
        self.consumer = consumer
        self.q: queue.SimpleQueue[ReceivedMessage | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="tandem-listener", daemon=True)
        self.thread.start()

    def submit(self, msg: ReceivedMessage) -> None:
        self.q.put(_Blocking.wrap(msg, self.lt))

    def stop(self) -> None:
        self.q.put(None)
        if threading.current_thread() is not self.thread:
            self.thread.join(5)

    def _run(self) -> None:
        while True:
            msg = self.q.get()
            if msg is None:
                return
            try:
                self.listener(msg)
            except Exception:
                logging.getLogger("tandem.client").exception("message listener raised")
            self.lt.call_soon(self.consumer.auto_ack, msg)


def connect(url: str, **options: Any) -> Connection:
    """Open a blocking connection: `tandem.connect("tcp://127.0.0.1:61616")`."""
    lt = _LoopThread()
    try:
        timeout = None
        aio = lt.run(AsyncConnection.connect(url, **options), timeout)
    except BaseException:
        lt.stop()
        raise
    return Connection(lt, aio)
