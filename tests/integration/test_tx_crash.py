"""Kill -9 a broker in the middle of transactions, many times: every transaction is all or nothing.

Each transaction takes one message from `src` and sends K messages (to two queues) naming it.
After each restart: a transaction's messages are all there or none are; its `src` message is
gone exactly when its messages are there; every commit that was confirmed is there.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter, defaultdict

import pytest

import tandem.aio as aio
from tandem.errors import TandemError

ROUNDS = int(os.environ.get("TANDEM_CRASH_ROUNDS", "20"))
K = 6
SRC = "tx.src"
OUTS = ("tx.a", "tx.b")
SOURCES = 4000


async def _fill(url: str) -> None:
    conn = await aio.connect(url)
    session = await conn.create_session()
    prod = session.create_producer(SRC)
    for i in range(SOURCES):
        await prod.send_async(f"src-{i}", properties={"src": i})
    await prod.flush()
    await conn.close()


async def _work(url: str, base: int, committed: set[int], stop: asyncio.Event) -> int:
    """Run transactions until the connection dies; returns the next transaction number."""
    t = base
    try:
        conn = await aio.connect(url)
    except TandemError:
        return t
    try:
        session = await conn.create_session(transacted=True, ack_mode="client")
        consumer = await session.create_consumer(SRC, window=0)
        prod = session.create_producer()
        while not stop.is_set():
            msg = await consumer.receive(1.0)
            if msg is None:
                break
            src = int(msg.properties["src"])
            await msg.ack()
            for i in range(K):
                await prod.send_async(f"t{t}-{i}", address=OUTS[i % 2], properties={"tx": t, "i": i, "src": src})
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


async def _browse(url: str, queue: str) -> list[dict[str, int]]:
    conn = await aio.connect(url)
    out = []
    try:
        session = await conn.create_session()
        browser = await session.create_browser(queue)
        while (m := await browser.receive(0.5)) is not None:
            out.append({k: int(v) for k, v in m.properties.items() if k in ("tx", "i", "src")})
    finally:
        await conn.close()
    return out


def _check(url: str, committed: set[int]) -> None:
    outs = asyncio.run(_browse(url, OUTS[0])) + asyncio.run(_browse(url, OUTS[1]))
    srcs = [p["src"] for p in asyncio.run(_browse(url, SRC))]
    assert len(srcs) == len(set(srcs)), "a source message is present twice"
    per_tx: dict[int, list[dict[str, int]]] = defaultdict(list)
    for p in outs:
        per_tx[p["tx"]].append(p)
    for t, parts in per_tx.items():
        assert sorted(p["i"] for p in parts) == list(range(K)), f"transaction {t} is partial: {parts}"
        assert len({p["src"] for p in parts}) == 1
        assert parts[0]["src"] not in srcs, f"transaction {t} is there but its source came back"
    missing = sorted(committed - set(per_tx))
    assert not missing, f"confirmed commits lost: {missing[:10]}"
    used = Counter(parts[0]["src"] for parts in per_tx.values())
    assert all(n == 1 for n in used.values()), "one source consumed by two transactions"
    assert set(srcs) | set(used) == set(range(SOURCES)), "a source message vanished"


@pytest.mark.timeout(600)
def test_kill9_during_commits_leaves_transactions_whole(broker_factory: object) -> None:
    seed = int(os.environ.get("TANDEM_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"tx crash test seed {seed}")
    b = broker_factory(journal_file_size=256 * 1024)  # type: ignore[operator]
    b.start()
    asyncio.run(_fill(b.url))
    committed: set[int] = set()
    next_tx = 0

    async def round_(kill_after: float) -> None:
        nonlocal next_tx
        stop = asyncio.Event()
        workers = [asyncio.create_task(_work(b.url, next_tx + k * 1_000_000, committed, stop)) for k in range(2)]
        await asyncio.sleep(kill_after)
        await asyncio.get_running_loop().run_in_executor(None, b.kill)
        stop.set()
        ends = await asyncio.wait_for(asyncio.gather(*workers), 30)
        next_tx = max(ends) + 2_000_000

    for _ in range(ROUNDS):
        asyncio.run(round_(rng.uniform(0.2, 0.8)))
        b.start()
        _check(b.url, committed)
    b.stop()
    assert len(committed) > ROUNDS * 5, f"too few commits to mean anything: {len(committed)}"
