"""Failover while an address pages and while it depages, on both kinds of pair, and a replicated
backup that joins (initial sync) while an address pages under load: after the takeover every
confirmed message is delivered once, in order, and none acknowledged comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from client_io import drain_committed, queue_stat
from ha_pair import Cluster
from tandem.errors import TandemError

PAGED = {"paged.#": {"max-size-bytes": 32 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 32 * 1024}}
BODY = "f" * 200


def _pages(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted((directory / "paging").iterdir()) if f.name.endswith(".page")}


@pytest.fixture
def make_pair(tmp_path: Path, pair: Any) -> Iterator[Any]:
    """A started pair of the kind asked for, holding the paging settings; killed at the end."""
    made: list[Cluster] = []

    def make(kind: str) -> Any:
        if kind == "replicated":
            return pair(address_settings=PAGED).start_all()
        c = Cluster(tmp_path / "shared", 1, address_settings=PAGED)
        made.append(c)
        return c.start_all()

    yield make
    for c in made:
        c.kill_all()


async def _produce(
    url: str, address: str, confirmed: list[int], stop: asyncio.Event, go: asyncio.Event | None = None
) -> None:
    """Send one at a time until `stop` or the server dies (no failover); each confirmed index in order."""
    conn = await aio.connect(url)
    try:
        prod = (await conn.create_session()).create_producer(address)
        i = len(confirmed)
        while not stop.is_set():
            if go is not None:
                await go.wait()
            await prod.send(f"m{i:06d}:" + BODY)
            confirmed.append(i)
            i += 1
    except TandemError:
        pass
    finally:
        try:
            await conn.close()
        except TandemError:
            pass


async def _send(url: str, address: str, n: int) -> None:
    conn = await aio.connect(url)
    try:
        prod = (await conn.create_session()).create_producer(address)
        for i in range(n):
            await prod.send_async(f"m{i:06d}:" + BODY)
        await prod.flush()
    finally:
        await conn.close()


async def _drain(url: str, queue: str) -> list[int]:
    """The message numbers `queue` holds, in order, consumed in one committed transaction."""
    return [int(t[1:]) for t in await drain_committed(url, queue, every=0)]


def _once_in_order(got: list[int], confirmed: list[int]) -> None:
    assert got == sorted(set(got)), "out of order, or delivered twice"
    missing = sorted(set(confirmed) - set(got))
    assert not missing, f"confirmed messages lost: {len(missing)}, first {missing[:5]}"


def test_a_backup_joining_while_an_address_pages_under_load_gets_every_page(pair: Any) -> None:
    """The initial copy lists and copies `paging/` while the page writer appends and creates pages:
    once in sync, the backup's page files are the primary's byte for byte, and after a kill -9
    under load it delivers every confirmed message once, in order."""
    p = pair(address_settings=PAGED)
    p.primary.start()
    p.wait_state(0, "active")
    confirmed: list[int] = []

    async def main() -> None:
        stop, go = asyncio.Event(), asyncio.Event()
        go.set()
        task = asyncio.create_task(_produce(p.url_of(0), "paged.j", confirmed, stop, go))
        loop = asyncio.get_running_loop()
        while len(confirmed) < 1500:  # paging, several pages written
            await asyncio.sleep(0.02)
        await loop.run_in_executor(None, p.backup.start)
        await loop.run_in_executor(None, p.wait_in_sync)
        joined_at = len(confirmed)
        go.clear()  # a pause: the backup catches up, then its pages must equal the primary's
        await asyncio.sleep(0.3)
        deadline = time.monotonic() + 20
        while (mine := _pages(p.dirs[0])) != _pages(p.dirs[1]):
            assert time.monotonic() < deadline, "the backup's page files differ from the primary's"
            await asyncio.sleep(0.2)
        assert len(mine) >= 3
        go.set()
        while len(confirmed) < joined_at + 500:
            await asyncio.sleep(0.02)
        await loop.run_in_executor(None, p.primary.kill)  # under load, paging
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    p.wait_state(1, "active")
    _once_in_order(asyncio.run(_drain(p.url_of(1), "paged.j")), confirmed)


@pytest.mark.parametrize("kind", ["replicated", "shared-store"])
def test_failover_while_paging_under_load(kind: str, make_pair: Any) -> None:
    c = make_pair(kind)
    confirmed: list[int] = []

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(_produce(c.url_of(0), "paged.p", confirmed, stop))
        while len(confirmed) < 2000:
            await asyncio.sleep(0.02)
        await asyncio.get_running_loop().run_in_executor(None, c.primary.kill)
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    c.wait_state(1, "active")
    got = asyncio.run(_drain(c.url_of(1), "paged.p"))
    _once_in_order(got, confirmed)
    assert len(got) >= 2000


@pytest.mark.parametrize("kind", ["replicated", "shared-store"])
def test_failover_while_depaging(kind: str, make_pair: Any) -> None:
    """A transacted consumer drains a paged backlog through the takeover: every message once, in
    order, none it committed comes back."""
    n = 4000
    c = make_pair(kind)
    asyncio.run(_send(c.url_of(0), "paged.d", n))
    consumed: list[int] = []

    async def consume() -> None:
        conn = await aio.connect(c.url, retry_interval=50)
        session = await conn.create_session(transacted=True)
        consumer = await session.create_consumer("paged.d")
        batch: list[int] = []
        killed = False
        deadline = time.monotonic() + 120
        while len(consumed) < n and time.monotonic() < deadline:
            if not killed and len(consumed) >= n // 3:
                await asyncio.get_running_loop().run_in_executor(None, c.primary.kill)
                killed = True
            try:
                msg = await consumer.receive(1.0)
                if msg is not None:
                    batch.append(int(msg.text[1:7]))
                if len(batch) >= 20 or (msg is None and batch):
                    await session.commit()
                    consumed.extend(batch)
                    batch = []
            except tandem.Unblocked:
                continue
            except tandem.TransactionRolledBack:
                batch = []
            except tandem.TransactionOutcomeUnknown:
                if not await session.retry_commit():
                    consumed.extend(batch)
                batch = []
        await conn.close()
        assert killed

    asyncio.run(consume())
    assert consumed == list(range(n))
    assert c.status(1)["state"] == "active"


@pytest.mark.parametrize(
    ("kind", "k", "enough"),
    [(kind, k, enough) for kind in ("replicated", "shared-store") for k, enough in ((4, 300), (400, 8))],
)
def test_failover_during_paged_transactions(kind: str, k: int, enough: int, make_pair: Any) -> None:
    """Transactions of K messages over two paging addresses, kill -9 of the primary among them:
    the backup has each transaction whole or not at all, and every confirmed one. Small ones are
    paged at their commit (decision 0049), large ones as they arrive (0055: their files renamed
    into pages by the commit, the renames replicated)."""
    outs = ("paged.ta", "paged.tb")
    c = make_pair(kind)
    for out in outs:
        asyncio.run(_send(c.url_of(0), out, 300))  # both addresses page
    committed: set[int] = set()

    async def work() -> None:
        conn = await aio.connect(c.url_of(0))
        t = 0
        try:
            session = await conn.create_session(transacted=True)
            prod = session.create_producer()
            while True:
                for i in range(k):
                    await prod.send_async(f"t{t:06d}:{i}:" + BODY, address=outs[i % 2])
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

    async def main() -> None:
        task = asyncio.create_task(work())
        deadline = time.monotonic() + 120
        while len(committed) < enough and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert len(committed) >= enough, f"only {len(committed)} commits"
        await asyncio.get_running_loop().run_in_executor(None, c.primary.kill)
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    c.wait_state(1, "active")
    parts: dict[int, list[int]] = {}
    for out in outs:
        conn_texts = asyncio.run(drain_committed(c.url_of(1), out, keep=None, every=0))
        assert [x[:7] for x in conn_texts if x.startswith("m")] == [f"m{i:06d}" for i in range(300)]
        keys = [tuple(int(n) for n in x[1:].split(":", 2)[:2]) for x in conn_texts if x.startswith("t")]
        assert keys == sorted(keys), f"out of order in {out}"
        for t, i in keys:
            parts.setdefault(t, []).append(i)
    for t, got in parts.items():
        assert sorted(got) == list(range(k)), f"transaction {t} is partial or twice: {got}"
    missing = sorted(committed - set(parts))
    assert not missing, f"confirmed commits lost: {missing[:10]}"


def test_a_backup_joining_while_an_address_depages_takes_over_where_the_primary_was(pair: Any) -> None:
    """Pages are read back, and deleted, while the initial copy lists and copies `paging/`; the
    joined backup then takes over after a kill -9 in the middle of the drain: every message once,
    in order, none the consumer committed again."""
    n = 6000
    p = pair(address_settings=PAGED)
    p.primary.start()
    p.wait_state(0, "active")
    asyncio.run(_send(p.url_of(0), "paged.b", n))
    consumed: list[int] = []

    async def consume() -> None:
        conn = await aio.connect(p.url, retry_interval=50)
        session = await conn.create_session(transacted=True)
        consumer = await session.create_consumer("paged.b", window=0)
        loop = asyncio.get_running_loop()
        joining = loop.run_in_executor(None, p.backup.start)
        synced: asyncio.Future[None] | None = None
        killed = False
        batch: list[int] = []
        deadline = time.monotonic() + 120
        while len(consumed) < n and time.monotonic() < deadline:
            if synced is None and joining.done():
                joining.result()
                synced = loop.run_in_executor(None, p.wait_in_sync)
            if not killed and synced is not None and synced.done() and len(consumed) >= n // 2:
                synced.result()
                await loop.run_in_executor(None, p.primary.kill)
                killed = True
            try:
                msg = await consumer.receive(1.0)
                if msg is not None:
                    batch.append(int(msg.text[1:7]))
                if len(batch) >= 10 or (msg is None and batch):
                    await session.commit()
                    consumed.extend(batch)
                    batch = []
                if not killed and synced is not None and not synced.done():
                    await asyncio.sleep(0.002)  # drain slowly while the copy runs
            except tandem.Unblocked:
                continue
            except tandem.TransactionRolledBack:
                batch = []
            except tandem.TransactionOutcomeUnknown:
                if not await session.retry_commit():
                    consumed.extend(batch)
                batch = []
        await conn.close()
        assert killed, "the backup never got in sync while the address depaged"

    asyncio.run(consume())
    assert consumed == list(range(n))
    assert p.status(1)["state"] == "active"


@pytest.mark.parametrize("kind", ["replicated", "shared-store"])
def test_failover_while_a_range_reader_reads_paged_messages(kind: str, make_pair: Any) -> None:
    """A range reader (the Spark source's way: read a chunk, acknowledge up to its end) over a
    paged reader-only queue, kill -9 of the primary in the middle: on the backup it goes on from
    its acknowledged offset; no acknowledged range is served again, no message is lost."""
    n = 4000
    c = make_pair(kind)

    async def fill() -> None:
        conn = await aio.connect(c.url_of(0))
        try:
            s = await conn.create_session()
            await s.create_queue("paged.rr", reader_only=True)
        finally:
            await conn.close()
        await _send(c.url_of(0), "paged.rr", n)

    asyncio.run(fill())
    assert asyncio.run(queue_stat(c.url_of(0), "paged.rr"))["paged_count"] > n // 2
    acked: list[int] = []  # message numbers whose acknowledgement returned, in order
    firsts_after_kill: list[tuple[int, int]] = []  # (first offset the broker gave, our acked offset)

    async def read() -> None:
        conn = await aio.connect(c.url, retry_interval=50)
        s = await conn.create_session()
        lo = 0
        killed = False
        deadline = time.monotonic() + 120
        while len(acked) < n and time.monotonic() < deadline:
            if not killed and len(acked) >= n // 3:
                await asyncio.get_running_loop().run_in_executor(None, c.primary.kill)
                killed = True
            try:
                first, last = await s.queue_offsets("paged.rr")
                if killed:
                    firsts_after_kill.append((first, lo))
                r = await s.read_range("paged.rr", lo, last, 150)
                if not r.messages:
                    continue
                end = r.messages[-1].seq
                await s.ack_upto("paged.rr", end)
                acked.extend(int(m.text[1:7]) for m in r.messages)
                lo = end
            except TandemError:
                continue  # unblocked by the failover: read again from the acknowledged offset
        await conn.close()
        assert killed

    asyncio.run(read())
    assert acked == list(range(n))
    assert firsts_after_kill and all(first > lo for first, lo in firsts_after_kill), firsts_after_kill[:5]
    assert c.status(1)["state"] == "active"


@pytest.mark.parametrize("kind", ["replicated", "shared-store"])
def test_failover_with_a_transaction_paged_while_open(kind: str, make_pair: Any) -> None:
    """Decision 0055: one transaction paged as it arrives and committed (confirmed), another
    still open when the primary is killed: the backup delivers the first whole, in order, and
    nothing of the second, and keeps none of its files."""
    c = make_pair(kind)
    backup_dir = Path(c.dirs[1] if kind == "replicated" else c.data)
    asyncio.run(_send(c.url_of(0), "paged.open", 300))  # the address pages

    async def main() -> None:
        conns = []
        for first, commit in ((1000, True), (5000, False)):
            conn = await aio.connect(c.url_of(0))
            conns.append(conn)
            session = await conn.create_session(transacted=True)
            prod = session.create_producer("paged.open")
            for i in range(first, first + 2000):
                await prod.send_async(f"m{i:06d}:" + BODY)
            await prod.flush()
            if commit:
                await session.commit()
        deadline = time.monotonic() + 10
        while not _tx_files(backup_dir) and time.monotonic() < deadline:  # on the backup's disk too
            await asyncio.sleep(0.05)
        assert _tx_files(backup_dir), "the open transaction's sends were not paged (or not replicated)"
        await asyncio.get_running_loop().run_in_executor(None, c.primary.kill)
        for conn in conns:
            try:
                await conn.close()
            except TandemError:
                pass

    asyncio.run(main())
    c.wait_state(1, "active")
    got = asyncio.run(_drain(c.url_of(1), "paged.open"))
    assert got == list(range(300)) + list(range(1000, 3000))
    left = _tx_files(backup_dir)
    assert not left, f"the open transaction's files are still there: {left[:3]}"


def _tx_files(data_dir: Path) -> list[str]:
    """Files of open transactions (a<address>-t<tx>-<n>.page)."""
    d = data_dir / "paging"
    return [f.name for f in d.iterdir() if "-t" in f.name] if d.is_dir() else []
