"""A transaction whose first work is done while the client is between servers.

A transacted send written after the client saw the primary go (and before the session's
restore on the backup) never reaches either server: the restore fails it (Unblocked). The
transaction then holds work no server has, so its commit must not report it committed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from client_io import queue_stat
from ha_pair import Cluster


@pytest.fixture
def pair(tmp_path: Path) -> Any:
    c = Cluster(tmp_path).start_all()
    yield c
    c.kill_all()


@pytest.mark.timeout(60)
def test_a_commit_after_a_transacted_send_written_while_away_is_not_reported_committed(pair: Cluster) -> None:
    c = pair

    async def main() -> None:
        conn = await aio.connect(c.url, retry_interval=50)
        session = await conn.create_session(transacted=True)
        await session.create_queue("txaway")
        producer = session.create_producer("txaway")
        c.primary.kill()
        deadline = asyncio.get_running_loop().time() + 20
        while conn.ready:
            assert asyncio.get_running_loop().time() < deadline, "the client never saw the primary go"
            await asyncio.sleep(0.002)
        away = producer.send_nowait("written while away")  # the transaction's first work
        assert away is not None
        committed = True
        try:
            await asyncio.wait_for(session.commit(), 20)
        except tandem.TransactionRolledBack:
            committed = False
        try:
            await away
        except tandem.TandemError:
            pass
        there = (await queue_stat(c.url_of(1), "txaway"))["message_count"]
        assert not committed or there == 1, "a commit reported committed a send that no server had"
        await conn.close()

    asyncio.run(main())
