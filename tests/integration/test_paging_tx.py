"""Transactions into a paging address, against real broker processes: what a transaction sends
to a PAGE address that pages is paged too (memory stays bounded), visible only once the commit
is journaled; a kill -9 before that leaves none of it, a confirmed commit loses none of it."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import drain_committed, queue_stat
from tandem.errors import TandemError

SETTINGS = {
    "paged.#": {
        "max-size-bytes": 64 * 1024,
        "address-full-policy": "PAGE",
        "page-size-bytes": 64 * 1024,
    },
}
BODY = "p" * 200


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def fill(url: str, address: str, n: int) -> None:
    conn = await aio.connect(url)
    try:
        prod = (await conn.create_session()).create_producer(address)
        for i in range(n):
            await prod.send_async(f"m{i:06d}" + BODY)
        await prod.flush()
    finally:
        await conn.close()


async def tx_send(url: str, address: str, first: int, n: int, commit: bool = True) -> None:
    conn = await aio.connect(url)
    try:
        session = await conn.create_session(transacted=True)
        prod = session.create_producer(address)
        for i in range(first, first + n):
            await prod.send_async(f"m{i:06d}" + BODY)
        if commit:
            await session.commit()
        else:
            await session.rollback()
    finally:
        await conn.close()


async def drain(url: str, queue: str) -> list[str]:
    """Everything `queue` holds, in order, whole texts, consumed in one committed transaction."""
    return await drain_committed(url, queue, wait=1.5, keep=None, every=0)


def paged_bytes_on_disk(b: BrokerProcess) -> int:
    return sum(p.stat().st_size for p in (Path(b.data_dir) / "paging").glob("*.page"))


def _expected(first: int, n: int) -> list[str]:
    return [f"m{i:06d}" for i in range(first, first + n)]


def test_transactional_sends_to_a_paging_address_are_paged(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.t", 500))
    before = run(queue_stat(b.url, "paged.t"))
    assert before["paging"]
    for k in range(10):
        run(tx_send(b.url, "paged.t", 500 + 100 * k, 100))
    run(tx_send(b.url, "paged.t", 9000, 100, commit=False))  # rolled back: never anywhere
    st = run(queue_stat(b.url, "paged.t"))
    assert st["message_count"] == 1500
    assert st["paged_count"] >= 1000 + before["paged_count"]  # the 1000 committed went to pages
    assert st["memory_bytes"] <= before["memory_bytes"] + 8 * 1024  # in memory they take ~230 KiB more
    b.stop()
    b.start()
    assert [t[:7] for t in run(drain(b.url, "paged.t"))] == _expected(0, 1500)


def test_a_kill_before_the_commit_is_journaled_leaves_no_paged_message_of_it(broker_factory: Any) -> None:
    """The transaction's page records are on disk, the journal's writes are held back (fault
    seam): a kill -9 then must leave none of them deliverable after the restart."""
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    run(fill(b.url, "paged.k", 500))
    assert run(queue_stat(b.url, "paged.k"))["paging"]
    b.stop()
    b.env = {"TANDEM_JOURNAL_FAULTS": "tandem-data:write=delay6"}
    b.start(timeout=60)
    on_disk = paged_bytes_on_disk(b)

    async def commit_then_kill() -> None:
        task = asyncio.create_task(tx_send(b.url, "paged.k", 500, 200))
        deadline = time.monotonic() + 4
        while paged_bytes_on_disk(b) < on_disk + 200 * 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert paged_bytes_on_disk(b) >= on_disk + 200 * 200, "the transaction's messages were not paged"
        assert not task.done(), "the commit was confirmed before its journal record was written"
        await asyncio.get_running_loop().run_in_executor(None, b.kill)
        try:
            await asyncio.wait_for(task, 10)
        except TandemError:
            pass

    run(commit_then_kill())
    out = subprocess.run(
        [sys.executable, "-m", "tandem", "data", "print", "--records", str(b.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "(never committed)" in out  # the transaction's page records, shown as such
    assert "page transaction" not in out.split("== paging")[0]
    per_queue = out.split("== messages per queue")[1]
    assert "paged.k" in per_queue and " 500\n" in per_queue  # not counted
    b.env = {}
    b.start()
    assert [t[:7] for t in run(drain(b.url, "paged.k"))] == _expected(0, 500)


K = 5
OUTS = ("paged.ca", "paged.cb")


async def _work(url: str, worker: int, base: int, committed: set[int], stop: asyncio.Event) -> int:
    """Transactions of K messages over both addresses until the connection dies; the next number."""
    t = base
    try:
        conn = await aio.connect(url)
    except TandemError:
        return t
    try:
        session = await conn.create_session(transacted=True)
        prod = session.create_producer()
        while not stop.is_set():
            for i in range(K):
                await prod.send_async(f"{worker}:{t}:{i}:" + BODY, address=OUTS[i % 2])
            await session.commit()
            committed.add(t)
            t += 1
    except TandemError:
        pass
    finally:
        try:
            await conn.close()
        except TandemError:
            pass
    return t + 1  # a number the dead connection may have used is never reused


@pytest.mark.timeout(300)
def test_kill9_during_paged_commits_leaves_transactions_whole(broker_factory: Any) -> None:
    seed = int(os.environ.get("TANDEM_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"paged tx crash test seed {seed}")
    b: BrokerProcess = broker_factory(address_settings=SETTINGS).start()
    for out in OUTS:
        run(fill(b.url, out, 400))  # both addresses page from the start
    committed: set[int] = set()
    seen: dict[int, list[tuple[str, int]]] = defaultdict(list)  # tx -> (queue, part)
    last: dict[tuple[str, str], int] = {}  # (queue, worker) -> last transaction number consumed
    next_tx = 0
    paged_rounds = 0

    async def round_(kill_after: float) -> None:
        nonlocal next_tx
        stop = asyncio.Event()
        workers = [asyncio.create_task(_work(b.url, k, next_tx + k * 1_000_000, committed, stop)) for k in range(2)]
        await asyncio.sleep(kill_after)
        await asyncio.get_running_loop().run_in_executor(None, b.kill)
        stop.set()
        ends = await asyncio.wait_for(asyncio.gather(*workers), 30)
        next_tx = max(ends) + 2_000_000

    for _ in range(4):
        asyncio.run(round_(rng.uniform(0.5, 1.5)))
        b.start()
        for out in OUTS:
            paged_rounds += bool(run(queue_stat(b.url, out))["paged_count"])
            for text in run(drain(b.url, out)):
                if text.startswith("m"):
                    continue  # the fill
                worker, t, i, _ = text.split(":", 3)
                key = (out, worker)
                assert int(t) > last.get(key, -1) or (int(t) == last[key]), f"out of order in {out}: {text[:20]}"
                last[key] = int(t)
                seen[int(t)].append((out, int(i)))
        for t, parts in seen.items():
            assert sorted(i for _q, i in parts) == list(range(K)), f"transaction {t} is partial or twice: {parts}"
        missing = sorted(committed - set(seen))
        assert not missing, f"confirmed commits lost: {missing[:10]}"
    b.stop()
    assert len(committed) > 20, f"too few commits to mean anything: {len(committed)}"
    assert paged_rounds, "no transaction was ever paged"
