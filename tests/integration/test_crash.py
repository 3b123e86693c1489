"""Kill -9 a broker under continuous confirmed durable sends and acks, many times.

After every restart: each confirmed message that was not confirmed-acked is
there exactly once, in per-producer order, and no confirmed-acked message
comes back.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from typing import Any

import pytest

import tandem.aio as aio
from tandem.errors import QueueDoesNotExist, TandemError

ROUNDS = int(os.environ.get("TANDEM_CRASH_ROUNDS", "10"))  # the roll test below does 50 more
ROLL_ROUNDS = int(os.environ.get("TANDEM_CRASH_ROLL_ROUNDS", "50"))
PRODUCERS = 2
QUEUE = "crash"


BACKLOG = 1500  # producers pause while this many of their messages wait unacknowledged


async def _producer(
    url: str,
    pid: int,
    start: int,
    confirmed: set[tuple[int, int]],
    acked: set[tuple[int, int]],
    stop: asyncio.Event,
    size: int = 0,
) -> int:
    """Send until the connection dies or `stop`; returns the next sequence number to use."""
    seq = start
    try:
        conn = await aio.connect(url)
    except TandemError:
        return seq
    try:
        session = await conn.create_session()
        prod = session.create_producer(QUEUE, window=64)
        while not stop.is_set():
            n = seq

            def done(exc: BaseException | None, n: int = n) -> None:
                if exc is None:
                    confirmed.add((pid, n))

            await prod.send_async(f"p{pid}-{n}".ljust(size, "."), done, properties={"p": pid, "n": n})
            seq += 1
            while len(confirmed) - len(acked) > BACKLOG * PRODUCERS and not stop.is_set():
                await asyncio.sleep(0.01)
    except TandemError:
        pass
    finally:
        try:
            await conn.close()
        except TandemError:
            pass
    return seq


async def _consumer(url: str, acked: set[tuple[int, int]], ack_sent: set[tuple[int, int]], stop: asyncio.Event) -> None:
    try:
        conn = await aio.connect(url)
    except TandemError:
        return
    try:
        session = await conn.create_session(ack_mode="individual")
        consumer = await session.create_consumer(QUEUE, window=16 * 1024)
        while not stop.is_set():
            msg = await consumer.receive(0.2)
            if msg is None:
                continue
            key = (int(msg.properties["p"]), int(msg.properties["n"]))
            ack_sent.add(key)
            await msg.ack()
            acked.add(key)
    except TandemError:
        pass
    finally:
        try:
            await conn.close()
        except TandemError:
            pass


async def _drain(url: str) -> list[tuple[int, int]]:
    conn = await aio.connect(url)
    out: list[tuple[int, int]] = []
    try:
        # The queue's count first: then no idle wait decides the end (it cost a second a round).
        try:
            expect = (await conn.manage("queue.stat", name=QUEUE))[0]["message_count"]
        except QueueDoesNotExist:
            return out
        session = await conn.create_session(ack_mode="client")
        consumer = await session.create_consumer(QUEUE)
        while (msg := await consumer.receive(10.0 if len(out) < expect else 0.1)) is not None:
            out.append((int(msg.properties["p"]), int(msg.properties["n"])))
        assert len(out) >= expect, f"the queue counted {expect} messages, {len(out)} came"
    finally:
        await conn.close()  # not acked: they stay for the next round
    return out


def _check(
    present: list[tuple[int, int]],
    confirmed: set[tuple[int, int]],
    acked: set[tuple[int, int]],
    ack_sent: set[tuple[int, int]],
) -> None:
    """`acked`: ack confirmed (must be gone); `ack_sent`: ack sent, outcome unknown (may be either)."""
    counts = Counter(present)
    dupes = [k for k, n in counts.items() if n > 1]
    assert not dupes, f"messages present more than once: {dupes[:10]}"
    resurrected = sorted(set(present) & acked)
    assert not resurrected, f"acknowledged messages came back: {resurrected[:10]}"
    missing = sorted(confirmed - ack_sent - set(present))
    assert not missing, f"confirmed messages lost: {missing[:10]} ({len(missing)} in all)"
    for pid in range(PRODUCERS):
        seqs = [n for p, n in present if p == pid]
        assert seqs == sorted(seqs), f"producer {pid} out of order: {seqs[:20]}"


async def _journal_problems(url: str) -> list[str]:
    conn = await aio.connect(url)
    try:
        status = await conn.manage("broker.status")
    finally:
        await conn.close()
    return [*status["journal"]["corrupt"], *status["bindings_journal"]["corrupt"]]


def _kill_rounds(b: Any, rounds: int, rng: random.Random, kill_after: tuple[float, float], size: int) -> int:
    """`rounds` kill -9s under load; after each restart the store must be clean and complete."""
    confirmed: set[tuple[int, int]] = set()
    acked: set[tuple[int, int]] = set()
    ack_sent: set[tuple[int, int]] = set()
    next_seq = [0] * PRODUCERS
    total_kills = 0

    async def round_(kill_after: float) -> None:
        nonlocal total_kills
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        producers = [
            asyncio.create_task(_producer(b.url, pid, next_seq[pid], confirmed, acked, stop, size))
            for pid in range(PRODUCERS)
        ]
        consumer = asyncio.create_task(_consumer(b.url, acked, ack_sent, stop))
        await asyncio.sleep(kill_after)
        await loop.run_in_executor(None, b.kill)
        total_kills += 1
        stop.set()
        results = await asyncio.wait_for(asyncio.gather(*producers), 30)
        for pid, n in enumerate(results):
            next_seq[pid] = n
        await asyncio.wait_for(consumer, 30)

    for r in range(rounds):
        b.start()  # a store it cannot load (damage, not a torn tail) fails the start
        if r > 0:
            assert asyncio.run(_journal_problems(b.url)) == [], f"round {r}: the restart found damage"
            present = asyncio.run(_drain(b.url))
            _check(present, confirmed, acked, ack_sent)
        asyncio.run(round_(rng.uniform(*kill_after)))
    b.start()
    assert asyncio.run(_journal_problems(b.url)) == []
    present = asyncio.run(_drain(b.url))
    _check(present, confirmed, acked, ack_sent)
    b.stop()
    assert len(confirmed) > rounds * 50, f"too little traffic to mean anything: {len(confirmed)} confirmed"
    assert acked, "the consumer never acknowledged anything"
    return total_kills


@pytest.mark.timeout(600)
def test_kill9_rounds_keep_every_confirmed_message(broker_factory: object) -> None:
    seed = int(os.environ.get("TANDEM_CRASH_SEED", random.randrange(1 << 30)))
    print(f"crash test seed {seed}")
    b = broker_factory(journal_file_size=256 * 1024, journal_compact_min_files=4)  # type: ignore[operator]
    kills = _kill_rounds(b, ROUNDS, random.Random(seed), (0.3, 1.2), 0)
    assert kills == ROUNDS


@pytest.mark.timeout(600)
def test_kill9_while_batches_roll_over_small_files_and_compact(broker_factory: object) -> None:
    """Kills land while a batch spans several 64 KiB files (3 KiB bodies) and compaction runs:
    a torn record in a file that is not the last is a torn tail, repaired at every restart."""
    seed = int(os.environ.get("TANDEM_CRASH_SEED", random.randrange(1 << 30)))
    print(f"crash test seed {seed}")
    b = broker_factory(  # type: ignore[operator]
        journal_file_size=64 * 1024,
        journal_compact_min_files=4,
        journal_compact_percentage=50,
        # Every round's check browses the backlog (a delivery each): 50 of them must not dead-letter it.
        address_settings={"#": {"max-delivery-attempts": 0}},
    )
    kills = _kill_rounds(b, ROLL_ROUNDS, random.Random(seed), (0.15, 0.5), 3000)
    assert kills >= 50 or ROLL_ROUNDS < 50
