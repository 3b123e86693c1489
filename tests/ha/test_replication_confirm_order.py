"""What a replicated primary confirms while its backup has not acknowledged the latest writes:
nothing that depends on them. In the first tests the replication link runs through a FaultProxy
whose primary-to-backup direction is a blackhole, so the primary's last page batch is on its disk
only; the primary is then killed and the backup takes over without that batch. The last one
joins a backup to a primary under paged transactions: its sync must replay cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import tandem.aio as aio
from client_io import drain_texts, send_padded
from replicated_pair import ReplicatedPair, linked_pairs
from tandem.testing import FaultProxy

pytestmark = pytest.mark.timeout(120)

PAGED = {"paged.#": {"max-size-bytes": 64 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 64 * 1024}}


@pytest.fixture
def linked(tmp_path: Path) -> Iterator[Any]:
    """make(**settings) -> (pair, proxy): an uncoordinated pair whose backup reaches its primary through the proxy."""
    with linked_pairs(tmp_path) as make:
        yield make


def _filled_then_cut_off(linked: Any, address: str) -> tuple[ReplicatedPair, FaultProxy, str]:
    """A pair in sync whose `address` pages (1,500 fills, all replicated), then the primary's
    frames lost on the way to the backup. The backup keeps pinging through the blackhole (its
    direction flows): the primary would drop it only by call-timeout, far longer than a test."""
    p, proxy = linked(address_settings=PAGED, call_timeout=60000, server_toml=("", "connection-ttl = 30000\n"))
    p.start_all()
    url = p.url_of(0)
    asyncio.run(send_padded(url, address, 1500, prefix="fill", width=5))
    assert p.status(0)["replication"] == "in-sync"
    proxy.blackhole("down")
    return p, proxy, url


@contextlib.asynccontextmanager
async def _clients(url: str, n: int) -> AsyncIterator[list[Any]]:
    """`n` connections that do not fail over (a client's own resend would hide a loss); closed at the end."""
    conns = [await aio.connect(url + "?reconnect_attempts=0") for _ in range(n)]
    try:
        yield conns
    finally:
        for c in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 5)


async def _commit_waiting(conn: Any, address: str, dedup_id: str | None = None) -> asyncio.Future[Any]:
    """A transaction of one paged message, its commit under way and not answered after a second
    (its page batch is on the primary's disk by then, and the backup cannot have it)."""
    session = await conn.create_session(transacted=True)
    await session.create_producer(address).send("in-the-tx")
    commit = asyncio.ensure_future(session.commit(dedup_id=dedup_id))
    await asyncio.sleep(1.0)
    assert not commit.done(), "committed while the backup cannot have it"
    return commit


def _on_the_backup_after_takeover(p: ReplicatedPair, address: str) -> list[str]:
    """What the backup serves once it took over: the 1,500 fills whole, and whatever else it has."""
    p.wait_state(1, "active", timeout=30)
    deadline = time.monotonic() + 10
    texts: list[str] = []
    while time.monotonic() < deadline and len(texts) < 1500:
        texts += asyncio.run(drain_texts(p.url_of(1), address, wait=1.0))
    assert len([t for t in texts if t.startswith("fill")]) == 1500
    return texts


def test_a_duplicate_of_a_paged_send_is_not_confirmed_before_the_backup_has_the_page(linked: Any) -> None:
    """A paged send's dedup id is journaled only once its page is on both servers (decision 0045);
    a resend with that id meanwhile is a duplicate, confirmed "once what is stored so far is
    durable". That must include the backup's acknowledgement of the page: confirmed before it,
    the primary's death leaves the backup without the message, and the client, told it is
    stored, never sends it again."""
    p, proxy, url = _filled_then_cut_off(linked, "paged.d")

    # Neither client fails over: a resend of the original by its own client would hide the loss
    # (the duplicate's confirmation told its sender, and the other, that it is stored).
    async def run() -> bool:
        async with _clients(url, 2) as (a, b):
            prod_a = (await a.create_session()).create_producer("paged.d")
            original = await prod_a.send_async("original", dedup_id="the-one")
            assert original is not None
            await asyncio.sleep(1.0)  # its page batch is on the primary's disk by now
            assert not original.done(), "confirmed while the backup cannot have it"
            prod_b = (await b.create_session()).create_producer("paged.d")
            dup = await prod_b.send_async("duplicate", dedup_id="the-one")
            assert dup is not None
            try:
                await asyncio.wait_for(asyncio.shield(dup), 3.0)
                dup.result()
                confirmed = True
            except TimeoutError:
                confirmed = False
            await asyncio.to_thread(p.primary.kill)
            proxy.reset()  # the backup learns that its link is gone
            return confirmed

    confirmed = asyncio.run(run())
    texts = _on_the_backup_after_takeover(p, "paged.d")
    if confirmed:
        assert "original" in texts, "a send confirmed (as a duplicate) is missing on the backup that took over"


def test_a_retried_commit_of_a_paged_transaction_is_not_confirmed_before_the_backup_has_the_page(
    linked: Any,
) -> None:
    """A transaction paged at its commit is journaled (PAGE_TX) once its page writes are on both
    servers; its dedup id is known at once. A retry of that commit from another connection (what
    a client does to resolve a commit whose answer it lost) is "already committed", confirmed
    once what is stored so far is durable: that must wait for the backup's acknowledgement of the
    page, or the backup that takes over at the primary's death lacks the whole transaction."""
    p, proxy, url = _filled_then_cut_off(linked, "paged.t")

    async def run() -> bool:
        async with _clients(url, 2) as (a, b):
            first = await _commit_waiting(a, "paged.t", "the-tx")
            sb = await b.create_session(transacted=True)
            try:
                await asyncio.wait_for(sb.commit(dedup_id="the-tx"), 3.0)
                confirmed = True
            except TimeoutError:
                confirmed = False
            await asyncio.to_thread(p.primary.kill)
            proxy.reset()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(first, 5)
            return confirmed

    confirmed = asyncio.run(run())
    texts = _on_the_backup_after_takeover(p, "paged.t")
    if confirmed:
        assert "in-the-tx" in texts, "a commit confirmed (as already committed) is missing on the backup that took over"


def test_a_primary_stopping_while_a_paged_commit_waits_for_its_backup_confirms_nothing_more(linked: Any) -> None:
    """A clean stop (SIGTERM) closes the store, then hands the node over. A paged transaction
    whose commit still waited for the backup's acknowledgement of its page must not go on against
    the closed store (it did: `replication callback failed`, a JournalError, in the log; chaos
    seed 1127302), nor be confirmed: the backup that takes over never had its page."""
    p, proxy, url = _filled_then_cut_off(linked, "paged.s")

    async def run() -> bool:
        async with _clients(url, 1) as (a,):
            first = await _commit_waiting(a, "paged.s")
            assert await asyncio.to_thread(p.primary.stop) == 0
            proxy.reset()  # the backup learns that its link is gone
            try:
                await asyncio.wait_for(first, 10)
            except Exception:  # outcome unknown: the connection went with the server
                return False
            return True

    assert not asyncio.run(run()), "a commit confirmed by a server stopping without its backup's acknowledgement"
    log = p.primary.log_text()
    assert "replication callback failed" not in log and "Traceback" not in log, log[-3000:]
    assert "in-the-tx" not in _on_the_backup_after_takeover(p, "paged.s")


def test_a_backup_joining_while_paged_transactions_commit_syncs_without_a_replay_error(pair: Any) -> None:
    """A transaction larger than a page pages while open into files of its own, renamed to pages
    at its commit by the page writer. A backup's initial sync lists `paging/` while that writer
    runs: a listing made between its rename and the hand-over of the rename to the stream found
    the new name, and the replayed operations (the file's last writes, the rename) named a file
    the backup never had; the sync failed and started again, for as long as such commits went on.
    Taken between two of the writer's batches, as the journals' listings are, it cannot."""
    p = pair(address_settings=PAGED)
    p.primary.start()
    p.wait_state(0, "active")
    stop = threading.Event()
    commits = [0]

    async def load() -> None:
        conn = await aio.connect(p.url_of(0) + "?reconnect_attempts=0")
        try:
            s = await conn.create_session(transacted=True)
            prod = s.create_producer("paged.x")
            while not stop.is_set():
                for _ in range(300):  # ~120 KiB: more than a page, paged while open
                    await prod.send_async("t" * 400)
                await s.commit()
                commits[0] += 1
        finally:
            await conn.close()

    loader = threading.Thread(target=lambda: asyncio.run(load()), daemon=True)
    loader.start()
    try:
        deadline = time.monotonic() + 30
        while commits[0] < 20:
            assert time.monotonic() < deadline and loader.is_alive(), "the transactions do not commit"
            time.sleep(0.1)
        for _ in range(8):
            p.backup.start()
            p.wait_in_sync(timeout=60)
            p.backup.kill()
            errors = [line for line in p.backup.log_text().splitlines() if "cannot apply the stream" in line]
            assert not errors, errors[:3]
    finally:
        stop.set()
        loader.join(20)
    assert commits[0] > 20
