"""A primary that dies after asking for failback (state F) must not leave the pair without a live server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import tandem
from ha_pair import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    c = Cluster(tmp_path, lock_check_period=50)
    yield c
    c.kill_all()


def _state_byte(c: Cluster) -> bytes:
    return (c.data / "server.lock").read_bytes()[:1]


def _state_of(c: Cluster, i: int) -> str:
    """Server i's state; a status call the server cut short as it stepped down means it no longer serves."""
    try:
        return str(c.status(i)["state"])
    except tandem.TandemError as exc:
        return f"unreachable ({exc.code.name})"


def test_backup_takes_over_when_the_primary_dies_after_asking_for_failback(cluster: Cluster) -> None:
    c = cluster.start_all()
    c.primary.kill()
    c.wait_state(1, "active", timeout=10)
    # The returning primary polls slowly: after writing F it sleeps 5 s before it tries the
    # live lock again, long enough to kill it between the backup stepping down and its takeover.
    cfg = c.primary.config_path
    cfg.write_text(cfg.read_text().replace("lock-check-period = 50", "lock-check-period = 5000"))
    c.primary.start()
    deadline = time.monotonic() + 10
    while _state_byte(c) != b"F" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state_byte(c) == b"F", "the primary did not ask for failback"
    asked = time.monotonic()  # the primary sleeps until asked + 5 s at the earliest
    while _state_of(c, 1) == "active" and time.monotonic() < asked + 3:
        time.sleep(0.02)
    assert _state_of(c, 1) != "active", "the backup did not step down"
    assert _state_byte(c) == b"F" and time.monotonic() < asked + 4, "the test missed its window"
    c.primary.kill()  # after writing F, before it is live
    c.wait_state(1, "active", timeout=10)
