"""An open transaction's sends to a paging address are paged as they arrive (decision 0055):
the broker's memory stays bounded however much an uncommitted transaction sends; commit
delivers all of it once, in order; rollback, a dropped connection or a kill -9 with the
transaction open delivers none of it and leaves no page behind; a kill -9 right after the
commit's confirmation loses none of it. Real broker processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import drain_committed as drain
from client_io import queue_stat
from tandem.errors import DuplicateId
from tandem.testing.procs import memory

SETTINGS = {
    "paged.#": {
        "max-size-bytes": 256 * 1024,
        "address-full-policy": "PAGE",
        "page-size-bytes": 1024 * 1024,
    },
}
BODY = "p" * 1000
N = 30_000  # ~30 MiB of bodies: held in memory, at least that much RSS


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def status(url: str) -> dict[str, Any]:
    conn = await aio.connect(url)
    try:
        return await conn.manage("broker.status")  # type: ignore[no-any-return]
    finally:
        await conn.close()


def page_files(b: BrokerProcess) -> list[Path]:
    return sorted((Path(b.data_dir) / "paging").iterdir())


def expected(first: int, n: int) -> list[str]:
    return [f"m{i:06d}" for i in range(first, first + n)]


async def open_tx(url: str, address: str, first: int, n: int, **fields: Any) -> tuple[Any, Any]:
    """A connection with a transaction that sent `n` messages (all received by the broker), not committed."""
    conn = await aio.connect(url)
    session = await conn.create_session(transacted=True)
    prod = session.create_producer(address)
    for i in range(first, first + n):
        extra = {k: f"{v}{i}" for k, v in fields.items()}
        await prod.send_async(f"m{i:06d}" + BODY, **extra)
    await prod.flush()
    return conn, session


async def fill(url: str, address: str, first: int, n: int) -> None:
    conn = await aio.connect(url)
    try:
        prod = (await conn.create_session()).create_producer(address)
        for i in range(first, first + n):
            await prod.send_async(f"m{i:06d}" + BODY)
        await prod.flush()
    finally:
        await conn.close()


@pytest.mark.timeout(240)
def test_an_open_transaction_holds_no_memory_and_its_commit_delivers_all_in_order(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    assert b.proc is not None
    run(fill(b.url, "paged.o", 0, 400))  # the address pages
    rss0 = memory(b.proc.pid)

    async def scenario() -> None:
        conn, session = await open_tx(b.url, "paged.o", 400, N)
        try:
            st = await status(b.url)
            grown = memory(b.proc.pid) - rss0  # type: ignore[union-attr]
            assert grown < 15 * 1024 * 1024, f"RSS grew {grown >> 20} MiB with {N} KiB held by a transaction"
            assert st["transaction_bytes"] <= 256 * 1024, st["transaction_bytes"]
            assert (await queue_stat(b.url, "paged.o"))["message_count"] == 400  # not visible yet
            await session.commit()
        finally:
            await conn.close()

    run(scenario())
    assert run(status(b.url))["transaction_bytes"] == 0
    got = run(drain(b.url, "paged.o"))
    assert got == expected(0, 400 + N)


@pytest.mark.timeout(240)
def test_rollback_or_a_dropped_connection_delivers_nothing_and_leaves_no_page(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.r", 0, 400))
    before = page_files(b)

    async def scenario() -> None:
        conn, session = await open_tx(b.url, "paged.r", 400, 5000)
        assert len(page_files(b)) > len(before)  # the transaction's sends went to disk
        await session.rollback()
        await conn.close()
        conn, session = await open_tx(b.url, "paged.r", 10_000, 5000)
        await conn.close()  # the session goes with its connection: an implicit rollback

    run(scenario())
    run(fill(b.url, "paged.r", 400, 10))
    assert run(drain(b.url, "paged.r")) == expected(0, 410)
    assert run(_settle(lambda: not page_files(b))), f"pages left behind: {page_files(b)}"
    assert run(status(b.url))["transaction_bytes"] == 0


async def _settle(cond: Any, timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if cond():
            return True
        await asyncio.sleep(0.1)
    return bool(cond())


@pytest.mark.timeout(240)
def test_kill9_with_the_transaction_open_then_restart_delivers_none_of_it(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.k", 0, 400))

    async def scenario() -> None:
        conn, _session = await open_tx(b.url, "paged.k", 400, 5000)
        await asyncio.get_running_loop().run_in_executor(None, b.kill)
        try:
            await conn.close()
        except Exception:
            pass

    run(scenario())
    printed = subprocess.run(
        [sys.executable, "-m", "tandem", "data", "print", str(b.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "an open transaction's sends" in printed
    b.start()
    assert run(drain(b.url, "paged.k")) == expected(0, 400)
    assert run(_settle(lambda: not page_files(b))), f"pages left behind: {page_files(b)}"


@pytest.mark.timeout(240)
def test_kill9_right_after_the_commit_confirmation_loses_none_of_it(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.c", 0, 400))

    async def scenario() -> None:
        conn, session = await open_tx(b.url, "paged.c", 400, 5000)
        await session.commit()
        await asyncio.get_running_loop().run_in_executor(None, b.kill)
        try:
            await conn.close()
        except Exception:
            pass

    run(scenario())
    b.start()
    assert run(drain(b.url, "paged.c")) == expected(0, 5400)


@pytest.mark.timeout(240)
def test_other_producers_are_not_held_up_by_an_open_transaction(broker_factory: Any) -> None:
    """A queue keeps delivering what others send while a transaction stays open; the
    transaction's messages come after what was sent before its commit (their order is the
    commit's, as for a transaction held in memory)."""
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.f", 0, 400))

    async def scenario() -> list[str]:
        conn, session = await open_tx(b.url, "paged.f", 400, 2000)
        try:
            await fill(b.url, "paged.f", 5000, 300)
            first = await drain(b.url, "paged.f")
            assert first == expected(0, 400) + expected(5000, 300)  # not stalled behind the open transaction
            await session.commit()
        finally:
            await conn.close()
        return await drain(b.url, "paged.f")

    assert run(scenario()) == expected(400, 2000)


@pytest.mark.timeout(240)
def test_dedup_ids_of_a_paged_transaction_are_known_after_commit_and_after_restart(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.d", 0, 400))

    async def scenario() -> None:
        conn, session = await open_tx(b.url, "paged.d", 400, 3000, dedup_id="d")
        await session.commit()
        await conn.close()

    async def again() -> None:
        conn, session = await open_tx(b.url, "paged.d", 3000, 10, dedup_id="d")  # d3000..: sent before
        try:
            with pytest.raises(DuplicateId):
                await session.commit()
        finally:
            await conn.close()

    run(scenario())
    run(again())
    b.kill()
    b.start()
    run(again())
    assert run(drain(b.url, "paged.d")) == expected(0, 3400)


@pytest.mark.timeout(240)
def test_kill9_after_the_renames_before_the_commit_is_journaled_delivers_none_of_it(broker_factory: Any) -> None:
    """The commit's renames are on disk (the files are pages now), the journal's writes are held
    back (fault seam) so its PAGE_TX is not: after a kill -9 and a restart none of the
    transaction is delivered, and its pages are shown as never committed."""
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.w", 0, 400))
    b.stop()
    b.env = {"TANDEM_JOURNAL_FAULTS": "tandem-data:write=delay6"}
    b.start(timeout=60)

    def tx_files() -> list[str]:
        return [p.name for p in page_files(b) if "-t" in p.name]

    async def scenario() -> None:
        conn, session = await open_tx(b.url, "paged.w", 400, 3000)
        assert tx_files(), "the open transaction's sends were not paged"
        task = asyncio.create_task(session.commit())
        assert await _settle(lambda: not tx_files(), 5), "the commit did not rename its files"
        assert not task.done(), "the commit was confirmed before its PAGE_TX was journaled"
        await asyncio.get_running_loop().run_in_executor(None, b.kill)
        try:
            await asyncio.wait_for(task, 10)
        except Exception:
            pass
        try:
            await conn.close()
        except Exception:
            pass

    run(scenario())
    printed = subprocess.run(
        [sys.executable, "-m", "tandem", "data", "print", "--records", str(b.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "(never committed)" in printed
    b.env = {}
    b.start()
    assert run(drain(b.url, "paged.w")) == expected(0, 400)
    assert run(_settle(lambda: not page_files(b))), f"pages left behind: {page_files(b)}"


@pytest.mark.timeout(240)
def test_open_transactions_together_stay_under_the_broker_limit(broker_factory: Any) -> None:
    """No address limit, a broker limit (global-max-size, 512 KiB): three open transactions on
    three addresses, ~300 KiB each (each under the limit, together over it), hold no more than
    the limit between them; committed, all is delivered in order."""
    b: BrokerProcess = broker_factory(
        global_max_size=512 * 1024, address_settings={"g.#": {"address-full-policy": "PAGE"}}
    ).start()

    async def scenario() -> None:
        opened = [await open_tx(b.url, f"g.{k}", 0, 300) for k in range(3)]
        try:
            held = (await status(b.url))["transaction_bytes"]
            assert 0 < held <= 512 * 1024 + 2000, held
            for _conn, session in opened:
                await session.commit()
        finally:
            for conn, _session in opened:
                await conn.close()

    run(scenario())
    for k in range(3):
        assert run(drain(b.url, f"g.{k}")) == expected(0, 300)
