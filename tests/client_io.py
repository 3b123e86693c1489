"""Small asyncio-client steps the integration tests share (each opens its own connection)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import tandem
import tandem.aio as aio


async def queue_stat(url: str, queue: str) -> dict[str, Any]:
    """One queue's `queue.stat` row."""
    conn = await aio.connect(url)
    try:
        return (await conn.manage("queue.stat", name=queue))[0]  # type: ignore[no-any-return]
    finally:
        await conn.close()


async def drain_texts(url: str, queue: str, wait: float = 0.5) -> list[str]:
    """Receive (auto-acknowledged) until `queue` has been quiet for `wait` seconds; the texts in order."""
    return [m.text for m in await _drain(url, queue, wait)]


async def drain_bodies(url: str, queue: str, wait: float = 0.5) -> list[bytes]:
    """As `drain_texts`, the bodies (large ones read whole)."""
    return [m.body for m in await _drain(url, queue, wait)]


async def drain_committed(
    url: str, queue: str, wait: float = 3.0, keep: int | None = 7, every: int = 1000
) -> list[str]:
    """Everything `queue` holds, in order, consumed in transactions committed every `every`
    messages (0: one transaction) and at the end, so the acknowledgements are on disk when
    this returns; the first `keep` characters of each text (the tests' message numbers)."""
    conn = await aio.connect(url)
    out: list[str] = []
    try:
        session = await conn.create_session(transacted=True)
        consumer = await session.create_consumer(queue)
        while (m := await consumer.receive(wait)) is not None:
            out.append(m.text[:keep])
            if every and len(out) % every == 0:
                await session.commit()
        await session.commit()
    finally:
        await conn.close()
    return out


async def _drain(url: str, queue: str, wait: float) -> list[Any]:
    conn = await aio.connect(url)
    try:
        consumer = await (await conn.create_session()).create_consumer(queue)
        out = []
        while (m := await consumer.receive(wait)) is not None:
            out.append(m)
        return out
    finally:
        await conn.close()


def exactly_once_across_a_kill(
    url: str, kill: Callable[[], None], total: int = 3000, until_killed: bool = False
) -> tuple[list[int], dict[str, float]]:
    """A producer (auto_dedup, send() after send()) and a transacted consumer on a pair's `url`;
    `kill` (kill -9 of the active server) runs once a third is confirmed. Returns what was consumed
    (committed) and when: "kill", "first_send" and "first_receive" after it (monotonic seconds),
    and "sent": how many were sent (`total`; with `until_killed`, more if `kill` took longer: the
    producer goes on until it returns, so a long `kill` such as failback cycles runs under load)."""
    confirmed: list[int] = []
    consumed: list[int] = []
    times: dict[str, float] = {}
    killed = asyncio.Event()
    produced = asyncio.Event()

    async def produce() -> None:
        conn = await aio.connect(url, retry_interval=50)
        prod = (await conn.create_session()).create_producer("work")
        i = 0
        while i < total or (until_killed and not killed.is_set()):
            await prod.send(str(i))  # auto_dedup: resent after failover if unconfirmed
            confirmed.append(i)
            if "kill" in times and "first_send" not in times:
                times["first_send"] = time.monotonic()
            await asyncio.sleep(0.0005)
            i += 1
        times["sent"] = i
        produced.set()
        await conn.close()

    async def consume() -> None:
        conn = await aio.connect(url, retry_interval=50)
        session = await conn.create_session(transacted=True)
        consumer = await session.create_consumer("work")
        batch: list[int] = []
        deadline = time.monotonic() + 120
        while not (produced.is_set() and len(consumed) >= times["sent"]) and time.monotonic() < deadline:
            try:
                msg = await consumer.receive(1.0)
                if msg is not None:
                    batch.append(int(msg.text))
                    if "kill" in times and "first_receive" not in times:
                        times["first_receive"] = time.monotonic()
                if len(batch) >= 20 or (msg is None and batch):
                    await session.commit()
                    consumed.extend(batch)
                    batch = []
            except tandem.Unblocked:
                continue  # a receive that crossed the failover: the backup delivers again
            except tandem.TransactionRolledBack:
                batch = []  # not committed: these come again
            except tandem.TransactionOutcomeUnknown:
                # the commit crossed the failover: an empty commit under its id says whether it went through
                if not await session.retry_commit():
                    consumed.extend(batch)
                batch = []
        await conn.close()

    async def main() -> None:
        tasks = [asyncio.create_task(produce()), asyncio.create_task(consume())]
        while len(confirmed) < total // 3:
            await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, kill)
        times["kill"] = time.monotonic()
        killed.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 150)

    asyncio.run(main())
    return consumed, times


class Load:
    """One producer on one server (no failover); each confirmation recorded with its send index."""

    def __init__(self) -> None:
        self.sent = 0
        self.confirmed: dict[str, int] = {}
        self.stop = asyncio.Event()

    async def run(self, url: str, queue: str) -> None:
        conn = await aio.connect(url, ha=False, reconnect_attempts=0, auto_dedup=False)
        try:
            prod = (await conn.create_session()).create_producer(queue, window=2000)
            while not self.stop.is_set():
                name, i = f"L{self.sent}", self.sent
                await prod.send_async(name, lambda exc, n=name, i=i: exc or self.confirmed.setdefault(n, i))
                self.sent += 1
                if self.sent % 32 == 0:
                    await asyncio.sleep(0.002)
        except tandem.TandemError:
            pass
        finally:
            try:
                await conn.close()
            except tandem.TandemError:
                pass

    async def until(self, n: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.confirmed) < n:
            assert time.monotonic() < deadline, f"only {len(self.confirmed)} of {n} sends confirmed"
            await asyncio.sleep(0.02)


async def send_confirmed(url: str, queue: str, prefix: str, n: int) -> list[str]:
    """Send `prefix0` .. `prefix{n-1}` to `queue`, every one confirmed; returns the bodies."""
    conn = await aio.connect(url)
    prod = (await conn.create_session()).create_producer(queue)
    for i in range(n):
        await prod.send_async(f"{prefix}{i}")
    await prod.flush()
    await conn.close()
    return [f"{prefix}{i}" for i in range(n)]


async def send_padded(url: str, address: str, n: int, prefix: str = "m", width: int = 6) -> None:
    """Send `{prefix}{i:0{width}d}` and 200 bytes of padding for i < n, every one confirmed:
    bodies big enough to fill a small memory limit (paging tests)."""
    conn = await aio.connect(url)
    try:
        prod = (await conn.create_session()).create_producer(address)
        for i in range(n):
            await prod.send_async(f"{prefix}{i:0{width}d}" + "r" * 200)
        await prod.flush()
    finally:
        await conn.close()
