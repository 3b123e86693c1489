"""An open transaction's sends to a paging address on a replicating primary whose backup is
stopped (SIGSTOP): the page writes go to the backup's link as they are made, so the
sender stops being read while that link is over its high-water mark (decision 0085, as large
uploads do, decision 0051) instead of queueing them in the primary's memory. Then the commit,
kill -9 of the primary, and the backup delivers every message of it once, in order."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

import tandem.aio as aio
from client_io import drain_committed
from replicated_pair import ReplicatedPair
from tandem.testing.procs import memory

MIB = 1024 * 1024
SETTINGS = {"paged.#": {"max-size-bytes": 256 * 1024, "address-full-policy": "PAGE", "page-size-bytes": MIB}}
BODY = "p" * 1000
N = 40_000  # ~40 MiB of bodies


async def send(url: str, first: int, n: int, transacted: bool) -> None:
    conn = await aio.connect(url)
    try:
        session = await conn.create_session(transacted=transacted)
        prod = session.create_producer("paged.o")
        for i in range(first, first + n):
            await prod.send_async(f"m{i:06d}" + BODY)
        await prod.flush()
        if transacted:
            await session.commit()
    finally:
        await conn.close()


@pytest.mark.timeout(240)
def test_a_stalled_backup_paces_an_open_transactions_paged_sends(tmp_path: Path) -> None:
    pair = ReplicatedPair(tmp_path, address_settings=SETTINGS).start_all()
    try:
        assert pair.primary.proc is not None
        pid = pair.primary.proc.pid
        url = pair.url_of(0) + "?ha=false"
        asyncio.run(send(url, 0, 400, transacted=False))  # the address pages
        base = memory(pid, "VmRSS")
        errors: list[BaseException] = []

        def sender() -> None:
            try:
                asyncio.run(send(url, 400, N, transacted=True))
            except BaseException as exc:  # raised below
                errors.append(exc)

        t = threading.Thread(target=sender)
        with pair.backup.paused():  # until the primary has stopped reading the sender
            t.start()
            deadline = time.monotonic() + 60
            while (waiting := pair.status(0)["pacing_waiting"]) == 0:
                assert t.is_alive(), "the send ended without being paced while the backup was stopped"
                assert time.monotonic() < deadline, "the sender was never paced while the backup was stopped"
                time.sleep(0.05)
            stalled = memory(pid, "VmRSS") - base
        t.join(120)
        assert not t.is_alive() and not errors, errors
        growth = memory(pid, "VmHWM") - base
        print(f"primary RSS +{stalled >> 20} MiB with {waiting} paced, peak +{growth >> 20} MiB")
        # Unpaced, what the stall held back queued for the backup in the primary's memory (+36 MiB
        # when the backup was stopped 1 s out of every 1.3 s); paced, the link's and the page
        # writer's high-water marks and a read or two.
        assert growth < 24 * MIB, f"the primary's peak RSS grew by {growth >> 20} MiB for {N} KiB of paged sends"
        pair.primary.kill()
        pair.wait_state(1, "active", timeout=30)
        got = asyncio.run(drain_committed(pair.url_of(1) + "?ha=false", "paged.o", wait=5.0))
        assert got == [f"m{i:06d}" for i in range(400 + N)]
    finally:
        pair.kill_all()
