"""Core messaging against a real broker process: ack modes, redelivery, fan-out, flow control, reload."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat as _stat


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _send(url: str, address: str, bodies: list[str], **fields: Any) -> None:
    conn = await aio.connect(url)
    try:
        session = await conn.create_session()
        prod = session.create_producer(address)
        for body in bodies:
            await prod.send(body, **fields)
    finally:
        await conn.close()


def test_blocking_send_receive_roundtrip_keeps_every_field(broker: BrokerProcess) -> None:
    props = {"s": "text", "i": -42, "f": 1.5, "b": True, "raw": b"\x00\x01"}
    with tandem.connect(broker.url) as conn:
        session = conn.session()
        prod = session.create_producer("roundtrip")
        prod.send(tandem.Message(b"\x00body\xff", properties=props, priority=7, ttl=60_000, dedup_id="d-1"))
        consumer = session.create_consumer("roundtrip")
        msg = consumer.receive(5)
    assert msg is not None
    assert msg.body == b"\x00body\xff"
    assert msg.properties == props
    assert msg.priority == 7
    assert msg.dedup_id == "d-1"
    assert msg.durable is True
    assert msg.expiration > msg.timestamp > 0
    assert msg.delivery_count == 1 and not msg.redelivered
    assert msg.address == "roundtrip"


def test_client_ack_is_cumulative_and_close_redelivers_rest_in_order(broker: BrokerProcess) -> None:
    async def main() -> None:
        await _send(broker.url, "q", [f"m{i}" for i in range(6)])
        conn = await aio.connect(broker.url)
        session = await conn.create_session(ack_mode="client")
        consumer = await session.create_consumer("q")
        got = [await consumer.receive(5) for _ in range(4)]
        assert [m.text for m in got if m] == ["m0", "m1", "m2", "m3"]
        await got[2].ack()  # acks m0..m2
        await consumer.close()
        consumer = await session.create_consumer("q")
        rest = [await consumer.receive(5) for _ in range(3)]
        assert [m.text for m in rest if m] == ["m3", "m4", "m5"]
        # m3 reached the application unacked: a failed delivery. m4 and m5 were only in the
        # client's buffer: they come back as they were.
        assert [m.delivery_count for m in rest if m] == [2, 1, 1]
        assert [m.redelivered for m in rest if m] == [True, False, False]
        await rest[-1].ack()
        await conn.close()
        assert (await _stat(broker.url, "q"))["message_count"] == 0

    run(main())


def test_short_lived_consumers_do_not_use_up_delivery_attempts_of_buffered_messages(
    broker_factory: Any,
) -> None:
    """A consumer that takes one message and closes, again and again, must not dead-letter the rest.

    The broker sends a whole window ahead; what stayed in the client's buffer was never a failed
    delivery. Closing the consumer, the session or the connection says so.
    """
    b = broker_factory(address_settings={"#": {"max-delivery-attempts": 3}}).start()

    async def main() -> None:
        await _send(b.url, "short", [f"m{i}" for i in range(12)])
        for round_ in range(10):
            conn = await aio.connect(b.url)
            session = await conn.create_session(ack_mode="client")
            consumer = await session.create_consumer("short")
            msg = await consumer.receive(5)
            assert msg is not None and msg.text == f"m{round_}"
            assert msg.delivery_count == 1, (round_, msg.delivery_count)
            await msg.ack()
            # three ways to leave: consumer, session, connection
            if round_ % 3 == 0:
                await consumer.close()
            elif round_ % 3 == 1:
                await session.close()
            await conn.close()
        stat = await _stat(b.url, "short")
        assert stat["message_count"] == 2

    run(main())


def test_received_but_unacked_messages_still_count_and_dead_letter(broker_factory: Any) -> None:
    b = broker_factory(address_settings={"#": {"max-delivery-attempts": 2, "dead-letter-address": "DLQ"}}).start()

    async def main() -> None:
        await _send(b.url, "seen", ["x", "y"])
        for _ in range(2):
            conn = await aio.connect(b.url)
            session = await conn.create_session(ack_mode="client")
            consumer = await session.create_consumer("seen")
            got = await consumer.receive(5)
            assert got is not None and got.text == "x"
            await consumer.close()  # x was handed over and not acked: a failed delivery
            await conn.close()
        assert (await _stat(b.url, "seen"))["message_count"] == 1  # y, never handed over, stays
        assert (await _stat(b.url, "DLQ"))["message_count"] == 1  # x, after 2 failed deliveries

    run(main())


def test_individual_ack_acks_only_that_message(broker: BrokerProcess) -> None:
    async def main() -> None:
        await _send(broker.url, "ind", ["a", "b", "c"])
        conn = await aio.connect(broker.url)
        session = await conn.create_session(ack_mode="individual")
        consumer = await session.create_consumer("ind")
        msgs = [await consumer.receive(5) for _ in range(3)]
        assert msgs[1] is not None
        await msgs[1].ack()
        await conn.close()  # a, c go back
        conn = await aio.connect(broker.url)
        session = await conn.create_session(ack_mode="individual")
        consumer = await session.create_consumer("ind")
        again = [await consumer.receive(5) for _ in range(2)]
        assert [(m.text, m.delivery_count) for m in again if m] == [("a", 2), ("c", 2)]
        assert await consumer.receive(0.3) is None
        await conn.close()

    run(main())


def test_auto_ack_removes_messages_as_the_application_takes_them(broker: BrokerProcess) -> None:
    async def main() -> None:
        await _send(broker.url, "auto", [str(i) for i in range(50)])
        conn = await aio.connect(broker.url)
        session = await conn.create_session()  # ack_mode="auto"
        consumer = await session.create_consumer("auto")
        seen = []
        async for msg in consumer:
            seen.append(msg.text)
            if len(seen) == 30:
                break
        await consumer.close()
        await conn.close()
        assert seen == [str(i) for i in range(30)]
        stat = await _stat(broker.url, "auto")
        assert stat["message_count"] == 20
        assert stat["messages_acknowledged"] == 30

    run(main())


def test_abrupt_disconnect_returns_unacked_with_delivery_count(broker: BrokerProcess) -> None:
    async def main() -> None:
        await _send(broker.url, "abrupt", ["x", "y"])
        conn = await aio.connect(broker.url)
        session = await conn.create_session(ack_mode="client")
        consumer = await session.create_consumer("abrupt")
        assert await consumer.receive(5) is not None
        assert conn._proto is not None and conn._proto.transport is not None
        conn._proto.transport.abort()  # no goodbye, like a crashed client
        for _ in range(100):
            if (await _stat(broker.url, "abrupt"))["delivering_count"] == 0:
                break
            await asyncio.sleep(0.05)
        conn2 = await aio.connect(broker.url)
        session2 = await conn2.create_session(ack_mode="client")
        c2 = await session2.create_consumer("abrupt")
        m1, m2 = await c2.receive(5), await c2.receive(5)
        assert m1 is not None and m2 is not None
        assert (m1.text, m1.delivery_count) == ("x", 2)
        assert (m2.text, m2.delivery_count) == ("y", 2)  # delivered (buffered) too, never acked
        await conn2.close()

    run(main())


def test_multicast_fans_out_to_every_subscription(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        session = await conn.create_session()
        subs = [await session.subscribe("news") for _ in range(3)]
        durable = await session.subscribe("news", subscription="archive", durable=True)
        prod = session.create_producer("news")
        for i in range(5):
            await prod.send(f"n{i}")
        for sub in [*subs, durable]:
            got = [await sub.receive(5) for _ in range(5)]
            assert [m.text for m in got if m] == [f"n{i}" for i in range(5)]
        await conn.close()
        # temporary subscriptions went with the connection; the durable one stays
        conn = await aio.connect(broker.url)
        names = {q["name"] for q in await conn.manage("queue.stat")}
        await conn.close()
        assert "archive" in names
        assert not [n for n in names if n.startswith("news.sub.")]

    run(main())


def test_round_robin_between_consumers(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        session = await conn.create_session()
        c1 = await session.create_consumer("rr")
        c2 = await session.create_consumer("rr")
        await _send(broker.url, "rr", [str(i) for i in range(10)])
        a = [await c1.receive(5) for _ in range(5)]
        b = [await c2.receive(5) for _ in range(5)]
        texts = sorted(int(m.text) for m in a + b if m)
        assert texts == list(range(10))
        assert [int(m.text) for m in a if m] == [0, 2, 4, 6, 8]
        assert [int(m.text) for m in b if m] == [1, 3, 5, 7, 9]
        await conn.close()

    run(main())


def test_slow_consumer_holds_only_its_window(broker: BrokerProcess) -> None:
    """Credit flow control: the broker sends at most the window, however many messages wait."""

    async def main() -> None:
        await _send(broker.url, "slow", ["x" * 1000] * 300)
        conn = await aio.connect(broker.url)
        session = await conn.create_session(ack_mode="client")
        consumer = await session.create_consumer("slow", window=10_000)
        await asyncio.sleep(0.5)
        stat = await _stat(broker.url, "slow")
        # ~10 KB of ~1.1 KB messages, plus the one that crosses the line
        assert 1 <= stat["delivering_count"] <= 11, stat
        assert len(consumer.buffer) == stat["delivering_count"]
        # taking messages returns credit and more flow
        for _ in range(50):
            assert await consumer.receive(5) is not None
        await asyncio.sleep(0.3)
        stat = await _stat(broker.url, "slow")
        assert stat["delivering_count"] <= 50 + 11
        assert stat["message_count"] == 300
        await conn.close()

    run(main())


def test_window_zero_pulls_one_message_at_a_time(broker: BrokerProcess) -> None:
    async def main() -> None:
        await _send(broker.url, "pull", ["1", "2", "3"])
        conn = await aio.connect(broker.url)
        session = await conn.create_session(ack_mode="client")
        consumer = await session.create_consumer("pull", window=0)
        await asyncio.sleep(0.3)
        assert (await _stat(broker.url, "pull"))["delivering_count"] == 0
        m = await consumer.receive(5)
        assert m is not None and m.text == "1"
        await asyncio.sleep(0.3)
        assert (await _stat(broker.url, "pull"))["delivering_count"] == 1
        await conn.close()

    run(main())


def test_browser_sees_without_consuming(broker: BrokerProcess) -> None:
    async def main() -> None:
        await _send(broker.url, "browse", ["a", "b", "c"])
        conn = await aio.connect(broker.url)
        session = await conn.create_session()
        browser = await session.create_browser("browse")
        seen = [await browser.receive(5) for _ in range(3)]
        assert [m.text for m in seen if m] == ["a", "b", "c"]
        assert await browser.receive(0.3) is None
        await _send(broker.url, "browse", ["d"])
        d = await browser.receive(5)
        assert d is not None and d.text == "d"
        await conn.close()
        assert (await _stat(broker.url, "browse"))["message_count"] == 4

    run(main())


def test_reload_keeps_order_and_delivery_counts_after_clean_stop_and_kill(broker: BrokerProcess) -> None:
    async def deliver_twice_then_close() -> None:
        conn = await aio.connect(broker.url)
        session = await conn.create_session(ack_mode="client")
        consumer = await session.create_consumer("reload", window=0)
        for _ in range(2):
            m = await consumer.receive(5)
            assert m is not None
        await conn.close()  # m0, m1 return with delivery count 1

    async def read_all() -> list[tuple[str, int]]:
        conn = await aio.connect(broker.url)
        session = await conn.create_session(ack_mode="client")
        consumer = await session.create_consumer("reload")
        out = []
        while (m := await consumer.receive(1)) is not None:
            out.append((m.text, m.delivery_count))
        await conn.close()
        return out

    run(_send(broker.url, "reload", [f"m{i}" for i in range(20)]))
    run(_send(broker.url, "reload", ["nd"], durable=False))
    run(deliver_twice_then_close())
    broker.stop()
    broker.start()
    got = run(read_all())
    assert [t for t, _ in got] == [f"m{i}" for i in range(20)], "non-durable must not survive, order must hold"
    assert [c for _, c in got[:3]] == [2, 2, 1]

    async def settle() -> None:
        """Wait until the broker took the messages back, then a confirmed send proves the journal synced."""
        for _ in range(100):
            if (await _stat(broker.url, "reload"))["delivering_count"] == 0:
                break
            await asyncio.sleep(0.05)
        await _send(broker.url, "other", ["sync"])

    run(settle())
    broker.kill()
    broker.start()
    got = run(read_all())
    assert [t for t, _ in got] == [f"m{i}" for i in range(20)]
    assert [c for _, c in got[:3]] == [3, 3, 2]


def test_message_larger_than_a_journal_file_survives_restart(broker: BrokerProcess) -> None:
    big = "B" * (3 * 1024 * 1024)  # journal files are 1 MiB in tests
    run(_send(broker.url, "big", [big, "small"]))
    broker.kill()
    broker.start()
    with tandem.connect(broker.url) as conn:
        consumer = conn.session().create_consumer("big")
        first, second = consumer.receive(10), consumer.receive(10)
    assert first is not None and first.text == big
    assert second is not None and second.text == "small"


def test_temporary_queue_dies_with_its_connection(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        session = await conn.create_session()
        await session.create_queue("tmpq", temporary=True)
        assert (await _stat(broker.url, "tmpq"))["temporary"] is True
        await conn.close()
        conn = await aio.connect(broker.url)
        names = {q["name"] for q in await conn.manage("queue.stat")}
        await conn.close()
        assert "tmpq" not in names

    run(main())


def test_listeners_aio_and_blocking(broker: BrokerProcess) -> None:
    async def aio_listener() -> list[str]:
        conn = await aio.connect(broker.url)
        session = await conn.create_session()
        consumer = await session.create_consumer("lst-a")
        got: list[str] = []
        done = asyncio.Event()

        async def on_message(m: tandem.ReceivedMessage) -> None:
            got.append(m.text)
            if len(got) == 5:
                done.set()

        consumer.set_listener(on_message)
        await _send(broker.url, "lst-a", [str(i) for i in range(5)])
        await asyncio.wait_for(done.wait(), 10)
        await conn.close()
        return got

    assert run(aio_listener()) == [str(i) for i in range(5)]

    got: list[str] = []
    done = threading.Event()

    def on_message(m: tandem.ReceivedMessage) -> None:
        got.append(m.text)
        if len(got) == 5:
            done.set()

    with tandem.connect(broker.url) as conn:
        session = conn.session()
        consumer = session.create_consumer("lst-b")
        consumer.set_listener(on_message)
        prod = session.create_producer("lst-b")
        for i in range(5):
            prod.send(str(i))
        assert done.wait(10)
    assert got == [str(i) for i in range(5)]


def test_pipelined_sends_respect_the_window_and_all_confirm(broker: BrokerProcess) -> None:
    confirmed: list[BaseException | None] = []
    max_in_flight = 0
    with tandem.connect(broker.url, send_window=8) as conn:
        prod = conn.session().create_producer("pipe")
        for i in range(400):
            prod.send_async(f"{i}", confirmed.append)
            max_in_flight = max(max_in_flight, prod.aio.in_flight)
        prod.flush()
    assert len(confirmed) == 400 and all(e is None for e in confirmed)
    assert max_in_flight <= 8
    assert run(_stat(broker.url, "pipe"))["message_count"] == 400


def test_closed_connection_unblocks_waiters_with_typed_error(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        session = await conn.create_session()
        consumer = await session.create_consumer("nobody-sends")
        waiter = asyncio.create_task(consumer.receive())
        await asyncio.sleep(0.2)
        broker.kill()
        with pytest.raises(tandem.ConnectionLost):
            await asyncio.wait_for(waiter, 10)
        with pytest.raises(tandem.ConnectionLost):
            await session.create_producer("x").send("after")

    t0 = time.monotonic()
    run(main())
    assert time.monotonic() - t0 < 15
