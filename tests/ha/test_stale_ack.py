"""Acknowledging a message delivered before a failover: a typed error, and the message comes again.

The old server's delivery is void once the client has failed over (the backup delivers the
message again), so an ack or nack of it cannot do anything. It must say so instead of
succeeding quietly: the application would believe the message done and then see it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from client_io import queue_stat
from ha_pair import Cluster
from tandem.aio import FailureEvent

BODIES = ["m1", "m2"]


@pytest.fixture
def pair(tmp_path: Path) -> Any:
    c = Cluster(tmp_path).start_all()
    yield c
    c.kill_all()


async def _fill(url: str) -> None:
    conn = await aio.connect(url)
    producer = (await conn.create_session()).create_producer("work")
    for body in BODIES:
        await producer.send(body)
    await conn.close()


def _assert_stale(exc: BaseException | None) -> None:
    assert isinstance(exc, tandem.TandemError), f"the ack of a void delivery succeeded quietly ({exc!r})"
    assert exc.code.name == "STALE_ACKNOWLEDGE", repr(exc)
    assert "again" in exc.message


async def _error_of(awaitable_factory: Any) -> BaseException | None:
    try:
        await awaitable_factory()
    except Exception as exc:
        return exc
    return None


@pytest.mark.timeout(60)
def test_ack_and_nack_of_deliveries_from_before_a_failover_asyncio(pair: Cluster) -> None:
    c = pair

    async def main() -> None:
        await _fill(c.url)
        conn = await aio.connect(c.url, retry_interval=50)
        failed_over = asyncio.Event()
        conn.add_failure_listener(lambda kind, _: failed_over.set() if kind is FailureEvent.FAILOVER else None)
        session = await conn.create_session(ack_mode="individual")
        consumer = await session.create_consumer("work")
        old = [await consumer.receive(5) for _ in BODIES]
        assert [m.text for m in old if m is not None] == BODIES
        c.primary.kill()
        await asyncio.wait_for(failed_over.wait(), 20)
        assert old[0] is not None and old[1] is not None
        _assert_stale(await _error_of(old[0].ack))
        _assert_stale(await _error_of(old[1].nack))
        again = [await consumer.receive(10) for _ in BODIES]  # the backup delivers them again
        assert sorted(m.text for m in again if m is not None) == BODIES
        for m in again:
            assert m is not None
            await m.ack()  # current deliveries: acknowledged normally
        await conn.close()
        assert (await queue_stat(c.url_of(1), "work"))["message_count"] == 0

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_ack_of_a_delivery_from_before_a_failover_blocking(pair: Cluster) -> None:
    c = pair
    asyncio.run(_fill(c.url))
    with tandem.connect(c.url, retry_interval=50) as conn:
        failed_over = threading.Event()
        conn.add_failure_listener(lambda kind, _: failed_over.set() if kind is FailureEvent.FAILOVER else None)
        session = conn.session(ack_mode="client")
        consumer = session.create_consumer("work")
        old = consumer.receive(5)
        assert old is not None and old.text == "m1"
        c.primary.kill()
        assert failed_over.wait(20)
        exc: BaseException | None = None
        try:
            old.ack()
        except Exception as e:
            exc = e
        _assert_stale(exc)
        got = [consumer.receive(10) for _ in BODIES]
        assert [m.text for m in got if m is not None] == BODIES  # m1 came again, first
        got[-1].ack()  # type: ignore[union-attr]  # client mode: cumulative
    assert asyncio.run(queue_stat(c.url_of(1), "work"))["message_count"] == 0


@pytest.mark.timeout(60)
def test_an_ack_sent_while_the_session_is_being_restored_is_confirmed(pair: Cluster) -> None:
    """The backup delivers to a consumer as soon as the session's restore has recreated it, while
    the restore still recreates the others: the application's ack of that delivery goes to the
    backup and is confirmed there. It must not be failed as sent before the failover."""
    c = pair

    async def main() -> None:
        await _fill(c.url)
        conn = await aio.connect(c.url, retry_interval=50)
        session = await conn.create_session(ack_mode="individual")
        first = await session.create_consumer("work")
        for i in range(8):  # recreated after `first`: the restore goes on while `first` gets its delivery
            await session.create_queue(f"idle.{i}")
            await session.create_consumer(f"idle.{i}")
        old = [await first.receive(5) for _ in BODIES]
        assert [m.text for m in old if m is not None] == BODIES
        c.primary.kill()
        got: list[str] = []
        deadline = asyncio.get_running_loop().time() + 20
        while len(got) < len(BODIES):
            assert asyncio.get_running_loop().time() < deadline, f"the backup delivered only {got}"
            try:
                m = await first.receive(1)  # again, from the backup
            except tandem.errors.Unblocked:
                continue  # the wait that the failure interrupted (documented)
            if m is not None:
                await m.ack()  # raised Unblocked when it went out while the restore was not finished
                got.append(m.text)
        assert sorted(got) == BODIES
        await conn.close()
        assert (await queue_stat(c.url_of(1), "work"))["message_count"] == 0

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_send_written_while_away_is_not_confirmed_by_the_new_servers_confirm_of_a_later_command(
    pair: Cluster,
) -> None:
    """A send (no dedup id: not replayable) written while the client is between servers never
    reaches either; an ack the backup confirms during the session's restore has a later command
    id. That confirmation must not settle the send as confirmed: it would be a confirmed message
    that no server has."""
    c = pair

    async def main() -> None:
        await _fill(c.url)
        conn = await aio.connect(c.url, retry_interval=50, auto_dedup=False)
        session = await conn.create_session(ack_mode="individual")
        await session.create_queue("away")
        producer = session.create_producer("away")
        first = await session.create_consumer("work")
        for i in range(8):
            await session.create_queue(f"idle.{i}")
            await session.create_consumer(f"idle.{i}")
        old = [await first.receive(5) for _ in BODIES]
        assert [m.text for m in old if m is not None] == BODIES
        c.primary.kill()
        deadline = asyncio.get_running_loop().time() + 20
        while conn.ready:
            assert asyncio.get_running_loop().time() < deadline, "the client never saw the primary go"
            await asyncio.sleep(0.002)
        away = producer.send_nowait("written while away")
        assert away is not None
        acked = 0
        while acked < len(BODIES):
            assert asyncio.get_running_loop().time() < deadline, f"the backup delivered only {acked}"
            try:
                m = await first.receive(1)
            except tandem.errors.Unblocked:
                continue
            if m is not None:
                with contextlib.suppress(tandem.errors.Unblocked):
                    await m.ack()
                acked += 1
        outcome = await _error_of(lambda: away)
        there = (await queue_stat(c.url_of(1), "away"))["message_count"]
        assert outcome is not None or there == 1, "a send confirmed that the backup does not have"
        assert isinstance(outcome, tandem.errors.Unblocked) or there == 1, repr(outcome)
        await conn.close()

    asyncio.run(main())
