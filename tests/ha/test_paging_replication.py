"""Paging on a replicated primary: page files reach the backup through the replication stream
(the same bytes), and a backup that takes over after a kill -9 has every confirmed paged message.
(Failover in the middle of depaging, and shared-store pairs, are issue 16's next slice.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import tandem.aio as aio
from client_io import send_padded

PAGED = {"paged.#": {"max-size-bytes": 64 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 64 * 1024}}


async def _drain(url: str, queue: str, limit: int) -> list[str]:
    conn = await aio.connect(url)
    out: list[str] = []
    try:
        consumer = await (await conn.create_session()).create_consumer(queue)
        while len(out) < limit and (m := await consumer.receive(3.0)) is not None:
            out.append(m.text[:7])
    finally:
        await conn.close()
    return out


def _pages(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted((directory / "paging").iterdir()) if f.name.endswith(".page")}


def test_page_files_are_replicated_and_the_backup_takes_over_with_them(pair: Any) -> None:
    n = 3000
    p = pair(address_settings=PAGED).start_all()
    asyncio.run(send_padded(p.url_of(0), "paged.r", n))  # confirmed: on the primary's disk and the backup's
    primary_pages = _pages(p.dirs[0])
    assert len(primary_pages) >= 5
    deadline = time.monotonic() + 20
    while _pages(p.dirs[1]) != primary_pages:
        assert time.monotonic() < deadline, "the backup's page files differ from the primary's"
        time.sleep(0.2)
    p.primary.kill()
    p.wait_state(1, "active")
    assert asyncio.run(_drain(p.url_of(1), "paged.r", n + 1)) == [f"m{i:06d}" for i in range(n)]


def test_warm_shared_store_backup_takes_over_a_paging_address_where_its_primary_was(tmp_path: Path) -> None:
    """Half of a paged backlog consumed (read back from pages and acknowledged), kill -9 of the
    primary: the warm backup, with the cursors its follower read, delivers exactly the other half."""
    from ha_pair import Cluster

    n = 4000
    c = Cluster(tmp_path, 1, address_settings=PAGED)
    try:
        c.primary.start()
        c.wait_state(0, "active")
        c.backup.start()
        c.wait_state(1, "passive")
        asyncio.run(send_padded(c.url_of(0), "paged.s", n))
        first = asyncio.run(_drain(c.url_of(0), "paged.s", n // 2))
        assert first == [f"m{i:06d}" for i in range(n // 2)]
        deadline = time.monotonic() + 30
        while not c.status(1).get("following", {}).get("caught_up"):
            assert time.monotonic() < deadline, "backup never caught up"
            time.sleep(0.05)
        time.sleep(0.5)  # let the follower read the last acknowledgements (it must be right either way)
        c.primary.kill()
        c.wait_state(1, "active", timeout=20)
        assert c.status(1)["warm_activation"] is True
        rest = asyncio.run(_drain(c.url_of(1), "paged.s", n))
        assert rest == [f"m{i:06d}" for i in range(n // 2, n)]
    finally:
        c.kill_all()
