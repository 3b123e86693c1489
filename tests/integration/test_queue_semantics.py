"""Dead letters, redelivery delay, expiry, priorities, exclusive and last-value queues, selectors,
address settings precedence and full addresses, against real broker processes."""

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


async def _drain(url: str, queue: str, timeout: float = 0.5) -> list[Any]:
    conn = await aio.connect(url)
    out = []
    try:
        session = await conn.create_session()
        consumer = await session.create_consumer(queue)
        while (m := await consumer.receive(timeout)) is not None:
            out.append(m)
    finally:
        await conn.close()
    return out


def test_nack_redelivers_after_delay_then_dead_letters(broker_factory: Any) -> None:
    settings = {
        "#": {"dead-letter-address": "DLQ", "max-delivery-attempts": 3},
        "jobs": {"redelivery-delay": 200, "redelivery-delay-multiplier": 2.0},
    }
    b = broker_factory(address_settings=settings).start()

    async def main() -> None:
        conn = await aio.connect(b.url)
        session = await conn.create_session(ack_mode="client")
        await session.create_producer("jobs").send("poison", properties={"k": 1})
        consumer = await session.create_consumer("jobs")
        times = []
        for attempt in (1, 2, 3):
            m = await consumer.receive(5)
            assert m is not None and m.text == "poison" and m.delivery_count == attempt
            times.append(time.monotonic())
            await m.nack()
        assert await consumer.receive(1.0) is None, "after 3 failed deliveries it must be gone"
        # delays 200 ms then 400 ms (multiplier 2)
        assert times[1] - times[0] >= 0.18
        assert times[2] - times[1] >= 0.36
        await conn.close()
        dead = await _drain(b.url, "DLQ")
        assert [m.text for m in dead] == ["poison"]
        props = dead[0].properties
        assert props["_AMQ_ORIG_ADDRESS"] == "jobs" and props["_AMQ_ORIG_QUEUE"] == "jobs"
        assert props["k"] == 1 and "max-delivery-attempts" in props["_AMQ_REASON"]
        stat = await _stat(b.url, "jobs")
        assert stat["message_count"] == 0 and stat["messages_killed"] == 1

    run(main())


def test_dead_letter_without_address_drops_with_a_log_line(broker_factory: Any) -> None:
    b = broker_factory(address_settings={"#": {"max-delivery-attempts": 1}}).start()

    async def main() -> None:
        conn = await aio.connect(b.url)
        session = await conn.create_session(ack_mode="client")
        await session.create_producer("nodlq").send("x")
        consumer = await session.create_consumer("nodlq")
        m = await consumer.receive(5)
        assert m is not None
        await m.nack()
        assert await consumer.receive(0.5) is None
        await conn.close()

    run(main())
    assert run(_stat(b.url, "nodlq"))["message_count"] == 0
    assert "dropping message" in b.log_text()


def test_expired_messages_go_to_the_expiry_address_on_delivery_and_by_scan(broker_factory: Any) -> None:
    b = broker_factory(message_expiry_scan_period=200, address_settings={"#": {"expiry-address": "EXP"}}).start()

    async def main() -> None:
        conn = await aio.connect(b.url)
        session = await conn.create_session()
        prod = session.create_producer("exp")
        await prod.send("short", ttl=100)
        await prod.send("long", ttl=60_000)
        await prod.send("forever")
        await asyncio.sleep(0.6)  # the scan moves "short" while nobody consumes
        assert (await _stat(b.url, "exp"))["messages_expired"] == 1
        await prod.send("on-delivery", ttl=50)
        await asyncio.sleep(0.1)
        consumer = await session.create_consumer("exp")
        got = [await consumer.receive(2) for _ in range(2)]
        assert [m.text for m in got if m] == ["long", "forever"]
        assert await consumer.receive(0.3) is None
        await conn.close()
        expired = await _drain(b.url, "EXP")
        assert sorted(m.text for m in expired) == ["on-delivery", "short"]
        for m in expired:
            assert m.expiration == 0, "the copy must not expire again"
            assert m.properties["_AMQ_ORIG_QUEUE"] == "exp"
            actual = m.properties["_AMQ_ACTUAL_EXPIRY"]  # when the broker expired it
            assert isinstance(actual, int) and m.timestamp < actual <= time.time() * 1000, m.properties

    run(main())


def test_expiry_delay_gives_messages_an_expiration(broker_factory: Any) -> None:
    b = broker_factory(address_settings={"short.#": {"expiry-delay": 100}}).start()
    with tandem.connect(b.url) as conn:
        conn.session().create_producer("short.lived").send("x")
    time.sleep(0.3)
    assert run(_drain(b.url, "short.lived")) == []


def test_priorities_higher_first_fifo_within(broker: BrokerProcess) -> None:
    with tandem.connect(broker.url) as conn:
        s = conn.session()
        prod = s.create_producer("prio")
        for i, prio in enumerate([4, 9, 0, 9, 4, 7]):
            prod.send(f"{prio}-{i}", priority=prio)
        consumer = s.create_consumer("prio")
        got = [consumer.receive(5) for _ in range(6)]
    assert [m.text for m in got if m] == ["9-1", "9-3", "7-5", "4-0", "4-4", "0-2"]


def test_exclusive_queue_has_one_active_consumer_and_fails_over(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        s = await conn.create_session()
        await s.create_queue("excl", exclusive=True)
        c1 = await s.create_consumer("excl")
        c2 = await s.create_consumer("excl")
        prod = s.create_producer("excl")
        for i in range(6):
            await prod.send(str(i))
        first = [await c1.receive(2) for _ in range(6)]
        assert [m.text for m in first if m] == [str(i) for i in range(6)]
        assert await c2.receive(0.3) is None
        await c1.close()
        await prod.send("after")
        m = await c2.receive(5)
        assert m is not None and m.text == "after"
        await conn.close()

    run(main())


def test_last_value_queue_keeps_only_the_latest_per_key(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        s = await conn.create_session()
        await s.create_queue("prices", last_value_key="symbol")
        prod = s.create_producer("prices")
        await prod.send("ACME 1", properties={"symbol": "ACME"})
        await prod.send("INIT 5", properties={"symbol": "INIT"})
        await prod.send("ACME 2", properties={"symbol": "ACME"})
        await prod.send("no key")
        await prod.send("ACME 3", properties={"symbol": "ACME"})
        await conn.close()
        assert (await _stat(broker.url, "prices"))["message_count"] == 3
        assert [m.text for m in await _drain(broker.url, "prices")] == ["INIT 5", "no key", "ACME 3"]

    run(main())
    broker.kill()
    broker.start()
    with tandem.connect(broker.url) as conn:
        s = conn.session()
        s.create_producer("prices").send("ACME 4", properties={"symbol": "ACME"})
        s.create_producer("prices").send("ACME 5", properties={"symbol": "ACME"})
    assert [m.text for m in run(_drain(broker.url, "prices"))] == ["ACME 5"]


def test_selectors_on_consumers_queues_and_browsers(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        s = await conn.create_session()
        await s.create_queue("eu.orders", address="orders", filter="region = 'eu'")
        await s.create_queue("big.orders", address="orders", routing_type="multicast", filter="amount >= 100")
        await s.create_queue("all.orders", address="orders", routing_type="multicast")
        prod = s.create_producer("orders")
        samples = [("eu", 10), ("us", 500), ("eu", 150), ("asia", 1)]
        for region, amount in samples:
            await prod.send(f"{region}:{amount}", properties={"region": region, "amount": amount})
        assert [m.text for m in await _drain(broker.url, "big.orders")] == ["us:500", "eu:150"]
        browser = await s.create_browser("all.orders", filter="region <> 'eu' AND amount < 100")
        b1 = await browser.receive(2)
        assert b1 is not None and b1.text == "asia:1"
        assert await browser.receive(0.3) is None
        picky = await s.create_consumer("all.orders", filter="amount BETWEEN 5 AND 200")
        got = [await picky.receive(2) for _ in range(2)]
        assert [m.text for m in got if m] == ["eu:10", "eu:150"]
        assert await picky.receive(0.3) is None
        with pytest.raises(tandem.InvalidSelector, match="position"):
            await s.create_consumer("all.orders", filter="amount >> 3")
        await conn.close()

    run(main())


def test_address_settings_most_specific_wins(broker_factory: Any) -> None:
    settings = {
        "#": {"max-delivery-attempts": 5, "dead-letter-address": "DLQ.all"},
        "a.#": {"max-delivery-attempts": 2},
        "a.b.*": {"dead-letter-address": "DLQ.ab"},
    }
    b = broker_factory(address_settings=settings).start()

    def attempts_until_dead(address: str) -> int:
        with tandem.connect(b.url) as conn:
            s = conn.session(ack_mode="client")
            s.create_producer(address).send("x")
            c = s.create_consumer(address)
            n = 0
            while (m := c.receive(1)) is not None:
                n += 1
                m.nack()
        return n

    assert attempts_until_dead("other") == 5
    assert attempts_until_dead("a.x") == 2
    assert attempts_until_dead("a.b.c") == 2  # inherits a.# for attempts, a.b.* for the DLA
    assert [m.properties["_AMQ_ORIG_ADDRESS"] for m in run(_drain(b.url, "DLQ.ab"))] == ["a.b.c"]
    assert sorted(m.properties["_AMQ_ORIG_ADDRESS"] for m in run(_drain(b.url, "DLQ.all"))) == ["a.x", "other"]


def test_full_address_fail_policy_rejects_sends(broker_factory: Any) -> None:
    b = broker_factory(address_settings={"capped": {"max-size-bytes": 5000, "address-full-policy": "FAIL"}}).start()
    with tandem.connect(b.url) as conn:
        prod = conn.session().create_producer("capped")
        sent = 0
        with pytest.raises(tandem.AddressFull):
            for _ in range(50):
                prod.send("x" * 1000)
                sent += 1
        assert 4 <= sent <= 6
        consumer = conn.session().create_consumer("capped")
        for _ in range(sent):
            assert consumer.receive(5) is not None
    with tandem.connect(b.url) as conn:  # room again
        conn.session().create_producer("capped").send("fits")


def test_full_address_block_policy_holds_producers_until_room(broker_factory: Any) -> None:
    b = broker_factory(address_settings={"blocky": {"max-size-bytes": 8000, "address-full-policy": "BLOCK"}}).start()
    progress = {"sent": 0}
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            with tandem.connect(b.url, producer_window_size=2000) as conn:
                prod = conn.session().create_producer("blocky")
                for _ in range(30):
                    prod.send("x" * 1000)
                    progress["sent"] += 1
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=produce)
    t.start()
    time.sleep(1.5)
    stalled_at = progress["sent"]
    assert stalled_at < 30, "the producer should be blocked by the full address"
    stat = run(_stat(b.url, "blocky"))
    assert stat["message_count"] <= 11
    got = 0
    with tandem.connect(b.url) as conn:
        consumer = conn.session().create_consumer("blocky")
        while got < 30 and consumer.receive(10) is not None:
            got += 1
    t.join(20)
    assert not failed, failed
    assert progress["sent"] == 30 and got == 30


def test_auto_delete_queues_when_idle(broker_factory: Any) -> None:
    b = broker_factory(address_settings={"temp.#": {"auto-delete-queues": True, "auto-delete-addresses": True}}).start()

    async def main() -> None:
        conn = await aio.connect(b.url)
        s = await conn.create_session()
        c = await s.create_consumer("temp.work")  # auto-created
        await s.create_producer("temp.work").send("x")
        assert await c.receive(5) is not None
        await c.close()
        # Deleted once the acknowledgement that emptied it is stored (a moment after the close).
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            names = {q["name"] for q in await conn.manage("queue.stat")}
            addresses = {a["name"] for a in await conn.manage("address.list")}
            if "temp.work" not in names or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        c2 = await s.create_consumer("kept.work")  # default settings: not auto-deleted
        await c2.close()
        names2 = {q["name"] for q in await conn.manage("queue.stat")}
        await conn.close()
        assert "temp.work" not in names and "temp.work" not in addresses
        assert "kept.work" in names2

    run(main())


def test_id_cache_size_is_circular_and_survives_restart(broker_factory: Any) -> None:
    b = broker_factory(address_settings={"small": {"id-cache-size": 3}}).start()

    def send(ids: list[str]) -> None:
        with tandem.connect(b.url) as conn:
            prod = conn.session().create_producer("small")
            for i in ids:
                prod.send(i, dedup_id=i)

    send(["a", "b", "c", "a"])  # "a" is still remembered
    assert run(_stat(b.url, "small"))["message_count"] == 3
    send(["d"])  # pushes "a" out
    b.kill()
    b.start()
    send(["b", "c", "d"])  # still remembered after the restart
    assert run(_stat(b.url, "small"))["message_count"] == 4
    send(["a"])  # forgotten: accepted again
    assert [m.text for m in run(_drain(b.url, "small"))] == ["a", "b", "c", "d", "a"]


def test_default_consumer_window_size_per_address(broker_factory: Any) -> None:
    b = broker_factory(address_settings={"slow.#": {"default-consumer-window-size": 0}}).start()

    async def main() -> None:
        conn = await aio.connect(b.url)
        s = await conn.create_session()
        prod = s.create_producer("slow.q")
        for i in range(5):
            await prod.send(str(i))
        c = await s.create_consumer("slow.q")  # window from the address settings: pull one at a time
        assert c.window == 0
        await asyncio.sleep(0.3)
        assert (await _stat(b.url, "slow.q"))["delivering_count"] == 0
        fast = await s.create_consumer("fast.q")
        assert fast.window == 1024 * 1024
        await conn.close()

    run(main())
