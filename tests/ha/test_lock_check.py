"""A live server re-checks its lock every `lock-check-period` and stops serving once it lost it.

On a local disk an OFD lock is only lost with its file: removed, or replaced by a new
`server.lock` that another server then locks (what a lock lost on a network file system
amounts to). Either way two servers would write one store; the old one must go, exit
status 4, and write nothing more — not even the state byte.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import tandem.aio as aio
from broker_process import BrokerProcess

EXIT_LOCK_LOST = 4  # `tandem run` after losing its live lock (docs/ha.md)
PERIOD = 100  # ms


def _send(url: str, queue: str, text: str) -> None:
    async def go() -> None:
        conn = await aio.connect(url, ha=False, reconnect_attempts=0)
        try:
            await (await conn.create_session()).create_producer(queue).send(text)
        finally:
            await conn.close()

    asyncio.run(go())


def _exit_status(b: BrokerProcess, why: str) -> int:
    try:
        return b.wait_exit(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still serving 30 s after {why}:\n{b.log_text()[-2000:]}")


def test_a_live_server_whose_lock_file_is_removed_stops_serving(broker_factory: Any) -> None:
    b = broker_factory(lock_check_period=PERIOD).start()
    _send(b.url, "q", "before")
    (b.data_dir / "server.lock").unlink()
    assert _exit_status(b, "its server.lock was removed") == EXIT_LOCK_LOST
    assert "lost its live lock" in b.log_text()
    assert not (b.data_dir / "server.lock").exists(), "a server that lost its lock writes nothing more"


def test_a_live_server_whose_lock_file_is_taken_over_stops_serving(broker_factory: Any, tmp_path: Path) -> None:
    a = broker_factory("a", lock_check_period=PERIOD).start()
    _send(a.url, "q", "from a")
    lock = a.data_dir / "server.lock"
    fresh = a.data_dir / "server.lock.new"
    fresh.write_bytes(lock.read_bytes())
    os.replace(fresh, lock)  # a new lock file: the next server locks it, not a's
    b = broker_factory("b", lock_check_period=PERIOD, data_directory=str(a.data_dir)).start()
    assert _exit_status(a, "another server took its lock file over") == EXIT_LOCK_LOST
    assert "lost its live lock" in a.log_text()
    assert b.running
    _send(b.url, "q", "from b")  # the new holder serves on
