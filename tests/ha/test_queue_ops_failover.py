"""A paused queue stays paused when its backup takes over (shared store and replication), and a
move of paged messages by selector cut by the kill of the primary leaves each message in exactly
one queue on the backup."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from ha_pair import Cluster

N = 4000
PAGED = {"#": {"max-size-bytes": 64 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 32 * 1024}}


async def _manage(url: str, op: str, **args: Any) -> Any:
    conn = await aio.connect(url, retry_interval=100)
    try:
        return await conn.manage(op, **args)
    finally:
        await conn.close()


async def _fill(url: str) -> None:
    conn = await aio.connect(url)
    try:
        session = await conn.create_session()
        await session.create_queue("jobs", exists_ok=True)
        await session.create_queue("done", exists_ok=True)
        prod = session.create_producer("jobs")
        for i in range(N):
            await prod.send_async(
                tandem.Message(f"j{i}" + "x" * 100, properties={"n": i, "parity": "odd" if i % 2 else "even"})
            )
        await prod.flush()
    finally:
        await conn.close()


async def _drain(url: str, queue: str) -> list[int]:
    conn = await aio.connect(url, retry_interval=100)
    out: list[int] = []
    try:
        consumer = await (await conn.create_session()).create_consumer(queue)
        while (m := await consumer.receive(1.0)) is not None:
            out.append(int(m.properties["n"]))
    finally:
        await conn.close()
    return out


def _pause_move_kill_then_check(c: Cluster) -> None:
    url0 = c.url_of(0)
    asyncio.run(_fill(url0))
    paged = asyncio.run(_manage(url0, "queue.stat", name="jobs"))[0]["paged_count"]
    assert paged > N // 2
    past_memory = (N - paged) // 2 + 100  # moved: the odd ones of memory, and some from the pages
    assert asyncio.run(_manage(url0, "queue.pause", name="jobs")) == {"name": "jobs", "paused": True}
    mover = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tandem",
            "queue",
            "move",
            "--url",
            url0,
            "jobs",
            "--to",
            "done",
            "--selector",
            "parity = 'odd'",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and mover.poll() is None:
        if asyncio.run(_manage(url0, "queue.stat", name="done"))[0]["message_count"] >= past_memory:
            break
        time.sleep(0.01)
    c.primary.kill()  # kill -9, the move under way (or just over)
    mover.wait(60)
    c.wait_state(1, "active")
    url1 = c.url_of(1)
    jobs = asyncio.run(_manage(url1, "queue.stat", name="jobs"))[0]
    done = asyncio.run(_manage(url1, "queue.stat", name="done"))[0]
    assert jobs["paused"] is True and done["paused"] is False
    assert jobs["message_count"] + done["message_count"] == N  # each in exactly one queue
    assert 0 < done["message_count"] <= N // 2
    assert asyncio.run(_drain(url1, "jobs")) == []  # paused: nothing delivered
    asyncio.run(_manage(url1, "queue.resume", name="jobs"))
    jobs_got, done_got = asyncio.run(_drain(url1, "jobs")), asyncio.run(_drain(url1, "done"))
    assert sorted(jobs_got + done_got) == list(range(N))
    assert all(n % 2 == 1 for n in done_got) and done_got == sorted(done_got)


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    made: list[Cluster] = []

    def make(**settings: Any) -> Cluster:
        c = Cluster(tmp_path, 1, **settings)
        made.append(c)
        return c

    yield make
    for c in made:
        c.kill_all()


@pytest.mark.timeout(180)
def test_shared_store_backup_keeps_the_pause_and_the_move(cluster: Any) -> None:
    _pause_move_kill_then_check(cluster(address_settings=PAGED).start_all())


@pytest.mark.timeout(180)
def test_replicated_backup_keeps_the_pause_and_the_move(pair: Any) -> None:
    _pause_move_kill_then_check(pair(address_settings=PAGED).start_all())
