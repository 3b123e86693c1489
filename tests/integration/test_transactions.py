"""Transactions and duplicate detection against real broker processes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat as _stat


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _drain(url: str, queue: str, timeout: float = 0.5) -> list[tuple[str, int]]:
    conn = await aio.connect(url)
    out = []
    try:
        session = await conn.create_session()
        consumer = await session.create_consumer(queue)
        while (m := await consumer.receive(timeout)) is not None:
            out.append((m.text, m.delivery_count))
    finally:
        await conn.close()
    return out


def test_sends_and_acks_on_several_queues_commit_together(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        plain = await conn.create_session()
        await plain.create_producer("in").send("work")
        tx = await conn.create_session(transacted=True, ack_mode="client")
        consumer = await tx.create_consumer("in")
        msg = await consumer.receive(5)
        assert msg is not None
        await msg.ack()
        prod = tx.create_producer()
        await prod.send("a", address="out.a")
        await prod.send("b", address="out.b")
        # nothing visible before commit
        assert (await _stat(broker.url, "out.a"))["message_count"] == 0
        assert (await _stat(broker.url, "in"))["messages_acknowledged"] == 0
        await tx.commit()
        assert (await _stat(broker.url, "out.a"))["message_count"] == 1
        assert (await _stat(broker.url, "out.b"))["message_count"] == 1
        assert (await _stat(broker.url, "in"))["message_count"] == 0
        await conn.close()

    run(main())
    broker.kill()
    broker.start()
    assert run(_drain(broker.url, "out.a")) == [("a", 1)]
    assert run(_drain(broker.url, "out.b")) == [("b", 1)]
    assert run(_drain(broker.url, "in")) == []


def test_rollback_drops_sends_and_redelivers_acked_in_order(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        plain = await conn.create_session()
        p = plain.create_producer("rb")
        for i in range(3):
            await p.send(f"m{i}")
        tx = await conn.create_session(transacted=True)
        consumer = await tx.create_consumer("rb", window=0)
        got = [await consumer.receive(5) for _ in range(3)]
        assert [m.text for m in got if m] == ["m0", "m1", "m2"]
        await tx.create_producer("rb.out").send("dropped")
        await tx.rollback()
        await consumer.close()
        again = await tx.create_consumer("rb")
        redelivered = [await again.receive(5) for _ in range(3)]
        assert [(m.text, m.delivery_count) for m in redelivered if m] == [("m0", 2), ("m1", 2), ("m2", 2)]
        await tx.commit()
        await conn.close()
        assert (await _stat(broker.url, "rb"))["message_count"] == 0
        assert (await _stat(broker.url, "rb.out"))["message_count"] == 0

    run(main())


def test_closing_a_session_rolls_back_its_transaction(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        tx = await conn.create_session(transacted=True)
        await tx.create_producer("open.tx").send("never")
        await tx.close()
        await conn.close()
        assert (await _stat(broker.url, "open.tx"))["message_count"] == 0

    run(main())


def test_duplicates_are_dropped_also_after_restart_and_compaction(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(journal_file_size=128 * 1024).start()
    with tandem.connect(b.url) as conn:
        prod = conn.session().create_producer("dedup")
        for _ in range(3):
            prod.send("once", dedup_id="order-1")
        prod.send("other", dedup_id="order-2")
    assert run(_stat(b.url, "dedup"))["message_count"] == 2
    b.kill()
    b.start()
    with tandem.connect(b.url) as conn:
        prod = conn.session().create_producer("dedup")
        prod.send("once", dedup_id="order-1")
        # churn so the journal rolls and the files holding the dedup records get compacted
        filler = conn.session().create_producer("filler")
        for _i in range(300):
            filler.send_async("x" * 1000)
        filler.flush()
    run(_drain(b.url, "filler"))
    b.stop()
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tandem", "data", "compact", str(b.data_dir)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    b.start()
    with tandem.connect(b.url) as conn:
        prod = conn.session().create_producer("dedup")
        prod.send("once", dedup_id="order-1")
        prod.send("other", dedup_id="order-2")
        prod.send("new", dedup_id="order-3")
    assert [t for t, _ in run(_drain(b.url, "dedup"))] == ["once", "other", "new"]


def test_duplicate_inside_a_transaction_fails_the_commit(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        plain = await conn.create_session()
        await plain.create_producer("txdup").send("first", dedup_id="k1")
        tx = await conn.create_session(transacted=True)
        prod = tx.create_producer("txdup")
        await prod.send("fresh", dedup_id="k2")
        await prod.send("again", dedup_id="k1")
        with pytest.raises(tandem.DuplicateId):
            await tx.commit()
        # a duplicate within the same transaction too
        await prod.send("x", dedup_id="k9")
        await prod.send("y", dedup_id="k9")
        with pytest.raises(tandem.DuplicateId):
            await tx.commit()
        # the session goes on: a clean transaction commits
        await prod.send("fresh", dedup_id="k2")
        await tx.commit()
        await conn.close()
        assert [t for t, _ in await _drain(broker.url, "txdup")] == ["first", "fresh"]

    run(main())


def test_transaction_dedup_id_makes_a_repeated_commit_a_noop(broker: BrokerProcess) -> None:
    async def main() -> None:
        conn = await aio.connect(broker.url)
        tx = await conn.create_session(transacted=True)
        prod = tx.create_producer("txid")
        for _attempt in range(3):
            await prod.send("batch-7-a")
            await prod.send("batch-7-b")
            await tx.commit(dedup_id="batch-7")  # the retries succeed and add nothing
        await conn.close()
        assert [t for t, _ in await _drain(broker.url, "txid")] == ["batch-7-a", "batch-7-b"]

    run(main())
    broker.kill()
    broker.start()

    async def after_restart() -> None:
        conn = await aio.connect(broker.url)
        tx = await conn.create_session(transacted=True)
        await tx.create_producer("txid").send("batch-7-a")
        await tx.commit(dedup_id="batch-7")
        await conn.close()
        assert await _drain(broker.url, "txid") == []

    run(after_restart())


def test_failed_send_in_a_transaction_rolls_it_back_at_commit(broker_factory: Any) -> None:
    b = broker_factory(address_settings={"strict.#": {"auto_create_addresses": False}}).start()

    async def main() -> None:
        conn = await aio.connect(b.url)
        tx = await conn.create_session(transacted=True)
        prod = tx.create_producer()
        await prod.send("ok", address="fine")
        with pytest.raises(tandem.AddressDoesNotExist):
            await prod.send("nope", address="strict.missing")
        with pytest.raises(tandem.TransactionRolledBack):
            await tx.commit()
        await conn.close()
        assert (await _stat(b.url, "fine"))["message_count"] == 0

    run(main())


def test_blocking_api_transactions(broker: BrokerProcess) -> None:
    with tandem.connect(broker.url) as conn:
        tx = conn.session(transacted=True)
        prod = tx.create_producer("blk")
        prod.send("1")
        prod.send("2")
        tx.commit()
        prod.send("3")
        tx.rollback()
        consumer = tx.create_consumer("blk")
        got = [consumer.receive(5), consumer.receive(5)]
        assert consumer.receive(0.3) is None
        tx.commit()
    assert [m.text for m in got if m] == ["1", "2"]
    assert run(_stat(broker.url, "blk"))["message_count"] == 0
