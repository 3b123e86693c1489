"""A paging queue deleted on the primary while its bindings journal is slow, then kill -9: the
backup that takes over (replicated pair, and the warm backup of a shared store) and a cold load
of the primary's own disk must never bring back the messages the queue had acknowledged, most of
them read back from its pages (their PAGE_ACK and cursor records go only once the queue's
deletion is durable, decision 0066), and its sibling queue on the same address keeps every
message. Checked in review; each check failed against a copy that deletes the page records at
once."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path

import tandem.aio as aio
from broker_process import BrokerProcess
from ha_pair import Cluster
from replicated_pair import ReplicatedPair
from tandem.journal.faults import ENV_FILE

PAGED = {"paged.#": {"max-size-bytes": 16 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 16 * 1024}}
N, ACKED = 300, 100
ALL = [f"m{i:04d}" for i in range(N)]


async def _drain(url: str, queue: str) -> list[str] | None:
    """The queue's messages (None: no such queue), acknowledged as they come."""
    conn = await aio.connect(url)
    try:
        rows = (await conn.manage("queue.list", name=queue, page_size=1000))["items"]
        if not any(r["name"] == queue for r in rows):
            return None
        s = await conn.create_session(ack_mode="individual")
        c = await s.create_consumer(queue)
        out = []
        while (m := await c.receive(1.5)) is not None:
            out.append(m.text[:5])
            await m.ack()
        return out
    finally:
        with contextlib.suppress(BaseException):
            await conn.close()


async def _delete_while_bindings_stall(url: str, rules: Path, kill: Callable[[], None]) -> None:
    conn = await aio.connect(url, call_timeout=60_000)
    s = await conn.create_session()
    await s.create_queue("tq", "paged.t", "multicast")
    await s.create_queue("tr", "paged.t", "multicast")
    p = s.create_producer("paged.t")
    for name in ALL:
        await p.send_async(name + "x" * 400)
    await p.flush()
    assert (await conn.manage("queue.stat", name="tq"))[0]["paged_count"] > ACKED
    cs = await conn.create_session(ack_mode="individual")
    c = await cs.create_consumer("tq")
    for _ in range(ACKED):
        m = await c.receive(5)
        assert m is not None
        await m.ack()
    await c.close()
    await asyncio.sleep(0.3)
    await asyncio.to_thread(rules.write_text, "tandem-bindings:write=delay8\n")
    await asyncio.sleep(0.3)
    # A bindings write that stalls in the writer: the queue's DELETE waits behind it.
    other = asyncio.ensure_future(s.create_queue("elsewhere", "other", "anycast"))
    await asyncio.sleep(0.3)
    deleting = asyncio.ensure_future((await conn.create_session()).delete_queue("tq", force=True))
    await asyncio.sleep(2.0)
    assert not deleting.done()
    kill()
    await asyncio.to_thread(rules.write_text, "")
    for f in (other, deleting):
        f.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(conn.close(), 3)


def _check(url: str) -> None:
    tq = asyncio.run(_drain(url, "tq"))
    tr = asyncio.run(_drain(url, "tr"))
    assert tr is not None and sorted(set(tr)) == ALL  # the sibling keeps every message
    again = [x for x in (tq or []) if x < f"m{ACKED:04d}"]
    assert not again, f"acknowledged messages delivered again: {again[:5]}"


def test_a_replicated_backup_and_the_primary_s_disk_never_bring_back_a_deleted_queue_s_acks(tmp_path: Path) -> None:
    rules = tmp_path / "faults"
    rules.write_text("")
    pair = ReplicatedPair(tmp_path / "pair", address_settings=PAGED, env={ENV_FILE: str(rules)})
    cold = tmp_path / "cold"
    try:
        pair.start_all()
        asyncio.run(_delete_while_bindings_stall(pair.url_of(0), rules, pair.primary.kill))
        shutil.copytree(pair.dirs[0], cold)  # the primary's disk as kill -9 left it
        pair.wait_state(1, "active")
        _check(pair.url_of(1))
    finally:
        pair.kill_all()
    b = BrokerProcess(cold, name="cold", address_settings=PAGED).start()
    try:
        _check(b.url)
    finally:
        b.kill()


def test_a_warm_backup_never_brings_back_a_deleted_queue_s_acks(tmp_path: Path) -> None:
    rules = tmp_path / "faults"
    rules.write_text("")
    cluster = Cluster(tmp_path / "shared", address_settings=PAGED, env={ENV_FILE: str(rules)})
    try:
        cluster.start_all()
        asyncio.run(_delete_while_bindings_stall(cluster.url_of(0), rules, cluster.primary.kill))
        cluster.wait_state(1, "active")
        _check(cluster.url_of(1))
    finally:
        cluster.kill_all()
