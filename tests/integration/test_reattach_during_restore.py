"""A link lost again while a session is being restored, and the client reattaches to that restore.

The broker restarted (its sessions gone: the client restores them on it), and the link fails
while the restore waits for the broker's answer to CREATE_SESSION. The broker keeps that new
connection for its TTL, so the client reattaches to it. A send written while the REATTACH is
answered is kept for the reattach's replay: it must reach the broker once, not also straight
away (the broker would then store it twice: auto_dedup is off, no dedup id).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

import tandem.aio as aio
from client_io import drain_texts
from tandem.errors import ErrorCode, NotConnected, ProtocolError, TandemError, Unblocked
from tandem.protocol import native as p
from tandem.testing import AsyncFaultProxy, free_port
from tandem.testing.proxy import Filter

FAST = {"client_failure_check_period": 2000, "connect_timeout": 3000, "retry_interval": 100}


async def _until(cond: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.002)


def _broker_behind_a_proxy(broker_factory: Any) -> tuple[Any, int]:
    """A broker whose topology sends clients through a proxy on a port chosen now."""
    port, proxy_port = free_port(), free_port()
    broker = broker_factory(
        connection_check_period=100,
        connector_ref="via-proxy",
        extra_toml=(
            f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:{port}"\n'
            f'[[connectors]]\nname = "via-proxy"\nurl = "127.0.0.1:{proxy_port}"\n'
        ),
    ).start()
    return broker, proxy_port


def _run_without_giving_up(main: Callable[[], Coroutine[Any, Any, None]], events: list[aio.FailureEvent]) -> None:
    """Run the scenario; the client must neither fail a call nor give the connection up."""
    try:
        asyncio.run(main())
    except TandemError as exc:
        pytest.fail(f"the client failed: {exc!r} (events {events})")
    assert aio.FailureEvent.DISCONNECT not in events, events


async def _the_parked_send_goes_once(
    away: asyncio.Future[None], conn: aio.AsyncConnection, producer: Any, url: str, events: list[Any], timeout: float
) -> None:
    """The send parked for its session's restore ("away", a dedup id) is confirmed, the client is
    back, a later send goes too, and the queue holds each once, in order."""
    done, _ = await asyncio.wait([away], timeout=timeout)  # bounded: the outcome, not a timing goal
    assert away in done, f"a send parked for its session's restore is still waiting ({events})"
    assert away.exception() is None, f"{away.exception()!r} ({events})"
    await _until(lambda: conn.ready, "the client is back")
    assert not conn.closed, f"the client gave up: {conn.error!r} ({events})"
    await producer.send("after")
    assert await drain_texts(url, "once", wait=0.3) == ["before", "away", "after"]


async def _two_sessions(conn: aio.AsyncConnection, single: bool = False) -> tuple[Any, Any]:
    """A first session holding the queue "once" (with `single`, also a queue "single" that takes
    one consumer, and that consumer), and a second session's producer on "once" that has sent
    "before". Returns the producer and the consumer (or None)."""
    first = await conn.create_session()
    await first.create_queue("once")
    consumer = None
    if single:
        await first.create_queue("single", max_consumers=1)
        consumer = await first.create_consumer("single")
    producer = (await conn.create_session()).create_producer("once")
    await producer.send("before")
    return producer, consumer


async def _killed_with_a_parked_send(conn: aio.AsyncConnection, broker: Any, producer: Any) -> asyncio.Future[None]:
    """Kill the broker; once the client has seen it go, send "away" (with a dedup id it waits for
    its session's restore)."""
    broker.kill()
    await _until(lambda: not conn.ready, "the client sees the broker go")
    away = producer.send_nowait("away")
    assert away is not None
    return away


async def _a_restore_the_broker_refuses(
    proxy: AsyncFaultProxy, conn: aio.AsyncConnection, broker: Any
) -> tuple[Any, Any, asyncio.Future[None], aio.AsyncConnection]:
    """Two sessions (`_two_sessions`, with the one-consumer queue), the broker killed with a send
    parked, restarted, another client holding that queue's one consumer, and the first session's
    restore cut (the next link reattaches to it, and the broker refuses its consumer there).
    Returns the producer, the first session's consumer, the parked send and the other client."""
    producer, single = await _two_sessions(conn, single=True)
    away = await _killed_with_a_parked_send(conn, broker, producer)
    await asyncio.get_running_loop().run_in_executor(None, broker.start)
    other = await aio.connect(broker.url)  # takes the queue's one consumer before the restore
    await (await other.create_session()).create_consumer("single")
    await _cut_the_restore(proxy, conn)
    return producer, single, away, other


async def _connect(url: str, **more: Any) -> aio.AsyncConnection:
    """A client with a confirmation window (it reattaches), without dedup ids (nothing replayable)
    unless `more` says otherwise."""
    options: dict[str, Any] = {
        "confirmation_window_size": 1024,
        "auto_dedup": False,
        "reconnect_attempts": -1,
        "connection_ttl": 30_000,
        **FAST,
    }
    return await aio.connect(url, **{**options, **more})


async def _cut_the_restore(proxy: AsyncFaultProxy, conn: aio.AsyncConnection) -> None:
    """Answers come 1 s late; once the client restores its session, the link is reset: the
    restore is cut short, and the client connects again (answers still late)."""
    await proxy.delay(1.0, "down")
    await _until(lambda: conn._restoring, "the client restores its session on the restarted broker")
    await asyncio.sleep(0.3)
    generation = conn.generation
    assert await proxy.reset() >= 1
    await _until(lambda: conn.generation > generation, "the client connects again")


async def _a_restore_refused_on_a_reattached_link(
    proxy: AsyncFaultProxy, conn: aio.AsyncConnection, broker: Any
) -> tuple[asyncio.Future[None], asyncio.Future[None], aio.AsyncConnection]:
    """A large send open at the loss (its answer cut: no reattach, the sessions dropped at once),
    the broker killed and restarted, a send written while away, another client holding the one
    consumer of a queue the restore needs, and the restore cut so that the next link reattaches
    to it: the restore fails (the consumer refused) on a reattached link. Returns the large send,
    the send written while away and the other client."""
    session = await conn.create_session()
    await session.create_queue("once")
    await session.create_queue("single", max_consumers=1)
    await session.create_consumer("single")
    producer = session.create_producer("once")
    await proxy.cut("down")  # the large send's answer never comes: it is open at the loss
    large = producer.send_nowait(b"x" * 10_000)
    assert large is not None
    await asyncio.sleep(0.3)
    away = await _killed_with_a_parked_send(conn, broker, producer)
    await asyncio.get_running_loop().run_in_executor(None, broker.start)
    other = await aio.connect(broker.url)  # takes the queue's one consumer before the restore
    await (await other.create_session()).create_consumer("single")
    await proxy.heal()
    await _cut_the_restore(proxy, conn)
    return large, away, other


async def _during_the_first_of_two_restores(
    proxy: AsyncFaultProxy, conn: aio.AsyncConnection, broker: Any
) -> aio.AsyncProducer:
    """Two sessions (a producer on the second, "before" sent); the broker killed and restarted,
    its answers late: returns the producer while the first session's restore is under way."""
    first = await conn.create_session()
    await first.create_queue("once")
    second = await conn.create_session()
    producer = second.create_producer("once")
    await producer.send("before")
    broker.kill()
    await _until(lambda: not conn.ready, "the client sees the broker go")
    await proxy.delay(1.0, "down")  # the answers of the restarted broker come late
    await asyncio.get_running_loop().run_in_executor(None, broker.start)
    await _until(lambda: conn._restoring, "the client restores its sessions on the restarted broker")
    await asyncio.sleep(0.3)
    return producer


@pytest.mark.timeout(90)
def test_a_send_written_while_reattaching_to_a_restore_reaches_the_broker_once(broker_factory: Any) -> None:
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            session = await conn.create_session()
            await session.create_queue("once")
            producer = session.create_producer("once")
            await producer.send("before")
            broker.kill()
            await asyncio.get_running_loop().run_in_executor(None, broker.start)
            # Answers from the restarted broker come late: the restore's CREATE_SESSION reaches
            # it at once, its answer is still in the proxy when the link is cut.
            await _cut_the_restore(proxy, conn)
            # The next connection: its REATTACH answer is 1 s late; a send is written meanwhile.
            assert not conn.ready
            during = producer.send_nowait("during")
            assert during is not None
            await asyncio.wait_for(during, 20)
            await proxy.delay(0, "down")
            await producer.send("after")
            await conn.close()

    try:
        asyncio.run(main())
    except TandemError as exc:
        pytest.fail(f"the client failed: {exc!r} (events {events})")
    texts = asyncio.run(drain_texts(broker.url, "once"))
    assert sorted(texts) == ["after", "before", "during"], f"{texts} (events {events})"


@pytest.mark.timeout(90)
def test_a_send_written_while_away_is_not_confirmed_after_a_restore_that_failed_on_a_reattached_link(
    broker_factory: Any,
) -> None:
    """The restore takes the send written while away (a large send was open when the link failed:
    no reattach, the sessions were dropped at once) and fails on the reattached link (a consumer
    the restarted broker refuses). What it took must not wait in the live channel for a later
    command's confirmation: it would settle a send the broker never had as confirmed. (The
    client then restores afresh on a new link, which the broker refuses too, and gives the
    connection up: decision 0074.)"""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, min_large_message_size=1024)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            large, away, other = await _a_restore_refused_on_a_reattached_link(proxy, conn, broker)
            await _until(lambda: conn.closed, "the client gives up after the restore failed")
            await proxy.delay(0, "down")
            try:
                await asyncio.wait_for(away, 5)
                confirmed = True
            except TandemError:
                confirmed = False
            with contextlib.suppress(TandemError):
                await large
            texts = [t[:8] for t in await drain_texts(broker.url, "once", wait=0.3)]
            assert not confirmed or "away" in texts, f"a send confirmed that the broker does not have ({texts})"
            assert aio.FailureEvent.DISCONNECT in events, events
            await other.close()
            with contextlib.suppress(TandemError):
                await conn.close()

    asyncio.run(main())


@pytest.mark.timeout(90)
def test_a_send_parked_by_a_restore_that_failed_on_a_reattached_link_fails_when_the_client_gives_up(
    broker_factory: Any,
) -> None:
    """As above, with a dedup id on the send written while away: the failed restore parks it for a
    resend. No restore follows a reattach: the client gives that link up and restores every
    session on a fresh one, which the broker refuses too, so it gives the connection up
    (decision 0074), and the send fails with Unblocked, neither waiting for a failover that
    never comes nor confirmed without being stored."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, min_large_message_size=1024, auto_dedup=True)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            # auto_dedup: the send written while away has a dedup id, it can be sent again
            large, away, other = await _a_restore_refused_on_a_reattached_link(proxy, conn, broker)
            done, _ = await asyncio.wait([away], timeout=10)  # bounded: the outcome, not a timing goal
            assert away in done, f"a send parked for a resend is still waiting after the reattach ({events})"
            assert isinstance(away.exception(), Unblocked), repr(away.exception())
            assert conn.closed
            await proxy.delay(0, "down")
            try:
                await large
                large_confirmed = True
            except TandemError:  # its answer was cut: outcome unknown (the old broker may have it)
                large_confirmed = False
            texts = [t[:8] for t in await drain_texts(broker.url, "once", wait=0.3)]
            assert [t for t in texts if t != "x" * 8] == [], texts  # "away" never went
            assert not large_confirmed or "x" * 8 in texts, texts
            await other.close()
            with contextlib.suppress(TandemError, TimeoutError):
                await asyncio.wait_for(conn.close(), 5)

    asyncio.run(main())
    assert events[-2:] == [aio.FailureEvent.REATTACHED, aio.FailureEvent.DISCONNECT], events


@pytest.mark.timeout(90)
def test_a_large_send_written_while_away_on_a_session_not_restored_yet_is_not_replayed_by_a_reattach(
    broker_factory: Any,
) -> None:
    """A large send written while away, on the second session, waits for that session's restore
    (which fails it: it cannot be sent again). The link is cut while the first session is being
    restored, and the next link reattaches to that restore: the reattach must not replay the
    large send, on a channel the broker has no session on yet (a protocol error, and the whole
    connection starts again)."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[tuple[aio.FailureEvent, TandemError | None]] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, min_large_message_size=1024)
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            first = await conn.create_session()
            await first.create_queue("once")
            second = await conn.create_session()
            producer = second.create_producer("once")
            await proxy.cut("down")  # this large send's answer never comes: it is open at the loss
            large = producer.send_nowait(b"x" * 10_000)
            assert large is not None
            await asyncio.sleep(0.3)
            broker.kill()
            await _until(lambda: not conn.ready, "the client sees the broker go")
            away = producer.send_nowait(b"a" * 10_000)  # large, written while away
            assert away is not None
            await asyncio.get_running_loop().run_in_executor(None, broker.start)
            await proxy.heal()
            await _cut_the_restore(proxy, conn)  # the first session's restore: the second's waits
            await _until(lambda: conn.ready, "the client reattaches")
            await proxy.delay(0, "down")
            try:
                await asyncio.wait_for(away, 10)
                away_confirmed = True
            except TandemError:
                away_confirmed = False
            with contextlib.suppress(TandemError):
                await large
            await producer.send("after")
            texts = [t[:8] for t in await drain_texts(broker.url, "once", wait=0.3)]
            assert "after" in texts, texts
            assert not away_confirmed or "a" * 8 in texts, texts
            with contextlib.suppress(TandemError):
                await conn.close()

    asyncio.run(main())
    errors = [cause for _, cause in events if isinstance(cause, ProtocolError)]
    assert not errors, f"the broker refused what the client replayed: {errors} (events {events})"


@pytest.mark.timeout(90)
def test_a_large_send_on_a_session_not_restored_yet_written_during_another_ones_restore(
    broker_factory: Any,
) -> None:
    """The broker restarted: the client restores its sessions one after the other, writing
    straight to the new link. A large send written meanwhile on the second session, whose
    channel the broker has no session on yet, must not reach it (a protocol error, and the
    whole connection starts again): it fails with Unblocked, or is stored once it can be."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[tuple[aio.FailureEvent, TandemError | None]] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, min_large_message_size=1024)
            conn.add_failure_listener(lambda kind, cause: events.append((kind, cause)))
            producer = await _during_the_first_of_two_restores(proxy, conn, broker)
            large = producer.send_nowait(b"x" * 10_000)  # the first session's restore is under way
            assert large is not None
            await proxy.delay(0, "down")
            try:
                await asyncio.wait_for(large, 10)
                confirmed = True
            except TandemError:
                confirmed = False
            await _until(lambda: conn.ready, "the client is back")
            await producer.send("after")
            texts = [t[:8] for t in await drain_texts(broker.url, "once", wait=0.3)]
            assert "after" in texts, texts
            assert not confirmed or "x" * 8 in texts, texts
            await conn.close()

    asyncio.run(main())
    errors = [cause for _, cause in events if isinstance(cause, ProtocolError)]
    assert not errors, f"the broker refused what the client wrote: {errors} (events {events})"
    assert [k for k, _ in events] == [aio.FailureEvent.RECONNECTED], events


@pytest.mark.timeout(90)
def test_a_send_on_a_session_not_restored_yet_written_during_another_ones_restore_waits_for_its_restore(
    broker_factory: Any,
) -> None:
    """As above with a small send that has a dedup id: it must not reach the broker before its
    session does (the broker refuses it: no session on that channel). Its session's restore
    sends it, as any send written while away; it is stored once and confirmed."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, auto_dedup=True)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            producer = await _during_the_first_of_two_restores(proxy, conn, broker)
            during = producer.send_nowait("during")  # the first session's restore is under way
            assert during is not None
            await proxy.delay(0, "down")
            await asyncio.wait_for(during, 10)  # raised SessionDoesNotExist
            await producer.send("after")
            assert await drain_texts(broker.url, "once", wait=0.3) == ["before", "during", "after"]
            await conn.close()

    try:
        asyncio.run(main())
    except TandemError as exc:
        pytest.fail(f"the client failed: {exc!r} (events {events})")
    assert events == [aio.FailureEvent.RECONNECTED], events


@pytest.mark.timeout(90)
def test_a_restore_that_fails_on_a_reattached_link_leaves_no_later_session_unrestored(broker_factory: Any) -> None:
    """Two sessions; the broker restarted. The first session's restore is cut (the next link
    reattaches to it) and then fails on that link (a consumer the broker refuses). The second
    session comes after it: it must end restored, or the client must give the connection up
    (decision 0074: after one more restore on a fresh link). Its send written while away (a dedup id:
    parked for its restore) must not wait for a restore that never comes, nor be confirmed
    without the broker having it; and the failure must not be swallowed."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, auto_dedup=True)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            producer, _, away, other = await _a_restore_the_broker_refuses(proxy, conn, broker)
            await proxy.delay(0, "down")
            done, _ = await asyncio.wait([away], timeout=10)  # bounded: the outcome, not a timing goal
            assert away in done, f"a send parked for its session's restore is still waiting ({events})"
            error = away.exception()
            assert error is None or isinstance(error, Unblocked), repr(error)
            texts = await drain_texts(broker.url, "once", wait=0.3)
            assert error is not None or "away" in texts, f"a send confirmed that the broker does not have ({texts})"
            if not conn.closed:  # restored, then: the second session works
                await producer.send("after")
                texts += await drain_texts(broker.url, "once", wait=0.3)
                assert "after" in texts, texts
            else:
                assert aio.FailureEvent.DISCONNECT in events, events
            await other.close()
            with contextlib.suppress(TandemError, TimeoutError):
                await asyncio.wait_for(conn.close(), 5)

    asyncio.run(main())


@pytest.mark.timeout(90)
def test_a_restore_refused_on_its_own_link_gives_the_connection_up(broker_factory: Any) -> None:
    """The rule the reattached case follows (decision 0074): the broker restarted, the first
    session's restore is refused (a consumer), and nothing cuts the link. The client gives up:
    DISCONNECT, and the second session's send parked for its restore fails with Unblocked."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, auto_dedup=True)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            first = await conn.create_session()
            await first.create_queue("once")
            await first.create_queue("single", max_consumers=1)
            await first.create_consumer("single")
            producer = (await conn.create_session()).create_producer("once")
            away = await _killed_with_a_parked_send(conn, broker, producer)
            await proxy.delay(1.0, "down")  # the restore waits for the other client's consumer
            await asyncio.get_running_loop().run_in_executor(None, broker.start)
            other = await aio.connect(broker.url)
            await (await other.create_session()).create_consumer("single")
            await proxy.delay(0, "down")
            done, _ = await asyncio.wait([away], timeout=10)  # bounded: the outcome, not a timing goal
            assert away in done, f"a send parked for its session's restore is still waiting ({events})"
            assert isinstance(away.exception(), Unblocked), repr(away.exception())
            assert conn.closed
            assert await drain_texts(broker.url, "once", wait=0.3) == []
            await other.close()

    asyncio.run(main())
    assert events == [aio.FailureEvent.DISCONNECT], events


@pytest.mark.timeout(90)
def test_a_restore_not_answered_while_its_link_is_down_is_done_again_on_a_fresh_link(broker_factory: Any) -> None:
    """The broker restarted; the link is cut while the first session's restore waits for its
    answer, and the client cannot connect again before that call times out. The restore failed
    for want of a link, not because the broker refused it: the client must not reattach to what
    it half made (the second session would have no session on the broker), nor give up; it
    restores every session on a fresh link, and the second session's parked send (dedup id) is
    stored once and confirmed."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, auto_dedup=True, call_timeout=2000)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            producer, _ = await _two_sessions(conn)
            away = await _killed_with_a_parked_send(conn, broker, producer)
            await proxy.delay(1.0, "down")  # the restarted broker's answers come late
            await asyncio.get_running_loop().run_in_executor(None, broker.start)
            await _until(lambda: conn._restoring, "the client restores its sessions on the restarted broker")
            await asyncio.sleep(0.3)
            await proxy.refuse_new()
            assert await proxy.reset() >= 1  # the restore's call is left without an answer
            await asyncio.sleep(3.0)  # past call_timeout: the restore's call timed out
            await proxy.delay(0, "down")
            await proxy.refuse_new(False)
            await _the_parked_send_goes_once(away, conn, producer, broker.url, events, 15)
            await conn.close()

    _run_without_giving_up(main, events)


@pytest.mark.timeout(90)
def test_a_restore_refused_on_a_reattached_link_and_not_on_the_fresh_one_restores_every_session(
    broker_factory: Any,
) -> None:
    """Decision 0074's flapped case when the refusal was transient: the first session's restore is
    cut (the next link reattaches to it) and refused on that link (a consumer on a queue at its
    max_consumers, held by another client), so it is done again on a fresh link; the other client
    lets the queue go before that restore asks. The connection must not be given up: every
    session is restored, the second session's parked send (dedup id) is stored once and
    confirmed, a later send is confirmed, and the first session's consumer receives."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, auto_dedup=True)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            producer, single, away, other = await _a_restore_the_broker_refuses(proxy, conn, broker)
            drops = conn.drops
            await _until(lambda: conn.drops > drops, "the refused restore is given up for a fresh one")
            await other.close()  # answers are still 1 s late: the fresh restore has not asked yet
            await proxy.delay(0, "down")
            await _the_parked_send_goes_once(away, conn, producer, broker.url, events, 15)
            await producer.session.create_producer("single").send("to single")
            got = None
            for _ in range(3):  # a receive may first raise the restore's Unblocked: call it again
                with contextlib.suppress(Unblocked):
                    got = await single.receive(timeout=5)
                    break
            assert got is not None and got.text == "to single", got
            await conn.close()

    _run_without_giving_up(main, events)
    assert events[-1] == aio.FailureEvent.RECONNECTED, events


def _an_error_after_a_restore_answer(armed: list[bool]) -> Callable[[], tuple[Filter, Filter]]:
    """The proxy's filters: on a link opened while `armed`, the broker's answer to the first call
    on a session channel (a restore's CREATE_SESSION) is followed in the same read by an ERROR
    (once): the client loses that link with the answer already in hand, before the restore has
    run on."""

    def filters() -> tuple[Filter, Filter]:
        watch = armed[0]
        reader = p.FrameReader(p.ServerPacket, 1 << 24, expect_magic=False)

        def down(data: bytes) -> bytes:
            if not (watch and armed[0]):
                return data
            for pkt in reader.feed(data):
                if type(pkt) is p.Response and pkt.channel != 0:
                    armed[0] = False
                    return data + p.encode(p.Error(int(ErrorCode.PROTOCOL), "injected by the test's proxy"))
            return data

        return (lambda data: data), down

    return filters


@pytest.mark.timeout(90)
def test_a_restore_whose_link_is_lost_with_an_answer_in_hand_stops_there(broker_factory: Any) -> None:
    """The broker restarted; the first session's restore gets its CREATE_SESSION answer and, in
    the same read, loses the link (the sessions go with it: no confirmation window). That restore
    must stop when it resumes: the next link's restore makes every session again. Going on, it
    took the second session's parked send (dedup id) and waited for an answer on no link; the
    fresh restore, finding nothing parked, did not send it, and the send stayed unconfirmed (then
    parked on a session the server has, with no restore to come)."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []
    armed = [False]

    async def main() -> None:
        async with AsyncFaultProxy(
            broker.port, port=proxy_port, filters=_an_error_after_a_restore_answer(armed)
        ) as proxy:
            conn = await aio.connect(proxy.url, auto_dedup=True, reconnect_attempts=-1, **FAST)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            producer, _ = await _two_sessions(conn)
            away = await _killed_with_a_parked_send(conn, broker, producer)
            armed[0] = True
            await asyncio.get_running_loop().run_in_executor(None, broker.start)
            await _until(lambda: not armed[0], "the restore's first answer comes with an ERROR")
            await _the_parked_send_goes_once(away, conn, producer, broker.url, events, 10)
            await conn.close()

    _run_without_giving_up(main, events)


async def _reattached_to_a_restore_before_the_second_session(
    proxy: AsyncFaultProxy,
    conn: aio.AsyncConnection,
    broker: Any,
    transacted: bool = False,
    park: bool = False,
    consumers: int = 1,
) -> tuple[aio.AsyncProducer, list[asyncio.Future[None]]]:
    """Two sessions (`consumers` consumers on the first, a producer on the second, "before"
    sent); the broker restarted, the link cut while the first session is being restored, and the
    next link reattached to that restore, which goes on (the first session's consumers, then the
    second session: answers 1 s late). Returns the second session's producer, the client ready
    again and the second session not restored yet, and with `park` two sends made once the
    client had seen the broker go, parked for that session's restore: "away" (durable: a dedup
    id with auto_dedup) and "unsent" (not durable: no dedup id, never written)."""
    first = await conn.create_session()
    await first.create_queue("once")
    await first.create_queue("other")
    for _ in range(consumers):  # one more answer each (1 s late) before the second session
        await first.create_consumer("other")
    second = await conn.create_session(transacted=transacted)
    producer = second.create_producer("once")
    await producer.send("before")
    if transacted:
        await second.commit()
    parked: list[asyncio.Future[None]] = []
    if park:
        parked.append(await _killed_with_a_parked_send(conn, broker, producer))
        unsent = producer.send_nowait("unsent", durable=False)
        assert unsent is not None
        parked.append(unsent)
    else:
        broker.kill()
        await _until(lambda: not conn.ready, "the client sees the broker go")
    await asyncio.get_running_loop().run_in_executor(None, broker.start)
    await _cut_the_restore(proxy, conn)
    await _until(lambda: conn.ready, "the client reattaches to the restore")
    assert conn._restoring is not None, "the restore is over already: nothing to test"
    assert not producer.session._callable.is_set(), "the second session's restore has begun: nothing to test"
    return producer, parked


def _on_a_session_not_restored_yet(
    broker_factory: Any, act: Callable[[Any], Awaitable[None]], expected: list[str], transacted: bool = False
) -> None:
    """The link reattached to a restore that has not reached the second session yet: `act` on
    that session's producer must wait for its restore and succeed, then a later send (committed
    in a transacted session) goes too, the queue holds `expected` once each, no DISCONNECT."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await (_connect(proxy.url) if transacted else _connect(proxy.url, auto_dedup=True))
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            producer, _ = await _reattached_to_a_restore_before_the_second_session(
                proxy, conn, broker, transacted=transacted
            )
            await act(producer)
            await proxy.delay(0, "down")
            await producer.send("after")
            if transacted:
                await producer.session.commit()
            assert await drain_texts(broker.url, "once", wait=0.3) == expected
            await conn.close()

    _run_without_giving_up(main, events)


@pytest.mark.timeout(90)
def test_a_send_on_a_session_not_restored_yet_written_after_the_link_reattached_to_the_restore(
    broker_factory: Any,
) -> None:
    """A send with a dedup id written on the second session once the client is ready again,
    before that session's restore, must wait for that restore, as it would before the reattach:
    the broker has no session on its channel yet and would refuse it."""

    async def act(producer: Any) -> None:
        during = producer.send_nowait("during")
        assert during is not None
        done, _ = await asyncio.wait([during], timeout=10)  # bounded: the outcome, not a timing goal
        assert during in done, "the send is still waiting"
        assert during.exception() is None, repr(during.exception())

    _on_a_session_not_restored_yet(broker_factory, act, ["before", "during", "after"])


@pytest.mark.timeout(90)
def test_a_call_on_a_session_not_restored_yet_made_after_the_link_reattached_to_the_restore(
    broker_factory: Any,
) -> None:
    """As above with `send()`, which first asks the broker for credit (a call on the second
    session's channel; the credit went with the old server): the call must wait for the
    session's restore, not reach a broker that has no session on that channel yet."""

    async def act(producer: Any) -> None:
        await asyncio.wait_for(producer.send("during"), 10)  # bounded: the outcome, not a timing goal

    _on_a_session_not_restored_yet(broker_factory, act, ["before", "during", "after"])


@pytest.mark.timeout(90)
def test_a_commit_on_a_session_not_restored_yet_made_after_the_link_reattached_to_the_restore(
    broker_factory: Any,
) -> None:
    """As above with `commit()` of a transaction that did nothing since the failure (the last one
    was committed before it): it must wait for the session's restore and succeed, not reach a
    broker that has no session on that channel yet."""

    async def act(producer: Any) -> None:
        await asyncio.wait_for(producer.session.commit(), 10)  # bounded: the outcome, not a timing goal

    _on_a_session_not_restored_yet(broker_factory, act, ["before", "after"], transacted=True)


@pytest.mark.timeout(90)
def test_a_session_closed_while_it_waits_for_its_restore_lets_the_restore_send_what_is_parked(
    broker_factory: Any,
) -> None:
    """Two sends parked while away on the second session (one with a dedup id, one without: never
    written), the link reattached to a restore that has not reached that session yet, and the
    application closes the session: the close must let the restore send them (it comes well
    within call_timeout), so they are confirmed and stored once each, not failed with Unblocked
    or NotConnected as sends no server will get; then the session closes cleanly."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, auto_dedup=True)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            producer, parked = await _reattached_to_a_restore_before_the_second_session(proxy, conn, broker, park=True)
            await asyncio.wait_for(producer.session.close(), 20)  # bounded: the outcome, not a timing goal
            results = await asyncio.gather(*parked, return_exceptions=True)
            assert results == [None, None], f"{results!r} ({events})"
            await proxy.delay(0, "down")
            assert await drain_texts(broker.url, "once", wait=0.3) == ["before", "away", "unsent"]
            assert not conn.closed, f"the client gave up: {conn.error!r} ({events})"
            await conn.close()

    _run_without_giving_up(main, events)


@pytest.mark.timeout(90)
def test_a_session_closed_while_its_restore_does_not_come_within_call_timeout_fails_what_is_parked(
    broker_factory: Any,
) -> None:
    """As above, with the first session's restore (eight consumers, each answered 1 s late)
    outlasting call_timeout (4 s; each answer well within it): the close waits for the second
    session's restore no longer than a call would, then fails its parked sends as sends no server
    got (Unblocked with a dedup id, NotConnected without: never written) and returns without
    an error, while the restore is still under way; the restore then skips the closed session.
    Nothing parked is stored, and the client does not give up."""
    broker, proxy_port = _broker_behind_a_proxy(broker_factory)
    events: list[aio.FailureEvent] = []

    async def main() -> None:
        async with AsyncFaultProxy(broker.port, port=proxy_port) as proxy:
            conn = await _connect(proxy.url, auto_dedup=True, call_timeout=4000)
            conn.add_failure_listener(lambda kind, _: events.append(kind))
            producer, parked = await _reattached_to_a_restore_before_the_second_session(
                proxy, conn, broker, park=True, consumers=8
            )
            await asyncio.wait_for(producer.session.close(), 20)  # bounded: the outcome, not a timing goal
            assert conn._restoring is not None, "the restore came: nothing to test"
            results = await asyncio.gather(*parked, return_exceptions=True)
            assert isinstance(results[0], Unblocked), f"{results!r} ({events})"
            assert isinstance(results[1], NotConnected), f"{results!r} ({events})"
            await _until(lambda: conn._restoring is None, "the restore ends")
            await proxy.delay(0, "down")
            assert not conn.closed, f"the client gave up: {conn.error!r} ({events})"
            assert await drain_texts(broker.url, "once", wait=0.3) == ["before"]
            await conn.close()

    _run_without_giving_up(main, events)
