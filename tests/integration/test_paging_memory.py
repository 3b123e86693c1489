"""Paging bounds the broker's real memory: `global-max-size` counts what a queued message really
holds (its bytes plus the broker's objects for it), and reading pages back adds only a small,
bounded amount (chunks of a page, not whole cached pages). Real broker processes."""

from __future__ import annotations

import asyncio
from typing import Any

from test_paging import _numbers, receive, send_range

from broker_process import BrokerProcess
from client_io import queue_stat
from tandem.testing.procs import memory

MIB = 1024 * 1024


def test_global_max_size_counts_each_messages_real_memory_not_only_its_bytes(broker_factory: Any) -> None:
    # 20k messages of ~140 encoded bytes with a 1 MiB broker limit. Counting bytes only, ~7,500
    # of them stay in memory, where each takes ~630 bytes of RSS (message objects, queue entry,
    # journal index): ~4.5 MiB for a 1 MiB limit.
    n = 20_000
    b: BrokerProcess = broker_factory(global_max_size=MIB, address_settings={"#": {"address-full-policy": "PAGE"}})
    b.start()
    asyncio.run(send_range(b.url, "small", 0, n, body="s" * 100))
    stat = asyncio.run(queue_stat(b.url, "small"))
    assert stat["message_count"] == n
    in_memory = n - stat["paged_count"]
    assert 0 < in_memory <= MIB // 500, f"{in_memory} messages in memory under a 1 MiB limit"
    assert _numbers(asyncio.run(receive(b.url, "small", n + 1))) == list(range(n))


def test_depaging_big_pages_adds_little_memory(broker_factory: Any) -> None:
    # 40 MiB of 1 KiB messages in 8 MiB pages, 1 MiB in memory. Reading a whole page at once
    # (8 MiB of file, ~9 MiB of records) and caching up to page-max-cache-size of them made the
    # broker grow by ~36 MiB while it drained; chunked reads: ~12 MiB. (The default journal
    # file size: with the tests' 1 MiB files the journal's own share of the growth is bigger.)
    n = 40_000
    settings = {"big.#": {"max-size-bytes": MIB, "address-full-policy": "PAGE", "page-size-bytes": 8 * MIB}}
    b: BrokerProcess = broker_factory(journal_file_size=10 * MIB, address_settings=settings).start()
    assert b.proc is not None
    asyncio.run(send_range(b.url, "big.q", 0, n, body="b" * 1000))
    stat = asyncio.run(queue_stat(b.url, "big.q"))
    assert stat["paged_count"] > n - 2_000
    filled = memory(b.proc.pid, "VmHWM")
    assert _numbers(asyncio.run(receive(b.url, "big.q", n + 1, wait=5.0))) == list(range(n))
    grew = memory(b.proc.pid, "VmHWM") - filled
    assert grew < 20 * MIB, f"the broker's peak RSS grew by {grew / MIB:.1f} MiB while it read its pages back"


def test_depaging_under_a_big_limit_reuses_the_memory_of_delivered_messages(broker_factory: Any) -> None:
    # 32 MiB of 1 KiB messages in memory, as much again in pages. Messages read back in a worker
    # thread were allocated from that thread's malloc arena while the memory of the delivered
    # ones stayed free in the main arena: the broker grew by ~20 MiB while it drained. One arena
    # (server/memory.py): a few MiB.
    n = 64_000
    settings = {"arena.#": {"max-size-bytes": 32 * MIB, "address-full-policy": "PAGE"}}
    b: BrokerProcess = broker_factory(journal_file_size=10 * MIB, address_settings=settings).start()
    assert b.proc is not None
    asyncio.run(send_range(b.url, "arena.q", 0, n, body="a" * 1000))
    assert asyncio.run(queue_stat(b.url, "arena.q"))["paged_count"] > n // 3
    filled = memory(b.proc.pid, "VmHWM")
    assert _numbers(asyncio.run(receive(b.url, "arena.q", n + 1, wait=5.0))) == list(range(n))
    grew = memory(b.proc.pid, "VmHWM") - filled
    assert grew < 10 * MIB, f"the broker's peak RSS grew by {grew / MIB:.1f} MiB while it read its pages back"
