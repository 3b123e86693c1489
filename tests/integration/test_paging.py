"""Paging against real broker processes: a PAGE address keeps taking messages while memory is
full, with the broker's RSS bounded, and gives them back in order, across restarts and kill -9."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat
from tandem.testing.procs import memory

PAGED = {"paged.#": {"max-size-bytes": 1024 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 1024 * 1024}}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def rss_kib(pid: int) -> int:
    return memory(pid) // 1024


async def send_range(url: str, address: str, start: int, n: int, body: str = "", **conn_kw: Any) -> None:
    """Send `m<start>` .. `m<start+n-1>` (plus `body`), all confirmed."""
    conn = await aio.connect(url, **conn_kw)
    try:
        prod = (await conn.create_session()).create_producer(address)
        for i in range(start, start + n):
            await prod.send_async(f"m{i:07d}{body}")
        await prod.flush()
    finally:
        await conn.close()


async def receive(url: str, queue: str, limit: int, wait: float = 2.0) -> list[str]:
    """Receive (auto-acknowledged) up to `limit` messages, their texts in order."""
    conn = await aio.connect(url)
    out: list[str] = []
    try:
        session = await conn.create_session()
        consumer = await session.create_consumer(queue)
        while len(out) < limit:
            m = await consumer.receive(wait)
            if m is None:
                break
            out.append(m.text)
        await consumer.close()
    finally:
        await conn.close()
    return out


def _numbers(texts: list[str]) -> list[int]:
    return [int(t[1:8]) for t in texts]


def test_paged_backlog_keeps_rss_bounded_then_drains_in_order(broker_factory: Any) -> None:
    # 200k x ~200 B = ~40 MiB of message data with a 1 MiB address limit.
    n = 200_000
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    assert b.proc is not None
    base = rss_kib(b.proc.pid)
    run(send_range(b.url, "paged.q", 0, n // 2, body="x" * 180))
    half = rss_kib(b.proc.pid)
    run(send_range(b.url, "paged.q", n // 2, n // 2, body="x" * 180))
    full = rss_kib(b.proc.pid)
    stat = run(queue_stat(b.url, "paged.q"))
    assert stat["message_count"] == n
    assert stat["paged_count"] > n - 10_000
    assert stat["memory_bytes"] <= 2 * 1024 * 1024
    # Held in memory, the second 100k (~20 MiB of bytes) would add ~70 MiB; paged, the broker's
    # RSS levels off (dedup ids of the producer's auto_dedup, buffers: ~28 MiB on this machine).
    assert full - half < 8 * 1024, f"RSS grew by {full - half} KiB for the second {n // 2} messages"
    assert full - base < 48 * 1024, f"RSS grew by {full - base} KiB for ~40 MiB of messages"
    pages = [p for p in os.listdir(b.data_dir / "paging") if p.endswith(".page")]
    assert len(pages) >= 30
    got = run(receive(b.url, "paged.q", n + 1, wait=5.0))
    assert _numbers(got) == list(range(n))
    assert run(queue_stat(b.url, "paged.q"))["message_count"] == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p.endswith(".page") for p in os.listdir(b.data_dir / "paging")):
        time.sleep(0.1)
    assert not [p for p in os.listdir(b.data_dir / "paging") if p.endswith(".page")]  # every page deleted
    assert rss_kib(b.proc.pid) - base < 60 * 1024


def test_paging_survives_restart_and_new_messages_follow_the_paged_ones(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    run(send_range(b.url, "paged.r", 0, 20_000, body="y" * 200))
    assert b.stop() == 0
    b.start()
    assert run(queue_stat(b.url, "paged.r"))["message_count"] == 20_000
    first = run(receive(b.url, "paged.r", 5_000))
    run(send_range(b.url, "paged.r", 20_000, 100))  # still paging: behind the paged ones
    rest = run(receive(b.url, "paged.r", 100_000))
    assert _numbers(first + rest) == list(range(20_100))


def test_kill_during_depaging_loses_nothing_and_resurrects_no_ack(broker_factory: Any) -> None:
    n = 30_000
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    run(send_range(b.url, "paged.k", 0, n, body="z" * 200))
    acked: list[str] = []

    async def consume_until_killed() -> None:
        conn = await aio.connect(b.url, reconnect_attempts=0)
        try:
            session = await conn.create_session(ack_mode="individual")
            consumer = await session.create_consumer("paged.k")
            while True:
                m = await consumer.receive(5)
                if m is None:
                    return
                await m.ack()  # waits for the broker: acknowledged means journaled
                acked.append(m.text)
                if len(acked) == n // 2:
                    assert b.proc is not None
                    os.kill(b.proc.pid, signal.SIGKILL)
        except Exception:
            return
        finally:
            try:
                await conn.close()
            except Exception:
                pass

    run(consume_until_killed())
    b.wait_exit(10)
    assert len(acked) >= n // 2
    b.start()
    rest = run(receive(b.url, "paged.k", n + 1, wait=5.0))
    got = _numbers(acked) + _numbers(rest)
    # Each acknowledged message was journaled before the kill: none comes back; every other one does.
    assert not set(_numbers(acked)) & set(_numbers(rest))
    assert sorted(got) == list(range(n))
    assert _numbers(rest) == sorted(_numbers(rest))


def test_multicast_subscriptions_each_get_every_paged_message_once(broker_factory: Any) -> None:
    n = 12_000
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()

    async def setup() -> None:
        conn = await aio.connect(b.url)
        try:
            for i in range(3):
                await conn.manage("queue.create", name=f"sub{i}", address="paged.news", routing_type="multicast")
        finally:
            await conn.close()

    run(setup())
    run(send_range(b.url, "paged.news", 0, n, body="w" * 200))
    page_bytes = sum(p.stat().st_size for p in (b.data_dir / "paging").iterdir() if p.name.endswith(".page"))
    assert page_bytes < n * 300  # stored once, not once per subscription
    for i in range(3):
        got = run(receive(b.url, f"sub{i}", n + 1))
        assert _numbers(got) == list(range(n)), f"sub{i}"
    b.stop()
    b.start()
    for i in range(3):
        assert run(queue_stat(b.url, f"sub{i}"))["message_count"] == 0


def test_global_max_size_pages_every_page_address(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(
        global_max_size=1024 * 1024, address_settings={"#": {"address-full-policy": "PAGE"}}
    ).start()
    for name in ("ga", "gb"):
        run(send_range(b.url, name, 0, 6_000, body="v" * 200))
    stats = {name: run(queue_stat(b.url, name)) for name in ("ga", "gb")}
    assert stats["gb"]["paged_count"] == 6_000  # ga filled the broker's memory: all of gb went to pages
    assert stats["ga"]["paged_count"] > 0
    for name in ("ga", "gb"):
        assert _numbers(run(receive(b.url, name, 10_000))) == list(range(6_000))


def test_status_queue_stat_and_data_print_show_paging(broker_factory: Any) -> None:
    import subprocess
    import sys

    def cli(*args: object) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "tandem", *map(str, args)], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        return r.stdout

    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    run(send_range(b.url, "paged.s", 0, 12_000, body="s" * 200))  # ~4000 in memory, ~8000 in pages
    run(receive(b.url, "paged.s", 5_000))  # more than memory held: some were read back from pages
    status = cli("admin", "status", "--url", b.url)
    line = next(x for x in status.splitlines() if "paged.s:" in x)
    assert "paging yes" in line and "bytes paged" in line and " 0 bytes paged" not in line
    stat = cli("queue", "stat", "--url", b.url, "--json")
    assert '"paging": true' in stat and '"paged_count"' in stat
    assert b.stop() == 0
    out = cli("data", "print", b.data_dir)
    assert "== paging" in out
    assert "cursor paged.s: page " in out
    pages = [x for x in out.splitlines() if x.strip().startswith("a") and ".page" in x]
    assert pages and all("messages " in x for x in pages)
    per_queue = out.split("== messages per queue")[1]
    assert "paged.s" in per_queue and " 7000" in per_queue  # in the journal plus ahead of its cursor


def test_kill_while_paging_keeps_every_confirmed_send(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    confirmed: set[int] = set()

    async def send_until_killed() -> None:
        conn = await aio.connect(b.url, reconnect_attempts=0)
        try:
            prod = (await conn.create_session()).create_producer("paged.w")
            for i in range(200_000):

                def done(err: BaseException | None, i: int = i) -> None:
                    if err is None:
                        confirmed.add(i)

                prod.send_nowait(f"m{i:07d}" + "c" * 200, callback=done)
                if i % 256 == 255:
                    await asyncio.sleep(0)
                if len(confirmed) >= 15_000 and b.proc is not None and b.proc.poll() is None:
                    os.kill(b.proc.pid, signal.SIGKILL)
                    await asyncio.sleep(0.5)
                    return
        except Exception:
            return
        finally:
            try:
                await conn.close()
            except Exception:
                pass

    run(send_until_killed())
    b.wait_exit(10)
    assert len(confirmed) >= 15_000
    b.start()
    got = _numbers(run(receive(b.url, "paged.w", 300_000, wait=5.0)))
    assert got == sorted(got) and len(set(got)) == len(got)  # in order, no repeats
    missing = confirmed - set(got)
    assert not missing, f"{len(missing)} confirmed sends lost, e.g. {sorted(missing)[:5]}"
