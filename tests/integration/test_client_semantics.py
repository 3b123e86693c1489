"""Client behaviours found in review: listeners, failures that must surface, ids, TTL negotiation."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat as _stat


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_message_ids_never_repeat_across_restarts(broker: BrokerProcess) -> None:
    def send_and_take(body: str) -> int:
        """The id of the message just sent. An acknowledgement is not waited for, so after a kill -9
        an earlier message can come again first (at least once): skip those."""
        with tandem.connect(broker.url) as conn:
            s = conn.session()
            s.create_producer("ids").send(body)
            consumer = s.create_consumer("ids")
            for _ in range(10):
                msg = consumer.receive(5)
                assert msg is not None
                if msg.text == body:
                    return msg.id
        raise AssertionError(f"{body} never came")

    first = send_and_take("first")
    broker.stop()
    broker.start()
    second = send_and_take("second")
    broker.kill()
    broker.start()
    third = send_and_take("third")
    assert first < second < third


def test_bad_selector_creates_nothing(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        session = await conn.create_session()
        with pytest.raises(tandem.InvalidSelector):
            await session.create_consumer("never-made", filter="color = ")
        names = {q["name"] for q in await conn.manage("queue.stat")}
        await conn.close()
        assert "never-made" not in names

    run(main())


def test_listener_can_be_removed_and_replaced_without_losing_messages(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        session = await conn.create_session()
        consumer = await session.create_consumer("swap")
        first: list[str] = []
        consumer.set_listener(lambda m: first.append(m.text))
        prod = session.create_producer("swap")
        await prod.send("a")
        for _ in range(100):
            if first:
                break
            await asyncio.sleep(0.02)
        consumer.set_listener(None)
        await prod.send("b")
        await asyncio.sleep(0.2)
        second: list[str] = []
        done = asyncio.Event()

        def on(m: tandem.ReceivedMessage) -> None:
            second.append(m.text)
            done.set()

        consumer.set_listener(on)
        await asyncio.wait_for(done.wait(), 5)
        await conn.close()
        assert first == ["a"]
        assert second == ["b"]

    run(main())


def test_blocking_listener_in_auto_mode_acks_after_it_returns(broker: BrokerProcess) -> None:
    inside = threading.Event()
    release = threading.Event()
    with tandem.connect(broker.url) as conn:
        session = conn.session()
        consumer = session.create_consumer("ackafter")

        def slow(m: tandem.ReceivedMessage) -> None:
            inside.set()
            release.wait(10)

        consumer.set_listener(slow)
        session.create_producer("ackafter").send("m")
        assert inside.wait(10)
        during = run(_stat(broker.url, "ackafter"))
        release.set()
        for _ in range(100):
            after = run(_stat(broker.url, "ackafter"))
            if after["message_count"] == 0:
                break
            threading.Event().wait(0.05)
    assert during["message_count"] == 1 and during["messages_acknowledged"] == 0
    assert after["message_count"] == 0 and after["messages_acknowledged"] == 1


def test_blocking_flush_raises_a_failed_async_send(broker_factory: Any) -> None:
    no_auto = {"#": {"auto_create_addresses": False, "auto_create_queues": False}}
    b = broker_factory(address_settings=no_auto).start()
    with tandem.connect(b.url) as conn:
        prod = conn.session().create_producer("nowhere")
        prod.send_async("lost?")
        with pytest.raises(tandem.AddressDoesNotExist):
            prod.flush()
        prod.flush()  # reported once


def test_connection_ttl_is_negotiated(broker_factory: Any) -> None:
    async def ttl(url: str, **opts: Any) -> int:
        conn = await aio.connect(url, **opts)
        try:
            return conn.ttl_ms
        finally:
            await conn.close()

    plain = broker_factory("plain").start()
    assert run(ttl(plain.url, connection_ttl=5000)) == 5000
    assert run(ttl(plain.url)) == 60_000
    forced = broker_factory("forced", connection_ttl_override=2000).start()
    assert run(ttl(forced.url, connection_ttl=5000)) == 2000


def test_producer_window_must_be_positive(broker: BrokerProcess) -> None:
    with tandem.connect(broker.url) as conn, pytest.raises(tandem.InvalidArgument):
        conn.session().create_producer("x", window=0)


def test_has_room_says_when_ready_would_wait(broker: BrokerProcess) -> None:
    async def main() -> tuple[list[bool], int]:
        conn = await aio.connect(broker.url)
        try:
            session = await conn.create_session()
            prod = session.create_producer("room", window=2)
            seen = [prod.has_room("room", 10)]  # no credit known for the address yet
            await prod.ready("room", 10)  # asks the broker: unlimited
            seen.append(prod.has_room("room", 10))
            futs = [prod.send_nowait(b"a"), prod.send_nowait(b"b")]
            seen.append(prod.has_room("room", 10))  # two unconfirmed: the window is full
            seen.append(prod.has_room())
            await asyncio.gather(*futs)  # type: ignore[arg-type]
            seen.append(prod.has_room("room", 10))
            return seen, prod.in_flight
        finally:
            await conn.close()

    seen, in_flight = run(main())
    assert seen == [False, True, False, False, True]
    assert in_flight == 0
    assert run(_stat(broker.url, "room"))["message_count"] == 2


@pytest.mark.parametrize("n", [323, 1500])
def test_a_long_burst_without_awaiting_goes_out_in_order(broker: BrokerProcess, n: int) -> None:
    """Hundreds of sends queued in one loop pass (one coalesced write): every one arrives, in
    order, and is confirmed (the broker handles such a read in slices of 128 packets)."""

    async def main() -> list[bytes]:
        conn = await aio.connect(broker.url)
        try:
            session = await conn.create_session()
            prod = session.create_producer(f"burst-{n}", window=n)
            await prod.ready(f"burst-{n}", 10)
            futs = [prod.send_nowait(f"m{i}".encode()) for i in range(n)]  # no await in between
            await asyncio.gather(*futs)  # type: ignore[arg-type]
            consumer = await session.create_consumer(f"burst-{n}")
            got = []
            for _ in range(n):
                m = await consumer.receive(5)
                assert m is not None
                got.append(m.body)
            return got
        finally:
            await conn.close()

    assert run(main()) == [f"m{i}".encode() for i in range(n)]
