"""Session reattachment through the fault proxy and a real broker process.

The client has a confirmation window, so the broker keeps its sessions for the connection TTL
after the link fails. A blackhole shorter than the TTL must be invisible to the application:
no exception, no redelivery, no duplicate (auto_dedup is off: only the replay can keep sends
exactly once). A longer one takes the reconnect path, with the errors docs/client.md lists.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import drain_bodies, drain_texts, send_confirmed
from reply_proxy import CommitReplyDropper
from tandem.errors import (
    CallTimeout,
    IllegalState,
    TandemError,
    TransactionOutcomeUnknown,
    TransactionRolledBack,
    Unblocked,
)
from tandem.testing import AsyncFaultProxy, FaultProxy, free_port

FAST = {"client_failure_check_period": 500, "connect_timeout": 500, "retry_interval": 100}
WINDOW = {"confirmation_window_size": 1024, "auto_dedup": False, "reconnect_attempts": -1}
# A call times out (1 s) well before the client notices the link is gone (3 s): a command it gave up.
SLOW_CHECK = {**WINDOW, **FAST, "connection_ttl": 20_000, "call_timeout": 1000, "client_failure_check_period": 3000}
Events = list[tuple[aio.FailureEvent, TandemError | None]]


def _broker(factory: Any, port: int) -> BrokerProcess:
    """A broker that announces the proxy (a reconnection must not go around it) and checks TTLs often."""
    return factory(  # type: ignore[no-any-return]
        connection_check_period=100,
        connector_ref="via-proxy",
        extra_toml=f'[[connectors]]\nname = "via-proxy"\nurl = "127.0.0.1:{port}"\n',
    ).start()


async def _until(cond: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.02)


async def _reconnecting(proxy: AsyncFaultProxy, timeout: float = 10.0) -> None:
    """Until the client, having noticed the silence, opens a second connection through the proxy."""
    deadline = time.monotonic() + timeout
    while (await proxy.stats()).connections < 2:
        assert time.monotonic() < deadline, "the client did not notice the silence"
        await asyncio.sleep(0.02)


async def _a_large_send_written_while_away(
    proxy: AsyncFaultProxy, conn: aio.AsyncConnection, body: bytes
) -> tuple[aio.AsyncProducer, asyncio.Future[None]]:
    """Send "before" to queue "big", blackhole the link until the client reconnects, then write a
    large send_nowait of `body` while it is away: the producer and that send."""
    producer = (await conn.create_session()).create_producer("big")
    await producer.send("before")
    await proxy.blackhole()
    await _reconnecting(proxy)
    assert not conn.ready
    large = producer.send_nowait(body)
    assert large is not None
    return producer, large


async def _status(url: str) -> dict[str, Any]:
    conn = await aio.connect(url)
    try:
        return await conn.manage("broker.status")  # type: ignore[no-any-return]
    finally:
        await conn.close()


@pytest.mark.timeout(60)
def test_blackhole_shorter_than_the_ttl_is_invisible(broker_factory: Any) -> None:
    port = free_port()
    broker = _broker(broker_factory, port)
    inbound = [f"in-{i}" for i in range(30)]
    events: Events = []
    got: list[tuple[str, int]] = []

    async def main() -> None:
        await send_confirmed(broker.url, "in", "in-", 30)
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(proxy.url, connection_ttl=10_000, **WINDOW, **FAST)
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            session = await conn.create_session()
            producer = session.create_producer("out")
            consumer = await session.create_consumer("in", window=200)  # small: FLOWs are in flight too
            tx = await conn.create_session(transacted=True)
            tx_producer = tx.create_producer("tx-out")
            for _ in range(10):
                m = await consumer.receive(5)
                assert m is not None
                got.append((m.text, m.delivery_count))
            for i in range(5):
                await producer.send(f"a-{i}")
            await tx_producer.send("t-0")
            await proxy.blackhole()
            # In flight across the blackhole: sends, a commit, consumption with its acks and credit.
            pending = [await producer.send_async(f"b-{i}") for i in range(5)]
            await tx_producer.send_async("t-1")
            commit = asyncio.ensure_future(tx.commit())
            await _reconnecting(proxy)
            await asyncio.sleep(max(0.0, 2.0 - 0.5))  # a 2-second blackhole in all
            await proxy.heal()
            await _until(lambda: events, "the client reattaches after the heal")
            for fut in pending:
                assert fut is not None
                await asyncio.wait_for(fut, 10)
            await asyncio.wait_for(commit, 10)
            for i in range(5):
                await producer.send(f"c-{i}")
            while len(got) < 30:
                m = await consumer.receive(5)
                assert m is not None, f"only {len(got)} of 30 received"
                got.append((m.text, m.delivery_count))
            assert await consumer.receive(0.3) is None
            await conn.close()
        status = await _status(broker.url)
        assert status["sessions"] == 0 and status["consumers"] == 0, status

    asyncio.run(main())
    assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events
    assert got == [(t, 1) for t in inbound], "a message came twice, out of order or as a redelivery"
    assert asyncio.run(drain_texts(broker.url, "out")) == [f"{x}-{i}" for x in "abc" for i in range(5)]
    assert asyncio.run(drain_texts(broker.url, "tx-out")) == ["t-0", "t-1"]
    assert asyncio.run(drain_texts(broker.url, "in")) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("direction", ["down", "up"])
def test_unconfirmed_commands_are_replayed_exactly_once(broker_factory: Any, direction: str) -> None:
    """`down`: the broker gets every command and the client none of its confirmations (it must
    replay nothing); `up`: the broker gets none (the client must replay all, once)."""
    port = free_port()
    broker = _broker(broker_factory, port)
    events: Events = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            # A window larger than what is sent: the server's RECEIVED never trims the buffer.
            conn = await aio.connect(proxy.url, connection_ttl=10_000, **{**WINDOW, **FAST})
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            session = await conn.create_session()
            producer = session.create_producer("replay")
            await producer.send("m-0")
            await proxy.blackhole(direction)  # type: ignore[arg-type]
            pending = [await producer.send_async(f"m-{i}") for i in range(1, 40)]
            await asyncio.sleep(0.2)
            await _reconnecting(proxy)
            await proxy.heal()
            await _until(lambda: events, "the client reattaches")
            for fut in pending:
                assert fut is not None
                await asyncio.wait_for(fut, 10)
            await conn.close()

    asyncio.run(main())
    assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events
    assert asyncio.run(drain_texts(broker.url, "replay")) == [f"m-{i}" for i in range(40)]


@pytest.mark.timeout(60)
def test_blackhole_longer_than_the_ttl_takes_the_reconnect_path(broker_factory: Any) -> None:
    port = free_port()
    broker = _broker(broker_factory, port)
    events: Events = []
    errors: dict[str, BaseException] = {}

    async def main() -> None:
        await send_confirmed(broker.url, "in", "in-", 1)
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(proxy.url, connection_ttl=1000, **WINDOW, **FAST)
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            session = await conn.create_session(ack_mode="client")
            consumer = await session.create_consumer("in")
            first = await consumer.receive(5)
            assert first is not None and first.text == "in-0"
            tx = await conn.create_session(transacted=True)
            await tx.create_producer("tx-out").send("t-0")
            await proxy.blackhole()
            receiving = asyncio.ensure_future(consumer.receive(20))
            await asyncio.sleep(0.1)
            await _reconnecting(proxy)
            await asyncio.sleep(3.0)  # the broker's TTL (1 s) expires under the blackhole
            await proxy.heal()
            await _until(lambda: events, "the client reconnects")
            try:
                await receiving
            except Unblocked as exc:
                errors["receive"] = exc
            try:
                await first.ack()
            except TandemError as exc:
                errors["ack"] = exc
            try:
                await tx.commit()
            except TransactionRolledBack as exc:
                errors["commit"] = exc
            again = await consumer.receive(5)
            assert again is not None and again.text == "in-0" and again.delivery_count == 2
            await again.ack()
            await conn.close()

    asyncio.run(main())
    assert [k for k, _ in events] == [aio.FailureEvent.RECONNECTED], events
    assert set(errors) == {"receive", "ack", "commit"}, errors
    assert errors["ack"].code.name == "STALE_ACKNOWLEDGE"
    assert asyncio.run(drain_texts(broker.url, "tx-out")) == []
    assert asyncio.run(drain_texts(broker.url, "in")) == []


@pytest.mark.timeout(60)
def test_send_acknowledgement_handler_confirms_each_send_once_across_a_reattach(broker_factory: Any) -> None:
    """Blocking API: with a handler `send()` does not wait; each message is acknowledged to the
    handler exactly once, without error, in order, though a blackhole cuts the link meanwhile."""
    port = free_port()
    broker = _broker(broker_factory, port)
    acked: list[tuple[str, BaseException | None]] = []
    events: Events = []
    with FaultProxy(broker.port, port=port) as proxy:
        conn = tandem.connect(proxy.url, connection_ttl=10_000, **WINDOW, **FAST)
        try:
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            session = conn.session()
            session.set_send_acknowledgement_handler(lambda msg, exc: acked.append((msg.body, exc)))
            producer = session.create_producer("acked")
            for i in range(50):
                producer.send(f"m-{i}")
            proxy.blackhole()
            for i in range(50, 100):
                producer.send(f"m-{i}")  # returns at once: nothing is confirmed while the link is dead
            deadline = time.monotonic() + 10
            while proxy.stats().connections < 2:
                assert time.monotonic() < deadline, "the client did not notice the silence"
                time.sleep(0.02)
            time.sleep(1.0)
            proxy.heal()
            producer.flush()
        finally:
            conn.close()
    assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events
    assert acked == [(f"m-{i}", None) for i in range(100)]
    assert asyncio.run(drain_texts(broker.url, "acked")) == [f"m-{i}" for i in range(100)]


def test_send_acknowledgement_handler_needs_a_confirmation_window(broker: BrokerProcess) -> None:
    with tandem.connect(broker.url) as conn, conn.session() as session:
        with pytest.raises(IllegalState, match="confirmation window"):
            session.set_send_acknowledgement_handler(lambda msg, exc: None)
        producer = session.create_producer("plain")
        producer.send("still waits")  # without a handler: confirmed before it returns
    assert asyncio.run(drain_texts(broker.url, "plain")) == ["still waits"]


@pytest.mark.timeout(60)
def test_commit_whose_answer_was_lost_is_answered_after_the_reattach(broker: BrokerProcess) -> None:
    """The broker commits, its answer is lost and the link reset: the reattach brings the answer
    (the server kept it), so the commit returns normally; nothing is applied twice."""
    events: Events = []

    async def main() -> None:
        with CommitReplyDropper(broker.port) as proxy:
            conn = await aio.connect(proxy.url, connection_ttl=10_000, **WINDOW, **FAST)
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            tx = await conn.create_session(transacted=True)
            producer = tx.create_producer("orders")
            for i in range(5):
                await producer.send(f"order-{i}")
            commit = asyncio.ensure_future(tx.commit())
            await _until(proxy.dropped.is_set, "the commit's answer is dropped")
            proxy.proxy.reset()
            await asyncio.wait_for(commit, 10)  # no TransactionOutcomeUnknown: the answer came again
            await producer.send("after")
            await tx.commit()
            await conn.close()

    asyncio.run(main())
    assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events
    assert asyncio.run(drain_texts(broker.url, "orders")) == [f"order-{i}" for i in range(5)] + ["after"]


def test_received_trims_the_resend_buffer(broker: BrokerProcess) -> None:
    """The broker says RECEIVED every window's worth of bytes: the client's kept commands stay
    around one window, however many are sent; without a window nothing is kept at all."""

    async def main() -> tuple[int, int, bool]:
        conn = await aio.connect(broker.url, confirmation_window_size=4096, auto_dedup=False)
        session = await conn.create_session()
        producer = session.create_producer("trimmed")
        for i in range(500):
            await producer.send_async("x" * 100 + str(i))
        await producer.flush()
        kept = session.channel.kept
        assert kept is not None
        left = len(kept)
        size = sum(len(frame) for _, frame in kept)
        await conn.close()
        plain = await aio.connect(broker.url)
        plain_session = await plain.create_session()
        await plain_session.create_producer("trimmed").send("plain")
        nothing_kept = plain_session.channel.kept is None
        await plain.close()
        return left, size, nothing_kept

    left, size, nothing_kept = asyncio.run(main())
    assert size <= 4096 + 200, f"{left} commands ({size} bytes) kept after 500 sends of ~130 bytes"
    assert nothing_kept
    assert len(asyncio.run(drain_texts(broker.url, "trimmed"))) == 501


@pytest.mark.timeout(60)
def test_a_restarted_broker_has_no_sessions_to_reattach(broker_factory: Any) -> None:
    """Same node id after the restart (its store), but the sessions died with the process: the
    REATTACH is refused and the client takes the reconnect path."""
    port = free_port()
    broker = broker_factory(extra_toml=f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:{port}"\n').start()
    events: Events = []

    async def main() -> None:
        conn = await aio.connect(
            broker.url, confirmation_window_size=1024, reconnect_attempts=-1, connection_ttl=30_000, **FAST
        )
        conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
        node = conn.node_id
        producer = (await conn.create_session()).create_producer("restart")
        await producer.send("before")
        broker.kill()
        await asyncio.get_running_loop().run_in_executor(None, broker.start)
        await _until(lambda: events, "the client reconnects to the restarted broker")
        await producer.send("after")
        assert conn.node_id == node
        await conn.close()

    asyncio.run(main())
    assert [k for k, _ in events] == [aio.FailureEvent.RECONNECTED], events
    assert asyncio.run(drain_texts(broker.url, "restart")) == ["before", "after"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ack_mode", ["auto", "client", "individual"])
def test_streams_ride_through_repeated_blackholes(broker_factory: Any, ack_mode: str) -> None:
    """A producer and a consumer on one connection stream while the link is blackholed twice
    (each time shorter than the TTL): the consumer sees every message once, in order, as a
    first delivery; everything is acknowledged; no exception reaches the application."""
    port = free_port()
    broker = _broker(broker_factory, port)
    total = 1500
    events: Events = []
    got: list[tuple[str, int]] = []
    at_cut: list[int] = []  # messages received when each blackhole began

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(
                proxy.url, connection_ttl=10_000, send_window=50, **{**WINDOW, "confirmation_window_size": 2048}, **FAST
            )
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            out = await conn.create_session()
            producer = out.create_producer("stream")
            inn = await conn.create_session(ack_mode=ack_mode)
            consumer = await inn.create_consumer("stream", window=4096)

            async def produce() -> None:
                for i in range(total):
                    await producer.send_async(f"s-{i}")
                    if i % 10 == 0:
                        await asyncio.sleep(0.02)  # ~3 s of traffic: both blackholes fall inside it
                await producer.flush()

            async def consume() -> None:
                while len(got) < total:
                    m = await consumer.receive(20)
                    assert m is not None, f"stalled after {len(got)} messages"
                    got.append((m.text, m.delivery_count))
                    if ack_mode != "auto":
                        await m.ack()

            tasks = [asyncio.ensure_future(produce()), asyncio.ensure_future(consume())]
            for n in range(2):
                await asyncio.sleep(0.3)
                at_cut.append(len(got))
                await proxy.blackhole()
                await asyncio.sleep(1.5)
                await proxy.heal()
                await _until(lambda n=n: len(events) > n, f"reattach {n + 1}")
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            await conn.close()

    asyncio.run(main())
    assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED] * 2, events
    assert all(0 < n < total for n in at_cut), f"a blackhole fell outside the traffic: {at_cut}"
    assert got == [(f"s-{i}", 1) for i in range(total)]
    assert asyncio.run(drain_texts(broker.url, "stream")) == []


@pytest.mark.timeout(60)
def test_a_consumer_closed_by_the_broker_while_away_is_reported_after_the_reattach(broker_factory: Any) -> None:
    """Its queue is deleted while the link is down: the CONSUMER_CLOSED is lost on the wire,
    the broker tells it again on the reattach, and `receive()` raises as without the outage."""
    port = free_port()
    broker = _broker(broker_factory, port)
    events: Events = []
    errors: list[BaseException] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(proxy.url, connection_ttl=10_000, **WINDOW, **FAST)
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            session = await conn.create_session()
            await session.create_queue("doomed")
            consumer = await session.create_consumer("doomed")
            await proxy.blackhole()
            admin = await aio.connect(broker.url)
            await admin.manage("queue.delete", name="doomed", force=True)
            await admin.close()
            await _reconnecting(proxy)
            await proxy.heal()
            await _until(lambda: events, "the client reattaches")
            try:
                await consumer.receive(5)
            except TandemError as exc:
                errors.append(exc)
            await conn.close()

    asyncio.run(main())
    assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events
    assert [type(e).__name__ for e in errors] == ["QueueDoesNotExist"], errors


@pytest.mark.timeout(60)
def test_a_session_closed_while_away_is_closed_on_the_broker_too(broker_factory: Any) -> None:
    port = free_port()
    broker = _broker(broker_factory, port)
    events: Events = []

    async def main() -> None:
        await send_confirmed(broker.url, "held", "h-", 3)
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(proxy.url, connection_ttl=10_000, **WINDOW, **FAST)
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            closing = await conn.create_session(ack_mode="client")
            consumer = await closing.create_consumer("held")
            m = await consumer.receive(5)
            assert m is not None
            await conn.create_session()  # stays open
            await proxy.blackhole()
            await _reconnecting(proxy)
            closed = asyncio.ensure_future(closing.close())
            await asyncio.sleep(0.3)
            assert not closed.done(), "close() must wait for the reattach"
            await proxy.heal()
            await asyncio.wait_for(closed, 10)
            status = await _status(broker.url)
            assert status["sessions"] == 1 and status["consumers"] == 0, status
            await conn.close()

    asyncio.run(main())
    assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events
    # Closed unacknowledged: all three back (the one handed to the application counts a delivery).
    assert asyncio.run(drain_texts(broker.url, "held")) == ["h-0", "h-1", "h-2"]


@pytest.mark.timeout(60)
def test_a_call_that_timed_out_is_not_replayed(broker_factory: Any) -> None:
    """CREATE_CONSUMER written into the blackhole times out: the application was told it failed,
    so the reattach must not create the consumer behind its back."""
    port = free_port()
    broker = _broker(broker_factory, port)
    events: Events = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(proxy.url, connection_ttl=10_000, call_timeout=1000, **WINDOW, **FAST)
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            session = await conn.create_session()
            await session.create_queue("ghost")
            await proxy.blackhole()
            with pytest.raises(CallTimeout):
                await session.create_consumer("ghost")
            await proxy.heal()
            await _until(lambda: events, "the client reattaches")
            await (await session.create_consumer("ghost")).close()  # the session works on
            status = await _status(broker.url)
            assert status["consumers"] == 0, status
            await conn.close()

    asyncio.run(main())
    assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events


class _SlowSource(io.RawIOBase):
    """A seekable body that takes its time: a blackhole lands in the middle of the large send."""

    def __init__(self, data: bytes, delay: float) -> None:
        self.data = data
        self.pos = 0
        self.delay = delay

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = (
            offset
            if whence == io.SEEK_SET
            else (self.pos + offset if whence == io.SEEK_CUR else len(self.data) + offset)
        )
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        time.sleep(self.delay)
        n = min(len(b), len(self.data) - self.pos)
        b[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


@pytest.mark.timeout(60)
def test_a_large_send_cut_by_a_blackhole_is_sent_again_whole_not_reattached(broker_factory: Any) -> None:
    """A reattach cannot replay the chunks of a large message lost in the blackhole: the broker
    refuses it, the client takes the reconnect path and sends the message again from its start
    (dedup id, seekable source); it arrives once, whole."""
    port = free_port()
    broker = _broker(broker_factory, port)
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB: 64 chunks of 64 KiB
    events: Events = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(
                proxy.url,
                connection_ttl=10_000,
                min_large_message_size=64 * 1024,
                **{**WINDOW, **FAST, "auto_dedup": True, "client_failure_check_period": 2000},
            )
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            producer = (await conn.create_session()).create_producer("big")
            send = asyncio.create_task(producer.send_stream(_SlowSource(body, 0.02)))
            await asyncio.sleep(0.4)
            assert not send.done()
            await proxy.blackhole()
            await _reconnecting(proxy)
            await proxy.heal()
            await asyncio.wait_for(send, 30)
            await conn.close()

    asyncio.run(main())
    assert aio.FailureEvent.REATTACHED not in [k for k, _ in events], events

    got = asyncio.run(drain_bodies(broker.url, "big", 1.0))
    assert len(got) == 1 and got[0] == body, [len(b) for b in got]


@pytest.mark.timeout(90)
def test_large_deliveries_through_a_blackhole_arrive_whole_once_and_in_order(broker_factory: Any) -> None:
    """Large messages delivered while the link is blackholed: whatever the client got whole is
    not delivered again, a part lost on the wire is, and every body arrives intact, in order."""
    port = free_port()
    broker = _broker(broker_factory, port)
    bodies = [bytes([i]) * (512 * 1024 + i) for i in range(12)]
    events: Events = []
    got: list[tuple[bytes, int]] = []

    async def main() -> None:
        conn = await aio.connect(broker.url, min_large_message_size=64 * 1024)
        producer = (await conn.create_session()).create_producer("bigs")
        for b in bodies:
            await producer.send(b)
        await conn.close()
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(proxy.url, connection_ttl=10_000, **{**WINDOW, **FAST})
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            session = await conn.create_session(ack_mode="individual")
            consumer = await session.create_consumer("bigs", window=256 * 1024)
            for k in range(len(bodies)):
                m = await consumer.receive(20)
                assert m is not None, f"message {k} did not come"
                got.append((m.body, m.delivery_count))
                await m.ack()
                if k == 3:
                    await proxy.blackhole()
                    await _reconnecting(proxy)
                    await proxy.heal()
            assert await consumer.receive(1.0) is None
            await conn.close()

    asyncio.run(main())
    assert events, "the blackhole went unnoticed"
    assert [b for b, _ in got] == bodies, [len(b) for b, _ in got]


@pytest.mark.timeout(60)
def test_a_large_send_written_while_away_goes_whole_after_the_reattach(broker_factory: Any) -> None:
    """`send_nowait` of a large body while the client is between links: its LARGE_BEGIN and
    chunks carry no command id. The reattach that follows must not replay only its LARGE_END
    (the broker takes that as a protocol error and the whole connection starts again): the
    message goes whole, once, and the link stays reattached."""
    port = free_port()
    broker = _broker(broker_factory, port)
    body = bytes(range(256)) * 64  # 16 KiB: 16 chunks of 1 KiB
    events: Events = []
    outcome: dict[str, BaseException | None] = {}

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(
                proxy.url, connection_ttl=10_000, min_large_message_size=1024, **{**WINDOW, **FAST}
            )
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            producer, large = await _a_large_send_written_while_away(proxy, conn, body)
            await proxy.heal()
            try:
                await asyncio.wait_for(large, 10)
                outcome["large"] = None
            except TandemError as exc:
                outcome["large"] = exc
            await producer.send("after")
            await conn.close()

    asyncio.run(main())
    assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events
    assert outcome["large"] is None, outcome

    got = asyncio.run(drain_bodies(broker.url, "big", 1.0))
    assert got == [b"before", body, b"after"], [len(b) for b in got]


@pytest.mark.timeout(60)
def test_a_large_send_written_while_away_survives_a_loss_before_the_reattach_is_answered(broker_factory: Any) -> None:
    """As above, and the link that reattaches is reset while the broker's answer is on its way.
    The message is kept whole, chunks and all, so it does not force a reconnection (as a large
    send cut on the wire does): the client reattaches again and the message goes once, whole."""
    port = free_port()
    broker = _broker(broker_factory, port)
    body = bytes(range(256)) * 64
    events: Events = []
    outcome: dict[str, BaseException | None] = {}

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(
                proxy.url,
                connection_ttl=10_000,
                min_large_message_size=1024,
                **{**WINDOW, **FAST, "connect_timeout": 3000, "client_failure_check_period": 2000},
            )
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            producer, large = await _a_large_send_written_while_away(proxy, conn, body)
            await proxy.heal()
            await proxy.delay(1.0, "down")  # the next link's HELLO and REATTACH answers come late
            await _until(lambda: conn._proto is not None, "the client connects again")
            await asyncio.sleep(0.3)
            assert not conn.ready, "reattached before the link was cut: the test missed its moment"
            assert await proxy.reset() >= 1  # the REATTACH reached the broker, its answer is lost
            await proxy.delay(0, "down")
            try:
                await asyncio.wait_for(large, 15)
                outcome["large"] = None
            except TandemError as exc:
                outcome["large"] = exc
            await producer.send("after")
            await conn.close()

    asyncio.run(main())
    assert outcome["large"] is None, (outcome, events)
    assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events

    got = asyncio.run(drain_bodies(broker.url, "big", 1.0))
    assert got == [b"before", body, b"after"], [len(b) for b in got]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["redo", "ask"])
def test_a_commit_that_timed_out_is_applied_once_after_a_reattach(broker_factory: Any, how: str) -> None:
    """A COMMIT written into a blackhole raises TransactionOutcomeUnknown (its call timed out);
    the link then reattaches within the TTL, so the broker's session, and the transaction's work
    in it, lives on. The COMMIT stays among the kept commands: the reattach has the broker
    execute it, and retry_commit() finds its id taken. Dropped, the work stayed in the broker's
    transaction and the retry committed it with whatever the retry carried (found in review):
    `redo` (send the rows again, retry) stored every row twice; `ask` (retry with nothing, as a
    consumer asks whether its acknowledgements were applied) was told "not applied, they come
    again" while it had just committed them."""
    port = free_port()
    broker = _broker(broker_factory, port)
    rows = ["row-1", "row-2"]

    async def main() -> tuple[bool, list[str], list[str]]:
        if how == "ask":
            await send_confirmed(broker.url, "inbox", "order-", 3)
        events: Events = []
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(proxy.url, **SLOW_CHECK)
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            tx = await conn.create_session(transacted=True)
            producer = tx.create_producer("orders")
            consumer = await tx.create_consumer("inbox") if how == "ask" else None
            if consumer is not None:
                for _ in range(3):
                    assert await consumer.receive(5) is not None
            else:
                for r in rows:
                    await producer.send(r)
            await proxy.blackhole()
            with pytest.raises(TransactionOutcomeUnknown):
                await tx.commit(dedup_id="batch-1")
            await _until(lambda: not conn.ready, "the client notices the loss")
            await proxy.heal()
            await _until(lambda: events, "the client reattaches after the heal")
            assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events
            if how == "redo":
                for r in rows:
                    await producer.send(r)
            applied = await tx.retry_commit()
            again = []
            if consumer is not None:
                while (m := await consumer.receive(1)) is not None:
                    again.append(m.text)
                await tx.commit()
            await conn.close()
        return applied, again, await drain_texts(broker.url, "orders" if how == "redo" else "inbox")

    applied, again, left = asyncio.run(main())
    assert applied is False  # the first attempt was committed, by the reattach
    if how == "redo":
        assert left == rows  # once
    else:
        assert again == [] and left == []  # acknowledged once, by the first attempt


@pytest.mark.timeout(60)
def test_a_rollback_that_timed_out_is_applied_after_a_reattach(broker_factory: Any) -> None:
    """As a commit: a ROLLBACK written into a blackhole stays among the kept commands, so the
    reattach has the broker roll the work back, and the next commit carries only its own."""
    port = free_port()
    broker = _broker(broker_factory, port)

    async def main() -> list[str]:
        events: Events = []
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(proxy.url, **SLOW_CHECK)
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            tx = await conn.create_session(transacted=True)
            producer = tx.create_producer("orders")
            await producer.send("undone")
            await proxy.blackhole()
            with pytest.raises(CallTimeout):
                await tx.rollback()
            await _until(lambda: not conn.ready, "the client notices the loss")
            await proxy.heal()
            await _until(lambda: events, "the client reattaches after the heal")
            assert [k for k, _ in events] == [aio.FailureEvent.REATTACHED], events
            await producer.send("kept")
            await tx.commit()
            await conn.close()
        return await drain_texts(broker.url, "orders")

    assert asyncio.run(main()) == ["kept"]


@pytest.mark.timeout(60)
def test_a_consumer_whose_creation_timed_out_does_not_hold_messages(broker_factory: Any) -> None:
    """create_consumer() raising CallTimeout while the broker did create the consumer (its answer
    held by a slow link): the client closes it, as one it never saw. Forgotten, it stayed on the
    broker with credit and took the queue's messages, which the client dropped as deliveries to
    no consumer of its: withheld from everyone for the session's life (found in review)."""
    port = free_port()
    broker = _broker(broker_factory, port)

    async def main() -> tuple[list[str], dict[str, Any]]:
        await send_confirmed(broker.url, "jobs", "job-", 5)
        async with AsyncFaultProxy(broker.port, port=port) as proxy:
            conn = await aio.connect(proxy.url, call_timeout=1000)
            s = await conn.create_session()
            await proxy.cut("down")  # the broker's answers wait (nothing is lost)
            with pytest.raises(CallTimeout):
                await s.create_consumer("jobs")
            await asyncio.sleep(1.0)
            await proxy.heal()
            c = await s.create_consumer("jobs")  # tried again on the same session
            got = []
            while (m := await c.receive(2)) is not None:
                got.append(m.text)
                assert m.delivery_count == 1  # the first consumer's deliveries were not failures
            async with await aio.connect(broker.url) as admin:
                stat = (await admin.manage("queue.stat", name="jobs"))[0]
            await conn.close()
        return got, stat

    got, stat = asyncio.run(main())
    assert got == [f"job-{i}" for i in range(5)]
    assert stat["consumer_count"] == 1, stat
